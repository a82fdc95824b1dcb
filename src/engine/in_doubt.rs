//! An `indeterminate` key taken up again by the reconciler (docs/contract.md §4, "Keys in
//! doubt"): its sink's check asks the receiver whether the effect of the command the key
//! keeps exists. *found* completes the key `succeeded` with the check's answer; *absent*
//! runs the command through the batch path (decide's `RunChecked`: claimed, then called,
//! as any claim), or, once its TTL is over, completes it `failed` without running it;
//! *unknown* or an error leaves it for the next pass.
//!
//! The key is held in flight while its check runs, as a call holds it, so no batch of this
//! process runs it meanwhile; with a changelog, the check is made only once this instance
//! proved it still owns the key's state partition, as a call is. The record is replaced only
//! if it is still the one the check was asked about.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Engine, EngineError, Item, ItemResult};
use crate::envelope::{Command, Shape};
use crate::outcome::{Outcome, Processed};
use crate::sinks::{CheckAnswer, CheckTiming, Sink};
use crate::store::{Held, InProgress, Indeterminate, Record, Settled, SettledBy, Settlement, SourcePos, StoreError};

/// What became of a key the reconciler took up.
#[derive(Debug)]
pub enum Reconciled {
    /// Settled: the result to publish for the input the key was in doubt for.
    Settled(Box<Processed>),
    /// Still `indeterminate`: the check did not tell (its label and sentence), or the run
    /// its *absent* allowed ended in doubt again.
    Unsettled { answer: &'static str, why: String },
    /// Not taken up in this pass; why.
    Skipped(Skip),
}

/// Why a key in doubt was not taken up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its record is not `indeterminate` (any more).
    NotIndeterminate,
    /// Another instance's: its state partition, or its input partition, is not held here.
    NotOwned,
    /// A batch of this process is running the key.
    BeingExecuted,
    /// Let go (a shutdown, a revoke) before it was settled.
    LetGo,
    /// Its record changed while its check ran (an operator, a repeat).
    Changed,
    /// Its claim is older than its sink's `check.deadline`.
    PastDeadline,
    /// Its record keeps no command (written before records kept one).
    NoCommand,
    /// Its route is gone from the config, or goes to another sink now.
    RouteChanged,
    /// Its sink has no check.
    NoCheck,
    /// The payload it keeps is not JSON.
    BadPayload,
}

impl Skip {
    /// What it says in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotIndeterminate => "not indeterminate",
            Skip::NotOwned => "not owned here",
            Skip::BeingExecuted => "being executed",
            Skip::LetGo => "let go",
            Skip::Changed => "changed while its check ran",
            Skip::PastDeadline => "past its check.deadline",
            Skip::NoCommand => "keeps no command",
            Skip::RouteChanged => "its route is gone, or goes to another sink now",
            Skip::NoCheck => "its sink has no check",
            Skip::BadPayload => "its kept payload is not JSON",
        }
    }

    /// Whether no pass will take the key up again: it waits for an operator
    /// (`dedupd_indeterminate_keys_unattended`).
    pub fn waits_for_an_operator(self) -> bool {
        matches!(self, Skip::PastDeadline | Skip::NoCommand | Skip::RouteChanged | Skip::NoCheck | Skip::BadPayload)
    }
}

/// A key in doubt the reconciler can take up: the command its record keeps, rebuilt, and
/// the sink that was called, with its check's timing.
struct InDoubt<'r> {
    held: &'r Held,
    command: Command,
    sink: Arc<Sink>,
    timing: CheckTiming,
}

impl InDoubt<'_> {
    /// The command as the batch path takes it: read where the input in doubt was, and
    /// cleared to run by its check (decide's `RunChecked`) when `checked_absent` says so.
    fn item(&self, checked_absent: Option<Settled>) -> Item {
        Item {
            source: self.held.source.clone(),
            parsed: Ok(self.command.clone()),
            traceparent: None,
            tracestate: None,
            span: None,
            checked_absent,
        }
    }
}

impl Engine {
    /// Takes up `key` when it is `indeterminate`, keeps its command and its sink has a check,
    /// and its claim is at most the check's `deadline` old (see the module doc).
    /// `owns` tells whether this instance may settle a key, by the key and the input it came
    /// from.
    pub async fn reconcile(
        &self,
        key: &str,
        owns: &(dyn Fn(&str, &SourcePos) -> bool + Sync),
        cancel: &CancellationToken,
    ) -> Result<Reconciled, EngineError> {
        let store = Arc::clone(&self.store);
        let owned_key = key.to_string();
        let stored = tokio::task::spawn_blocking(move || store.get(&owned_key))
            .await
            .map_err(|e| EngineError::Join(e.to_string()))??;
        let record = match stored {
            Some(Record::Indeterminate(record)) => record,
            Some(Record::InProgress(claim)) if claim.held.is_some() => {
                match self.take_up_left_run(key, claim, owns).await? {
                    Ok(record) => record,
                    Err(skip) => return Ok(Reconciled::Skipped(skip)),
                }
            }
            _ => return Ok(Reconciled::Skipped(Skip::NotIndeterminate)),
        };
        let doubt = match self.in_doubt(key, &record) {
            Ok(doubt) => doubt,
            Err(why) => return Ok(Reconciled::Skipped(why)),
        };
        if !owns(key, &doubt.held.source) {
            return Ok(Reconciled::Skipped(Skip::NotOwned));
        }
        let now = self.clock.now_ms();
        let age = now.saturating_sub(record.claimed_at_ms);
        if age > i64::try_from(doubt.timing.deadline.as_millis()).unwrap_or(i64::MAX) {
            return Ok(Reconciled::Skipped(Skip::PastDeadline));
        }
        if !self.mark_in_flight(key) {
            return Ok(Reconciled::Skipped(Skip::BeingExecuted));
        }
        let answer = self.ask_in_doubt(key, &record, &doubt, cancel).await;
        self.release(&[key.to_string()]);
        let Some(answer) = answer else { return Ok(Reconciled::Skipped(Skip::LetGo)) };
        let ttl_ms = i64::try_from(doubt.command.ttl.as_millis()).unwrap_or(i64::MAX);
        let label = answer.label();
        let settlement = match answer {
            CheckAnswer::Found(result) => Settlement::found(&result),
            CheckAnswer::Absent if age < ttl_ms => {
                let checked = Settled::new(SettledBy::CheckAbsent, self.clock.now_ms());
                return self.run_checked(doubt.item(Some(checked)), cancel).await;
            }
            CheckAnswer::Absent => Settlement::absent(format!(
                "the check of sink `{}` found no effect after the command's TTL was over: not run; was: {}",
                doubt.sink.name(),
                record.why
            )),
            CheckAnswer::Unknown(why) | CheckAnswer::Error(why) => {
                return Ok(Reconciled::Unsettled { answer: label, why });
            }
        };
        self.settle_in_doubt(key, &record, settlement, &doubt, (now, ttl_ms)).await
    }

    /// A claim of the reconciler's own run (it keeps its command) that no batch of this
    /// process holds: a crash or a stop left it during its call, which may have landed, and
    /// its input does not come again. It becomes `indeterminate` again (durable, and queued
    /// in the changelog), to be checked as any key in doubt; `Err` says why not now.
    async fn take_up_left_run(
        &self,
        key: &str,
        claim: InProgress,
        owns: &(dyn Fn(&str, &SourcePos) -> bool + Sync),
    ) -> Result<Result<Indeterminate, Skip>, EngineError> {
        let Some(held) = claim.held.clone() else { return Ok(Err(Skip::NotIndeterminate)) };
        if !owns(key, &held.source) {
            return Ok(Err(Skip::NotOwned));
        }
        if !self.mark_in_flight(key) {
            return Ok(Err(Skip::BeingExecuted));
        }
        let why = format!(
            "a run the reconciler started after a check found no effect was left in progress (a crash or a stop during its call, claimed at {}): its call may have reached sink `{}`",
            crate::time::rfc3339_ms(claim.claimed_at_ms),
            held.sink
        );
        let record = Indeterminate {
            fingerprint: claim.fingerprint,
            claimed_at_ms: claim.claimed_at_ms,
            attempts: claim.attempts,
            why,
            held: Some(held),
        };
        let (store, owned_key) = (Arc::clone(&self.store), key.to_string());
        let (was, new) = (Record::InProgress(claim), Record::Indeterminate(record.clone()));
        let swapped = tokio::task::spawn_blocking(move || -> Result<bool, StoreError> {
            let swapped = store.compare_and_swap(&owned_key, Some(&was), Some(&new))?.is_ok();
            store.flush()?;
            Ok(swapped)
        })
        .await
        .map_err(|e| EngineError::Join(e.to_string()));
        self.release(&[key.to_string()]);
        if !swapped?? {
            return Ok(Err(Skip::Changed));
        }
        self.queue_changelog().await?;
        tracing::warn!(
            key,
            sink = record.held.as_ref().map(|h| h.sink.as_str()),
            "a run of the reconciler was left in progress: the key is indeterminate again, to be checked"
        );
        Ok(Ok(record))
    }

    /// The command `record` keeps and the sink it went to, if that sink is still its
    /// route's and has a check; or why the key cannot be taken up.
    fn in_doubt<'r>(&self, key: &str, record: &'r Indeterminate) -> Result<InDoubt<'r>, Skip> {
        let held: &Held = record.held.as_deref().ok_or(Skip::NoCommand)?;
        let route = self.router.routes().iter().position(|r| r.name == held.route).ok_or(Skip::RouteChanged)?;
        let sink = &self.route_sinks[route];
        // Checked at the sink that was called, and run only through it.
        if sink.name() != held.sink {
            return Err(Skip::RouteChanged);
        }
        let timing = *sink.check_timing().ok_or(Skip::NoCheck)?;
        let payload = serde_json::from_slice(&held.payload).map_err(|_| Skip::BadPayload)?;
        let command = Command {
            key: key.to_string(),
            kind: held.kind.clone(),
            payload,
            fingerprint: record.fingerprint,
            route,
            ttl: self.router.effective_ttl(None, &self.router.routes()[route]),
            created_at_ms: None,
            produced_at_ms: None,
            traceparent: None,
            tracestate: None,
            shape: Shape::Native,
            intake_client: held.intake_client.clone(),
        };
        Ok(InDoubt { held, command, sink: Arc::clone(sink), timing })
    }

    /// Asks the sink's check about `record`'s command, once this instance proved it still
    /// owns the key's state partition (with a changelog); `None` when it could not, or
    /// `cancel` fired first.
    async fn ask_in_doubt(
        &self,
        key: &str,
        record: &Indeterminate,
        doubt: &InDoubt<'_>,
        cancel: &CancellationToken,
    ) -> Option<CheckAnswer> {
        if let Some(changelog) = &self.changelog
            && let Err(e) = changelog.prove_owned().await
        {
            tracing::warn!(key, error = %e, "no check: this instance could not prove it still owns the key's state partition");
            return None;
        }
        tokio::select! {
            answer = doubt.sink.check_held(key, doubt.held, record.claimed_at_ms) => Some(answer),
            () = cancel.cancelled() => None,
        }
    }

    /// Runs the command of a key whose check said *absent*, through the batch path.
    async fn run_checked(&self, item: Item, cancel: &CancellationToken) -> Result<Reconciled, EngineError> {
        let mut results = self.process_batch(std::slice::from_ref(&item), cancel).await?;
        Ok(match results.pop() {
            Some(ItemResult::Done(p)) => match p.result.outcome {
                Outcome::Succeeded | Outcome::Failed if p.sink_called => settled(p),
                Outcome::Indeterminate => {
                    Reconciled::Unsettled { answer: "absent", why: p.result.error.clone().unwrap_or_default() }
                }
                // Another writer got there first (an operator's resolve, a replay).
                _ => Reconciled::Skipped(Skip::Changed),
            },
            Some(ItemResult::Abandoned) | None => Reconciled::Skipped(Skip::LetGo),
        })
    }

    /// Completes `key`'s `record` as `settlement` says, if it is still that record, made
    /// durable (and queued in the changelog) before its result is returned to publish.
    async fn settle_in_doubt(
        &self,
        key: &str,
        record: &Indeterminate,
        settlement: Settlement,
        doubt: &InDoubt<'_>,
        (now, ttl_ms): (i64, i64),
    ) -> Result<Reconciled, EngineError> {
        let (store, owned_key, was) = (Arc::clone(&self.store), key.to_string(), record.clone());
        let settled_record =
            tokio::task::spawn_blocking(move || store.settle(&owned_key, &was, settlement, now, ttl_ms))
                .await
                .map_err(|e| EngineError::Join(e.to_string()))??;
        let Some(Record::Completed(completed)) = settled_record else {
            return Ok(Reconciled::Skipped(Skip::Changed));
        };
        self.queue_changelog().await?;
        Ok(settled(Box::new(self.republished(&doubt.item(None), &doubt.command, &completed))))
    }
}

/// A settlement's result, marked as the check's.
fn settled(mut p: Box<Processed>) -> Reconciled {
    p.result.settled_by = Some("check".into());
    Reconciled::Settled(p)
}

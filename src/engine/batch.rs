//! One batch through the engine, in rounds (see the module docs of `engine`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::retry::{RunEnd, run_with_retry};
use super::round::{RoundMarks, claim_durably, complete_durably};
use super::{Engine, EngineError, Item, ItemResult};
use crate::decide::{Action, Arrival, Context, decide};
use crate::envelope::{Command, Rejection};
use crate::outcome::{DeadLetter, Outcome, Processed, ResultRecord, SourceRef, rfc3339_ms};
use crate::store::{ClaimRequest, Completed, Completion, InProgress, Indeterminate, Record};

/// The first step for one record.
enum Start {
    /// Decided without running a sink.
    Done(Box<Processed>),
    /// To claim (the key is marked in flight); `request.expected` is what the claim
    /// replaces. Claims of a round are written together.
    Claim(Box<ClaimRequest>),
    /// Another batch of this process is executing the key.
    Wait(watch::Receiver<()>),
}

impl Engine {
    /// Processes `items` (one partition's batch, in offset order). Returns one result per
    /// item, in the same order.
    pub async fn process_batch(
        &self,
        items: &[Item],
        cancel: &CancellationToken,
    ) -> Result<Vec<ItemResult>, EngineError> {
        Ok(self.process_batch_reporting_flush(items, cancel).await?.0)
    }

    /// [`Engine::process_batch`], also telling whether it flushed the store at least once
    /// (then every write made before the call is durable too, e.g. a watermark).
    pub async fn process_batch_reporting_flush(
        &self,
        items: &[Item],
        cancel: &CancellationToken,
    ) -> Result<(Vec<ItemResult>, bool), EngineError> {
        let mut flushed = false;
        let mut results: Vec<Option<ItemResult>> = vec![None; items.len()];
        // Per-key queues of item indexes, in order of first appearance.
        let mut queues: Vec<VecDeque<(usize, &Command)>> = Vec::new();
        let mut queue_of: HashMap<&str, usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            match &item.parsed {
                Err(rejection) => results[i] = Some(ItemResult::Done(Box::new(rejected(item, rejection)))),
                Ok(cmd) => {
                    let q = *queue_of.entry(cmd.key.as_str()).or_insert_with(|| {
                        queues.push(VecDeque::new());
                        queues.len() - 1
                    });
                    queues[q].push_back((i, cmd));
                }
            }
        }

        loop {
            // At most `max_in_flight` records per round: claims are made for sinks about to
            // run, so a crash leaves no more unsent claims (future `indeterminate` keys for
            // non-forwarding sinks) than could have been in flight anyway.
            let heads: Vec<(usize, usize, &Command)> = queues
                .iter()
                .enumerate()
                .filter_map(|(q, d)| d.front().map(|&(i, c)| (q, i, c)))
                .take(self.max_in_flight)
                .collect();
            if heads.is_empty() || cancel.is_cancelled() {
                break;
            }
            let now = self.clock.now_ms();
            // Where a round's time goes, for `RUST_LOG=dedupd::engine=trace`.
            let mut marks = RoundMarks::new();
            let mut claimed: Vec<(usize, usize, &Command, Option<Record>)> = Vec::new();
            let mut waits: Vec<watch::Receiver<()>> = Vec::new();
            let mut requests: Vec<ClaimRequest> = Vec::new();
            let mut requested: Vec<(usize, usize, &Command)> = Vec::new();
            for (q, i, cmd) in heads {
                match self.start(&items[i], cmd, now)? {
                    Start::Done(p) => {
                        results[i] = Some(ItemResult::Done(p));
                        queues[q].pop_front();
                    }
                    Start::Claim(request) => {
                        requests.push(*request);
                        requested.push((q, i, cmd));
                    }
                    Start::Wait(rx) => waits.push(rx),
                }
            }
            marks.mark();
            // The round's claims in one write, then one flush (group commit) that makes them
            // durable; only then do we hold DurableClaims, and only those can build a sink
            // request. Both on the blocking pool: a write waits while another thread's flush
            // holds the backend's journal (fjall), and must not hold up a runtime thread.
            // A claim that lost a race (the key changed since it was read) stays at the
            // head of its queue and is decided again next round.
            let previous: Vec<Option<Record>> = requests.iter().map(|r| r.expected.clone()).collect();
            let store = Arc::clone(&self.store);
            let written = tokio::task::spawn_blocking(move || claim_durably(&store, requests))
                .await
                .map_err(|e| EngineError::Join(e.to_string()))
                .and_then(|r| r.map_err(EngineError::from));
            let outcomes = match written {
                Ok(o) => o,
                Err(e) => {
                    let mut map = self.inflight.lock();
                    for (_, _, cmd) in &requested {
                        map.remove(&cmd.key);
                    }
                    return Err(e);
                }
            };
            marks.mark();
            let mut durable = Vec::with_capacity(outcomes.len());
            for ((outcome, (q, i, cmd)), previous) in outcomes.into_iter().zip(requested).zip(previous) {
                match outcome {
                    Some(claim) => {
                        durable.push(claim);
                        claimed.push((q, i, cmd, previous));
                    }
                    None => {
                        self.inflight.lock().remove(&cmd.key);
                    }
                }
            }
            flushed |= !durable.is_empty();

            let runs = durable.into_iter().zip(claimed.iter()).map(|(claim, &(_, i, cmd, _))| {
                // Everything the sink run logs (retries, the sink's own events) carries
                // the command's identity.
                let source = &items[i].source;
                let span = tracing::info_span!(
                    "sink_run",
                    key = %cmd.key,
                    r#type = %cmd.kind,
                    topic = %source.topic,
                    partition = source.partition,
                    offset = source.offset,
                );
                async move {
                    let sink = &self.route_sinks[cmd.route];
                    let end = run_with_retry(sink.as_ref(), &claim, cmd, &self.retry, &self.limiter, cancel).await;
                    (claim, end)
                }
                .instrument(span)
            });
            let ends = futures::future::join_all(runs).await;
            marks.mark();

            let mut done_keys = Vec::with_capacity(ends.len());
            let mut completions = Vec::with_capacity(ends.len());
            for ((claim, end), (q, i, cmd, previous)) in ends.into_iter().zip(claimed) {
                let completed_at = self.clock.now_ms();
                let first_seen = claim.record().claimed_at_ms;
                let prior = claim.record().attempts.saturating_sub(1);
                let result = match end {
                    RunEnd::Succeeded { result, attempts } => {
                        let c = self.completion(
                            cmd,
                            first_seen,
                            completed_at,
                            Completion::Succeeded,
                            &result,
                            None,
                            prior + attempts,
                        );
                        completions.push((claim, c));
                        ItemResult::Done(Box::new(self.executed(
                            &items[i],
                            cmd,
                            Outcome::Succeeded,
                            result,
                            None,
                            prior + attempts,
                            first_seen,
                            completed_at,
                        )))
                    }
                    RunEnd::Failed { result, error, attempts } => {
                        let c = self.completion(
                            cmd,
                            first_seen,
                            completed_at,
                            Completion::Failed,
                            &result,
                            Some(&error),
                            prior + attempts,
                        );
                        completions.push((claim, c));
                        ItemResult::Done(Box::new(self.executed(
                            &items[i],
                            cmd,
                            Outcome::Failed,
                            result,
                            Some(error),
                            prior + attempts,
                            first_seen,
                            completed_at,
                        )))
                    }
                    RunEnd::NeverRan => {
                        // The sink never saw it: put back what the claim replaced, so the
                        // next owner of the partition decides as if we had never been here.
                        let mine = Record::InProgress(claim.record().clone());
                        if self.store.compare_and_swap(&cmd.key, Some(&mine), previous.as_ref())?.is_err() {
                            tracing::warn!(key = %cmd.key, "claim changed while abandoning it; leaving it");
                        }
                        ItemResult::Abandoned
                    }
                    RunEnd::Interrupted { attempts } => {
                        tracing::warn!(key = %cmd.key, attempts, "abandoned after sink calls without an answer; the claim stays in_progress");
                        ItemResult::Abandoned
                    }
                };
                results[i] = Some(result);
                queues[q].pop_front();
                done_keys.push(cmd.key.clone());
            }
            marks.mark();
            // One write (and one expiry-index entry) for the round's completions, then one
            // flush; on the blocking pool for the same reason as the claims.
            let store = Arc::clone(&self.store);
            let must_flush = !done_keys.is_empty();
            flushed |= must_flush;
            let lost = tokio::task::spawn_blocking(move || complete_durably(&store, completions, must_flush))
                .await
                .map_err(|e| EngineError::Join(e.to_string()))??;
            if let Some(key) = lost {
                // An operator forgot (or overwrote) a key while its sink ran: the effect
                // happened and its result is published, but the store keeps what the
                // operator asked for. Not a reason to stop the partition.
                tracing::warn!(%key, "the claim was removed by an operator while its sink ran; result published, not stored");
            }
            marks.mark();
            tracing::trace!(records = done_keys.len(), waits = waits.len(), ms = ?marks.ms, "round: ms for starts, claims + flush, sinks, results, completions + flush");
            // Release the keys only once their completions are durable: a waiter must not
            // replay a result that a crash could still take back.
            {
                let mut map = self.inflight.lock();
                for key in &done_keys {
                    map.remove(key);
                }
            }
            for mut rx in waits {
                tokio::select! {
                    _ = rx.changed() => {}
                    () = cancel.cancelled() => {}
                }
            }
        }
        Ok((results.into_iter().map(|r| r.unwrap_or(ItemResult::Abandoned)).collect(), flushed))
    }

    /// Decides one record and takes the first step. Loops only when a compare-and-swap
    /// loses a race, re-reading what won.
    fn start(&self, item: &Item, cmd: &Command, now: i64) -> Result<Start, EngineError> {
        let sink = &self.route_sinks[cmd.route];
        let arrival = Arrival {
            fingerprint: &cmd.fingerprint,
            produced_at_ms: cmd.produced_at_ms,
            ttl_ms: i64::try_from(cmd.ttl.as_millis()).unwrap_or(i64::MAX),
        };
        loop {
            let (stored, stamp) = self.store.get_stamped(&cmd.key)?;
            let waiter = self.inflight.lock().get(&cmd.key).map(watch::Sender::subscribe);
            let ctx = Context {
                now_ms: now,
                executing_here: waiter.is_some(),
                sink_forwards_key: sink.forwards_key(),
                stale_guard: self.stale_guard,
            };
            let action = decide(Ok(&arrival), stored.as_ref(), &ctx);
            match action {
                Action::Wait => {
                    if let Some(rx) = waiter {
                        return Ok(Start::Wait(rx));
                    }
                }
                Action::Execute | Action::RerunOrphan => {
                    {
                        let mut map = self.inflight.lock();
                        if map.contains_key(&cmd.key) {
                            continue;
                        }
                        map.insert(cmd.key.clone(), watch::channel(()).0);
                    }
                    let claim = match (&action, &stored) {
                        (Action::RerunOrphan, Some(Record::InProgress(p))) => InProgress {
                            fingerprint: cmd.fingerprint,
                            claimed_at_ms: p.claimed_at_ms,
                            attempts: p.attempts.saturating_add(1),
                            source: item.source.clone(),
                        },
                        _ => InProgress {
                            fingerprint: cmd.fingerprint,
                            claimed_at_ms: now,
                            attempts: 1,
                            source: item.source.clone(),
                        },
                    };
                    return Ok(Start::Claim(Box::new(ClaimRequest {
                        key: cmd.key.clone(),
                        expected: stored,
                        stamp,
                        claim,
                    })));
                }
                Action::MarkIndeterminate => {
                    let Some(Record::InProgress(p)) = &stored else { continue };
                    let why = format!(
                        "claimed at {} by {}/{}/{} and never completed (crash?); sink `{}` does not forward the key, so the effect is unknown",
                        rfc3339_ms(p.claimed_at_ms),
                        p.source.topic,
                        p.source.partition,
                        p.source.offset,
                        sink.name()
                    );
                    let new = Record::Indeterminate(Indeterminate {
                        fingerprint: p.fingerprint,
                        claimed_at_ms: p.claimed_at_ms,
                        attempts: p.attempts,
                        why,
                    });
                    if self.store.compare_and_swap(&cmd.key, stored.as_ref(), Some(&new))?.is_ok() {
                        return Ok(Start::Done(Box::new(self.processed_from_record(item, cmd, &new, now))));
                    }
                }
                Action::Replay | Action::ReportIndeterminate | Action::Conflict => {
                    if let Some(record) = &stored {
                        let mut p = self.processed_from_record(item, cmd, record, now);
                        if action == Action::Conflict {
                            p.result.outcome = Outcome::Conflict;
                            p.result.replay = false;
                            p.result.result = Value::Object(Default::default());
                            p.result.error = Some(format!(
                                "key already holds a {} record with fingerprint {}; this command's fingerprint is {}",
                                record.state().as_str(),
                                record.fingerprint(),
                                cmd.fingerprint
                            ));
                            p.result.fingerprint = Some(cmd.fingerprint.to_string());
                            p.duplicate_age_ms = None;
                        }
                        return Ok(Start::Done(Box::new(p)));
                    }
                }
                Action::Stale => {
                    let produced = cmd.produced_at_ms.map(rfc3339_ms).unwrap_or_default();
                    let error = format!(
                        "produced at {produced}, longer ago than its TTL of {}; not executed",
                        humantime::format_duration(cmd.ttl)
                    );
                    let mut p = self.base(item, Some(cmd), Outcome::Stale);
                    p.result.error = Some(error.clone());
                    p.dead_letter = Some(DeadLetter { reason: "stale", error });
                    return Ok(Start::Done(Box::new(p)));
                }
                Action::Reject(reason) => {
                    let rejection = Rejection { reason, message: "rejected".into(), key: Some(cmd.key.clone()) };
                    return Ok(Start::Done(Box::new(rejected(item, &rejection))));
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn completion(
        &self,
        cmd: &Command,
        first_seen: i64,
        completed_at: i64,
        outcome: Completion,
        result: &Value,
        error: Option<&str>,
        attempts: u32,
    ) -> Completed {
        let ttl = i64::try_from(cmd.ttl.as_millis()).unwrap_or(i64::MAX);
        Completed {
            fingerprint: cmd.fingerprint,
            outcome,
            result: serde_json::to_vec(result).unwrap_or_else(|_| b"{}".to_vec()),
            error: error.map(str::to_string),
            first_seen_at_ms: first_seen,
            completed_at_ms: completed_at,
            expires_at_ms: completed_at.saturating_add(ttl),
            attempts,
        }
    }

    /// The parts of a result every outcome shares.
    fn base(&self, item: &Item, cmd: Option<&Command>, outcome: Outcome) -> Processed {
        let route = cmd.and_then(|c| self.router.routes().get(c.route));
        Processed {
            result: ResultRecord {
                key: cmd.map(|c| c.key.clone()),
                kind: cmd.map(|c| c.kind.clone()),
                outcome,
                replay: false,
                route: route.map(|r| r.name.clone()),
                sink: route.map(|r| r.sink.clone()),
                result: Value::Object(Default::default()),
                error: None,
                attempts: 0,
                fingerprint: cmd.map(|c| c.fingerprint.to_string()),
                first_seen_at: None,
                completed_at: None,
                source: SourceRef::from(&item.source),
            },
            dead_letter: None,
            duplicate_age_ms: None,
            // The envelope's trace context (CloudEvents attributes included) when there is
            // a command; the raw header otherwise.
            traceparent: cmd.and_then(|c| c.traceparent.clone()).or_else(|| item.traceparent.clone()),
            sink_called: false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn executed(
        &self,
        item: &Item,
        cmd: &Command,
        outcome: Outcome,
        result: Value,
        error: Option<String>,
        attempts: u32,
        first_seen: i64,
        completed_at: i64,
    ) -> Processed {
        let mut p = self.base(item, Some(cmd), outcome);
        p.result.result = result;
        p.result.error = error;
        p.result.attempts = attempts;
        p.result.first_seen_at = Some(rfc3339_ms(first_seen));
        p.result.completed_at = Some(rfc3339_ms(completed_at));
        p.sink_called = true;
        p
    }

    /// A result read from a stored record: a replay (`duplicate`) or `indeterminate`.
    fn processed_from_record(&self, item: &Item, cmd: &Command, record: &Record, now: i64) -> Processed {
        match record {
            Record::Completed(c) => {
                let mut p = self.base(item, Some(cmd), Outcome::Duplicate);
                p.result.replay = true;
                p.result.result = serde_json::from_slice(&c.result)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&c.result).into_owned()));
                p.result.error = c.error.clone();
                p.result.attempts = c.attempts;
                p.result.first_seen_at = Some(rfc3339_ms(c.first_seen_at_ms));
                p.result.completed_at = Some(rfc3339_ms(c.completed_at_ms));
                p.duplicate_age_ms = Some(now.saturating_sub(c.first_seen_at_ms).max(0));
                p
            }
            Record::Indeterminate(r) => {
                let mut p = self.base(item, Some(cmd), Outcome::Indeterminate);
                p.result.error = Some(r.why.clone());
                p.result.attempts = r.attempts;
                p.result.first_seen_at = Some(rfc3339_ms(r.claimed_at_ms));
                p
            }
            Record::InProgress(r) => {
                let mut p = self.base(item, Some(cmd), Outcome::Indeterminate);
                p.result.error = Some("in progress".into());
                p.result.attempts = r.attempts;
                p.result.first_seen_at = Some(rfc3339_ms(r.claimed_at_ms));
                p
            }
        }
    }
}

fn rejected(item: &Item, rejection: &Rejection) -> Processed {
    let error = rejection.message.clone();
    Processed {
        result: ResultRecord {
            key: rejection.key.clone(),
            kind: None,
            outcome: Outcome::Rejected,
            replay: false,
            route: None,
            sink: None,
            result: Value::Object(Default::default()),
            error: Some(format!("{}: {error}", rejection.reason.as_str())),
            attempts: 0,
            fingerprint: None,
            first_seen_at: None,
            completed_at: None,
            source: SourceRef::from(&item.source),
        },
        dead_letter: Some(DeadLetter { reason: rejection.reason.as_str(), error }),
        duplicate_age_ms: None,
        traceparent: item.traceparent.clone(),
        sink_called: false,
    }
}

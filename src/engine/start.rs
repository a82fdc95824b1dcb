//! Start the heads: decide each key's oldest unfinished record. It is done without a sink
//! (a replay, a conflict, a stale or rejected command, an orphan marked indeterminate), or
//! its key is marked in flight and a claim is to be written once it holds a ticket (see
//! `ticket`), or it waits for another batch of this process that is executing the key.
//!
//! Heads are started in order and a claim takes its ticket as soon as it is decided; at the
//! first claim without a ticket the round stops starting heads, and that head and the ones
//! after it are decided next round. Deciding them now would be undone: a claim without a
//! ticket lets go of its key, and with several partitions sharing `max_in_flight` most heads
//! of a round found no ticket and were decided again and again (about a sixth of the
//! engine's CPU with six partitions: docs/performance-notes.md, "Tickets as heads are
//! decided").
//!
//! The round's heads are read first, all in one blocking-pool call (`read_heads`), and each
//! is decided on that read. A claim is checked against its key as it is when written (the
//! read's stamp, `KeyStore::claim_batch`), so a head whose key changed meanwhile loses
//! its claim and is decided again next round, as it would after any race.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::queue::{Head, KeyQueues};
use super::ticket::Ticket;
use super::{Engine, EngineError, Item, ItemResult};
use crate::decide::{Action, Arrival, Context, decide};
use crate::envelope::{Command, Rejection};
use crate::outcome::{Processed, rfc3339_ms};
use crate::store::{ClaimRequest, InProgress, Indeterminate, ReadStamp, Record};

/// A key's record and the stamp of its read (see [`crate::store::KeyStore::get_stamped`]).
type StampedRead = (Option<Record>, ReadStamp);

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

/// A claim to write for a head whose key is now marked in flight.
pub(super) struct ToClaim<'a> {
    /// The head.
    pub(super) head: Head<'a>,
    /// The claim, with the record it replaces.
    pub(super) request: ClaimRequest,
}

/// What starting a round's heads leaves to do (the heads decided without a sink are
/// finished in the queues).
pub(super) struct Started<'a> {
    /// The claims to write, each with the ticket its first call will use.
    pub(super) to_claim: Vec<(ToClaim<'a>, Ticket<'a>)>,
    /// Whether a head to claim found no ticket (it and the heads after it are left for the
    /// next round).
    pub(super) short_of_tickets: bool,
    /// Keys other batches are executing: awaited once this round's keys are released.
    pub(super) waits: Vec<watch::Receiver<()>>,
}

impl Engine {
    /// Starts `heads` in order at time `now`, taking a ticket for each claim (waiting for
    /// the first with `wait_first`), until a claim finds no ticket (see the module doc).
    pub(super) async fn start_heads<'a>(
        &'a self,
        queues: &mut KeyQueues<'a>,
        heads: Vec<Head<'a>>,
        now: i64,
        wait_first: bool,
        cancel: &CancellationToken,
    ) -> Result<Started<'a>, EngineError> {
        let mut started =
            Started { to_claim: Vec::with_capacity(heads.len()), short_of_tickets: false, waits: Vec::new() };
        let reads = self.read_heads(&heads).await?;
        for (head, read) in heads.into_iter().zip(reads) {
            let start = match self.start(&queues.items()[head.index], head.command, now, read) {
                Ok(start) => start,
                Err(e) => {
                    let marked: Vec<String> =
                        started.to_claim.iter().map(|(c, _)| c.head.command.key.clone()).collect();
                    return Err(self.release_if_let_go(e, &marked));
                }
            };
            match start {
                Start::Done(p) => queues.finish(head, ItemResult::Done(p)),
                Start::Wait(rx) => started.waits.push(rx),
                Start::Claim(request) => {
                    let wait = wait_first && started.to_claim.is_empty();
                    match self.ticket_for(head.command, wait, cancel).await {
                        Some(ticket) => started.to_claim.push((ToClaim { head, request: *request }, ticket)),
                        None => {
                            // Not claimed: its head stays first in its queue for the next round.
                            self.inflight.lock().remove(&head.command.key);
                            started.short_of_tickets = true;
                            break;
                        }
                    }
                }
            }
        }
        Ok(started)
    }

    /// The records of `heads` as they are now, read on the blocking pool: a read waits while
    /// another partition's claims hold the key's stripe through their write (docs/performance-notes.md,
    /// "Heads read off the runtime"), and a record not in memory is read
    /// from disk; neither may hold up a runtime thread. A head decided later in the round
    /// decides on this read; its claim is checked against the key as it is then (`claim`).
    async fn read_heads(&self, heads: &[Head<'_>]) -> Result<Vec<StampedRead>, EngineError> {
        let keys: Vec<String> = heads.iter().map(|h| h.command.key.clone()).collect();
        let store = Arc::clone(&self.store);
        let reads = tokio::task::spawn_blocking(move || {
            keys.iter().map(|key| store.get_stamped(key)).collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e| EngineError::Join(e.to_string()))?;
        Ok(reads?)
    }

    /// Decides one record, first on `read` (its record read at the round's start), and
    /// takes the first step. Loops only when a compare-and-swap loses a race, re-reading
    /// what won.
    fn start(&self, item: &Item, cmd: &Command, now: i64, read: StampedRead) -> Result<Start, EngineError> {
        let sink = &self.route_sinks[cmd.route];
        let arrival = Arrival {
            fingerprint: &cmd.fingerprint,
            produced_at_ms: cmd.produced_at_ms,
            ttl_ms: i64::try_from(cmd.ttl.as_millis()).unwrap_or(i64::MAX),
            source: &item.source,
            checked_absent: item.checked_absent.is_some(),
        };
        let mut read = Some(read);
        loop {
            let (stored, stamp) = match read.take() {
                Some(read) => read,
                None => self.store.get_stamped(&cmd.key)?,
            };
            let waiter = self
                .inflight
                .lock()
                .get_mut(&cmd.key)
                .map(|waiters| waiters.get_or_insert_with(|| watch::channel(()).0).subscribe());
            let ctx = Context {
                now_ms: now,
                executing_here: waiter.is_some(),
                sink_forwards_key: sink.forwards_key(),
                sink_has_check: sink.check_timing().is_some(),
                stale_guard: self.stale_guard,
            };
            let action = decide(Ok(&arrival), stored.as_ref(), &ctx);
            match action {
                Action::Wait => {
                    if let Some(rx) = waiter {
                        return Ok(Start::Wait(rx));
                    }
                }
                Action::Execute | Action::RerunOrphan | Action::CheckOrphan | Action::RunChecked => {
                    if !self.mark_in_flight(&cmd.key) {
                        continue;
                    }
                    // Taking over an orphan (to run it again, or to check it first: `retry`),
                    // or a key in doubt its check cleared, keeps its first sighting and counts
                    // the attempt it may make.
                    let orphan = action != Action::Execute;
                    let claim = claim_record(item, cmd, orphan, stored.as_ref(), now);
                    let request = ClaimRequest { key: cmd.key.clone(), expected: stored, stamp, claim };
                    return Ok(Start::Claim(Box::new(request)));
                }
                Action::MarkIndeterminate => {
                    if let Some(p) = self.mark_indeterminate(item, cmd, stored.as_ref(), now)? {
                        return Ok(Start::Done(Box::new(p)));
                    }
                }
                Action::Replay | Action::ReportIndeterminate | Action::Conflict => {
                    if let Some(record) = &stored {
                        let p = if action == Action::Conflict {
                            self.conflict(item, cmd, record, now)
                        } else {
                            self.processed_from_record(item, cmd, record, now)
                        };
                        return Ok(Start::Done(Box::new(p)));
                    }
                }
                Action::Republish => {
                    if let Some(Record::Completed(c)) = &stored {
                        return Ok(Start::Done(Box::new(self.republished(item, cmd, c))));
                    }
                }
                Action::Stale => return Ok(Start::Done(Box::new(self.stale(item, cmd)))),
                Action::Reject(reason) => {
                    let rejection = Rejection {
                        reason,
                        message: "rejected".into(),
                        key: Some(cmd.key.clone()),
                        kind: Some(cmd.kind.clone()),
                    };
                    return Ok(Start::Done(Box::new(super::processed::rejected(item, &rejection))));
                }
            }
        }
    }

    /// Marks `key` in flight; `false` when another batch of this process got there first.
    pub(super) fn mark_in_flight(&self, key: &str) -> bool {
        let mut map = self.inflight.lock();
        if map.contains_key(key) {
            return false;
        }
        map.insert(key.to_string(), None);
        true
    }

    /// Replaces an orphaned claim (`stored`, left by a crash) with an `indeterminate`
    /// record, for a sink that does not forward the key. `None` when the record is not an
    /// orphan any more or changed meanwhile: decide again.
    fn mark_indeterminate(
        &self,
        item: &Item,
        cmd: &Command,
        stored: Option<&Record>,
        now: i64,
    ) -> Result<Option<Processed>, EngineError> {
        let Some(Record::InProgress(p)) = stored else { return Ok(None) };
        let why = format!(
            "claimed at {} by {}/{}/{} and never completed (crash?); sink `{}` does not forward the key, so the effect is unknown",
            rfc3339_ms(p.claimed_at_ms),
            p.source.topic,
            p.source.partition,
            p.source.offset,
            self.route_sinks[cmd.route].name()
        );
        let new = Record::Indeterminate(Indeterminate {
            fingerprint: p.fingerprint,
            claimed_at_ms: p.claimed_at_ms,
            attempts: p.attempts,
            why,
            held: Some(self.held(cmd, &p.source)),
        });
        if self.store.compare_and_swap(&cmd.key, stored, Some(&new))?.is_ok() {
            // One line per key, for the operator who settles it (docs/runbook.md, "Resolving
            // indeterminate keys"): the result record says so too, but logs are searched first.
            tracing::warn!(key = %cmd.key, claimed_by = %format_args!("{}/{}/{}", p.source.topic, p.source.partition, p.source.offset),
                sink = self.route_sinks[cmd.route].name(),
                "a claim left by a crash is now indeterminate: resolve or forget the key");
            return Ok(Some(self.processed_from_record(item, cmd, &new, now)));
        }
        Ok(None)
    }
}

/// The claim to write: a re-run of an orphan, or of a key in doubt its check cleared, keeps
/// its first sighting and counts one more attempt; anything else is a first claim made `now`.
fn claim_record(item: &Item, cmd: &Command, rerun: bool, stored: Option<&Record>, now: i64) -> InProgress {
    match (rerun, stored) {
        (true, Some(Record::InProgress(p))) => InProgress {
            fingerprint: cmd.fingerprint,
            claimed_at_ms: p.claimed_at_ms,
            attempts: p.attempts.saturating_add(1),
            source: item.source.clone(),
            held: None,
        },
        // The reconciler's run keeps the command: its input does not come again, so a claim
        // left in progress is taken up from what it keeps (`in_doubt`).
        (true, Some(Record::Indeterminate(i))) => InProgress {
            fingerprint: cmd.fingerprint,
            claimed_at_ms: i.claimed_at_ms,
            attempts: i.attempts.saturating_add(1),
            source: item.source.clone(),
            held: i.held.clone(),
        },
        _ => InProgress {
            fingerprint: cmd.fingerprint,
            claimed_at_ms: now,
            attempts: 1,
            source: item.source.clone(),
            held: None,
        },
    }
}

//! Complete: each sink run's end becomes its record's result and, when the sink answered,
//! a completion; then the round's completions are written at once (one write, one
//! expiry-index entry), durable with the next round's claims or the batch's last flush
//! (`batch`). A run cancelled with no call in doubt (none made, every one refused before it
//! left or answered) puts its claim's old record back instead.

use std::sync::Arc;

use super::claim::Claimed;
use super::processed::Answer;
use super::queue::KeyQueues;
use super::retry::RunEnd;
use super::run::Ran;
use super::{Engine, EngineError, ItemResult};
use crate::envelope::Command;
use crate::store::{
    Completed, Completion, DurableClaim, Held, Indeterminate, KeyStore, Record, Settled, SourcePos, StoreError,
};
use crate::time::Rfc3339Memo;

/// What a round's sink runs leave to store.
pub(super) struct Completions {
    /// One completion per claim whose sink answered.
    pub(super) to_write: Vec<(DurableClaim, Completed)>,
    /// The keys of every claim of the round, answered or abandoned: released once the
    /// completions are durable.
    pub(super) keys: Vec<String>,
}

impl Engine {
    /// Finishes each run's head in `queues` with its result, and collects the completions
    /// to write. A claim none of whose calls is in doubt gets back the record it replaced.
    pub(super) fn settle_runs<'a>(
        &self,
        queues: &mut KeyQueues<'a>,
        ran: impl ExactSizeIterator<Item = Ran<'a>>,
    ) -> Result<Completions, EngineError> {
        let mut done = Completions { to_write: Vec::with_capacity(ran.len()), keys: Vec::with_capacity(ran.len()) };
        // Runs that end in the same millisecond share the text of their `completed_at`.
        let mut times = Rfc3339Memo::default();
        for Ran { claimed: Claimed { head, claim, previous, .. }, end, ended_at_ms: completed_at_ms } in ran {
            let cmd = head.command;
            let first_seen_ms = claim.record().claimed_at_ms;
            let prior = claim.record().attempts.saturating_sub(1);
            let answer = |completion, result, error, attempts: u32| Answer {
                completion,
                result,
                error,
                attempts: prior + attempts,
                first_seen_ms,
                completed_at_ms,
            };
            // A key the reconciler's check cleared to run was settled by that check, unless a
            // later check of this run settled it again.
            let checked = queues.items()[head.index].checked_absent;
            let result = match end {
                RunEnd::Succeeded { result, attempts, settled } => {
                    let answer = answer(Completion::Succeeded, result, None, attempts);
                    let completed = completion(cmd, &answer, &claim.record().source, settled.or(checked));
                    done.to_write.push((claim, completed));
                    ItemResult::Done(Box::new(self.executed(&queues.items()[head.index], cmd, answer, &mut times)))
                }
                RunEnd::Failed { result, error, attempts, settled } => {
                    let answer = answer(Completion::Failed, result, Some(error), attempts);
                    let completed = completion(cmd, &answer, &claim.record().source, settled.or(checked));
                    done.to_write.push((claim, completed));
                    ItemResult::Done(Box::new(self.executed(&queues.items()[head.index], cmd, answer, &mut times)))
                }
                RunEnd::Releasable => {
                    // No call is in doubt: put back what the claim replaced, so the next
                    // owner of the partition decides as if we had never been here.
                    let mine = Record::InProgress(claim.record().clone());
                    if !self.swap_unless_let_go(&cmd.key, &mine, previous.as_ref())? {
                        tracing::warn!(key = %cmd.key, "claim changed while abandoning it; leaving it");
                    }
                    ItemResult::Abandoned
                }
                RunEnd::Indeterminate { why, attempts } => {
                    let record = Record::Indeterminate(Indeterminate {
                        fingerprint: claim.record().fingerprint,
                        claimed_at_ms: first_seen_ms,
                        attempts: prior + attempts,
                        why,
                        held: Some(self.held(cmd, &claim.record().source)),
                    });
                    let mine = Record::InProgress(claim.record().clone());
                    if !self.swap_unless_let_go(&cmd.key, &mine, Some(&record))? {
                        // An operator forgot or resolved the key while its sink ran: their
                        // record stands; this input still learns the call is in doubt.
                        tracing::warn!(key = %cmd.key, "the claim was changed by an operator while its sink ran; indeterminate result published, not stored");
                    }
                    let item = &queues.items()[head.index];
                    let mut p = self.processed_from_record(item, cmd, &record, completed_at_ms);
                    p.sink_called = true;
                    ItemResult::Done(Box::new(p))
                }
                RunEnd::Interrupted { attempts } => {
                    tracing::warn!(key = %cmd.key, attempts, "abandoned after sink calls without an answer; the claim stays in_progress");
                    ItemResult::Abandoned
                }
            };
            queues.finish(head, result);
            done.keys.push(cmd.key.clone());
        }
        Ok(done)
    }

    /// Writes `completions` (durable with the next flush); on the blocking pool for the
    /// same reason as the claims (see `claim`).
    pub(super) async fn complete(&self, completions: Vec<(DurableClaim, Completed)>) -> Result<(), EngineError> {
        if completions.is_empty() {
            return Ok(());
        }
        let store = Arc::clone(&self.store);
        let lost = tokio::task::spawn_blocking(move || write_completions(&store, completions))
            .await
            .map_err(|e| EngineError::Join(e.to_string()))??;
        match lost {
            // An operator forgot (or overwrote) a key while its sink ran: the effect
            // happened and its result is published, but the store keeps what the
            // operator asked for. Not a reason to stop the partition.
            Some(Unwritten::Lost(key)) => {
                tracing::warn!(%key, "the claim was removed by an operator while its sink ran; result published, not stored")
            }
            Some(Unwritten::LetGo(e)) => tracing::warn!(error = %e, "{LET_GO}"),
            None => {}
        }
        Ok(())
    }

    /// Replaces `mine` (a claim of this batch) with `new`, unless the key changed meanwhile
    /// or its partition was let go (`store::ownership`): says whether it did.
    fn swap_unless_let_go(&self, key: &str, mine: &Record, new: Option<&Record>) -> Result<bool, EngineError> {
        match self.store.compare_and_swap(key, Some(mine), new) {
            Ok(swapped) => Ok(swapped.is_ok()),
            Err(e @ StoreError::NotOwned { .. }) => {
                tracing::warn!(error = %e, "{LET_GO}");
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Flushes the store: every completion written so far becomes durable (with a
    /// changelog, queued in its open transaction before anything that depends on them; see
    /// `changelog`).
    pub(super) async fn flush_store(&self) -> Result<(), EngineError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.flush()).await.map_err(|e| EngineError::Join(e.to_string()))??;
        self.queue_changelog().await
    }
}

impl Engine {
    /// What an `indeterminate` record keeps of `cmd`, claimed by the record at `source`:
    /// what a later check needs to ask its sink's receiver about it.
    pub(super) fn held(&self, cmd: &Command, source: &SourcePos) -> Box<Held> {
        let route = self.router.routes().get(cmd.route).map(|r| r.name.clone()).unwrap_or_default();
        Box::new(Held {
            sink: self.route_sinks[cmd.route].name().to_string(),
            route,
            kind: cmd.kind.clone(),
            payload: serde_json::to_vec(&cmd.payload).unwrap_or_else(|_| b"null".to_vec()),
            source: source.clone(),
            intake_client: cmd.intake_client.clone(),
        })
    }
}

/// The completion stored for `answer` to the claim made by the record at `source`, and how
/// the key was settled if it was in doubt.
fn completion(cmd: &Command, answer: &Answer, source: &SourcePos, settled: Option<Settled>) -> Completed {
    let ttl = i64::try_from(cmd.ttl.as_millis()).unwrap_or(i64::MAX);
    Completed {
        fingerprint: cmd.fingerprint,
        outcome: answer.completion,
        result: serde_json::to_vec(&answer.result).unwrap_or_else(|_| b"{}".to_vec()),
        error: answer.error.clone(),
        first_seen_at_ms: answer.first_seen_ms,
        completed_at_ms: answer.completed_at_ms,
        expires_at_ms: answer.completed_at_ms.saturating_add(ttl),
        attempts: answer.attempts,
        source: Some(source.clone()),
        settled,
    }
}

/// What a worker whose partition was let go under it logs for a write the store refused.
const LET_GO: &str = "the partition was let go while this batch was at its sinks (past the drain bound): not stored; its new owner settles the key";

/// Why some of a round's completions were not written; the others were.
enum Unwritten {
    /// An operator removed the key's claim meanwhile (the key).
    Lost(String),
    /// The key's partition was let go meanwhile (`store::ownership`).
    LetGo(StoreError),
}

/// Writes a round's completions; says why some were not, if so.
fn write_completions(
    store: &KeyStore,
    completions: Vec<(DurableClaim, Completed)>,
) -> Result<Option<Unwritten>, StoreError> {
    match store.complete_batch(completions) {
        Ok(_) => Ok(None),
        Err(StoreError::ClaimLost(key)) => Ok(Some(Unwritten::Lost(key))),
        Err(e @ StoreError::NotOwned { .. }) => Ok(Some(Unwritten::LetGo(e))),
        Err(e) => Err(e),
    }
}

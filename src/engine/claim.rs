//! Claim: the round's claims in one write, then one durability point (group commit) that
//! makes them durable, together with the previous round's completions when the round
//! carries them (`batch`); only then does the engine hold [`DurableClaim`]s, and only
//! those can build a sink request. Both on the blocking pool: a write waits while another
//! thread's flush holds the backend's journal (fjall), and must not hold up a runtime
//! thread.

use std::sync::Arc;

use super::queue::Head;
use super::start::ToClaim;
use super::ticket::Ticket;
use super::{Engine, EngineError};
use crate::store::{ClaimRequest, DurableClaim, KeyStore, Record, StoreError};

/// A head whose claim is durable: its sink may run.
pub(super) struct Claimed<'a> {
    /// The head.
    pub(super) head: Head<'a>,
    /// The durable claim.
    pub(super) claim: DurableClaim,
    /// What the claim replaced: put back if the sink never runs.
    pub(super) previous: Option<Record>,
    /// What its first call needs to start, taken before the claim was written; handed to
    /// that call (so `None` once it ran).
    pub(super) ticket: Option<Ticket<'a>>,
}

impl Engine {
    /// Writes and flushes the claims of `to_claim`; with `backend`, the same durability
    /// point flushes the backend too (the previous round's completions are written there).
    /// A claim that lost a race (the key changed since it was read) has its key let go and
    /// its head left at the front of its queue, to be decided again next round. On failure
    /// every key of `to_claim` is let go.
    pub(super) async fn claim<'a>(
        &self,
        to_claim: Vec<(ToClaim<'a>, Ticket<'a>)>,
        backend: bool,
    ) -> Result<Vec<Claimed<'a>>, EngineError> {
        // One pass: a round's claims are hundreds of KiB, each copy of them a cost.
        let n = to_claim.len();
        let (mut heads, mut requests, mut previous, mut tickets) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for (ToClaim { head, request }, ticket) in to_claim {
            previous.push(request.expected.clone());
            heads.push(head);
            requests.push(request);
            tickets.push(ticket);
        }
        let store = Arc::clone(&self.store);
        let handed_over = std::time::Instant::now();
        let written = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            (claim_durably(&store, requests, backend), started.elapsed())
        })
        .await
        .map_err(|e| EngineError::Join(e.to_string()))
        .and_then(|(r, in_store)| {
            // In a drain on a busy machine the wait to be run and resumed can exceed the
            // store's own write and fsync (docs/performance-notes.md, "What a drain's round waits for").
            let waited = handed_over.elapsed().saturating_sub(in_store);
            tracing::trace!(
                store_us = in_store.as_micros() as u64,
                waited_us = waited.as_micros() as u64,
                "claims written and synced"
            );
            r.map_err(EngineError::from)
        });
        // With a changelog, a claim is durable once the changelog committed it.
        let written = match written {
            Ok(o) => self.commit_changelog().await.map(|()| o),
            Err(e) => Err(e),
        };
        let outcomes = match written {
            Ok(o) => o,
            Err(e) => {
                let mut map = self.inflight.lock();
                for head in &heads {
                    map.remove(&head.command.key);
                }
                return Err(e);
            }
        };
        let mut claimed = Vec::with_capacity(outcomes.len());
        for (((outcome, head), previous), ticket) in outcomes.into_iter().zip(heads).zip(previous).zip(tickets) {
            match outcome {
                Some(claim) => claimed.push(Claimed { head, claim, previous, ticket: Some(ticket) }),
                None => {
                    self.inflight.lock().remove(&head.command.key);
                }
            }
        }
        Ok(claimed)
    }
}

/// Writes a round's claims and flushes them (and the backend, with `backend`): per
/// request, the durable claim, or `None` when the key changed since it was read.
fn claim_durably(
    store: &KeyStore,
    requests: Vec<ClaimRequest>,
    backend: bool,
) -> Result<Vec<Option<DurableClaim>>, StoreError> {
    let outcomes = store.claim_batch(requests)?;
    crate::crash::point("claim.appended");
    if backend {
        crate::crash::point("claim.appended_with_completions");
    }
    let won: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
    let pending = outcomes.into_iter().filter_map(Result::ok).collect();
    let mut durable = store.flush_claims_and_backend(pending, backend)?.into_iter();
    crate::crash::point("claim.synced");
    Ok(won.into_iter().map(|w| if w { durable.next() } else { None }).collect())
}

//! A round's store steps, each a single blocking call (the engine runs them on the
//! blocking pool: a write can wait while another thread's flush holds the backend's
//! journal), and the round's timings.

use crate::store::{ClaimRequest, Completed, DurableClaim, KeyStore, StoreError};

/// Milliseconds between successive points of a round.
pub(super) struct RoundMarks {
    last: std::time::Instant,
    pub(super) ms: Vec<u64>,
}

impl RoundMarks {
    pub(super) fn new() -> RoundMarks {
        RoundMarks { last: std::time::Instant::now(), ms: Vec::with_capacity(8) }
    }

    pub(super) fn mark(&mut self) {
        let now = std::time::Instant::now();
        self.ms.push(now.duration_since(self.last).as_millis() as u64);
        self.last = now;
    }
}

/// Writes a round's claims and flushes them: per request, the durable claim, or `None`
/// when the key changed since it was read.
pub(super) fn claim_durably(
    store: &KeyStore,
    requests: Vec<ClaimRequest>,
) -> Result<Vec<Option<DurableClaim>>, StoreError> {
    let outcomes = store.claim_batch(requests)?;
    let won: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
    let mut durable = store.flush_claims(outcomes.into_iter().filter_map(Result::ok).collect())?.into_iter();
    Ok(won.into_iter().map(|w| if w { durable.next() } else { None }).collect())
}

/// Writes a round's completions and, when asked, flushes. Returns the key of a claim an
/// operator removed meanwhile (its completion is not stored).
pub(super) fn complete_durably(
    store: &KeyStore,
    completions: Vec<(DurableClaim, Completed)>,
    flush: bool,
) -> Result<Option<String>, StoreError> {
    let lost = if completions.is_empty() {
        None
    } else {
        match store.complete_batch(completions) {
            Ok(_) => None,
            Err(StoreError::ClaimLost(key)) => Some(key),
            Err(e) => return Err(e),
        }
    };
    if flush {
        store.flush()?;
    }
    Ok(lost)
}

//! What carries over when a fenced run of the pipeline starts again in process (see
//! [`super::run`]), and the wait before it does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::PipelineError;
use crate::ops::Metrics;
use crate::store::KeyStore;

/// What carries over from one run of the pipeline to the next after a fence.
#[derive(Default)]
pub(super) struct Kept {
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) fences: FenceBudget,
}

/// At most this many fenced restarts within [`FENCE_WINDOW`]; one more stops the process.
const MAX_FENCED_RESTARTS: usize = 10;
const FENCE_WINDOW: Duration = Duration::from_secs(600);

/// The fenced restarts made recently. A fence is rare (a pause past the session, another
/// instance finding this one's transaction stalled); fences in a row mean another process
/// takes this store's `transactional.id` each time this one takes it back (a copied
/// store), which only stopping one of them ends.
#[derive(Default)]
pub(super) struct FenceBudget {
    restarts: VecDeque<Instant>,
}

impl FenceBudget {
    /// Whether a fence at `now` may start the pipeline again (and counts it): not when
    /// [`MAX_FENCED_RESTARTS`] were made within [`FENCE_WINDOW`] before it.
    pub(super) fn allows(&mut self, now: Instant) -> bool {
        while self.restarts.front().is_some_and(|&at| now.saturating_duration_since(at) > FENCE_WINDOW) {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= MAX_FENCED_RESTARTS {
            return false;
        }
        self.restarts.push_back(now);
        true
    }
}

/// How one run of the pipeline ended without an error.
pub(super) enum Ended {
    /// Stopped on request.
    Stopped,
    /// Fenced (see [`run`](super::run)): its store, to be let go before the next run opens it.
    Fenced(std::sync::Weak<KeyStore>),
}

/// How long a fenced pipeline's tasks may keep its store before the next run gives up.
const STORE_RELEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause before starting again after a fence, so that a fence repeated at once does
/// not spin.
const FENCED_RESTART_DELAY: Duration = Duration::from_secs(1);

/// Waits until the fenced run's store is let go (its last tasks ended) and a moment more;
/// an error if it is still held after [`STORE_RELEASE_TIMEOUT`].
pub(super) async fn restart_after_fence(
    store: std::sync::Weak<KeyStore>,
    shutdown: &CancellationToken,
) -> Result<(), PipelineError> {
    let deadline = tokio::time::Instant::now() + STORE_RELEASE_TIMEOUT;
    while store.strong_count() > 0 {
        if tokio::time::Instant::now() >= deadline {
            tracing::error!(
                "fenced: the store is still held by a task of the fenced run; stopping (a restart of the process starts again)"
            );
            return Err(PipelineError::Fatal);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!("fenced: starting the pipeline again from the committed offsets");
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = tokio::time::sleep(FENCED_RESTART_DELAY) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_in_a_row_stop_the_restarts_and_old_ones_are_forgotten() {
        let (mut budget, t0) = (FenceBudget::default(), Instant::now());
        for i in 0..MAX_FENCED_RESTARTS {
            assert!(budget.allows(t0 + Duration::from_secs(i as u64)), "restart {i}");
        }
        assert!(!budget.allows(t0 + Duration::from_secs(30)), "one too many within the window");
        let later = t0 + FENCE_WINDOW + Duration::from_millis(500);
        assert!(budget.allows(later), "the first has left the window");
        assert!(!budget.allows(later), "and only it");
    }
}

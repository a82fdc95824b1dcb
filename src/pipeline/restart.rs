//! What carries over when a fenced run of the pipeline starts again in process (see
//! [`super::run`]), and the wait before it does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::PipelineError;
use crate::ops::Metrics;
use crate::store::KeyStore;

/// What carries over from one run of the pipeline to the next after a fence.
#[derive(Default)]
pub(super) struct Kept {
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) http_addr: Option<SocketAddr>,
}

/// How one run of the pipeline ended without an error.
pub(super) enum Ended {
    /// Stopped on request.
    Stopped,
    /// Fenced (see [`run`]): its store, to be let go before the next run opens it.
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

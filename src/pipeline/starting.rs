//! The HTTP listener while the pipeline starts (the store opens, the cluster is checked, a
//! fenced run starts again): `/healthz` alive, `/readyz` not ready, until the pipeline's
//! own server takes the listener.

use tokio_util::sync::CancellationToken;

use super::PipelineError;

/// The server of the HTTP listener while the pipeline starts: alive, not ready. It stops
/// when dropped, also when the run fails before the pipeline serves the listener.
pub(super) struct StartingServer {
    task: tokio::task::JoinHandle<Result<(), crate::ops::OpsError>>,
    stop: tokio_util::sync::DropGuard,
}

impl StartingServer {
    pub(super) fn start(listener: &std::net::TcpListener) -> Result<StartingServer, PipelineError> {
        let stop = CancellationToken::new();
        let serving = crate::ops::serve_starting(listener, stop.clone().cancelled_owned())
            .map_err(|e| PipelineError::Ops(e.to_string()))?;
        Ok(StartingServer { task: tokio::spawn(serving), stop: stop.drop_guard() })
    }

    /// Stops it and waits until it no longer takes connections, for the pipeline's server.
    pub(super) async fn hand_over(self) {
        drop(self.stop);
        let _ = self.task.await;
    }
}

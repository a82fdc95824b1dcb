//! The admin API on a loopback listener for the operator tests (admin_api, cli_admin,
//! cli_resolve_check): what `dedupd run` serves, without a pipeline.

use std::sync::Arc;
use std::time::Duration;

use dedupd::ops::{AdminApi, Health, Metrics, serve_with_admin};
use dedupd::store::KeyStore;
use tokio_util::sync::CancellationToken;

/// An admin API over `store` with `token`: no `/v1/status`, no owner to ask, no sinks.
pub fn api(store: &Arc<KeyStore>, token: &str) -> AdminApi {
    AdminApi {
        store: Arc::clone(store),
        token: token.into(),
        resolve_ttl: Duration::from_secs(3600),
        compaction_chunk: 100,
        status: None,
        owner: None,
        sinks: Default::default(),
    }
}

/// The ops listener serving `admin` (or the API off, for `None`) on 127.0.0.1.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), dedupd::ops::OpsError>>,
}

impl Server {
    /// Starts it on a free port.
    pub async fn start(admin: Option<AdminApi>) -> Server {
        let stop = CancellationToken::new();
        let (addr, fut) = serve_with_admin(
            &dedupd::ops::bind("127.0.0.1:0".parse().expect("an address")).expect("bind"),
            Arc::new(Metrics::new().expect("metrics")),
            Arc::new(Health::default()),
            admin,
            stop.clone().cancelled_owned(),
        )
        .await
        .expect("serve");
        Server { base: format!("http://{addr}"), stop, task: tokio::spawn(fut) }
    }

    /// Stops it; it must end within 10 s.
    pub async fn stop(self) {
        self.stop.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        ended.expect("the server stops within 10 s").expect("the server task").expect("the server ends cleanly");
    }
}

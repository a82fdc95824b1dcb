//! Operating surface: the one HTTP listener (`/metrics`, `/healthz`, `/readyz`, and the
//! admin API under `/v1` when `http.admin_token` is set, `/v1/status` among it) and the
//! metrics catalogue.

pub mod admin;
mod config;
pub mod metrics;
pub mod settle;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use parking_lot::Mutex;

pub use admin::{AdminApi, KeyOwner};
pub use config::HttpConfig;
pub use metrics::Metrics;
pub use status::{PartitionsView, Status, StatusSources};

/// The reason a state partition is down while it is restored (a long restore adds how far
/// it got): `/readyz` names it, and `/v1/status` tells a restore from a failure by it.
pub const RESTORING: &str = "restoring its state from the changelog";

/// What `/readyz` reports: ready once the consumer joined its group, not ready while any
/// partition is refused (store watermark behind the committed offset, or not checked yet
/// because the committed offsets could not be read) or down (its worker panicked), nor
/// once a store write failed (the process is stopping).
#[derive(Default)]
pub struct Health {
    joined: AtomicBool,
    refused: Mutex<BTreeSet<String>>,
    /// Partitions that cannot run now, each with why.
    down: Mutex<BTreeMap<String, String>>,
    /// Why the store failed (a full disk names its path), once it has.
    store_failure: Mutex<Option<String>>,
    /// The consumer loop's last turn, once `dedupd run` watches it (`/healthz`).
    consumer_loop: Mutex<Option<LoopWatch>>,
    /// The running consumer's partitions (`/v1/status`).
    partitions: Mutex<Option<Arc<dyn PartitionsView>>>,
}

/// When the consumer loop last turned, and how long it may go without a turn.
#[derive(Clone, Copy)]
struct LoopWatch {
    last_turn: Instant,
    bound: Duration,
}

impl Health {
    /// The consumer has an assignment (or joined with none).
    pub fn set_joined(&self, joined: bool) {
        self.joined.store(joined, Ordering::SeqCst);
    }
    /// Marks `topic/partition` refused or not.
    pub fn set_refused(&self, partition: &str, refused: bool) {
        let mut set = self.refused.lock();
        if refused {
            set.insert(partition.to_string());
        } else {
            set.remove(partition);
        }
    }
    /// Refused partitions now.
    pub fn refused(&self) -> Vec<String> {
        self.refused.lock().iter().cloned().collect()
    }
    /// Marks `topic/partition` down with `reason`, or (`None`) up again.
    pub fn set_down(&self, partition: &str, reason: Option<&str>) {
        let mut map = self.down.lock();
        match reason {
            Some(r) => {
                map.insert(partition.to_string(), r.to_string());
            }
            None => {
                map.remove(partition);
            }
        }
    }
    /// Partitions down now, each with why.
    pub fn down(&self) -> Vec<(String, String)> {
        self.down.lock().iter().map(|(p, r)| (p.clone(), r.clone())).collect()
    }
    /// A store write failed: not ready from now on (the first failure is the one reported).
    pub fn set_store_failed(&self, why: &str) {
        self.store_failure.lock().get_or_insert_with(|| why.to_string());
    }
    /// Why the store failed, if it has.
    pub fn store_failure(&self) -> Option<String> {
        self.store_failure.lock().clone()
    }
    /// From now on `/healthz` fails once the consumer loop has not turned for `bound`.
    /// `dedupd run` gives the consumer's `max.poll.interval.ms`: the longest the loop may
    /// legitimately stay away (a restore in the rebalance callback ends before it), after
    /// which librdkafka leaves the group anyway.
    pub fn watch_consumer_loop(&self, bound: Duration) {
        *self.consumer_loop.lock() = Some(LoopWatch { last_turn: Instant::now(), bound });
    }
    /// The consumer loop turned (it polls at least every 100 ms when well).
    pub fn consumer_loop_turned(&self) {
        if let Some(watch) = self.consumer_loop.lock().as_mut() {
            watch.last_turn = Instant::now();
        }
    }
    /// Alive at `now`, or why not: the consumer loop has not turned within its bound.
    pub fn liveness_at(&self, now: Instant) -> Result<(), String> {
        let Some(watch) = *self.consumer_loop.lock() else { return Ok(()) };
        let idle = now.saturating_duration_since(watch.last_turn);
        if idle <= watch.bound {
            return Ok(());
        }
        Err(format!(
            "the Kafka consumer loop has not polled for {} s (bound: {} s, the consumer's max.poll.interval.ms)",
            idle.as_secs(),
            watch.bound.as_secs()
        ))
    }
    /// The partitions of the consumer that runs now (a replaced consumer's view goes).
    pub fn show_partitions(&self, view: Arc<dyn PartitionsView>) {
        *self.partitions.lock() = Some(view);
    }
    /// The partitions held now, each with what stops it, if anything.
    pub fn held_partitions(&self) -> Vec<(String, Option<&'static str>)> {
        let view = self.partitions.lock().clone();
        view.map(|v| v.partitions()).unwrap_or_default()
    }
    /// Why it is not ready, or `None` when it is.
    pub fn why_not_ready(&self) -> Option<String> {
        if self.is_ready() {
            return None;
        }
        let (refused, down) = (self.refused(), self.down());
        Some(if let Some(failure) = self.store_failure() {
            format!("store failed, stopping: {failure}")
        } else if !down.is_empty() {
            let each: Vec<String> = down.iter().map(|(p, r)| format!("{p} ({r})")).collect();
            format!("partitions down: {}", each.join(", "))
        } else if refused.is_empty() {
            "consumer has not joined its group".to_string()
        } else {
            format!("partitions refused (store watermark behind committed offset): {}", refused.join(", "))
        })
    }
    /// Ready to do its job.
    pub fn is_ready(&self) -> bool {
        self.joined.load(Ordering::SeqCst)
            && self.refused.lock().is_empty()
            && self.down.lock().is_empty()
            && self.store_failure.lock().is_none()
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// An HTTP listener failure.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Could not bind `http.listen`.
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    /// The server stopped with an error.
    #[error("http server: {0}")]
    Serve(std::io::Error),
}

/// Binds `addr` for the HTTP listener, once for the process: it is served while dedupd
/// starts ([`serve_starting`]), then by the running pipeline ([`serve_with_admin`]), and
/// again across an in-process restart, so a port taken by another process is found before
/// anything else is opened, and `/readyz` answers from the start.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, OpsError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|source| OpsError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| OpsError::Bind { addr, source })?;
    Ok(listener)
}

/// A handle on `listener` for one server, with the address it is bound to.
fn serving(listener: &std::net::TcpListener) -> Result<(SocketAddr, tokio::net::TcpListener), OpsError> {
    let unbound = || SocketAddr::from(([0, 0, 0, 0], 0));
    let addr = listener.local_addr().map_err(|source| OpsError::Bind { addr: unbound(), source })?;
    let handle = listener
        .try_clone()
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|source| OpsError::Bind { addr, source })?;
    Ok((addr, handle))
}

/// Binds `addr`; returns the bound address and a future that serves until `shutdown`.
/// No admin API (see [`serve_with_admin`]).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, Serving), OpsError> {
    serve_with_admin(&bind(addr)?, metrics, health, None, shutdown).await
}

/// A server's future: it serves until its shutdown future resolves.
pub type Serving = futures::future::BoxFuture<'static, Result<(), OpsError>>;

/// Serves `listener` (see [`bind`]), with the admin API under `/v1` when `admin` is set
/// (else `/v1/...` answers 404 saying it is off), until `shutdown`.
pub async fn serve_with_admin(
    listener: &std::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    admin: Option<AdminApi>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, Serving), OpsError> {
    let (bound, listener) = serving(listener)?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics: Arc::clone(&metrics), health })
        .merge(admin::router(admin, metrics));
    let fut = async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(OpsError::Serve) };
    Ok((bound, Box::pin(fut)))
}

/// What `/readyz` says while dedupd starts.
pub const STARTING: &str = "starting: opening the store and connecting to Kafka";

/// Serves `listener` while dedupd starts, until `shutdown`: `/healthz` alive (a long store
/// open is not a wedged process), `/readyz` 503 saying it is starting, anything else 503.
pub fn serve_starting(
    listener: &std::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Serving, OpsError> {
    let (_, listener) = serving(listener)?;
    let app = Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok (starting)\n") }))
        .route("/readyz", get(|| async { (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {STARTING}\n")) }))
        .fallback(|| async { (StatusCode::SERVICE_UNAVAILABLE, format!("{STARTING}\n")) });
    Ok(Box::pin(
        async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(OpsError::Serve) },
    ))
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render())
}

/// Alive unless the consumer loop is wedged: a liveness probe restarts the process then.
async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.liveness_at(Instant::now()) {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not alive: {why}\n")),
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.why_not_ready() {
        None => (StatusCode::OK, "ready\n".to_string()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_store_failure_makes_readyz_503_naming_it() {
        let health = Arc::new(Health::default());
        health.set_joined(true);
        health.set_store_failed("claim journal store: disk full: no space left on device for /data/j");
        health.set_store_failed("a later failure is not the one reported");
        assert!(!health.is_ready());
        let state = AppState { metrics: Arc::new(Metrics::new().expect("metrics")), health };
        let response = readyz(State(state)).await.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.expect("body");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("store failed") && body.contains("no space left on device for /data/j"), "{body}");
    }

    #[test]
    fn healthz_fails_once_the_consumer_loop_has_not_turned_within_its_bound() {
        let health = Health::default();
        let later = Instant::now() + Duration::from_secs(3600);
        assert_eq!(health.liveness_at(later), Ok(()), "alive while nothing is watched (no pipeline yet)");
        health.watch_consumer_loop(Duration::from_secs(300));
        let start = Instant::now();
        assert_eq!(health.liveness_at(start + Duration::from_secs(299)), Ok(()));
        let why = health.liveness_at(start + Duration::from_secs(302)).expect_err("wedged");
        assert!(why.contains("not polled for 30") && why.contains("bound: 300 s"), "{why}");
        health.consumer_loop_turned();
        assert_eq!(health.liveness_at(Instant::now() + Duration::from_secs(299)), Ok(()), "a turn renews it");
    }
}

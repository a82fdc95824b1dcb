//! The HTTP intake (`[intake]`, docs/intake.md): dedupd as the idempotency layer in front
//! of an API. A client posts a command with an `Idempotency-Key`; the intake produces it to
//! an input topic as a native envelope under the key scoped to the client, and answers with
//! the result the pipeline publishes for that very record. So a request gets every rule of
//! the Kafka path (the claim durable before the sink, the decision table, the answer rules
//! of calls in doubt, the store on Kafka with its owners and fences) from the one pipeline,
//! on whichever instance it arrives (docs/decisions.md, "The intake produces into the
//! pipeline").
//!
//! - [`config`]: the `[intake]` section.
//! - `clients`: API keys and rates. `key`: the `Idempotency-Key` header and its scoping.
//! - `run`: a command posted, run through the pipeline whichever door it came by.
//! - `record`: a request as the record produced, checked by the pipeline's own parser.
//! - `results`: the reader of the results topic and the requests waiting on it.
//! - `answer`: a result record as the HTTP answer. `problem`: RFC 9457 problem documents.
//! - `mcp`: the same as an MCP server at `/mcp`, a tool per `[intake.tools.NAME]`.
//! - `handlers`: the routes; `openapi`: `/v1/openapi.json`, their description. `tls`: the listener's certificate and key.

pub mod config;

mod answer;
mod clients;
mod handlers;
mod key;
mod mcp;
mod openapi;
mod problem;
mod record;
mod results;
mod run;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::FutureProducer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::IntakeConfig;
pub use record::Checks;

use crate::ops::{KeyOwner, Metrics};
use crate::store::KeyStore;
use clients::Clients;
use results::Waiters;

/// Why the intake could not start.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("intake.tls: {0}")]
    Tls(String),
    #[error("intake: cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("intake: intake.clients.{0}.api_key: {1}")]
    ApiKey(String, crate::connection::ValueError),
    #[error("intake: {0}")]
    Kafka(String),
    #[error(transparent)]
    Results(#[from] results::ReaderError),
}

/// Binds the intake's listener (once per process: it outlives the pipeline's restarts).
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, IntakeError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|source| IntakeError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| IntakeError::Bind { addr, source })?;
    Ok(listener)
}

/// What a running intake reads from the pipeline it feeds. The pipeline makes its Kafka
/// clients, as it makes every client of its cluster.
pub struct Parts<'a> {
    pub config: &'a IntakeConfig,
    /// The input topic requests are produced to.
    pub topic: String,
    /// Idempotent, `acks=all`, with Kafka's murmur2 partitioner (so that a key lands on its
    /// state partition, as `kafka.copartitioned` requires) and no linger.
    pub producer: FutureProducer,
    /// The results topic and its reader: assigned, never in a group; `read_committed`
    /// under transactional results.
    pub results: (String, BaseConsumer),
    pub checks: Checks,
    /// The running store, for `GET /v1/commands/{key}`.
    pub store: Arc<KeyStore>,
    /// With the store on Kafka: whether this instance holds a key's state.
    pub owner: Option<Arc<dyn KeyOwner>>,
    /// The process's metrics (`intake_requests_total`, `intake_request_duration_seconds`).
    pub metrics: Arc<Metrics>,
}

/// The intake's state, shared by its handlers.
pub(crate) struct Door {
    clients: Clients,
    checks: Checks,
    waiters: Arc<Waiters>,
    producer: FutureProducer,
    topic: String,
    wait: Duration,
    max_body_bytes: usize,
    store: Arc<KeyStore>,
    owner: Option<Arc<dyn KeyOwner>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

/// Serves the intake on `listener` until `stop`; requests still waiting are then answered
/// 202. Returns the address served and the task that ends with it.
pub async fn serve(
    listener: &std::net::TcpListener,
    parts: Parts<'_>,
    stop: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), IntakeError> {
    let clients = Clients::new(&parts.config.clients).map_err(|(name, e)| IntakeError::ApiKey(name, e))?;
    let waiters = Arc::new(Waiters::default());
    let reader = {
        let (results_topic, consumer) = parts.results;
        let (waiters, stop) = (Arc::clone(&waiters), stop.clone());
        tokio::task::spawn_blocking(move || results::start_reader(consumer, &results_topic, waiters, stop))
            .await
            .map_err(|e| IntakeError::Kafka(e.to_string()))??
    };
    let door = Arc::new(Door {
        clients,
        checks: parts.checks,
        waiters,
        producer: parts.producer,
        topic: parts.topic,
        wait: parts.config.wait,
        max_body_bytes: parts.config.max_body_bytes,
        store: parts.store,
        owner: parts.owner,
        metrics: parts.metrics,
        stop: stop.clone(),
    });
    let (tools, allowed_hosts) = (&parts.config.tools, &parts.config.mcp_allowed_hosts);
    let app = Router::new()
        // One path, its segment a type to POST and a key to GET.
        .route("/v1/commands/{segment}", post(handlers::submit).get(handlers::state))
        .route("/v1/openapi.json", get(openapi::describe))
        .merge(
            Router::new()
                .nest_service("/mcp", mcp::service(Arc::clone(&door), tools, allowed_hosts, stop.child_token()))
                .layer(axum::middleware::from_fn_with_state(Arc::clone(&door), mcp::admit)),
        )
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&door), measured))
        .with_state(door);
    let std_listener = listener.try_clone().map_err(|source| bind_error(listener, source))?;
    let addr = std_listener.local_addr().map_err(|source| bind_error(listener, source))?;
    let served = match &parts.config.tls {
        Some(tls) => {
            let config = tls::server_config(&tls.cert_file, &tls.key_file).map_err(IntakeError::Tls)?;
            serve_tls(std_listener, RustlsConfig::from_config(config), app, stop.clone())?
        }
        None => {
            let listener =
                tokio::net::TcpListener::from_std(std_listener).map_err(|source| IntakeError::Bind { addr, source })?;
            let stopped = stop.clone().cancelled_owned();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stopped).await })
        }
    };
    let task = tokio::spawn(async move {
        if let Ok(Err(e)) = served.await {
            tracing::error!(error = %e, "intake: listener failed");
        }
        let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    });
    Ok((addr, task))
}

/// Counts each request the intake answers and times it (`intake_requests_total`,
/// `intake_request_duration_seconds`).
async fn measured(
    axum::extract::State(door): axum::extract::State<Arc<Door>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = std::time::Instant::now();
    let surface = if request.uri().path().starts_with("/mcp") { "mcp" } else { "http" };
    let client = door.clients.name_of(request.headers()).unwrap_or("-").to_string();
    let response = next.run(request).await;
    door.metrics.intake_answered(surface, &client, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

/// Serves `app` over TLS on `listener` until `stop`, then lets requests under way finish
/// (each waits at most `intake.wait`, and is answered 202 once `stop` fires).
fn serve_tls(
    listener: std::net::TcpListener,
    config: RustlsConfig,
    app: Router,
    stop: CancellationToken,
) -> Result<JoinHandle<std::io::Result<()>>, IntakeError> {
    let addr = listener.local_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, config)
        .map_err(|source| IntakeError::Bind { addr, source })?
        .handle(handle.clone());
    tokio::spawn(async move {
        stop.cancelled().await;
        handle.graceful_shutdown(None);
    });
    Ok(tokio::spawn(server.serve(app.into_make_service())))
}

fn bind_error(listener: &std::net::TcpListener, source: std::io::Error) -> IntakeError {
    let addr = listener.local_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    IntakeError::Bind { addr, source }
}

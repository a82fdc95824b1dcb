//! `dedupd run`: wires the store, sinks and engine to Kafka, serves HTTP, purges expired
//! keys, and shuts down in order when `shutdown` resolves or a fatal error fires:
//! stop taking records → drain workers (publish, store offsets) → commit → leave the group.

mod circuits;
mod consumer;
mod metered;
mod publish;
mod purge;
mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::{Clock, Engine, EngineError, EngineParts, SystemClock};
use crate::ops::{Health, Metrics};
use crate::routes::Router;
use crate::sinks::{self, Sink};
use crate::store::{KeyStore, StoreError};

pub use consumer::consumer_config;
pub use publish::{Publisher, producer_config};

/// A failure that stops `dedupd run`.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The store could not be opened or failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Kafka client setup failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A sink could not be built.
    #[error("sink: {0}")]
    Sink(#[from] sinks::SinkBuildError),
    /// The engine could not be built.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// Routes did not compile.
    #[error("routes: {0}")]
    Routes(#[from] crate::routes::RouteError),
    /// Metrics or the HTTP listener failed.
    #[error("{0}")]
    Ops(String),
    /// A worker hit a fatal error (logged); the process stopped after draining.
    #[error("stopped after a fatal error in a worker (see the log)")]
    Fatal,
}

/// Options of `dedupd run` that are not config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Process partitions whose committed offset is beyond the store's watermark.
    pub accept_empty_store: bool,
}

/// A running pipeline's handles, for the demo and tests.
pub struct Running {
    /// Where `/metrics` is served.
    pub http_addr: SocketAddr,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The store.
    pub store: Arc<KeyStore>,
    /// Health for `/readyz`.
    pub health: Arc<Health>,
}

/// Runs until `shutdown` resolves. `on_start` is told where things are once serving.
pub async fn run(
    config: Config,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_start: impl FnOnce(&Running) + Send,
) -> Result<(), PipelineError> {
    let store = Arc::new(KeyStore::open(config.store.backend, &config.store.path, config.store.sync)?);
    let metrics = Arc::new(Metrics::new().map_err(|e| PipelineError::Ops(e.to_string()))?);
    let health = Arc::new(Health::default());
    let router = Arc::new(Router::from_config(&config)?);
    {
        let routes: Vec<&str> = router.routes().iter().map(|r| r.name.as_str()).collect();
        let sinks: Vec<&str> = config.sinks.keys().map(String::as_str).collect();
        metrics.init_known(&routes, &sinks);
    }
    let built: HashMap<String, Arc<Sink>> = sinks::build_all(&config.sinks)?
        .into_iter()
        .map(|(name, sink)| (name, Arc::new(metered::MeteredEffect::wrap(sink, Arc::clone(&metrics)))))
        .collect();
    let sinks_by_name = built.clone();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let engine = Arc::new(Engine::new(EngineParts {
        store: Arc::clone(&store),
        router,
        sinks: built,
        max_in_flight: config.pipeline.max_in_flight.get(),
        retry: config.retry.clone(),
        stale_guard: config.envelope.stale_guard,
        clock: Arc::clone(&clock),
    })?);
    let publisher = Arc::new(Publisher::new(&config.kafka)?);

    let stop = CancellationToken::new();
    let circuit_gauges = circuits::spawn_gauges(&sinks_by_name, &metrics, &stop);
    drop(sinks_by_name);
    let fatal = CancellationToken::new();
    let admin = config.http.admin_token.clone().map(|token| crate::ops::AdminApi {
        store: Arc::clone(&store),
        token,
        resolve_ttl: config.store.default_ttl,
        compaction_chunk: config.store.compaction_chunk.get(),
    });
    let (http_addr, http) =
        crate::ops::serve_with_admin(config.http.listen, Arc::clone(&metrics), Arc::clone(&health), admin, {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        })
        .await
        .map_err(|e| PipelineError::Ops(e.to_string()))?;
    let http_task = tokio::spawn(http);
    let purge_task = tokio::spawn(purge::run(
        Arc::clone(&store),
        Arc::clone(&metrics),
        Arc::clone(&engine),
        clock,
        config.store.compaction_interval,
        config.store.compaction_chunk.get(),
        stop.clone(),
    ));

    let shared = Arc::new(worker::WorkerShared {
        engine: Arc::clone(&engine),
        publisher: Arc::clone(&publisher),
        metrics: Arc::clone(&metrics),
        envelope: config.envelope.clone(),
        limits: config.limits.clone(),
        batch_size: config.pipeline.batch_size.get(),
        batch_linger: config.pipeline.batch_linger,
        fatal: fatal.clone(),
    });
    let consumer_stop = CancellationToken::new();
    let consumer_thread = consumer::spawn(consumer::ConsumerParts {
        kafka: config.kafka.clone(),
        shared,
        health: Arc::clone(&health),
        accept_empty_store: options.accept_empty_store,
        stop: consumer_stop.clone(),
        // Room for the batch at the engine and those behind it: a full queue pauses the
        // partition, and a paused partition's prefetched records are fetched again.
        queue_per_partition: config.pipeline.batch_size.get() * 4,
    })?;
    on_start(&Running { http_addr, metrics: Arc::clone(&metrics), store: Arc::clone(&store), health });
    tracing::info!(%http_addr, backend = store.backend_name(), "dedupd running");

    tokio::select! {
        () = shutdown => tracing::info!("shutdown requested: draining"),
        () = fatal.cancelled() => tracing::error!("fatal error: draining and stopping"),
    }
    consumer_stop.cancel();
    // The consumer thread blocks on the runtime while draining: wait for it off the runtime.
    let _ = tokio::task::spawn_blocking(move || consumer_thread.join()).await;
    if let Err(e) = publisher.flush(std::time::Duration::from_secs(10)) {
        tracing::warn!(error = %e, "producer flush at shutdown");
    }
    stop.cancel();
    let _ = purge_task.await;
    let _ = http_task.await;
    for gauge in circuit_gauges {
        let _ = gauge.await;
    }
    store.flush_always()?;
    if fatal.is_cancelled() {
        return Err(PipelineError::Fatal);
    }
    tracing::info!("dedupd stopped cleanly");
    Ok(())
}

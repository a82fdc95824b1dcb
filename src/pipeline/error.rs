//! Why `dedupd run` stops.

use crate::engine::EngineError;
use crate::sinks;
use crate::store::StoreError;

/// A failure that stops `dedupd run`.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The store could not be opened or failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Kafka client setup failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A `[kafka.connection]` value could not be read.
    #[error("{0}")]
    Connection(#[from] crate::connection::ConnectionError),
    /// The cluster did not answer in time or refused the client.
    #[error("kafka: {0}")]
    Connect(#[from] crate::connection::probe::ConnectError),
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
    /// The intake could not start.
    #[error("{0}")]
    Intake(#[from] crate::intake::IntakeError),
    /// Transactional publishing could not start.
    #[error("kafka: {0}")]
    Transactions(String),
    /// The changelog topic could not be found, made or used (`store.changelog`).
    #[error("changelog: {0}")]
    Changelog(String),
    /// A worker hit a fatal error (logged); the process stopped after draining.
    #[error("stopped after a fatal error in a worker (see the log)")]
    Fatal,
}

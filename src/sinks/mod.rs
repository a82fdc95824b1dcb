//! Sinks (SPEC §6): where a command's side effect happens. A sink is a named instance of a
//! kind; each kind lives in one file, has a config type (pure data) separate from its
//! runtime, and declares whether it forwards the key downstream (which decides what
//! happens to a claim orphaned by a crash, SPEC §4).

pub mod http;
pub mod log;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::DurableClaim;

/// Config of one sink instance: `kind = "..."` plus the kind's own keys.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SinkConfig {
    /// JSON POST to a URL with an `Idempotency-Key` header.
    Http(http::HttpSinkConfig),
    /// Writes the command to the log; for trials and tests.
    Log(log::LogSinkConfig),
}

impl SinkConfig {
    /// Checks the kind's values; on error returns (key, value, reason).
    pub fn validate(&self, at: &str) -> Result<(), (String, String, String)> {
        match self {
            SinkConfig::Http(c) => c.validate(at),
            SinkConfig::Log(_) => Ok(()),
        }
    }

    /// Whether this instance passes the key downstream so that a re-run is safe.
    pub fn forwards_key(&self) -> bool {
        match self {
            SinkConfig::Http(c) => c.forward_key,
            SinkConfig::Log(_) => true,
        }
    }

    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Http(_) => "http",
            SinkConfig::Log(_) => "log",
        }
    }
}

/// What a sink gets: built only from a [`DurableClaim`], so no sink can run before its
/// claim reached the disk.
#[derive(Debug, Clone, Copy)]
pub struct SinkRequest<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The command type.
    pub kind: &'a str,
    /// The payload.
    pub payload: &'a Value,
    /// 1 for the first run of this claim; higher for retries and crash re-runs.
    pub attempt: u32,
    /// W3C trace context of the input, if any.
    pub traceparent: Option<&'a str>,
}

impl<'a> SinkRequest<'a> {
    /// A request for a durable claim.
    pub fn new(
        claim: &'a DurableClaim,
        kind: &'a str,
        payload: &'a Value,
        attempt: u32,
        traceparent: Option<&'a str>,
    ) -> SinkRequest<'a> {
        SinkRequest { key: claim.key(), kind, payload, attempt, traceparent }
    }
}

/// A sink failure, classified.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// Worth retrying with the same key: timeouts, connection errors, HTTP 5xx/429/408.
    #[error("transient: {message}")]
    Transient {
        /// What happened.
        message: String,
        /// A server-suggested wait (Retry-After), if any.
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help: HTTP 4xx, a rejected address. Completes as `failed`.
    #[error("permanent: {message}")]
    Permanent {
        /// What happened.
        message: String,
        /// What the downstream answered, stored as the result.
        result: Value,
    },
}

/// A sink's successful answer: stored as the result and replayed to repeats.
pub type SinkOutput = Value;

/// One sink instance at run time.
#[async_trait::async_trait]
pub trait Sink: Send + Sync {
    /// The instance name (from config).
    fn name(&self) -> &str;
    /// Whether a re-run after a crash is safe because the key goes downstream.
    fn forwards_key(&self) -> bool;
    /// Performs the effect once.
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError>;
}

/// A sink that could not be built from its config.
#[derive(Debug, thiserror::Error)]
#[error("sink {name}: {reason}")]
pub struct SinkBuildError {
    /// The instance name.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// Builds every configured sink instance, by name.
pub fn build_all(
    configs: &std::collections::BTreeMap<String, SinkConfig>,
) -> Result<std::collections::HashMap<String, std::sync::Arc<dyn Sink>>, SinkBuildError> {
    let mut out: std::collections::HashMap<String, std::sync::Arc<dyn Sink>> = std::collections::HashMap::new();
    for (name, config) in configs {
        let sink: std::sync::Arc<dyn Sink> = match config {
            SinkConfig::Http(c) => std::sync::Arc::new(
                http::HttpSink::new(name, c).map_err(|e| SinkBuildError { name: name.clone(), reason: e.to_string() })?,
            ),
            SinkConfig::Log(c) => std::sync::Arc::new(log::LogSink::new(name, c)),
        };
        out.insert(name.clone(), sink);
    }
    Ok(out)
}

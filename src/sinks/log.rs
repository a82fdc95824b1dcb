//! The `log` sink: writes the command to the log and succeeds. For trials and tests.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::limit::SinkLimits;
use super::{Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput, SinkRequest};

/// Config of a `log` sink.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSinkConfig {
    /// Rate and concurrency limits (useful to try a limit out before pointing it at a provider).
    #[serde(default)]
    pub limits: SinkLimits,
    /// The circuit breaker (`[sinks.NAME.circuit]`, see docs/sinks.md).
    #[serde(default)]
    pub circuit: crate::sinks::circuit::CircuitConfig,
}

impl SinkKind for LogSinkConfig {
    fn validate(&self, _problems: &mut Problems) {
        // Nothing of its own: its limits and circuit are checked as every kind's are.
    }

    fn forwards_key(&self) -> bool {
        // Logging twice is harmless: a re-run is safe.
        true
    }

    fn call_holds_a_resource(&self) -> bool {
        false
    }

    fn limits(&self) -> &SinkLimits {
        &self.limits
    }

    fn circuit(&self) -> &crate::sinks::circuit::CircuitConfig {
        &self.circuit
    }

    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        Ok(Arc::new(LogSink::new(name, self)))
    }
}

/// A `log` sink at run time.
pub struct LogSink {
    name: String,
}

impl LogSink {
    /// Builds the sink.
    pub fn new(name: &str, _config: &LogSinkConfig) -> LogSink {
        LogSink { name: name.to_string() }
    }
}

#[async_trait::async_trait]
impl SinkEffect for LogSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        tracing::info!(sink = %self.name, key = request.key(), kind = request.kind(), attempt = request.attempt(), "log sink");
        Ok(serde_json::json!({}))
    }
}

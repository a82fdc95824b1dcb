//! The `log` sink: writes the command to the log and succeeds. For trials and tests.

use serde::{Deserialize, Serialize};

use super::{Sink, SinkError, SinkOutput, SinkRequest};

/// Config of a `log` sink.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSinkConfig {}

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
impl Sink for LogSink {
    fn name(&self) -> &str {
        &self.name
    }
    fn forwards_key(&self) -> bool {
        // Logging twice is harmless: a re-run is safe.
        true
    }
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        tracing::info!(sink = %self.name, key = request.key, kind = request.kind, attempt = request.attempt, "log sink");
        Ok(serde_json::json!({}))
    }
}

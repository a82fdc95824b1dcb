//! The `file` sink: appends one JSON line per command to a file.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::circuit::CircuitConfig;
use super::limit::SinkLimits;
use super::{Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput, SinkRequest};

/// Config of a `file` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileSinkConfig {
    /// The file lines are appended to (created if missing).
    pub path: PathBuf,
    /// Rate and concurrency limits, as every kind has (`[sinks.NAME.limits]`).
    #[serde(default)]
    pub limits: SinkLimits,
    /// The circuit breaker, as every kind has (`[sinks.NAME.circuit]`).
    #[serde(default)]
    pub circuit: CircuitConfig,
}

impl SinkKind for FileSinkConfig {
    fn validate(&self, problems: &mut Problems) {
        if self.path.as_os_str().is_empty() {
            problems.add("path", "", "must name a file");
        }
    }

    fn forwards_key(&self) -> bool {
        // Every line carries the key, so a reader can drop repeats: re-running is safe.
        true
    }

    fn call_holds_a_resource(&self) -> bool {
        // One file shared by every call.
        false
    }

    fn limits(&self) -> &SinkLimits {
        &self.limits
    }

    fn circuit(&self) -> &CircuitConfig {
        &self.circuit
    }

    fn build(&self, _name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        Ok(Arc::new(FileSink { path: self.path.clone() }))
    }
}

/// A `file` sink at run time: only the effect; the instance's name, key forwarding, limits
/// and breaker come from the config above.
pub struct FileSink {
    path: PathBuf,
}

#[async_trait::async_trait]
impl SinkEffect for FileSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let line = json!({ "key": request.key(), "type": request.kind(), "payload": request.payload() });
        // One write per line: concurrent calls append whole lines, never interleaved pieces.
        let line = format!("{line}\n");
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
            file.write_all(line.as_bytes())
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(json!({ "path": self.path })),
            // A full disk or a missing directory may be fixed by the time of the next try.
            Ok(Err(e)) => Err(SinkError::Transient { message: format!("append failed: {e}"), retry_after: None }),
            Err(e) => Err(SinkError::Transient { message: format!("append task failed: {e}"), retry_after: None }),
        }
    }
}

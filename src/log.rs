//! Logging: the `[log]` section and the tracing subscriber it sets up.

use serde::{Deserialize, Serialize};

/// Log output format.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `dedupd=debug,rdkafka=warn`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, level: "info".into() }
    }
}

/// Sets up the global tracing subscriber on stderr. The filter is, first found:
/// `DEDUPD_LOG`, then `RUST_LOG`, then `level` (the `log.level` key). A filter from the
/// environment that does not parse is reported on stderr and `level` is used instead, so a
/// typo in a variable never silences the log.
pub fn init(format: LogFormat, level: &str) {
    let from_env = ["DEDUPD_LOG", "RUST_LOG"]
        .into_iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()).map(|v| (var, v)));
    let filter = match from_env {
        Some((var, text)) => match tracing_subscriber::EnvFilter::try_new(&text) {
            Ok(filter) => filter,
            Err(e) => {
                eprintln!("dedupd: {var}={text:?} is not a tracing filter ({e}); using log.level {level:?}");
                tracing_subscriber::EnvFilter::new(level)
            }
        },
        None => tracing_subscriber::EnvFilter::new(level),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // try_init: a second call (tests that start several pipelines) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

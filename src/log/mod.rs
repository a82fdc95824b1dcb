//! Logging: the `[log]` section and the tracing subscriber it sets up.
//!
//! - `trace_ids`: JSON lines carry the `trace_id` and `span_id` of the command they are
//!   about (with traces on, see [`crate::telemetry`]).

mod trace_ids;

use serde::{Deserialize, Serialize};

use crate::problems::Problems;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

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

impl LogConfig {
    /// `[log]`'s values, keys under `problems`' `log`.
    pub fn validate(&self, problems: &mut Problems) {
        if let Err(e) = self.level.parse::<tracing_subscriber::EnvFilter>() {
            problems.add("level", &self.level, format!("is not a tracing filter: {e}"));
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, level: "info".into() }
    }
}

/// Sets up the global tracing subscriber on stderr, with the filter [`filter_text`] picks
/// from `DEDUPD_LOG`, `RUST_LOG` and `level` (the `log.level` key).
pub fn init(format: LogFormat, level: &str) {
    let env = |var: &str| std::env::var(var).ok();
    let (text, refused) = filter_text(env("DEDUPD_LOG"), env("RUST_LOG"), level);
    if let Some(why) = refused {
        eprintln!("dedupd: {why}; using log.level {level:?}");
    }
    let filter =
        tracing_subscriber::EnvFilter::try_new(&text).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let registry = tracing_subscriber::registry().with(filter);
    // try_init: a second call (tests that start several pipelines) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => {
            let lines = tracing_subscriber::fmt::layer()
                .json()
                .event_format(trace_ids::JsonWithTraceIds(tracing_subscriber::fmt::format().json()))
                .with_writer(std::io::stderr);
            registry.with(trace_ids::TraceIdLayer).with(lines).try_init()
        }
        LogFormat::Text => {
            let lines = tracing_subscriber::fmt::layer().with_ansi(colours_on_stderr()).with_writer(std::io::stderr);
            registry.with(lines).try_init()
        }
    };
}

/// Whether text lines carry colours: only for a terminal, and not when `NO_COLOR` is set
/// (no-color.org). A file, a pipe or a container runtime's log gets plain text, not escape
/// codes, and a span's fields are not wrapped in them for every command.
fn colours_on_stderr() -> bool {
    use std::io::IsTerminal;
    colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref())
}

/// [`colours_on_stderr`] for a stream that is (or is not) a terminal and a `NO_COLOR` value.
fn colours(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The log filter: the first of `DEDUPD_LOG` and `RUST_LOG` that is set and not blank, else
/// `level`. A variable's filter that does not parse falls back to `level` and says why, so a
/// typo in a variable never silences the log.
pub fn filter_text(dedupd_log: Option<String>, rust_log: Option<String>, level: &str) -> (String, Option<String>) {
    let chosen = [("DEDUPD_LOG", dedupd_log), ("RUST_LOG", rust_log)]
        .into_iter()
        .find_map(|(var, value)| value.filter(|v| !v.trim().is_empty()).map(|v| (var, v)));
    match chosen {
        Some((var, text)) => match tracing_subscriber::EnvFilter::try_new(&text) {
            Ok(_) => (text, None),
            Err(e) => (level.to_string(), Some(format!("{var}={text:?} is not a tracing filter ({e})"))),
        },
        None => (level.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::{colours, filter_text};

    #[test]
    fn text_is_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colours(true, None));
        assert!(colours(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count (no-color.org)");
        assert!(!colours(true, Some(OsStr::new("1"))));
        assert!(!colours(false, None), "a file or a pipe gets plain text");
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn dedupd_log_wins_then_rust_log_then_the_level() {
        assert_eq!(filter_text(some("dedupd=debug"), some("warn"), "info").0, "dedupd=debug");
        assert_eq!(filter_text(None, some("warn"), "info").0, "warn");
        assert_eq!(filter_text(some("  "), None, "info").0, "info");
        assert_eq!(filter_text(None, None, "error").0, "error");
    }

    #[test]
    fn a_bad_filter_in_a_variable_falls_back_and_says_which() {
        let (text, why) = filter_text(some("dedupd=[[["), None, "info");
        assert_eq!(text, "info");
        assert!(why.is_some_and(|w| w.contains("DEDUPD_LOG")));
    }
}

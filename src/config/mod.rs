//! Configuration: one TOML file, every key overridable by `DEDUPD_SECTION__KEY`
//! environment variables, validated before anything starts (docs/contract.md §7).
//!
//! Each section's type lives with the module that reads it (`[store]` in `store::config`,
//! `[kafka]` in `pipeline::config`, ...); this module composes them, loads the file and the
//! environment, and [`Config::validate`] checks what serde cannot (references between
//! sections, ranges, patterns), naming the key.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::engine::RetryConfig;
use crate::envelope::{EnvelopeConfig, LimitsConfig};
use crate::intake::IntakeConfig;
use crate::log::LogConfig;
use crate::ops::HttpConfig;
use crate::pipeline::config::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT_UNBOUNDED_SINKS, KafkaConfig, PipelineConfig,
};
use crate::routes::RouteConfig;
use crate::sinks::SinkConfig;
use crate::store::StoreConfig;
use crate::telemetry::TelemetryConfig;

mod env;
mod lines;
mod load;

pub use lines::line_of;

/// A configuration that could not be loaded or is invalid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Not TOML at all: toml's message, and the line where it went wrong.
    #[error("config is not valid TOML{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Parse { line: Option<usize>, message: String },
    /// TOML, but a key the config does not have or a value of the wrong type or form.
    #[error("config key `{key}`: {reason}")]
    Value { key: String, line: Option<usize>, reason: String },
    #[error("environment variable {var}: {reason}")]
    Env { var: String, reason: String },
    #[error("config key `{key}` = {value}: {reason}")]
    Invalid { key: String, value: String, reason: String },
}

impl Config {
    /// The router of this config's routes, with the TTL defaults of `[store]`.
    pub fn router(&self) -> Result<crate::routes::Router, crate::routes::RouteError> {
        crate::routes::Router::new(&self.routes, self.store.default_ttl, self.store.max_ttl)
    }

    /// `pipeline.max_in_flight`, or when unset [`DEFAULT_MAX_IN_FLIGHT`], except with the
    /// embedded store while [`Config::sinks_holding_the_default_down`] names a sink: then
    /// [`DEFAULT_MAX_IN_FLIGHT_UNBOUNDED_SINKS`].
    pub fn max_in_flight(&self) -> NonZeroUsize {
        let default = if self.sinks_holding_the_default_down().is_empty() {
            DEFAULT_MAX_IN_FLIGHT
        } else {
            DEFAULT_MAX_IN_FLIGHT_UNBOUNDED_SINKS
        };
        self.pipeline.max_in_flight.unwrap_or(NonZeroUsize::new(default).unwrap_or(NonZeroUsize::MIN))
    }

    /// With the embedded store and `max_in_flight` unset, the sinks that keep its default at
    /// [`DEFAULT_MAX_IN_FLIGHT_UNBOUNDED_SINKS`] (see [`Config::sinks_without_own_bound`]).
    /// Empty otherwise.
    pub fn sinks_holding_the_default_down(&self) -> Vec<&str> {
        if self.store.changelog || self.pipeline.max_in_flight.is_some() {
            return Vec::new();
        }
        self.sinks_without_own_bound()
    }

    /// With the store on Kafka and `max_in_flight` unset, the sinks its default of
    /// [`DEFAULT_MAX_IN_FLIGHT`] leaves with nothing of their own to bound their calls at
    /// once (see [`Config::sinks_without_own_bound`]); `run` warns of each. Empty otherwise.
    pub fn sinks_unbounded_by_default(&self) -> Vec<&str> {
        if !self.store.changelog || self.pipeline.max_in_flight.is_some() {
            return Vec::new();
        }
        self.sinks_without_own_bound()
    }

    /// The sinks whose every call holds a connection or a process
    /// (`SinkKind::call_holds_a_resource`) without `limits.max_concurrency`. They are also
    /// the only kinds that may be set not to forward the key, whose claims a crash leaves
    /// `indeterminate`.
    fn sinks_without_own_bound(&self) -> Vec<&str> {
        self.sinks
            .iter()
            .filter(|(_, sink)| {
                let kind = sink.as_kind();
                kind.call_holds_a_resource() && kind.limits().max_concurrency.is_none()
            })
            .map(|(name, _)| name.as_str())
            .collect()
    }
}

impl From<crate::problems::Problem> for ConfigError {
    fn from(p: crate::problems::Problem) -> ConfigError {
        ConfigError::Invalid { key: p.key, value: p.value, reason: p.reason }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Kafka connection, topics and librdkafka pass-through settings.
    pub kafka: KafkaConfig,
    /// How commands are recognised in Kafka records.
    pub envelope: EnvelopeConfig,
    /// Size limits on input.
    pub limits: LimitsConfig,
    /// The embedded key store.
    pub store: StoreConfig,
    /// Concurrency and batching of the pipeline.
    pub pipeline: PipelineConfig,
    /// Retries of transient sink failures.
    pub retry: RetryConfig,
    /// Named sink instances, keyed by name.
    pub sinks: BTreeMap<String, SinkConfig>,
    /// Routes from command types to sinks, first match wins.
    pub routes: Vec<RouteConfig>,
    /// The HTTP listener for metrics, health and the admin API.
    pub http: HttpConfig,
    /// Logging.
    pub log: LogConfig,
    /// OpenTelemetry traces.
    pub telemetry: TelemetryConfig,
    /// The HTTP intake; off unless the section is present.
    pub intake: Option<IntakeConfig>,
    /// The keys `DEDUPD_*` variables set, as errors spell them, with their variables: a
    /// problem with one of them names the variable, not the file.
    #[serde(skip)]
    pub(crate) set_by_env: Vec<(String, String)>,
}

#[cfg(test)]
mod tests;

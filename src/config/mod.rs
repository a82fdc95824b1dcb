//! Configuration: one TOML file, every key overridable by `DEDUPD_SECTION__KEY`
//! environment variables, validated before anything starts (docs/contract.md §7).
//!
//! The types here are pure data with `deny_unknown_fields`; [`Config::validate`] checks
//! what serde cannot (references between sections, ranges, patterns) and names the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::envelope::KeySource;
use crate::sinks::SinkConfig;

mod load;

/// A configuration that could not be loaded or is invalid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config is not valid TOML or has a bad value: {0}")]
    Parse(String),
    #[error("environment variable {var}: {reason}")]
    Env { var: String, reason: String },
    #[error("config key `{key}` = {value}: {reason}")]
    Invalid { key: String, value: String, reason: String },
}

fn invalid(key: &str, value: impl std::fmt::Display, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), value: value.to_string(), reason: reason.into() }
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
}

/// Kafka settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list of brokers.
    pub bootstrap_servers: String,
    /// Consumer group id.
    pub group_id: String,
    /// Topics holding commands.
    pub input_topics: Vec<String>,
    /// Topic receiving one result record per input record.
    pub results_topic: String,
    /// Topic receiving invalid and stale input, unchanged, with reason headers.
    pub dead_letter_topic: String,
    /// Publish results and commit offsets in one Kafka transaction.
    pub transactional_results: bool,
    /// Extra librdkafka consumer properties, passed through verbatim.
    pub consumer: BTreeMap<String, String>,
    /// Extra librdkafka producer properties, passed through verbatim.
    pub producer: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: "127.0.0.1:9092".into(),
            group_id: "dedupd".into(),
            input_topics: vec!["commands".into()],
            results_topic: "dedupd.results".into(),
            dead_letter_topic: "dedupd.dead-letter".into(),
            transactional_results: false,
            consumer: BTreeMap::new(),
            producer: BTreeMap::new(),
        }
    }
}

/// Which envelope shapes are accepted.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeFormat {
    /// Detect native, tool call or CloudEvents per record.
    #[default]
    Auto,
    /// `{"id", "type", "payload"}` only.
    Native,
    /// `{"tool", "arguments"}` only.
    ToolCall,
    /// CloudEvents 1.0, structured or binary.
    Cloudevents,
}

/// Which timestamp decides whether a command is stale.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StaleBy {
    /// The Kafka record timestamp.
    #[default]
    KafkaTimestamp,
    /// The envelope's `created_at`, falling back to the Kafka timestamp when absent.
    CreatedAt,
}

/// Envelope settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvelopeConfig {
    /// `auto`, `native`, `tool_call` or `cloudevents`.
    pub format: EnvelopeFormat,
    /// Where the idempotency key comes from: `auto`, `header:NAME`, `json:/pointer`, `record-key`.
    pub key: KeySource,
    /// Refuse to execute commands produced longer ago than their TTL.
    pub stale_guard: bool,
    /// `kafka_timestamp` or `created_at`.
    pub stale_by: StaleBy,
}

impl Default for EnvelopeConfig {
    fn default() -> Self {
        Self {
            format: EnvelopeFormat::Auto,
            key: KeySource::Auto,
            stale_guard: true,
            stale_by: StaleBy::KafkaTimestamp,
        }
    }
}

/// Input limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest accepted record value in bytes; larger ones are dead-lettered as `too_large`.
    pub max_command_bytes: NonZeroUsize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self { max_command_bytes: NonZeroUsize::new(1024 * 1024).unwrap_or(NonZeroUsize::MIN) }
    }
}

/// Store backend.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    /// sled 0.34: unmaintained; a SIGKILL test left a sled store that would not open
    /// again (docs/decisions.md). Kept for existing stores.
    Sled,
    /// fjall 3 (LSM tree), the default: passes every crash test.
    #[default]
    Fjall,
}

/// When the store's writes reach the disk.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// One fsync covers the claims (and then the completions) of a batch. Safe.
    #[default]
    Batch,
    /// Leave it to the OS. UNSAFE: a power loss can forget claims whose sink already ran.
    None,
}

/// Store settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sled` or `fjall`.
    pub backend: StoreBackend,
    /// Directory of the store.
    pub path: PathBuf,
    /// `batch` (default) or `none` (unsafe).
    pub sync: SyncMode,
    /// TTL of a completed record when neither command nor route sets one.
    #[serde(with = "duration_str")]
    pub default_ttl: Duration,
    /// Upper bound on any TTL.
    #[serde(with = "duration_str")]
    pub max_ttl: Duration,
    /// How often expired records are removed.
    #[serde(with = "duration_str")]
    pub compaction_interval: Duration,
    /// Most records removed per compaction chunk (one write batch).
    pub compaction_chunk: NonZeroUsize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::default(),
            path: PathBuf::from("./dedupd-data"),
            sync: SyncMode::Batch,
            default_ttl: Duration::from_secs(24 * 3600),
            max_ttl: Duration::from_secs(7 * 24 * 3600),
            compaction_interval: Duration::from_secs(60),
            compaction_chunk: NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// Pipeline settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Most commands executing at once across all partitions.
    pub max_in_flight: NonZeroUsize,
    /// Most records taken into one batch (one claim flush, one completion flush).
    pub batch_size: NonZeroUsize,
    /// How long a batch waits for more records once it has one. 0 (default): take what is
    /// queued and go; batches still grow under load, and idle latency stays low.
    #[serde(with = "duration_str")]
    pub batch_linger: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            max_in_flight: NonZeroUsize::new(256).unwrap_or(NonZeroUsize::MIN),
            batch_size: NonZeroUsize::new(500).unwrap_or(NonZeroUsize::MIN),
            batch_linger: Duration::ZERO,
        }
    }
}

/// Retry settings for transient sink failures.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: NonZeroU32,
    /// Backoff before the second attempt; doubles each time, with jitter.
    #[serde(with = "duration_str")]
    pub initial_backoff: Duration,
    /// Upper bound on one backoff.
    #[serde(with = "duration_str")]
    pub max_backoff: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// One route: command types to a sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Name used in metrics and result records; defaults to the sink's name.
    #[serde(default)]
    pub name: Option<String>,
    /// Exact types or globs (`email.*`, `*` for a default route).
    pub types: Vec<String>,
    /// Name of a sink in `[sinks]`.
    pub sink: String,
    /// TTL of this route's completed records (capped by `store.max_ttl`).
    #[serde(default, with = "opt_duration_str")]
    pub ttl: Option<Duration>,
    /// JSON pointers (into `{"type", "payload"}`) left out of the fingerprint.
    #[serde(default)]
    pub fingerprint_exclude: Vec<String>,
}

/// HTTP listener settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of the one listener (`/metrics`, `/healthz`, `/readyz`, `/v1/keys`).
    pub listen: SocketAddr,
    /// Bearer token for the admin API under `/v1` (docs/admin.md); the admin API is off
    /// (404) when unset.
    pub admin_token: Option<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { listen: SocketAddr::from(([127, 0, 0, 1], 9464)), admin_token: None }
    }
}

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

/// Durations written as humantime strings ("24h", "500ms", "7d").
pub mod duration_str {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map_err(|e| serde::de::Error::custom(format!("`{text}` is not a duration like \"24h\" or \"500ms\": {e}")))
    }
}

/// Optional durations written as humantime strings.
pub mod opt_duration_str {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_str::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::duration_str::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests;

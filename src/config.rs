//! Configuration: one TOML file, every key overridable by `DEDUPD_SECTION__KEY`
//! environment variables, validated before anything starts (SPEC §7).
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
    /// sled 0.34.
    #[default]
    Sled,
    /// fjall 3 (LSM tree).
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

impl Config {
    /// Reads `path`, applies `DEDUPD_*` overrides from `env`, and validates.
    pub fn load(
        path: &std::path::Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::from_toml_str(&text, env)
    }

    /// Parses TOML text, applies `DEDUPD_*` overrides from `env`, and validates.
    pub fn from_toml_str(text: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        for (var, value) in env {
            apply_env_override(&mut table, &var, &value)?;
        }
        let config: Config =
            toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: references, ranges and patterns. Names the key on error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let k = &self.kafka;
        if k.bootstrap_servers.trim().is_empty() {
            return Err(invalid("kafka.bootstrap_servers", "\"\"", "must list at least one host:port"));
        }
        if k.group_id.trim().is_empty() {
            return Err(invalid("kafka.group_id", "\"\"", "must not be empty"));
        }
        if k.input_topics.is_empty() || k.input_topics.iter().any(|t| t.trim().is_empty()) {
            return Err(invalid(
                "kafka.input_topics",
                format!("{:?}", k.input_topics),
                "must list non-empty topic names",
            ));
        }
        for (key, topic) in
            [("kafka.results_topic", &k.results_topic), ("kafka.dead_letter_topic", &k.dead_letter_topic)]
        {
            if topic.trim().is_empty() {
                return Err(invalid(key, "\"\"", "must not be empty"));
            }
            if k.input_topics.contains(topic) {
                return Err(invalid(
                    key,
                    topic,
                    "must not be one of kafka.input_topics (results would be consumed as commands)",
                ));
            }
        }
        for forbidden in ["enable.auto.offset.store", "group.id", "bootstrap.servers"] {
            if k.consumer.contains_key(forbidden) {
                return Err(invalid(
                    &format!("kafka.consumer.\"{forbidden}\""),
                    &k.consumer[forbidden],
                    "is set by dedupd itself; use the dedicated key",
                ));
            }
        }
        let s = &self.store;
        if s.default_ttl.is_zero() {
            return Err(invalid("store.default_ttl", "0s", "must be positive"));
        }
        if s.max_ttl < s.default_ttl {
            return Err(invalid(
                "store.max_ttl",
                humantime::format_duration(s.max_ttl),
                "must be at least store.default_ttl",
            ));
        }
        if s.compaction_interval.is_zero() {
            return Err(invalid("store.compaction_interval", "0s", "must be positive"));
        }
        if self.retry.max_backoff < self.retry.initial_backoff {
            return Err(invalid(
                "retry.max_backoff",
                humantime::format_duration(self.retry.max_backoff),
                "must be at least retry.initial_backoff",
            ));
        }
        for (name, sink) in &self.sinks {
            sink.validate(&format!("sinks.{name}")).map_err(|(key, value, reason)| invalid(&key, value, reason))?;
        }
        for (i, route) in self.routes.iter().enumerate() {
            let at = format!("routes[{i}]");
            if !self.sinks.contains_key(&route.sink) {
                return Err(invalid(&format!("{at}.sink"), &route.sink, "names no sink in [sinks]"));
            }
            if route.types.is_empty() {
                return Err(invalid(&format!("{at}.types"), "[]", "must list at least one type or glob"));
            }
            for t in &route.types {
                if let Err(e) = globset::Glob::new(t) {
                    return Err(invalid(&format!("{at}.types"), t, format!("is not a valid glob: {e}")));
                }
            }
            if let Some(ttl) = route.ttl
                && ttl.is_zero()
            {
                return Err(invalid(&format!("{at}.ttl"), "0s", "must be positive"));
            }
            for p in &route.fingerprint_exclude {
                if !(p.is_empty() || p.starts_with('/')) {
                    return Err(invalid(
                        &format!("{at}.fingerprint_exclude"),
                        p,
                        "must be a JSON pointer starting with '/'",
                    ));
                }
            }
        }
        if let Some(token) = &self.http.admin_token
            && token.len() < 16
        {
            return Err(invalid("http.admin_token", "(hidden)", "must be at least 16 characters"));
        }
        if let Err(e) = self.log.level.parse::<tracing_subscriber::EnvFilter>() {
            return Err(invalid("log.level", &self.log.level, format!("is not a tracing filter: {e}")));
        }
        Ok(())
    }
}

/// Applies one `DEDUPD_A__B__C=value` override to the TOML table. Other variables are ignored.
/// The value is read as a TOML value when it parses as one (numbers, booleans, arrays),
/// else as a string.
fn apply_env_override(table: &mut toml::Table, var: &str, value: &str) -> Result<(), ConfigError> {
    let Some(rest) = var.strip_prefix("DEDUPD_") else { return Ok(()) };
    // Variables the CLI reads itself, not config keys.
    if matches!(rest, "CONFIG" | "ADMIN_TOKEN" | "ADMIN_URL" | "LOG") || !rest.contains("__") {
        return Ok(());
    }
    let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
    if path.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::Env { var: var.into(), reason: "has an empty path segment".into() });
    }
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let mut node = table;
    for seg in &path[..path.len() - 1] {
        let entry = node.entry(seg.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(ConfigError::Env { var: var.into(), reason: format!("`{seg}` is not a table") }),
        };
    }
    let last = path[path.len() - 1].clone();
    node.insert(last, parsed);
    Ok(())
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
mod tests {
    use super::*;

    fn no_env() -> Vec<(String, String)> {
        Vec::new()
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml_str("", no_env()).unwrap();
        assert_eq!(c.store.default_ttl, Duration::from_secs(86_400));
        assert_eq!(c.store.max_ttl, Duration::from_secs(7 * 86_400));
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:9464");
        assert!(c.envelope.stale_guard);
    }

    #[test]
    fn env_overrides_a_nested_key() {
        let env = vec![
            ("DEDUPD_KAFKA__BOOTSTRAP_SERVERS".to_string(), "10.0.0.1:9093".to_string()),
            ("DEDUPD_PIPELINE__MAX_IN_FLIGHT".to_string(), "7".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ];
        let c = Config::from_toml_str("[kafka]\nbootstrap_servers = \"a:1\"\n", env).unwrap();
        assert_eq!(c.kafka.bootstrap_servers, "10.0.0.1:9093");
        assert_eq!(c.pipeline.max_in_flight.get(), 7);
    }

    #[test]
    fn unknown_key_is_refused() {
        let err = Config::from_toml_str("[store]\nbakend = \"sled\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("bakend"), "{err}");
    }

    #[test]
    fn bad_duration_names_the_value() {
        let err = Config::from_toml_str("[store]\ndefault_ttl = \"soon\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn zero_in_flight_is_refused() {
        let err = Config::from_toml_str("[pipeline]\nmax_in_flight = 0\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("max_in_flight") || err.to_string().contains("zero"), "{err}");
    }

    #[test]
    fn route_to_missing_sink_names_the_key() {
        let err = Config::from_toml_str("[[routes]]\ntypes = [\"a\"]\nsink = \"nope\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("routes[0].sink"), "{err}");
    }

    #[test]
    fn max_ttl_below_default_is_refused() {
        let err = Config::from_toml_str("[store]\nmax_ttl = \"1h\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("store.max_ttl"), "{err}");
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn the_example_config_in_deploy_parses_and_validates() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dedupd.toml");
        let c = Config::load(&path, Vec::<(String, String)>::new()).unwrap();
        assert_eq!(c.sinks.len(), 2);
        assert_eq!(c.routes[0].ttl, Some(Duration::from_secs(72 * 3600)));
        assert!(c.sinks["payments-api"].forwards_key());
    }
}

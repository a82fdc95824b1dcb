//! The `[kafka]` and `[pipeline]` sections: where commands come from and go to, and how
//! much work runs at once.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use rdkafka::ClientConfig;

use crate::connection::{ConnectionConfig, ConnectionError};
use crate::problems::{Problem, Problems};

/// The results producer's `message.max.bytes` unless `kafka.producer` sets it: room for a
/// dead-letter copy of the largest command `limits.max_command_bytes` admits by default
/// (1 MiB) with its key and headers. (librdkafka's own default, 1,000,000, is below it.)
pub const RESULTS_PRODUCER_MAX_BYTES: usize = 2 * 1024 * 1024;

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
    /// Publish results and dead letters in Kafka transactions that also commit their input
    /// offsets (pipeline/transactions/mod.rs), so a `read_committed` reader sees exactly one
    /// result per input record, also across crashes.
    pub transactional_results: bool,
    /// Under `transactional_results`: how often the open transaction commits. Longer means
    /// fewer pauses (nothing is queued while a commit runs) and a longer wait before a
    /// `read_committed` reader sees a result.
    #[serde(with = "humantime_serde")]
    pub transaction_interval: Duration,
    /// Producers key the input records by their idempotency key with Kafka's default
    /// partitioner (murmur2), so an input partition is a state partition: with
    /// `store.changelog`, dedupd checks each record's partition against its key's hash and
    /// dead-letters a mismatch (`not_copartitioned`).
    pub copartitioned: bool,
    /// librdkafka properties every client of this cluster shares (security protocol, SASL,
    /// TLS, client id); `consumer`, `producer` and the kafka sinks' `producer` override them.
    pub connection: ConnectionConfig,
    /// How long `run` waits at start for the cluster to answer before it exits non-zero
    /// naming the cause; a refused login or certificate ends it at once.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Static group membership: the consumer joins as `group.instance.id = "dedupd-<store
    /// identity>"` unless `kafka.consumer` names one, so a restarted process gets its
    /// partitions back at once instead of after the dead member's session timeout (on by
    /// default; docs/config.md).
    pub static_membership: bool,
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
            transaction_interval: Duration::from_millis(100),
            copartitioned: false,
            connection: ConnectionConfig::default(),
            connect_timeout: Duration::from_secs(30),
            static_membership: true,
            consumer: BTreeMap::new(),
            producer: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// The settings of one client of this cluster, in order of precedence from low to
    /// high: `defaults` (what dedupd chooses for that client), `client.id = "dedupd"`,
    /// `[kafka.connection]`, then `overrides` (the client's own table); `bootstrap.servers`
    /// last. Reads `env`/`file` values now.
    pub fn client_config(
        &self,
        defaults: &[(&str, &str)],
        overrides: &BTreeMap<String, String>,
    ) -> Result<ClientConfig, ConnectionError> {
        let mut c = ClientConfig::new();
        c.set("client.id", "dedupd");
        for (k, v) in defaults {
            c.set(*k, *v);
        }
        self.connection.apply("kafka.connection", &mut c)?;
        for (k, v) in overrides {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.bootstrap_servers);
        Ok(c)
    }
}

impl KafkaConfig {
    /// The results producer's `message.max.bytes`: `kafka.producer`'s, else dedupd's
    /// default (config validation refuses one that is not a number).
    pub fn producer_max_bytes(&self) -> usize {
        self.producer.get("message.max.bytes").and_then(|v| v.trim().parse().ok()).unwrap_or(RESULTS_PRODUCER_MAX_BYTES)
    }

    /// The consumer's `session.timeout.ms`: `kafka.consumer`'s, else librdkafka's default
    /// (45 s). One librdkafka refuses makes the consumer fail to start, naming it.
    pub fn session_timeout(&self) -> Duration {
        let ms = self.consumer.get("session.timeout.ms").and_then(|v| v.trim().parse().ok()).unwrap_or(45_000);
        Duration::from_millis(ms)
    }

    /// The consumer's `max.poll.interval.ms`: `kafka.consumer`'s, else librdkafka's
    /// default (300 s).
    pub fn max_poll_interval(&self) -> Duration {
        let ms = self.consumer.get("max.poll.interval.ms").and_then(|v| v.trim().parse().ok()).unwrap_or(300_000);
        Duration::from_millis(ms)
    }
}

/// `pipeline.max_in_flight` unset: a slot is held through its claim's durability point as
/// well as its call, so with sinks that answer at once the slots cap the rate near
/// `slots / that point's time`, and rounds of many claims cost less CPU per command than
/// small ones (docs/decisions.md, "Slots by sink"). With the store on Kafka that point is a
/// transaction commit (~20 ms), as Kafka Streams' defaults change with its processing
/// guarantee ("Slots with the store on Kafka").
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4096;
/// `pipeline.max_in_flight` unset with the embedded store while a sink whose every call
/// holds a connection or a process (the only kinds that may not forward the key) has no
/// `limits.max_concurrency`: the bound on that downstream's calls at once, and on the claims
/// a crash can leave `indeterminate` for it.
pub const DEFAULT_MAX_IN_FLIGHT_UNBOUNDED_SINKS: usize = 256;

/// `pipeline.batch_size` when the config leaves it unset. A batch is abandoned at its next
/// round once its partition is revoked or the process stops, so the size bounds neither
/// wait; larger batches make larger rounds, fetches and result bursts, which cost the
/// broker and dedupd less CPU per command (docs/decisions.md, "Batches of 2,000").
pub const DEFAULT_BATCH_SIZE: usize = 2000;

/// Pipeline settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Most commands executing at once across all partitions; unset, the mode's default
    /// (`Config::max_in_flight`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<NonZeroUsize>,
    /// Most records taken into one batch (worked in rounds; its results are published
    /// together once its last round ends).
    pub batch_size: NonZeroUsize,
    /// How long a batch waits for more records once it has one. 0 (default): take what is
    /// queued and go; batches still grow under load, and idle latency stays low.
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Most bytes (keys, values, headers) of records waiting for one partition's worker; a
    /// record that would go past it waits, with its partition paused. One record is always
    /// taken, whatever its size.
    pub partition_buffer_bytes: NonZeroUsize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            max_in_flight: None,
            batch_size: NonZeroUsize::new(DEFAULT_BATCH_SIZE).unwrap_or(NonZeroUsize::MIN),
            batch_linger: Duration::ZERO,
            partition_buffer_bytes: NonZeroUsize::new(16 << 20).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// `bootstrap_servers`: at least one entry, each a broker address.
fn validate_bootstrap(servers: &str, problems: &mut Problems) {
    if servers.trim().is_empty() {
        problems.add("bootstrap_servers", "\"\"", "must list at least one host:port");
    } else if let Some(bad) = servers.split(',').find(|s| crate::connection::servers::broker_address(s).is_none()) {
        problems.add(
            "bootstrap_servers",
            format!("{servers:?}"),
            format!("{:?} is not a host:port (port 1-65535; an IPv6 host in brackets)", bad.trim()),
        );
    }
}

impl KafkaConfig {
    /// `[kafka]` on its own, keys under `problems`' `kafka`: non-empty names, no loops from
    /// results to input, no property that dedupd sets itself.
    pub fn validate(&self, problems: &mut Problems) {
        validate_bootstrap(&self.bootstrap_servers, problems);
        if self.group_id.trim().is_empty() {
            problems.add("group_id", "\"\"", "must not be empty");
        }
        if self.input_topics.is_empty() || self.input_topics.iter().any(|t| t.trim().is_empty()) {
            problems.add(
                "input_topics",
                format!("[{}]", self.input_topics.join(", ")),
                "must list non-empty topic names",
            );
        }
        for (key, topic) in [("results_topic", &self.results_topic), ("dead_letter_topic", &self.dead_letter_topic)] {
            if topic.trim().is_empty() {
                problems.add(key, "\"\"", "must not be empty");
            }
            if self.input_topics.contains(topic) {
                problems.add(
                    key,
                    topic,
                    "must not be one of kafka.input_topics (results would be consumed as commands)",
                );
            }
        }
        for forbidden in ["enable.auto.offset.store", "group.id", "bootstrap.servers"] {
            if self.consumer.contains_key(forbidden) {
                problems.add(
                    &format!("consumer.\"{forbidden}\""),
                    &self.consumer[forbidden],
                    "is set by dedupd itself; use the dedicated key",
                );
            }
        }
        for (property, value) in self.connection.per_client_properties() {
            problems.push(Problem {
                key: crate::connection::key_of(&format!("{}.connection", problems.at()), property),
                value,
                reason: "is set by dedupd for each client (docs/config.md) and cannot be shared".into(),
            });
        }
        for forbidden in ["bootstrap.servers", "enable.idempotence", "acks", "transactional.id"] {
            if let Some(value) = self.producer.get(forbidden) {
                problems.add(
                    &format!("producer.\"{forbidden}\""),
                    crate::connection::shown_text(forbidden, value),
                    "is set by dedupd itself: results are published idempotently with acks=all",
                );
            }
        }
        if self.connect_timeout.is_zero() {
            problems.add("connect_timeout", "0s", "must be positive");
        }
        if self.transaction_interval.is_zero() {
            problems.add("transaction_interval", "0s", "must be positive");
        }
        // Measured (docs/decisions.md, "Rebalance protocol"): under the classic protocol's
        // cooperative assignor, the broker refuses the transaction committed on a revoke, so
        // every rebalance fenced and restarted an instance, and left keys indeterminate.
        let classic = self.consumer.get("group.protocol").is_none_or(|p| p.trim().eq_ignore_ascii_case("classic"));
        if let Some(strategy) = self.consumer.get("partition.assignment.strategy")
            && self.transactional_results
            && classic
            && strategy.contains("cooperative")
        {
            problems.add(
            "consumer.\"partition.assignment.strategy\"",
            strategy,
            "cannot be cooperative with kafka.transactional_results under the classic group protocol: the broker refuses \
             the transaction committed on a revoke, fencing the instance at every rebalance; for incremental rebalances \
             use kafka.consumer.\"group.protocol\" = \"consumer\" (Kafka 4.0 or later)",
        );
        }
    }
}

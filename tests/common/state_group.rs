//! Instances of `dedupd run` sharing one consumer group with the store on Kafka
//! (`store.changelog`, `kafka.copartitioned`, transactional results, a 6 s session), each
//! with its own store and log, one HTTP sink that does not forward the key
//! (tests/kafka/kafka_expiry.rs, tests/kafka/kafka_standby.rs).

use std::path::PathBuf;
use std::time::Duration;

use dedupd::pipeline::state_partition;
use dedupd::store::{Completed, Completion, Record};
use rdkafka::message::{Message, OwnedMessage};

use super::exposition::Exposition;
use super::kafka;
use super::pay_kills;
use super::process::{KeptOnFailure, SlowReceiver};

/// The topics, the group, the directory and the sink of one test.
pub struct StateGroup {
    pub bootstrap: String,
    /// Input, results, dead letters.
    pub topics: [String; 3],
    pub partitions: i32,
    pub group: String,
    pub dir: KeptOnFailure,
    pub receiver: SlowReceiver,
}

impl StateGroup {
    /// Topics named after `name`, the input with `partitions`; a sink answering in
    /// `sink_delay_ms`.
    pub async fn new(bootstrap: &str, name: &str, partitions: i32, sink_delay_ms: (u64, u64)) -> StateGroup {
        let unique = |what: &str| kafka::unique(&format!("{name}-{what}"));
        let topics = [unique("in"), unique("out"), unique("dlq")];
        kafka::create_topics(bootstrap, &[(&topics[0], partitions), (&topics[1], 1), (&topics[2], 1)]).await;
        StateGroup {
            bootstrap: bootstrap.to_string(),
            group: unique("dedupd"),
            topics,
            partitions,
            dir: KeptOnFailure::new(),
            receiver: SlowReceiver::start(sink_delay_ms, 7).await,
        }
    }

    /// The changelog topic.
    pub fn changelog(&self) -> String {
        format!("{}.dedupd-state", self.group)
    }

    /// Command `i` on its key's partition.
    pub fn placed(&self, i: usize) -> kafka::OutgoingTo {
        pay_kills::command(i, state_partition(&pay_kills::key(i), self.partitions))
    }

    /// Writes the config of instance `name` (its own store), `[store]` lines and
    /// `[pipeline]` lines added; its text passed through `edit`. Returns its path.
    pub fn config(&self, name: &str, store: &str, pipeline: &str, edit: impl FnOnce(String) -> String) -> PathBuf {
        let [input, results, dlq] = &self.topics;
        let toml = pay_kills::config_toml(
            &self.bootstrap,
            &self.group,
            [input, results, dlq],
            &self.dir.path().join(format!("store-{name}")),
            &self.receiver.url("/pay"),
            "transactional_results = true\ncopartitioned = true\n\n[kafka.consumer]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n",
            pipeline,
        )
        .replace("[store]\n", &format!("[store]\nchangelog = true\n{store}"));
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, edit(toml)).expect("write config");
        path
    }

    /// Creates the changelog holding a completion of each of commands `0..keys` (see
    /// [`completed_record`]), each on its key's partition, for an instance to restore.
    pub async fn restorable_state(&self, keys: usize) {
        kafka::create_changelog(&self.bootstrap, &self.changelog(), self.partitions).await;
        let records: Vec<kafka::OutgoingTo> = (0..keys)
            .map(|i| {
                let key = pay_kills::key(i);
                let partition = state_partition(&key, self.partitions);
                (key, completed_record(i), Vec::new(), Some(partition))
            })
            .collect();
        kafka::produce_all_with(&kafka::idempotent_producer(&self.bootstrap), &self.changelog(), records).await;
    }

    /// The log of instance `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }
}

/// Every record of the changelog `topic` `read_committed`, read to the end, as (partition,
/// key, record or `None` for a tombstone).
pub async fn changelog(bootstrap: &str, topic: &str) -> Vec<(i32, String, Option<Record>)> {
    let records = kafka::read_to_end(bootstrap, topic, "read_committed").await;
    records.iter().map(decoded).filter(|(_, key, _)| !names_a_writer(key)).collect()
}

/// Each key's last record on the changelog `topic` (`None`: a tombstone).
pub async fn last_records(bootstrap: &str, topic: &str) -> std::collections::HashMap<String, Option<Record>> {
    changelog(bootstrap, topic).await.into_iter().map(|(_, key, record)| (key, record)).collect()
}

/// How the key of a changelog record that only names its writer begins (a transaction
/// with nothing else on dedupd's topics has one: src/pipeline/transactions/named.rs).
pub const WRITER_KEY_PREFIX: &str = "\u{0}dedupd-writer/";

/// Whether a changelog record keyed `key` only names its writer: no key's record.
pub fn names_a_writer(key: &str) -> bool {
    key.starts_with(WRITER_KEY_PREFIX)
}

fn decoded(m: &OwnedMessage) -> (i32, String, Option<Record>) {
    let key = String::from_utf8(m.key().expect("keyed").to_vec()).expect("utf-8 key");
    (m.partition(), key, m.payload().map(|v| Record::decode(v).expect("a record")))
}

/// The value of the series `name` (no labels) of the instance serving HTTP at `http`.
pub async fn metric(http: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{http}/metrics")).await.expect("GET /metrics").text().await.expect("body");
    Exposition::parse(&text).value(name, &[]).unwrap_or(0.0)
}

/// `GET /v1/status` of the instance serving HTTP at `http`, with its admin `token`.
pub async fn status(http: &str, token: &str) -> dedupd::ops::Status {
    reqwest::Client::new()
        .get(format!("http://{http}/v1/status"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET /v1/status")
        .json()
        .await
        .expect("status JSON")
}

/// The "state partition restored" lines of a JSON log: (partition, records applied).
pub fn restores(log: &std::path::Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "state partition restored")
        .map(|v| {
            let partition = v["fields"]["partition"].as_str().expect("partition in the restore line").to_string();
            (partition, v["fields"]["records"].as_u64().expect("records in the restore line"))
        })
        .collect()
}

/// How long a test waits for a condition on the group.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// A completed record of command `i`, as dedupd writes one, with another fingerprint than
/// the command's: restored, it makes the command a conflict without a call.
pub fn completed_record(i: usize) -> Vec<u8> {
    Record::Completed(Completed {
        fingerprint: dedupd::fingerprint::Fingerprint([7; 32]),
        outcome: Completion::Succeeded,
        result: format!("{{\"i\":{i}}}").into_bytes(),
        error: None,
        first_seen_at_ms: 1,
        completed_at_ms: 2,
        expires_at_ms: 4_000_000_000_000,
        attempts: 1,
        source: None,
        settled: None,
    })
    .encode()
}

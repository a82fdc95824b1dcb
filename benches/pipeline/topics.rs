//! The bench's topics: unique names, creating a topic, producing the backlog of commands
//! (keyed by their idempotency key) and reading the result records back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

pub(super) fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), rand::random::<u32>())
}

pub(super) async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    create_topic_with(bootstrap, name, partitions, &[]).await;
}

/// A changelog topic, compacted as dedupd requires of one it finds.
pub(super) async fn create_changelog_topic(bootstrap: &str, name: &str, partitions: i32) {
    create_topic_with(bootstrap, name, partitions, &[("cleanup.policy", "compact")]).await;
}

async fn create_topic_with(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<_> = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin");
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let r = admin.create_topics(&[t], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await;
    for x in r.expect("create topics") {
        x.expect("topic created");
    }
    wait_for_leaders(bootstrap, name, partitions).await;
}

/// Waits (up to 30 s, then panics) until the metadata shows topic `name` with `partitions`
/// partitions, each with a leader. A topic just created is not in every answer at once, and
/// dedupd refuses to start without its results and dead-letter topics
/// (src/pipeline/connect.rs).
async fn wait_for_leaders(bootstrap: &str, name: &str, partitions: i32) {
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let md = c.fetch_metadata(Some(name), Duration::from_secs(5)).expect("metadata");
        let ok = md.topics().iter().any(|t| {
            t.name() == name
                && t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0 && p.error().is_none())
        });
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topic {name} did not show {partitions} partitions with leaders within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the dead-letter topic `name` (one partition) unless it exists: dedupd creates
/// no topic it publishes to, and every phase starting an instance of a config needs it.
pub(super) async fn ensure_dead_letter_topic(bootstrap: &str, name: &str) {
    let admin: AdminClient<_> = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin");
    let t = NewTopic::new(name, 1, TopicReplication::Fixed(1));
    let r = admin.create_topics(&[t], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await;
    for x in r.expect("create topics") {
        match x {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, e)) => panic!("creating {topic}: {e}"),
        }
    }
    wait_for_leaders(bootstrap, name, 1).await;
}

pub(super) fn command(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"id": format!("bench-{i}"), "type": "bench.noop", "payload": {"i": i, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}))
        .expect("json")
}

pub(super) fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "1")
        // Records keyed by their idempotency key land on its state partition, as
        // `kafka.copartitioned` needs (and Kafka Streams' recipe re-keys anyway).
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer")
}

pub(super) async fn produce_backlog(bootstrap: &str, topic: &str, n: usize) {
    let p = producer(bootstrap);
    let mut acks = Vec::with_capacity(n);
    for i in 0..n {
        let v = command(i);
        let key = format!("bench-{i}");
        loop {
            match p.send_result(FutureRecord::to(topic).key(&key).payload(&v)) {
                Ok(f) => {
                    acks.push(f);
                    break;
                }
                Err((_, _)) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
    for a in futures::future::join_all(acks).await {
        a.expect("ack").expect("delivered");
    }
}

/// Reads `n` result records; returns (input (partition, offset) → result timestamp ms).
pub(super) fn read_results(bootstrap: &str, topic: &str, n: usize, bound: Duration) -> HashMap<(i32, i64), i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("bench-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("reader");
    c.subscribe(&[topic]).expect("subscribe");
    let mut out = HashMap::with_capacity(n);
    let deadline = Instant::now() + bound;
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_default();
            let p = v["source"]["partition"].as_i64().unwrap_or(-1) as i32;
            let o = v["source"]["offset"].as_i64().unwrap_or(-1);
            out.insert((p, o), m.timestamp().to_millis().unwrap_or(0));
        }
    }
    out
}

/// Reads the `n` results of a drain once all of them are on `topic`. Until then it only asks
/// for the topic's end offsets, four times a second: a reader consuming alongside the drain
/// took about a sixth of the process's CPU, which the drain is measured with (the plain
/// relay has no such reader). The rate comes from the records' timestamps either way.
pub(super) fn read_after_drain(bootstrap: &str, topic: &str, n: usize, bound: Duration) -> HashMap<(i32, i64), i64> {
    let deadline = Instant::now() + bound;
    wait_for_results(bootstrap, topic, n, deadline);
    read_results(bootstrap, topic, n, deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(60))
}

/// Waits until `topic` holds `n` records or `deadline` passes, asking only for its end
/// offsets (see [`read_after_drain`]).
pub(super) fn wait_for_results(bootstrap: &str, topic: &str, n: usize, deadline: Instant) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("bench-watermarks"))
        .create()
        .expect("watermarks");
    let partitions = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .ok()
        .and_then(|m| m.topics().first().map(|t| t.partitions().len() as i32))
        .unwrap_or(0);
    while Instant::now() < deadline {
        let on_topic: i64 = (0..partitions)
            .map(|p| c.fetch_watermarks(topic, p, Duration::from_secs(5)).map_or(0, |(_, high)| high))
            .sum();
        if on_topic >= n as i64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

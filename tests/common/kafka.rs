//! Helpers for tests against a real Kafka broker started by `scripts/kafka/kafka.sh with …`
//! (see docs/kafka-for-tests.md), plus an HTTP receiver that records every request.
//!
//! Without `DEDUPD_TEST_KAFKA_BOOTSTRAP` a test skips (prints "skipped: no broker"), unless
//! `DEDUPD_REQUIRE_KAFKA=1`, in which case it fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use parking_lot::Mutex;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The broker's address, or `None` when the test should skip. Panics when no broker is
/// set but `DEDUPD_REQUIRE_KAFKA=1`.
pub fn bootstrap() -> Option<String> {
    set_by_kafka_sh("DEDUPD_TEST_KAFKA_BOOTSTRAP")
}

/// The value of `var`, which `kafka.sh with` sets, or `None` when the test should skip;
/// panics when it is not set but `DEDUPD_REQUIRE_KAFKA=1`.
pub fn set_by_kafka_sh(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(b) if !b.trim().is_empty() => Some(b.trim().to_string()),
        _ => {
            if std::env::var("DEDUPD_REQUIRE_KAFKA").as_deref() == Ok("1") {
                panic!(
                    "DEDUPD_REQUIRE_KAFKA=1 but {var} is not set: run under \
                     `scripts/kafka/kafka.sh with cargo test …` (docs/kafka-for-tests.md)"
                );
            }
            eprintln!("skipped: no broker ({var} is not set)");
            None
        }
    }
}

/// `name` plus the process id and a suffix unique within and (very likely) across runs.
pub fn unique(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{:x}{n}", std::process::id(), (nanos as u64) ^ rand::random::<u64>())
}

/// Creates the topics (replication 1) and waits until the broker reports all of them with
/// the asked number of partitions.
pub async fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) {
    create_topics_with(bootstrap, topics, &[]).await;
}

/// A changelog topic made ahead of dedupd, as an operator makes one: compacted.
pub async fn create_changelog(bootstrap: &str, name: &str, partitions: i32) {
    create_topics_with(bootstrap, &[(name, partitions)], &[("cleanup.policy", "compact")]).await;
}

/// [`create_topics`], each topic with `settings`.
pub async fn create_topics_with(bootstrap: &str, topics: &[(&str, i32)], settings: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, parts)| {
            let topic = NewTopic::new(name, *parts, TopicReplication::Fixed(1));
            settings.iter().fold(topic, |t, (k, v)| t.set(k, v))
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = tokio::time::timeout(Duration::from_secs(60), admin.create_topics(&new, &opts))
        .await
        .expect("create_topics timed out")
        .expect("create_topics");
    for r in results {
        if let Err((topic, code)) = r {
            panic!("creating topic {topic}: {code:?}");
        }
    }
    // Wait until the metadata shows every partition (leaders elected).
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("probe");
    for (name, parts) in topics {
        loop {
            let ok = tokio::task::block_in_place(|| probe.fetch_metadata(Some(name), Duration::from_secs(5)))
                .ok()
                .and_then(|md| {
                    md.topics().iter().find(|t| t.name() == *name).map(|t| {
                        t.error().is_none()
                            && t.partitions().len() == *parts as usize
                            && t.partitions().iter().all(|p| p.leader() >= 0 && p.error().is_none())
                    })
                })
                .unwrap_or(false);
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "topic {name} did not show {parts} partitions within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One record to produce: Kafka key, value, headers.
pub type Outgoing = (String, Vec<u8>, Vec<(String, String)>);

/// Produces every record (keyed, partitioned by key) and waits for every acknowledgement.
/// Returns each record's `(partition, offset)`, in input order.
pub async fn produce_all(bootstrap: &str, topic: &str, records: Vec<Outgoing>) -> Vec<(i32, i64)> {
    produce_all_to(bootstrap, topic, records.into_iter().map(|(k, v, h)| (k, v, h, None)).collect()).await
}

/// An [`Outgoing`] record with an explicit partition, or `None` to partition by key.
pub type OutgoingTo = (String, Vec<u8>, Vec<(String, String)>, Option<i32>);

/// Like [`produce_all`], with an optional explicit partition per record. Order within a
/// partition is the input order (idempotent producer).
pub async fn produce_all_to(bootstrap: &str, topic: &str, records: Vec<OutgoingTo>) -> Vec<(i32, i64)> {
    produce_all_with(&idempotent_producer(bootstrap), topic, records).await
}

/// An idempotent producer with acks from all replicas, to keep for many
/// [`produce_all_with`] calls: each new idempotent producer takes a producer id from the
/// broker, and a test that makes them by the thousand can run the broker's block of ids dry.
pub fn idempotent_producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer")
}

/// [`produce_all_to`] through `producer`.
pub async fn produce_all_with(producer: &FutureProducer, topic: &str, records: Vec<OutgoingTo>) -> Vec<(i32, i64)> {
    let mut acks = Vec::with_capacity(records.len());
    for (key, value, headers, partition) in &records {
        let mut h = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            h = h.insert(Header { key: k.as_str(), value: Some(v.as_str()) });
        }
        let mut rec = FutureRecord::to(topic).key(key.as_str()).payload(value.as_slice()).headers(h);
        if let Some(p) = partition {
            rec = rec.partition(*p);
        }
        // send() only waits when the local queue is full; the returned futures await acks.
        acks.push(producer.send_result(rec).map_err(|(e, _)| e).expect("enqueue"));
    }
    let mut out = Vec::with_capacity(acks.len());
    for ack in futures::future::join_all(acks).await {
        let delivery = ack.expect("producer dropped").map_err(|(e, _)| e).expect("delivery");
        out.push((delivery.partition, delivery.offset));
    }
    out
}

/// Reads `topic` from the earliest offset with a fresh group until `expected` records
/// arrived or `timeout` passed; returns what it got.
pub async fn read_all(bootstrap: &str, topic: &str, expected: usize, timeout: Duration) -> Vec<OwnedMessage> {
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", unique("reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .expect("reader");
        consumer.subscribe(&[topic.as_str()]).expect("subscribe");
        let deadline = Instant::now() + timeout;
        let mut got = Vec::with_capacity(expected);
        while got.len() < expected && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => got.push(m.detach()),
                Some(Err(e)) => eprintln!("read_all({topic}): {e}"),
                None => {}
            }
        }
        got
    })
    .await
    .expect("read_all task")
}

/// The data records of every partition of `topic` that a reader with `isolation`
/// (`read_committed` or `read_uncommitted`) gets, read to the end: for a topic nothing
/// writes any more.
pub async fn read_to_end(bootstrap: &str, topic: &str, isolation: &str) -> Vec<OwnedMessage> {
    let partitions = watermarks(bootstrap, topic).await.len();
    let (bootstrap, topic, isolation) = (bootstrap.to_string(), topic.to_string(), isolation.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", unique("to-end"))
            .set("isolation.level", &isolation)
            .set("enable.partition.eof", "true")
            .create()
            .expect("reader");
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..partitions as i32 {
            tpl.add_partition_offset(&topic, p, rdkafka::Offset::Beginning).expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let (mut got, mut at_end) = (Vec::new(), std::collections::HashSet::new());
        let deadline = Instant::now() + Duration::from_secs(120);
        while at_end.len() < partitions {
            assert!(Instant::now() < deadline, "{topic} not read to its end ({isolation})");
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => got.push(m.detach()),
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                Some(Err(_)) | None => {}
            }
        }
        got
    })
    .await
    .expect("read_to_end task")
}

/// The number of records in `topic`: the sum over partitions of high minus low watermark.
/// Exact for topics written without transactions.
pub async fn count_records(bootstrap: &str, topic: &str) -> i64 {
    watermarks(bootstrap, topic).await.iter().map(|(low, high)| high - low).sum()
}

/// The low and high watermark of each partition of `topic`, in partition order.
pub async fn watermarks(bootstrap: &str, topic: &str) -> Vec<(i64, i64)> {
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("client");
        let md = c.fetch_metadata(Some(&topic), Duration::from_secs(10)).expect("metadata");
        let t = md.topics().iter().find(|t| t.name() == topic).expect("topic in metadata");
        let mut partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        partitions.sort_unstable();
        partitions
            .into_iter()
            .map(|p| c.fetch_watermarks(&topic, p, Duration::from_secs(10)).expect("watermarks"))
            .collect()
    })
    .await
    .expect("watermarks task")
}

/// A header's value as a string.
pub fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    let h = m.headers()?;
    h.iter().find(|h| h.key == name).and_then(|h| h.value).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// One request the receiver saw: its `Idempotency-Key` header and body.
pub type Request = (Option<String>, Bytes);

/// An HTTP receiver on 127.0.0.1 that answers 200 `{"accepted":true}` to every POST on
/// `/effects` and records it.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Every request, in arrival order.
    pub seen: Arc<Mutex<Vec<Request>>>,
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

async fn receive(
    State(seen): State<Arc<Mutex<Vec<Request>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::Json<serde_json::Value> {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    seen.lock().push((key, body));
    axum::Json(serde_json::json!({"accepted": true}))
}

impl Receiver {
    /// Starts it on 127.0.0.1:0.
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let app = axum::Router::new().route("/effects", axum::routing::post(receive)).with_state(Arc::clone(&seen));
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        };
        Receiver { addr, seen, stop, task }
    }

    /// The URL of its endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/effects", self.addr)
    }

    /// Requests per `Idempotency-Key` (None counted under "").
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for (k, _) in self.seen.lock().iter() {
            *m.entry(k.clone().unwrap_or_default()).or_insert(0) += 1;
        }
        m
    }

    /// Stops it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// The `[kafka]` table of a test's dedupd config: broker, group and the three topics.
/// Tests add their own `[kafka.consumer]`/`[kafka.producer]` tables after it.
pub fn kafka_table(bootstrap: &str, group: &str, input: &str, results: &str, dlq: &str) -> String {
    format!(
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"{group}\"\ninput_topics = [\"{input}\"]\n\
         results_topic = \"{results}\"\ndead_letter_topic = \"{dlq}\"\n"
    )
}

//! `dedupd demo`: the real pipeline against librdkafka's in-process mock cluster and a
//! local HTTP receiver, with duplicates (same batch, later, other partition), conflicts
//! and bad records. Passes only when the receiver saw exactly one request per distinct
//! valid key and every input got a result.
//!
//! The mock cluster keeps only ~5 MB per partition and drops older data silently, so the
//! demo stays far below that (a few thousand small records).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use parking_lot::Mutex;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::routes::RouteConfig;
use crate::sinks::SinkConfig;
use crate::sinks::http::HttpSinkConfig;

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Kafka mock or client.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Local I/O (receiver socket, temp dir).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The pipeline failed.
    #[error("pipeline: {0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
    /// Timed out waiting for results.
    #[error("timed out after {} waiting for results ({} of {} arrived)", humantime::format_duration(*.0), .1, .2)]
    Timeout(Duration, usize, usize),
}

/// What the demo saw.
#[derive(Debug, Default)]
pub struct Summary {
    inputs: usize,
    distinct_valid_keys: usize,
    requests: usize,
    keys_with_more_than_one_request: usize,
    outcomes: HashMap<String, usize>,
    dead_letters: usize,
    metrics_url: String,
    seconds: f64,
}

impl Summary {
    /// True when every distinct valid key was executed exactly once.
    pub fn passed(&self) -> bool {
        self.requests == self.distinct_valid_keys && self.keys_with_more_than_one_request == 0
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = |k: &str| self.outcomes.get(k).copied().unwrap_or(0);
        writeln!(f, "dedupd demo: {} commands in, {:.1} s", self.inputs, self.seconds)?;
        writeln!(f, "  effects done (HTTP requests received) : {}", self.requests)?;
        writeln!(f, "  distinct valid keys                   : {}", self.distinct_valid_keys)?;
        writeln!(f, "  duplicates suppressed (replayed)      : {}", o("duplicate"))?;
        writeln!(f, "  conflicts (same key, other payload)   : {}", o("conflict"))?;
        writeln!(f, "  dead-lettered (bad or stale records)  : {}", self.dead_letters)?;
        writeln!(f, "  result records by outcome             : {}", by_outcome(&self.outcomes))?;
        writeln!(f, "  metrics were at                       : {}", self.metrics_url)?;
        if self.passed() {
            write!(f, "PASS: every distinct valid command ran exactly once")
        } else {
            write!(
                f,
                "FAIL: {} effects for {} distinct keys ({} keys executed more than once)",
                self.requests, self.distinct_valid_keys, self.keys_with_more_than_one_request
            )
        }
    }
}

/// `conflict 6, duplicate 1994, ok 2000`: the counts by outcome name.
fn by_outcome(m: &HashMap<String, usize>) -> String {
    let mut v: Vec<(&str, usize)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    v.sort();
    v.iter().map(|(outcome, n)| format!("{outcome} {n}")).collect::<Vec<_>>().join(", ")
}

type Received = Arc<Mutex<HashMap<String, usize>>>;

async fn receive(State(seen): State<Received>, headers: HeaderMap) -> axum::Json<serde_json::Value> {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    *seen.lock().entry(key).or_insert(0) += 1;
    axum::Json(json!({"accepted": true}))
}

/// The demo's input: (kafka key, value, is a distinct valid key's first appearance).
fn workload(distinct: usize) -> (Vec<(String, Vec<u8>)>, usize) {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let cmd = |i: usize, amount: usize| {
        serde_json::to_vec(&json!({"id": format!("order-{i}"), "type": "payment.charge",
            "payload": {"customer": format!("c{}", i % 97), "amount": amount}}))
        .unwrap_or_default()
    };
    for i in 0..distinct {
        out.push((format!("p{i}"), cmd(i, 100 + i)));
        if i % 10 == 0 {
            // A retry right behind the original: same batch, same partition.
            out.push((format!("p{i}"), cmd(i, 100 + i)));
        }
        if i % 10 == 1 {
            // The same command through another partition (other Kafka key).
            out.push((format!("other-{i}"), cmd(i, 100 + i)));
        }
        if i % 50 == 2 {
            // Same key, different payload: a conflict, never executed.
            out.push((format!("p{i}"), cmd(i, 999_999)));
        }
    }
    // Much later repeats of the first tenth.
    for i in 0..distinct / 10 {
        out.push((format!("late-{i}"), cmd(i, 100 + i)));
    }
    // Bad records, one of each kind.
    let bad: Vec<Vec<u8>> = vec![
        b"{not json".to_vec(),
        br#"{"type":"payment.charge","payload":{}}"#.to_vec(),
        br#"{"id":"","type":"payment.charge","payload":{}}"#.to_vec(),
        br#"{"id":"x-1","type":"unknown.kind","payload":{}}"#.to_vec(),
        b"[1,2,3]".to_vec(),
    ];
    for (j, v) in bad.into_iter().cycle().take((distinct / 100).max(5)).enumerate() {
        out.push((format!("bad-{j}"), v));
    }
    (out, distinct)
}

/// Runs the demo with `distinct` valid keys.
pub async fn run(distinct: usize) -> Result<Summary, DemoError> {
    let started = Instant::now();
    let cluster = MockCluster::new(1)?;
    let bootstrap = cluster.bootstrap_servers();
    for (topic, parts) in [("demo.commands", 6), ("demo.results", 3), ("demo.dead-letter", 1)] {
        cluster.create_topic(topic, parts, 1)?;
    }
    let receiver = EffectReceiver::start().await?;
    let dir = tempfile::tempdir()?;
    let config = demo_config(&bootstrap, &dir.path().join("store"), receiver.addr)?;

    let (workload, distinct_valid_keys) = workload(distinct);
    let inputs = workload.len();
    produce(&bootstrap, &workload).await?;

    let stop = CancellationToken::new();
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let pipeline = {
        let stop = stop.clone();
        tokio::spawn(crate::pipeline::run(config, Default::default(), stop.cancelled_owned(), move |r| {
            let _ = addr_tx.send(r.http_addr);
        }))
    };
    let metrics_url = match addr_rx.await {
        Ok(a) => format!("http://{a}/metrics"),
        Err(_) => String::from("(not started)"),
    };

    let read = read_results(&bootstrap, inputs, started).await;
    stop.cancel();
    let read = match read {
        Ok(read) => read,
        Err(timeout) => {
            // Bounded: the error must reach the user even if the pipeline cannot drain.
            let _ = tokio::time::timeout(Duration::from_secs(30), pipeline).await;
            return Err(timeout);
        }
    };
    let _ = pipeline.await;
    let seen = receiver.stop().await;
    Ok(Summary {
        inputs,
        distinct_valid_keys,
        requests: seen.values().sum(),
        keys_with_more_than_one_request: seen.values().filter(|n| **n > 1).count(),
        outcomes: read.outcomes,
        dead_letters: read.dead_letters,
        metrics_url,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The loopback HTTP server the demo's webhook sink calls: counts requests per key.
struct EffectReceiver {
    addr: std::net::SocketAddr,
    seen: Received,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl EffectReceiver {
    async fn start() -> Result<EffectReceiver, DemoError> {
        let seen: Received = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new().route("/effects", axum::routing::post(receive)).with_state(Arc::clone(&seen));
        let stop = CancellationToken::new();
        let serving = stop.clone();
        let task =
            tokio::spawn(
                async move { axum::serve(listener, app).with_graceful_shutdown(serving.cancelled_owned()).await },
            );
        Ok(EffectReceiver { addr, seen, stop, task })
    }

    /// Stops serving; the requests per key it saw.
    async fn stop(self) -> HashMap<String, usize> {
        self.stop.cancel();
        let _ = self.task.await;
        self.seen.lock().clone()
    }
}

/// The demo's config: the mock cluster's topics, a store in `store_path`, and one route of
/// `payment.*` commands to the webhook at `receiver`.
fn demo_config(
    bootstrap: &str,
    store_path: &std::path::Path,
    receiver: std::net::SocketAddr,
) -> Result<Config, DemoError> {
    let mut config = Config::default();
    config.kafka.bootstrap_servers = bootstrap.to_string();
    config.kafka.group_id = "dedupd-demo".into();
    config.kafka.input_topics = vec!["demo.commands".into()];
    config.kafka.results_topic = "demo.results".into();
    config.kafka.dead_letter_topic = "demo.dead-letter".into();
    config.store.path = store_path.to_path_buf();
    config.http.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    config.sinks.insert(
        "webhook".into(),
        SinkConfig::Http(HttpSinkConfig {
            url: format!("http://{receiver}/effects"),
            forward_key: true,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            ..HttpSinkConfig::default()
        }),
    );
    config.routes.push(RouteConfig {
        name: Some("payments".into()),
        types: vec!["payment.*".into()],
        sink: "webhook".into(),
        ttl: None,
        fingerprint_exclude: vec![],
    });
    Ok(config)
}

/// Produces the workload to `demo.commands` and waits for every acknowledgement.
async fn produce(bootstrap: &str, workload: &[(String, Vec<u8>)]) -> Result<(), DemoError> {
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("enable.idempotence", "true").create()?;
    // Queue everything, then await the acknowledgements: awaiting each send in turn
    // would wait out linger.ms once per record.
    let mut acks = Vec::with_capacity(workload.len());
    for (key, value) in workload {
        let record = FutureRecord::to("demo.commands").key(key.as_str()).payload(value.as_slice());
        acks.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for ack in futures::future::join_all(acks).await {
        match ack {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(e.into()),
            Err(_) => return Err(DemoError::Kafka(rdkafka::error::KafkaError::Canceled)),
        }
    }
    Ok(())
}

/// What the demo read back from the results and dead-letter topics.
struct ReadBack {
    outcomes: HashMap<String, usize>,
    dead_letters: usize,
}

/// Reads results until there is one per input (or two minutes since `started` have passed),
/// then the dead letters of the rejected ones (at most ten seconds more).
async fn read_results(bootstrap: &str, inputs: usize, started: Instant) -> Result<ReadBack, DemoError> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "dedupd-demo-reader")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    reader.subscribe(&["demo.results", "demo.dead-letter"])?;
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    let (mut results, mut dead_letters) = (0usize, 0usize);
    let limit = Duration::from_secs(120);
    while results < inputs {
        if started.elapsed() > limit {
            return Err(DemoError::Timeout(limit, results, inputs));
        }
        let Some(msg) = tokio::task::block_in_place(|| reader.poll(Duration::from_millis(200))) else { continue };
        let Ok(msg) = msg else { continue };
        if msg.topic() == "demo.dead-letter" {
            dead_letters += 1;
            continue;
        }
        results += 1;
        let outcome = msg
            .payload()
            .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
            .and_then(|v| v.get("outcome").and_then(|o| o.as_str()).map(str::to_string))
            .unwrap_or_else(|| "unreadable".into());
        *outcomes.entry(outcome).or_insert(0) += 1;
    }
    // Dead letters are published with their results; give the reader a moment to see them.
    let rejected = outcomes.get("rejected").copied().unwrap_or(0) + outcomes.get("stale").copied().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dead_letters < rejected && Instant::now() < deadline {
        if let Some(Ok(m)) = tokio::task::block_in_place(|| reader.poll(Duration::from_millis(200)))
            && m.topic() == "demo.dead-letter"
        {
            dead_letters += 1;
        }
    }
    Ok(ReadBack { outcomes, dead_letters })
}

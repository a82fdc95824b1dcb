//! A sink outage on a real broker (docs/sinks.md, "Circuit breaker and backpressure"):
//! `dedupd run` as a child with an http sink to a loopback receiver. A first wave of
//! commands goes through; the receiver is then stopped (connections refused) and a second
//! wave is produced while it is down, for much longer than `retry.max_attempts` × backoff
//! would last. While down: the circuit opens (`dedupd_sink_circuit_open` = 1, logged), the
//! partitions waiting on it are paused (logged), and no result of the second wave appears
//! (nothing completes as `failed`, the consumer does not move past them). Then the receiver
//! comes back on the same port and every command ends with exactly one `succeeded` result,
//! nothing is dead-lettered, the receiver saw every key, always under its own
//! `Idempotency-Key`, and the circuit is closed again.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test sinks sink_outage::`.

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use common::exposition::scrape;
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, TopicTail, tail_of_file, wait_for_http_addr};
use dedupd::outcome::ResultRecord;
use parking_lot::Mutex;
use rdkafka::message::Message;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;
/// Commands produced while the receiver is up, then while it is down.
const FIRST_WAVE: usize = 100;
const SECOND_WAVE: usize = 200;
/// How long the receiver stays down: far beyond 3 attempts × at most 50 ms of backoff.
const OUTAGE: Duration = Duration::from_secs(4);

/// Every request: (`Idempotency-Key`, body).
type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

async fn receive(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Json<Value> {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    seen.lock().push((key, body));
    Json(json!({"accepted": true}))
}

/// An HTTP receiver that can be stopped (its port then refuses connections) and started
/// again on the same port, keeping what it saw.
struct Receiver {
    addr: SocketAddr,
    seen: Seen,
    running: Option<(CancellationToken, JoinHandle<std::io::Result<()>>)>,
}

impl Receiver {
    async fn start() -> Receiver {
        let mut r = Receiver { addr: "127.0.0.1:0".parse().expect("addr"), seen: Seen::default(), running: None };
        r.up().await;
        r
    }

    /// Listens on `addr` (port 0 the first time), retrying a busy port for a while.
    async fn up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let listener = loop {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.set_reuseaddr(true).expect("SO_REUSEADDR");
            match socket.bind(self.addr).and_then(|()| socket.listen(128)) {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "could not listen on {} again: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        self.addr = listener.local_addr().expect("local addr");
        let app = axum::Router::new().fallback(axum::routing::post(receive)).with_state(Arc::clone(&self.seen));
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        };
        self.running = Some((stop, task));
    }

    /// Stops listening and closes every connection (graceful: a request being answered
    /// is finished first).
    async fn down(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            stop.cancel();
            let ended = tokio::time::timeout(Duration::from_secs(30), task).await;
            assert!(ended.is_ok(), "receiver did not stop within 30 s");
        }
    }

    fn url(&self) -> String {
        format!("http://{}/effects", self.addr)
    }

    fn seen(&self) -> Vec<(Option<String>, Value)> {
        self.seen.lock().clone()
    }
}

fn config(bootstrap: &str, topics: [&str; 3], store: &Path, url: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[store]
path = "{store}"

[retry]
max_attempts = 3
initial_backoff = "20ms"
max_backoff = "50ms"

[sinks.receiver]
kind = "http"
url = "{url}"
connect_timeout = "1s"
request_timeout = "5s"

[sinks.receiver.circuit]
failure_threshold = 3
probe_backoff = "100ms"
max_probe_backoff = "400ms"

[[routes]]
types = ["outage.*"]
sink = "receiver"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, &kafka::unique("outage-group"), input, results, dlq),
        store = store.display(),
    )
}

fn commands(range: std::ops::Range<usize>) -> Vec<kafka::Outgoing> {
    range
        .map(|i| {
            let value = json!({"id": format!("k{i}"), "type": "outage.op", "payload": {"i": i}});
            (format!("k{i}"), serde_json::to_vec(&value).expect("json"), vec![])
        })
        .collect()
}

fn results_of(tail: &TopicTail) -> Vec<ResultRecord> {
    tail.since(0)
        .iter()
        .map(|m| serde_json::from_slice(m.payload().expect("result payload")).expect("result record"))
        .collect()
}

/// Polls `cond` every 50 ms until it holds; fails after `timeout` or if dedupd died.
async fn until(
    what: &str,
    timeout: Duration,
    dedupd: &mut DedupdProcess,
    log: &Path,
    mut cond: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(dedupd.exited().is_none(), "dedupd exited while waiting for {what}:\n{}", tail_of_file(log, 40));
        assert!(Instant::now() < deadline, "no {what} within {timeout:?}; dedupd log:\n{}", tail_of_file(log, 40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_outage_pauses_and_resumes_without_loss_failure_or_double_effect() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("out-in"), kafka::unique("out-results"), kafka::unique("out-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let mut receiver = Receiver::start().await;

    let dir = KeptOnFailure::new();
    let (config_path, log, store) =
        (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"), dir.path().join("store"));
    std::fs::write(&config_path, config(&bootstrap, [&input, &results, &dlq], &store, &receiver.url()))
        .expect("config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let http = wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let tail = TopicTail::start(&bootstrap, &results, 1);
    let gauge = async |client: &reqwest::Client| {
        scrape(client, &http).await.value("dedupd_sink_circuit_open", &[("sink", "receiver")])
    };
    assert_eq!(gauge(&client).await, Some(0.0), "the circuit gauge is there, closed, before any record");

    // First wave, receiver up: every command goes through.
    kafka::produce_all(&bootstrap, &input, commands(0..FIRST_WAVE)).await;
    until("first-wave results", Duration::from_secs(60), &mut dedupd, &log, async || tail.len() >= FIRST_WAVE).await;

    // Outage: the port refuses connections; the second wave arrives meanwhile.
    receiver.down().await;
    let log_len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let down_at = Instant::now();
    kafka::produce_all(&bootstrap, &input, commands(FIRST_WAVE..FIRST_WAVE + SECOND_WAVE)).await;
    until("open circuit (gauge 1)", Duration::from_secs(30), &mut dedupd, &log, async || {
        gauge(&client).await == Some(1.0)
    })
    .await;
    let since_down = || {
        std::fs::read_to_string(&log).map(|t| t.get(log_len as usize..).unwrap_or("").to_string()).unwrap_or_default()
    };
    until(
        "log line of the open circuit and a paused partition",
        Duration::from_secs(30),
        &mut dedupd,
        &log,
        async || {
            let text = since_down();
            text.contains("sink circuit OPEN") && text.contains("partition paused")
        },
    )
    .await;
    // Stay down for the whole outage: meanwhile nothing of the second wave completes (no
    // `failed` once retries would have run out) and the circuit stays open.
    while down_at.elapsed() < OUTAGE {
        let done = results_of(&tail);
        assert_eq!(done.len(), FIRST_WAVE, "a second-wave result while the sink was down: {:?}", done.last());
        assert_eq!(gauge(&client).await, Some(1.0), "the circuit closed while the sink was down");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Back on the same port: everything completes.
    receiver.up().await;
    until("every result", Duration::from_secs(120), &mut dedupd, &log, async || tail.len() >= FIRST_WAVE + SECOND_WAVE)
        .await;
    until("closed circuit (gauge 0)", Duration::from_secs(30), &mut dedupd, &log, async || {
        gauge(&client).await == Some(0.0)
    })
    .await;
    // No retry storm: at most one failing call per second-wave command (the calls already
    // under way when the circuit opened) plus the probes; plain retries would make
    // `max_attempts` = 3 calls per command and then complete them as `failed`.
    let transient = scrape(&client, &http)
        .await
        .value("dedupd_sink_requests_total", &[("sink", "receiver"), ("status", "transient")]);
    eprintln!("transient sink calls during the outage: {transient:?}");
    assert!(transient.is_some_and(|n| n >= 3.0 && n <= (SECOND_WAVE + 50) as f64), "transient calls: {transient:?}");
    let text = since_down();
    assert!(text.contains("sink circuit closed") && text.contains("partition resumed"), "no close/resume log lines");
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");

    // Exactly one result per command, all `succeeded`; nothing dead-lettered.
    let all = results_of(&tail);
    assert_eq!(kafka::count_records(&bootstrap, &results).await, (FIRST_WAVE + SECOND_WAVE) as i64, "results");
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &all {
        by_key.entry(r.key.clone().expect("key")).or_default().push(r.outcome.as_str().to_string());
    }
    assert_eq!(by_key.len(), FIRST_WAVE + SECOND_WAVE, "one result per key");
    let bad: Vec<_> = by_key.iter().filter(|(_, o)| o.as_slice() != ["succeeded"]).collect();
    assert!(bad.is_empty(), "keys without exactly one `succeeded`: {bad:?}");
    assert_eq!(kafka::count_records(&bootstrap, &dlq).await, 0, "dead letters");

    // The receiver saw every command, each request under its own command's key.
    let seen = receiver.seen();
    let mut requests: BTreeMap<String, usize> = BTreeMap::new();
    for (key, body) in &seen {
        let i = body["i"].as_u64().expect("payload i");
        assert_eq!(key.as_deref(), Some(format!("k{i}").as_str()), "Idempotency-Key of payload {i}");
        *requests.entry(format!("k{i}")).or_default() += 1;
    }
    assert_eq!(requests.len(), FIRST_WAVE + SECOND_WAVE, "keys the receiver saw");
    receiver.down().await;
    drop(tail);
}

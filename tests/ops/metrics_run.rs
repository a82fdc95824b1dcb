//! The docs/contract.md §10 metrics after a real run: `dedupd run` as a child on a real broker, two
//! routes (`main` with the default TTL, `brief` with a TTL of a few seconds so compaction
//! removes its keys during the test), one http sink to a scripted loopback receiver (one
//! key answered 400 for good, one 503 then 200), and a known mix of commands: distinct,
//! repeats, conflicts, a stale record and one bad record of each kind we can make.
//!
//! Once the results topic holds one record per input, `/metrics` is scraped (polled until
//! the background gauges have refreshed and compaction has run) and every docs/contract.md §10 metric is
//! checked with exact values against the ground truth: the results and dead-letter topics,
//! what the receiver answered, and the store itself once dedupd has stopped.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test ops metrics_run::`.

mod checks;
mod truth;

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use checks::{check_catalogue, check_scrape, check_status, check_store, scrape};
use common::exposition::Exposition;
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file, wait_for_http_addr};
use common::scripted::ScriptedReceiver;
use dedupd::ops::metrics::catalogue::{self as metric, CATALOGUE, MetricDef};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use truth::check_topics;

/// The admin API's token (`/v1/status`).
const ADMIN_TOKEN: &str = "metrics-run-admin-token";
/// Input partitions; every one gets records, so every one must report its lag.
const PARTITIONS: i32 = 3;
/// Distinct commands per route.
const DISTINCT: usize = 8;
/// TTL of the `brief` route: long enough that its repeats arrive before expiry and no
/// command of it goes stale on a loaded machine, short enough to see compaction.
const BRIEF_TTL: &str = "15s";
/// The key the receiver refuses for good (HTTP 400: `failed`).
const FAILING_KEY: &str = "main-0";
/// The key the receiver answers 503 once, then 200 (`transient`, then `ok`).
const FLAKY_KEY: &str = "main-1";
/// Every family a run must expose, with its type: the library's catalogue (docs/contract.md
/// §10) but [`NOT_IN_THIS_RUN`], then the process collector's `process_*` (no prefix: the
/// Prometheus client libraries' names, outside the catalogue). Among them
/// `store_write_errors_total` is at 0 unless a store write failed,
/// `transaction_commit_seconds` empty without transactional results, and
/// `state_restore_records_total`, `state_standby_records_total`, `state_standby_partitions`,
/// `fenced_total` and `stalled_transactions_aborted_total` at 0 without `store.changelog`.
fn catalogue() -> Vec<(String, &'static str)> {
    let dedupd = CATALOGUE
        .iter()
        .filter(|d| !NOT_IN_THIS_RUN.iter().any(|n| n.name == d.name))
        .map(|d| (d.exposed_name(), d.kind.as_str()));
    let process = PROCESS.iter().map(|(n, k)| (n.to_string(), *k));
    dedupd.chain(process).collect()
}

/// The catalogue's families that have no series in this run: no worker panics,
/// `state_restoring` has none until a restore (no `store.changelog` here), and the
/// intake's none without `[intake]` (tests/intake/intake.rs scrapes them).
const NOT_IN_THIS_RUN: [&MetricDef; 4] =
    [&metric::WORKER_PANICS, &metric::STATE_RESTORING, &metric::INTAKE_REQUESTS, &metric::INTAKE_DURATION];

/// The process collector's metrics and their types.
const PROCESS: [(&str, &str); 7] = [
    ("process_cpu_seconds_total", "counter"),
    ("process_max_fds", "gauge"),
    ("process_open_fds", "gauge"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_start_time_seconds", "gauge"),
    ("process_threads", "gauge"),
    ("process_virtual_memory_bytes", "gauge"),
];

/// One input record and what its result must be.
struct Input {
    kafka_key: String,
    value: Vec<u8>,
    partition: i32,
    /// Kafka timestamp to set (the stale record's is days old); `None` = now.
    timestamp_ms: Option<i64>,
    outcome: &'static str,
    /// The route in `commands_total` (`-` for records without one).
    route: &'static str,
    /// `dedupd-reason` of its dead letter, if it must have one.
    reason: Option<&'static str>,
}

fn command(key: &str, kind: &str, payload: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": key, "type": kind, "payload": payload})).expect("json")
}

fn workload() -> Vec<Input> {
    let mut out = Vec::new();
    let cmd = |route: &'static str, i: usize, payload: Value, outcome: &'static str| {
        let key = format!("{route}-{i}");
        Input {
            value: command(&key, &format!("{route}.op"), payload),
            kafka_key: key,
            partition: (i % PARTITIONS as usize) as i32,
            timestamp_ms: None,
            outcome,
            route,
            reason: None,
        }
    };
    for route in ["main", "brief"] {
        for i in 0..DISTINCT {
            let outcome = if format!("{route}-{i}") == FAILING_KEY { "failed" } else { "succeeded" };
            out.push(cmd(route, i, json!({"i": i}), outcome));
        }
    }
    // Repeats (same payload) behind their originals in the same partition, the failed
    // key's included (it replays the failure), then conflicts (same key, other payload).
    for (route, i) in [("main", 0), ("main", 2), ("main", 3), ("brief", 0), ("brief", 1)] {
        out.push(cmd(route, i, json!({"i": i}), "duplicate"));
    }
    for (route, i) in [("main", 4), ("brief", 2)] {
        out.push(cmd(route, i, json!({"i": i, "changed": true}), "conflict"));
    }
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    out.push(Input {
        timestamp_ms: Some(now_ms - 2 * 86_400_000),
        reason: Some("stale"),
        ..cmd("main", 100, json!({"old": true}), "stale")
    });
    let bad: [(&'static str, Vec<u8>); 6] = [
        ("invalid_json", b"{not json".to_vec()),
        ("missing_key", br#"{"type":"main.op","payload":{}}"#.to_vec()),
        ("bad_key", br#"{"id":"","type":"main.op","payload":{}}"#.to_vec()),
        ("no_route", command("nr-1", "other.op", json!({}))),
        ("too_large", command("big-1", "main.op", json!({"pad": "x".repeat(4096)}))),
        ("bad_field", br#"{"id":"bf-1","type":"main.op","payload":{},"ttl":"soon"}"#.to_vec()),
    ];
    for (j, (reason, value)) in bad.into_iter().enumerate() {
        out.push(Input {
            kafka_key: format!("bad-{j}"),
            value,
            partition: (j % PARTITIONS as usize) as i32,
            timestamp_ms: None,
            outcome: "rejected",
            route: "-",
            reason: Some(reason),
        });
    }
    out
}

/// Produces `inputs` in order (idempotent producer: order kept per partition); returns
/// each record's `(partition, offset)`.
async fn produce(bootstrap: &str, topic: &str, inputs: &[Input]) -> Vec<(i32, i64)> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer");
    let mut acks = Vec::new();
    for r in inputs {
        let mut rec =
            FutureRecord::to(topic).key(r.kafka_key.as_str()).payload(r.value.as_slice()).partition(r.partition);
        if let Some(ts) = r.timestamp_ms {
            rec = rec.timestamp(ts);
        }
        acks.push(producer.send_result(rec).map_err(|(e, _)| e).expect("enqueue"));
    }
    let mut out = Vec::new();
    for ack in futures::future::join_all(acks).await {
        let d = ack.expect("producer dropped").map_err(|(e, _)| e).expect("delivery");
        out.push((d.partition, d.offset));
    }
    out
}

fn config(bootstrap: &str, topics: [&str; 3], store: &Path, receiver_url: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[kafka.consumer]
"statistics.interval.ms" = "500"

[limits]
max_command_bytes = 2048

[store]
path = "{store}"

[retry]
initial_backoff = "50ms"

[sinks.receiver]
kind = "http"
url = "{receiver_url}"

[[routes]]
name = "main"
types = ["main.*"]
sink = "receiver"

[[routes]]
name = "brief"
types = ["brief.*"]
sink = "receiver"
ttl = "{BRIEF_TTL}"

[http]
listen = "127.0.0.1:0"
admin_token = "{ADMIN_TOKEN}"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, &kafka::unique("metrics-group"), input, results, dlq),
        store = store.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_run_match_what_the_run_did() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("met-in"), kafka::unique("met-results"), kafka::unique("met-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let receiver = ScriptedReceiver::start(&[(FAILING_KEY, &[400]), (FLAKY_KEY, &[503])]).await;

    let dir = KeptOnFailure::new();
    let (config_path, log, store) =
        (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"), dir.path().join("store"));
    let text = config(&bootstrap, [&input, &results, &dlq], &store, &receiver.url("/effects"));
    std::fs::write(&config_path, text).expect("write config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let http = wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");

    // Produce only once the consumer has its partitions, so that the brief route's
    // commands are consumed well within their TTL (else the stale guard would stop them).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client.get(format!("http://{http}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(dedupd.exited().is_none(), "dedupd exited:\n{}", tail_of_file(&log, 40));
        assert!(Instant::now() < deadline, "not ready within 60 s:\n{}", tail_of_file(&log, 40));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Before any record: the catalogue is there already, every series known from the config
    // at 0 (only consumer_lag waits for a committed offset to measure from).
    let fresh = scrape(&client, &http).await;
    check_catalogue(&fresh, &[&metric::CONSUMER_LAG.exposed_name()]);
    for route in ["main", "brief"] {
        for outcome in ["succeeded", "failed", "duplicate", "conflict", "indeterminate", "stale"] {
            let v = fresh.value("dedupd_commands_total", &[("outcome", outcome), ("route", route)]);
            assert_eq!(v, Some(0.0), "commands_total{{{outcome},{route}}} before any record");
        }
    }
    for status in ["ok", "transient", "permanent"] {
        let v = fresh.value("dedupd_sink_requests_total", &[("sink", "receiver"), ("status", status)]);
        assert_eq!(v, Some(0.0), "sink_requests_total{{receiver,{status}}} before any record");
    }
    for answer in ["answered", "never_sent", "maybe"] {
        let v = fresh.value("dedupd_sink_calls_total", &[("sink", "receiver"), ("answer", answer)]);
        assert_eq!(v, Some(0.0), "sink_calls_total{{receiver,{answer}}} before any record");
    }
    for answer in ["found", "absent", "unknown", "error"] {
        let v = fresh.value("dedupd_checks_total", &[("sink", "receiver"), ("answer", answer)]);
        assert_eq!(v, Some(0.0), "checks_total{{receiver,{answer}}} before any record");
    }
    for gauge in ["dedupd_indeterminate_keys", "dedupd_indeterminate_keys_unattended"] {
        let v = fresh.value(gauge, &[("sink", "receiver")]);
        assert_eq!(v, Some(0.0), "{gauge}{{receiver}} before any record");
    }
    let inputs = workload();
    let positions = produce(&bootstrap, &input, &inputs).await;
    let by_pos: BTreeMap<(i32, i64), usize> = positions.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let n_dead = inputs.iter().filter(|r| r.reason.is_some()).count();

    let published = kafka::read_all(&bootstrap, &results, inputs.len(), Duration::from_secs(90)).await;
    assert_eq!(published.len(), inputs.len(), "results within 90 s; dedupd log:\n{}", tail_of_file(&log, 40));
    let dead = kafka::read_all(&bootstrap, &dlq, n_dead, Duration::from_secs(30)).await;
    let truth = check_topics(&inputs, &by_pos, &published, &dead, &receiver);

    // Scrape until the background task has refreshed the gauges after compaction, the
    // statistics report every partition at lag 0, and the counters have caught up.
    let deadline = Instant::now() + Duration::from_secs(90);
    let scrape = loop {
        let e = scrape(&client, &http).await;
        let lags: Vec<Option<f64>> = (0..PARTITIONS)
            .map(|p| e.value("dedupd_consumer_lag", &[("topic", &input), ("partition", &p.to_string())]))
            .collect();
        let settled = e.nonzero_by("dedupd_commands_total", &["outcome", "route"]) == truth.commands
            && e.value("dedupd_compaction_removed_total", &[]) == Some(truth.brief_completed)
            && e.value("dedupd_store_records", &[("state", "completed")]) == Some(truth.main_completed)
            && e.value("dedupd_in_flight", &[]) == Some(0.0)
            && lags.iter().all(|l| *l == Some(0.0));
        if settled || Instant::now() > deadline {
            break e;
        }
        assert!(dedupd.exited().is_none(), "dedupd exited:\n{}", tail_of_file(&log, 40));
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    check_scrape(&scrape, &truth, &input);
    check_status(&client, &http, &input, &truth).await;

    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    // Nothing more than one result per input and one dead letter per bad or stale record.
    assert_eq!(kafka::count_records(&bootstrap, &results).await, inputs.len() as i64, "records in the results topic");
    assert_eq!(kafka::count_records(&bootstrap, &dlq).await, n_dead as i64, "records in the dead-letter topic");
    check_store(&store, &scrape);
    receiver.stop().await;
}

#[test]
fn exposition_parser_reads_values_help_and_type() {
    let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"z\"} 3\nb 1.5\n\
                c_bucket{le=\"+Inf\"} 2\n";
    let e = Exposition::parse(text);
    assert_eq!(e.help["a_total"], "Things.");
    assert_eq!(e.types["a_total"], "counter");
    assert_eq!(e.value("a_total", &[("x", "1"), ("y", "q\"z")]), Some(3.0));
    assert_eq!(e.value("b", &[]), Some(1.5));
    assert_eq!(e.value("c_bucket", &[("le", "+Inf")]), Some(2.0));
}

//! `dedupd_consumer_lag` on a real broker where librdkafka's own figure is wrong
//! (src/pipeline/consumer/lag.rs), checked against the broker's end offsets and the group's
//! committed offsets:
//! - under `kafka.transactional_results`, offsets are committed by the results producer,
//!   which librdkafka's consumer statistics never see: a caught-up instance must show 0,
//!   not the number of records it processed since its assignment;
//! - a partition paused for an open circuit is not fetched, so librdkafka's figure stands
//!   still: commands produced behind the outage must show as lag.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_lag::`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::exposition::scrape;
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file, wait_for_http_addr};
use serde_json::json;

const PARTITIONS: i32 = 2;

fn config(bootstrap: &str, topics: [&str; 3], store: &Path, extra_kafka: &str, sinks: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}{extra_kafka}
[store]
path = "{store}"

{sinks}
[[routes]]
types = ["ok.*"]
sink = "fine"

[[routes]]
types = ["*"]
sink = "target"

[sinks.fine]
kind = "log"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, &kafka::unique("lag-group"), input, results, dlq),
        store = store.display(),
    )
}

/// Commands `k{from}`.. of type `kind` (`ok.op` runs at the `log` sink, any other at
/// `target`).
fn commands(kind: &str, from: usize, n: usize) -> Vec<kafka::Outgoing> {
    (from..from + n)
        .map(|i| {
            let value = json!({"id": format!("k{i}"), "type": kind, "payload": {"i": i}});
            (format!("k{i}"), serde_json::to_vec(&value).expect("json"), vec![])
        })
        .collect()
}

/// Each input partition's `dedupd_consumer_lag` (`None`: no series).
async fn lags(client: &reqwest::Client, http: &str, input: &str) -> Vec<Option<f64>> {
    let e = scrape(client, http).await;
    (0..PARTITIONS)
        .map(|p| e.value("dedupd_consumer_lag", &[("topic", input), ("partition", &p.to_string())]))
        .collect()
}

/// Polls `lags` until `cond` holds of them (bounded by `within`); returns the last seen.
async fn lags_until(
    what: &str,
    (client, http, input): (&reqwest::Client, &str, &str),
    dedupd: &mut DedupdProcess,
    log: &Path,
    within: Duration,
    cond: impl Fn(&[Option<f64>]) -> bool,
) -> Vec<Option<f64>> {
    let deadline = Instant::now() + within;
    loop {
        let seen = lags(client, http, input).await;
        if cond(&seen) {
            return seen;
        }
        assert!(dedupd.exited().is_none(), "dedupd exited:\n{}", tail_of_file(log, 40));
        assert!(Instant::now() < deadline, "{what}: lags {seen:?} after {within:?}:\n{}", tail_of_file(log, 20));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

struct Run {
    bootstrap: String,
    input: String,
    results: String,
    dedupd: DedupdProcess,
    log: std::path::PathBuf,
    http: String,
    client: reqwest::Client,
    _dir: KeptOnFailure,
}

async fn start(extra_kafka: &str, sinks: &str) -> Option<Run> {
    let bootstrap = kafka::bootstrap()?;
    let (input, results, dlq) = (kafka::unique("lag-in"), kafka::unique("lag-results"), kafka::unique("lag-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let text = config(&bootstrap, [&input, &results, &dlq], &dir.path().join("store"), extra_kafka, sinks);
    std::fs::write(&config_path, text).expect("config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let http = wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await.to_string();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client.get(format!("http://{http}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(dedupd.exited().is_none(), "dedupd exited:\n{}", tail_of_file(&log, 40));
        assert!(Instant::now() < deadline, "not ready within 60 s:\n{}", tail_of_file(&log, 40));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Some(Run { bootstrap, input, results, dedupd, log, http, client, _dir: dir })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_transactional_results_a_caught_up_instance_shows_no_lag() {
    let Some(mut run) = start("transactional_results = true\n", "[sinks.target]\nkind = \"log\"\n").await else {
        return;
    };
    const N: usize = 60;
    kafka::produce_all(&run.bootstrap, &run.input, commands("lag.op", 0, N)).await;
    let published = kafka::read_all(&run.bootstrap, &run.results, N, Duration::from_secs(90)).await;
    assert_eq!(published.len(), N, "results:\n{}", tail_of_file(&run.log, 40));
    // librdkafka's own figure would read about N / PARTITIONS here, and stay there.
    let target = (&run.client, run.http.as_str(), run.input.as_str());
    lags_until("every partition at 0", target, &mut run.dedupd, &run.log, Duration::from_secs(60), |l| {
        l.iter().all(|l| *l == Some(0.0))
    })
    .await;
    assert!(run.dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_for_an_open_circuit_shows_its_backlog() {
    // Nothing listens there: every call is refused, and the circuit opens after 3.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let sinks = format!(
        "[sinks.target]\nkind = \"http\"\nurl = \"http://127.0.0.1:{port}/x\"\nconnect_timeout = \"1s\"\n\n\
         [sinks.target.circuit]\nfailure_threshold = 3\nprobe_backoff = \"30s\"\nmax_probe_backoff = \"60s\"\n"
    );
    let Some(mut run) = start("", &sinks).await else { return };
    // First commands that succeed, so that every partition has a committed offset to
    // measure from (a fresh group has none: then there is no series, as for any consumer).
    kafka::produce_all(&run.bootstrap, &run.input, commands("ok.op", 1000, 20)).await;
    let target = (&run.client, run.http.as_str(), run.input.as_str());
    lags_until(
        "a committed offset on every partition",
        target,
        &mut run.dedupd,
        &run.log,
        Duration::from_secs(60),
        |l| l.iter().all(|l| *l == Some(0.0)),
    )
    .await;
    kafka::produce_all(&run.bootstrap, &run.input, commands("lag.op", 0, 6)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while scrape(&run.client, &run.http).await.value("dedupd_sink_circuit_open", &[("sink", "target")]) != Some(1.0) {
        assert!(Instant::now() < deadline, "no open circuit:\n{}", tail_of_file(&run.log, 30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The backlog produced behind the outage: librdkafka's figure would stand where the
    // pause left it, at a few records.
    const BEHIND: usize = 200;
    kafka::produce_all(&run.bootstrap, &run.input, commands("lag.op", 100, BEHIND)).await;
    let seen = lags_until("the backlog in the lag", target, &mut run.dedupd, &run.log, Duration::from_secs(60), |l| {
        l.iter().map(|l| l.unwrap_or(0.0)).sum::<f64>() >= BEHIND as f64
    })
    .await;
    let total: f64 = seen.iter().map(|l| l.unwrap_or(0.0)).sum();
    assert!(total <= (BEHIND + 6) as f64, "more lag than records produced: {seen:?}");
    assert!(run.dedupd.terminate(Duration::from_secs(60)).is_some_and(|s| s.success()), "stop");
}

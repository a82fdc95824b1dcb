//! A partition's batches overlap at their last durability point (src/pipeline/worker/overlap.rs),
//! seen from outside on a real broker: `dedupd run` as a child with batches of one record,
//! an http sink to a loopback receiver, and the failpoint `overlap.last_point` holding every
//! last durability point 1.5 s. Two commands wait on one partition before it starts. The
//! second one's sink call must come while the first one's point is held, before the first
//! one's result is published. The first result must still wait for its point (results only
//! after durable completions).
//!
//! Needs the `failpoints` feature (scripts/test passes it). Run with
//! `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test engine batch_overlap::`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, TopicTail, tail_of_file};
use dedupd::outcome::ResultRecord;
use rdkafka::message::Message;
use serde_json::{Value, json};

/// How long the failpoint holds each last durability point.
const HOLD_MS: u64 = 1500;

fn config(bootstrap: &str, topics: [&str; 3], store: &Path, url: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[store]
path = "{store}"

[pipeline]
batch_size = 1

[sinks.receiver]
kind = "http"
url = "{url}"

[sinks.receiver.limits]
max_concurrency = 4

[[routes]]
types = ["overlap.*"]
sink = "receiver"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, &kafka::unique("overlap-group"), input, results, dlq),
        store = store.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_batch_runs_while_the_last_durability_point_is_held_and_results_wait_for_it() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !cfg!(feature = "failpoints") {
        let why = "this test holds a durability point with a failpoint: run it with `--features failpoints`";
        assert!(std::env::var("DEDUPD_REQUIRE_KAFKA").is_err(), "{why}");
        println!("skipped: {why}");
        return;
    }
    let (input, results, dlq) =
        (kafka::unique("overlap-in"), kafka::unique("overlap-results"), kafka::unique("overlap-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;
    // Answers at once: the sink call's time is all the test reads.
    let receiver = SlowReceiver::start((0, 0), 0).await;
    let url = receiver.url("/effects");

    // Both commands wait on the partition before dedupd starts, so the second is queued
    // when the first one's batch ends.
    let commands = (0..2u64)
        .map(|i| {
            let value = json!({"id": format!("o{i}"), "type": "overlap.op", "payload": {"i": i}});
            (format!("o{i}"), serde_json::to_vec(&value).expect("json"), vec![])
        })
        .collect();
    kafka::produce_all(&bootstrap, &input, commands).await;

    let dir = KeptOnFailure::new();
    let (config_path, log, store) =
        (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"), dir.path().join("store"));
    std::fs::write(&config_path, config(&bootstrap, [&input, &results, &dlq], &store, &url)).expect("config");
    let tail = TopicTail::start(&bootstrap, &results, 1);
    let hold = format!("overlap.last_point=return({HOLD_MS})");
    let args = ["run", "-c", config_path.to_str().expect("utf-8")];
    let mut dedupd = DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", hold.as_str())], &log);
    let deadline = Instant::now() + Duration::from_secs(90);
    while tail.len() < 2 {
        assert!(dedupd.exited().is_none(), "dedupd exited:\n{}", tail_of_file(&log, 40));
        assert!(Instant::now() < deadline, "no two results within 90 s; dedupd log:\n{}", tail_of_file(&log, 40));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    let arrivals: Vec<(u64, i64)> = receiver
        .seen()
        .iter()
        .map(|seen| {
            let body: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
            (body["i"].as_u64().unwrap_or(u64::MAX), seen.at_unix_ms)
        })
        .collect();
    receiver.stop().await;
    let called = |i: u64| arrivals.iter().find(|(n, _)| *n == i).map(|(_, at)| *at);
    let (Some(first_call), Some(second_call)) = (called(0), called(1)) else {
        panic!("both commands should reach the sink once: {arrivals:?}");
    };
    assert_eq!(arrivals.len(), 2, "each command called once: {arrivals:?}");
    let mut published = std::collections::HashMap::new();
    for m in tail.since(0) {
        let r: ResultRecord = serde_json::from_slice(m.payload().expect("payload")).expect("result record");
        assert_eq!(r.outcome.as_str(), "succeeded", "{r:?}");
        let at = m.timestamp().to_millis().expect("a result's timestamp");
        published.insert(r.key.clone().expect("key"), at);
    }
    let (first_result, second_result) = (published["o0"], published["o1"]);
    assert!(
        second_call < first_result,
        "the second batch's call ({second_call}) should come while the first batch's last durability point is held, before its result ({first_result})"
    );
    assert!(
        first_result >= first_call + HOLD_MS as i64 - 50,
        "the first result ({first_result}) should wait for its held durability point (call at {first_call}, held {HOLD_MS} ms)"
    );
    assert!(first_result <= second_result, "results in offset order: {first_result} then {second_result}");
}

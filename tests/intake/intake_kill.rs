//! The intake across a `kill -9` (docs/intake.md, contract §4): a request whose command is
//! in its sink's call when dedupd is SIGKILLed gets no answer; after the restart its repeat
//! gets the crash rules' answer. The sink does not forward the key and has no check, so the
//! call that may have landed is never made again: the repeat is answered 502
//! `indeterminate` with the place to poll, the key reads `indeterminate`, and the receiver
//! saw one request.

use crate::common;

use std::time::Duration;

use common::intake::{Door, problem_type};
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, tail_of_file, wait_until};
use reqwest::StatusCode;
use serde_json::json;

const KEY: &str = "alice-key-0123456789abcdef";
/// The receiver takes the request and answers this much later: the kill lands in between.
const SINK_MS: u64 = 6_000;

fn config(bootstrap: &str, topics: [&str; 3], store: &std::path::Path, url: &str) -> String {
    let rest = format!(
        r#"
[sinks.pay]
kind = "http"
url = "{url}"
forward_key = false
request_timeout = "20s"

[[routes]]
types = ["*"]
sink = "pay"

[intake]
listen = "127.0.0.1:0"
wait = "20s"

[intake.clients.alice]
api_key = "{KEY}"
"#,
    );
    common::intake::dedupd_toml(bootstrap, "intake-kill-dedupd", topics, store, &rest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_a_kill_in_the_call_gets_the_crash_rules_answer_and_no_second_call() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topics = [kafka::unique("intake-kill-in"), kafka::unique("intake-kill-out"), kafka::unique("intake-kill-dlq")];
    kafka::create_topics(&bootstrap, &[(&topics[0], 2), (&topics[1], 2), (&topics[2], 1)]).await;
    let receiver = SlowReceiver::start((SINK_MS, SINK_MS), 1).await;
    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let names = [topics[0].as_str(), topics[1].as_str(), topics[2].as_str()];
    std::fs::write(&config_path, config(&bootstrap, names, &dir.path().join("store"), &receiver.url("/pay")))
        .expect("write config");
    let charge = json!({"amount": 1200, "customer": "c_42"});

    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let door = Door::when_ready(&log, &mut dedupd).await;
    let first = {
        let request = door.post(KEY, "payment.charge", Some("order-9")).body(charge.to_string());
        tokio::spawn(async move { request.send().await })
    };
    assert!(wait_until(Duration::from_secs(30), || receiver.count() == 1).await, "the call never reached the sink");
    dedupd.kill();
    let first = first.await.expect("task");
    assert!(first.is_err(), "the killed process answered: {first:?}");

    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let door = Door::when_ready(&log, &mut dedupd).await;
    let (status, replayed, body) = door.send(KEY, "payment.charge", "order-9", charge.clone()).await;
    assert_eq!((status, problem_type(&body)), (StatusCode::BAD_GATEWAY, "indeterminate"), "{body}");
    assert_eq!(replayed, None);
    let (status, state) = door.get(KEY, "/v1/commands/order-9").await;
    assert_eq!((status, state["state"].as_str()), (StatusCode::OK, Some("indeterminate")), "{state}");
    // The repeat has the key's partition after the killed request's record (one key, one
    // partition), so both were decided when it was answered: each got its result, and
    // neither called the sink (no check: nothing is asked again later either).
    let results = kafka::read_all(&bootstrap, &topics[1], 2, Duration::from_secs(30)).await;
    let outcomes: Vec<String> = results
        .iter()
        .map(|r| {
            let v: serde_json::Value =
                serde_json::from_slice(rdkafka::Message::payload(r).unwrap_or_default()).expect("result json");
            v["outcome"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(outcomes, ["indeterminate", "indeterminate"]);
    assert_eq!(receiver.count(), 1, "the call that may have landed was made again");
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", tail_of_file(&log, 40));
}

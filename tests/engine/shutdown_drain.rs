//! Shutdown with several busy partitions on a real broker (docs/sinks.md, "Shutdown and
//! revoke"): `dedupd run` as a child with an http sink to a slow loopback receiver and a
//! backlog on every partition. On SIGTERM every partition is let go at once: no request
//! starts after the signal, the calls under way are answered and completed, the process
//! exits within one drain bound (not one per partition), and what was never called was
//! released: a restart runs every command to exactly one `succeeded` (the sink does not
//! forward the key, so a claim left behind would come back `indeterminate`).
//!
//! The clean stop saves the presence filter and the restart reads it back instead of
//! scanning the store (`store::scan::saved`): repeats of the commands the first run
//! completed are then replays, with no second call.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test engine shutdown_drain::`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use common::kafka;
use common::process::{
    DedupdProcess, KeptOnFailure, TopicTail, tail_of_file, until, wait_for_http_addr, wait_for_line,
};
use dedupd::outcome::ResultRecord;
use parking_lot::Mutex;
use rdkafka::message::Message;
use serde_json::{Value, json};

const PARTITIONS: i32 = 4;
const COMMANDS: usize = 40;
/// How long the receiver takes to answer each request.
const SLOW: Duration = Duration::from_secs(4);

/// When each request arrived, and its payload's `i`; `slow` says whether to answer slowly.
#[derive(Default)]
struct Receiver {
    arrivals: Mutex<Vec<(Instant, u64)>>,
    slow: Mutex<bool>,
}

async fn receive(State(r): State<Arc<Receiver>>, Json(body): Json<Value>) -> Json<Value> {
    r.arrivals.lock().push((Instant::now(), body["i"].as_u64().unwrap_or(u64::MAX)));
    let slow = *r.slow.lock();
    if slow {
        tokio::time::sleep(SLOW).await;
    }
    Json(json!({"accepted": true}))
}

fn config(bootstrap: &str, topics: [&str; 3], store: &Path, url: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[store]
path = "{store}"

[pipeline]
max_in_flight = 4

[sinks.receiver]
kind = "http"
url = "{url}"
forward_key = false
request_timeout = "20s"

[sinks.receiver.limits]
max_concurrency = 2

[[routes]]
types = ["drain.*"]
sink = "receiver"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, &kafka::unique("drain-group"), input, results, dlq),
        store = store.display(),
    )
}

fn commands() -> Vec<kafka::Outgoing> {
    commands_of(0..COMMANDS as u64)
}

/// The commands numbered `numbers`, each with its key and payload.
fn commands_of(numbers: impl IntoIterator<Item = u64>) -> Vec<kafka::Outgoing> {
    numbers
        .into_iter()
        .map(|i| {
            let value = json!({"id": format!("k{i}"), "type": "drain.op", "payload": {"i": i}});
            (format!("k{i}"), serde_json::to_vec(&value).expect("json"), vec![])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_every_partition_go_at_once_and_starts_no_call_after_the_signal() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("drain-in"), kafka::unique("drain-results"), kafka::unique("drain-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let receiver = Arc::new(Receiver { slow: Mutex::new(true), ..Receiver::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/effects", listener.local_addr().expect("addr"));
    let app = axum::Router::new().fallback(axum::routing::post(receive)).with_state(Arc::clone(&receiver));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = KeptOnFailure::new();
    let (config_path, log, store) =
        (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"), dir.path().join("store"));
    std::fs::write(&config_path, config(&bootstrap, [&input, &results, &dlq], &store, &url)).expect("config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    let tail = TopicTail::start(&bootstrap, &results, 1);
    kafka::produce_all(&bootstrap, &input, commands()).await;
    // Two calls at a time (the sink's limit), each 4 s: the backlog keeps every partition busy.
    until("the first calls", Duration::from_secs(60), &mut dedupd, &log, || receiver.arrivals.lock().len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let signalled = Instant::now();
    let status = dedupd.terminate(Duration::from_secs(60));
    let took = signalled.elapsed();
    assert!(status.is_some_and(|s| s.success()), "dedupd did not stop cleanly:\n{}", tail_of_file(&log, 40));
    let late: Vec<_> = receiver.arrivals.lock().iter().filter(|(at, _)| *at > signalled).map(|(_, i)| *i).collect();
    assert!(late.is_empty(), "requests started after the signal: {late:?}");
    assert!(took < SLOW + Duration::from_secs(6), "shutdown took {took:?}: one bound, not one per partition");
    let before = receiver.arrivals.lock().len();
    assert!(before < COMMANDS, "the backlog was not reached: {before} calls");
    assert!(store.join("dedupd-presence.saved").exists(), "the clean stop saved no presence filter");

    // Restart with a fast receiver: every command ends `succeeded` exactly once.
    *receiver.slow.lock() = false;
    let called_first: Vec<u64> = receiver.arrivals.lock().iter().map(|(_, i)| *i).collect();
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let read_back = wait_for_line(&log, dedupd.log_start, "presence filter read back", Duration::from_secs(60), || {
        dedupd.exited().is_some()
    })
    .await;
    assert!(
        read_back.is_some(),
        "the restart scanned instead of reading the saved filter:\n{}",
        tail_of_file(&log, 40)
    );
    until("every result", Duration::from_secs(120), &mut dedupd, &log, || tail.len() >= COMMANDS).await;
    // Repeats of what the first run completed: found through the filter read back, each
    // answered `duplicate` from its stored result.
    kafka::produce_all(&bootstrap, &input, commands_of(called_first.iter().copied())).await;
    let all = COMMANDS + called_first.len();
    until("the repeats' results", Duration::from_secs(60), &mut dedupd, &log, || tail.len() >= all).await;
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "second stop");
    let repeats: Vec<(Option<String>, &str, bool)> = tail
        .since(COMMANDS)
        .iter()
        .map(|m| {
            let r: ResultRecord = serde_json::from_slice(m.payload().expect("payload")).expect("result record");
            (r.key, r.outcome.as_str(), r.replay)
        })
        .collect();
    let replays = repeats.iter().filter(|(_, outcome, replay)| *replay && *outcome == "duplicate").count();
    assert_eq!(replays, called_first.len(), "every repeat replayed: {repeats:?}");
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in tail.since(0).into_iter().take(COMMANDS) {
        let r: ResultRecord = serde_json::from_slice(m.payload().expect("payload")).expect("result record");
        by_key.entry(r.key.clone().expect("key")).or_default().push(r.outcome.as_str().to_string());
    }
    let bad: Vec<_> = by_key.iter().filter(|(_, o)| o.as_slice() != ["succeeded"]).collect();
    assert!(bad.is_empty() && by_key.len() == COMMANDS, "keys without exactly one `succeeded`: {bad:?}");
    assert_eq!(receiver.arrivals.lock().len(), COMMANDS, "every command called once");
    server.abort();
    drop(tail);
}

//! `dedupd run` SIGKILLed again and again while it charges cards through one slow HTTP
//! sink that does not forward the key (tests/kafka/kafka_kill_unsent.rs,
//! tests/kafka/kafka_kill_transactional.rs): the config, the commands, the kill loop and what
//! the results topic and the sink saw.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use dedupd::outcome::{Outcome, ResultRecord};
use rdkafka::message::Message;

use super::kafka;
use super::process::{DedupdProcess, SlowReceiver, SplitMix, TopicTail, tail_of_file};

/// The config: `kafka_extra` goes into `[kafka]`, `pipeline` into `[pipeline]` (TOML lines).
pub fn config_toml(
    bootstrap: &str,
    group: &str,
    topics: [&str; 3],
    store: &Path,
    sink_url: &str,
    kafka_extra: &str,
    pipeline: &str,
) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}{kafka_extra}
[store]
path = {store:?}

[pipeline]
{pipeline}

[http]
listen = "127.0.0.1:0"

[log]
format = "json"

[sinks.pay]
kind = "http"
url = "{sink_url}"
forward_key = false
request_timeout = "10s"

[[routes]]
name = "pay"
types = ["*"]
sink = "pay"
"#,
        kafka_table = kafka::kafka_table(bootstrap, group, input, results, dlq),
        store = store.to_str().expect("utf-8 path"),
    )
}

/// The idempotency key of command `i`; also in its payload, since a sink that does not
/// forward the key sends no `Idempotency-Key` header.
pub fn key(i: usize) -> String {
    format!("pay-{i}")
}

/// Command `i`, to `partition`.
pub fn command(i: usize, partition: i32) -> kafka::OutgoingTo {
    let value = serde_json::json!({"id": key(i), "type": "card.charge", "payload": {"key": key(i), "amount": i}});
    (format!("k{i}"), value.to_string().into_bytes(), Vec::new(), Some(partition))
}

/// Every result record in `tail`, parsed; an unreadable one fails the test.
pub fn results(tail: &TopicTail) -> Vec<ResultRecord> {
    tail.since(0)
        .iter()
        .map(|m| serde_json::from_slice::<ResultRecord>(m.payload().unwrap_or_default()).expect("a result record"))
        .collect()
}

/// Runs `kills` incarnations of `dedupd run -c config`, each SIGKILLed at a random moment
/// `kill_after_ms` after its first request to the sink.
pub async fn kill_repeatedly(
    config: &Path,
    log: &Path,
    receiver: &SlowReceiver,
    kills: usize,
    kill_after_ms: (u64, u64),
    rng: &mut SplitMix,
) {
    for _ in 0..kills {
        let mut p = DedupdProcess::run(config, log);
        wait_for_a_request(receiver, receiver.count(), &mut p, log).await;
        tokio::time::sleep(Duration::from_millis(rng.between(kill_after_ms.0, kill_after_ms.1))).await;
        p.kill();
    }
}

/// Runs one incarnation of `dedupd run -c config` that SIGKILLs itself at crash point
/// `transaction.delivered` (src/crash.rs) the first time it reaches it after passing it
/// `passes` times: a kill that always leaves a transaction's records delivered and not
/// committed, where random kills land only now and then. Fails with the log if it does not
/// die so within a minute.
pub async fn kill_inside_a_transaction(config: &Path, log: &Path, passes: usize) {
    use std::os::unix::process::ExitStatusExt;
    let failpoints = format!("transaction.delivered={passes}*off->return");
    let config = config.to_str().expect("utf-8 config path");
    let mut p = DedupdProcess::spawn_with_env(&["run", "-c", config], &[("FAILPOINTS", failpoints.as_str())], log);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = p.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "not killed inside a transaction within 60 s; log:\n{}",
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        status.signal(),
        Some(9),
        "exited otherwise than by its own SIGKILL: {status:?}; log:\n{}",
        tail_of_file(log, 40)
    );
}

/// Waits until the receiver has seen more than `before` requests; fails with the log if the
/// process exits or nothing arrives within a minute.
async fn wait_for_a_request(receiver: &SlowReceiver, before: usize, p: &mut DedupdProcess, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.count() <= before {
        let exited = p.exited();
        assert!(
            Instant::now() < deadline && exited.is_none(),
            "no request within 60 s (exited: {exited:?}); log:\n{}",
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every input position has a result in `tail`; fails with the log otherwise.
pub async fn wait_for_every_result(tail: &TopicTail, inputs: &[(i32, i64)], p: &mut DedupdProcess, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let seen: HashSet<(i32, i64)> = results(tail).iter().map(|r| (r.source.partition, r.source.offset)).collect();
        let done = inputs.iter().filter(|i| seen.contains(i)).count();
        if done == inputs.len() {
            return;
        }
        let exited = p.exited();
        assert!(
            Instant::now() < deadline && exited.is_none(),
            "{done} of {} results (exited: {exited:?}); log:\n{}",
            inputs.len(),
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How often the sink was called for each key (the key is in each request's body).
pub fn calls_per_key(receiver: &SlowReceiver) -> HashMap<String, usize> {
    let mut calls = HashMap::new();
    for s in receiver.seen() {
        let body: serde_json::Value = serde_json::from_slice(&s.body).expect("json body");
        *calls.entry(body["key"].as_str().expect("key in the body").to_string()).or_default() += 1;
    }
    calls
}

/// The keys whose committed result is `succeeded` and those whose is `indeterminate`;
/// fails unless every key that succeeded was called and none is both.
pub fn succeeded_and_indeterminate<'a>(
    seen: &'a [ResultRecord],
    calls: &HashMap<String, usize>,
) -> (HashSet<&'a str>, HashSet<&'a str>) {
    let keys_with = |outcome: Outcome| -> HashSet<&str> {
        seen.iter().filter(|r| r.outcome == outcome).filter_map(|r| r.key.as_deref()).collect()
    };
    let (succeeded, indeterminate) = (keys_with(Outcome::Succeeded), keys_with(Outcome::Indeterminate));
    let uncalled: Vec<_> = succeeded.iter().filter(|k| !calls.contains_key(**k)).take(5).collect();
    assert!(uncalled.is_empty(), "succeeded without a call: {uncalled:?}");
    assert!(succeeded.is_disjoint(&indeterminate), "a key both succeeded and indeterminate");
    (succeeded, indeterminate)
}

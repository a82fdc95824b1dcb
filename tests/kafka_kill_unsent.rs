//! Claims only for calls that can start (src/engine/ticket.rs), seen from a crash: after
//! SIGKILLs, the `indeterminate` keys whose sink never saw a call are at most 1% of the
//! `indeterminate` keys.
//!
//! A key is `indeterminate` when a crash leaves its claim without a completion and its sink
//! does not forward the key. Such a key whose sink *never saw a call* is one an operator
//! resolves for nothing: its claim was durable while it waited for something else (a slot,
//! a rate token, a circuit). With tickets taken before the claim, what remains is the moment
//! between a claim's fsync and its request leaving, so the share of such keys is about one
//! fsync against one sink call. The sink here answers after 1–2 s, as a slow payment API
//! does; with sink calls of a few milliseconds that share grows toward one half, and no
//! ordering of the work can shrink it (a "sent" marker would need its own fsync before the
//! request, which leaves the same window).
//!
//! `dedupd run` on the real broker, one non-forwarding HTTP sink that records every request
//! on arrival, every command produced at the start; ten incarnations each SIGKILLed at a
//! random moment 0.3–1.5 s after its first request, then one that runs until every input has
//! a result. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka_kill_unsent -- --nocapture`.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, seed_from_env, tail_of_file};
use dedupd::outcome::{Outcome, ResultRecord};
use rdkafka::message::Message;

const PARTITIONS: i32 = 6;
const COMMANDS: usize = 800;
const KILLS: usize = 10;
const MAX_IN_FLIGHT: usize = 64;
/// How long the sink takes to answer, at random in this range.
const SINK_DELAY_MS: (u64, u64) = (1_000, 2_000);
/// When a kill lands, after the incarnation's first request.
const KILL_AFTER_MS: (u64, u64) = (300, 1_500);

fn config_toml(bootstrap: &str, group: &str, topics: [&str; 3], store: &Path, sink_url: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[store]
path = {store:?}

[pipeline]
max_in_flight = {MAX_IN_FLIGHT}

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
fn key(i: usize) -> String {
    format!("pay-{i}")
}

fn commands() -> Vec<kafka::OutgoingTo> {
    (0..COMMANDS)
        .map(|i| {
            let value =
                serde_json::json!({"id": key(i), "type": "card.charge", "payload": {"key": key(i), "amount": i}});
            (format!("k{i}"), value.to_string().into_bytes(), Vec::new(), Some(i as i32 % PARTITIONS))
        })
        .collect()
}

/// Every result record in `tail`, parsed.
fn results(tail: &TopicTail) -> Vec<ResultRecord> {
    tail.since(0).iter().filter_map(|m| serde_json::from_slice::<ResultRecord>(m.payload()?).ok()).collect()
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

/// Waits until every input position has a result; fails with the log otherwise.
async fn wait_for_every_result(tail: &TopicTail, inputs: &[(i32, i64)], p: &mut DedupdProcess, log: &Path) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kills_almost_every_indeterminate_key_had_its_call() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let seed = seed_from_env("KAFKA_KILL_UNSENT_SEED");
    println!("seed {seed} (replay the kill timing with KAFKA_KILL_UNSENT_SEED={seed})");
    let mut rng = SplitMix(seed);
    let (input, results_topic, dlq) =
        (kafka::unique("unsent-in"), kafka::unique("unsent-out"), kafka::unique("unsent-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results_topic, 3), (&dlq, 1)]).await;
    let receiver = SlowReceiver::start(SINK_DELAY_MS, seed).await;
    let dir = KeptOnFailure::new();
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let group = kafka::unique("unsent-dedupd");
    let toml = config_toml(
        &bootstrap,
        &group,
        [&input, &results_topic, &dlq],
        &dir.path().join("store"),
        &receiver.url("/pay"),
    );
    std::fs::write(&config, toml).expect("write config");
    let tail = TopicTail::start(&bootstrap, &results_topic, 3);
    let inputs = kafka::produce_all_to(&bootstrap, &input, commands()).await;

    for _ in 0..KILLS {
        let mut p = DedupdProcess::run(&config, &log);
        wait_for_a_request(&receiver, receiver.count(), &mut p, &log).await;
        tokio::time::sleep(Duration::from_millis(rng.between(KILL_AFTER_MS.0, KILL_AFTER_MS.1))).await;
        p.kill();
    }
    let mut last = DedupdProcess::run(&config, &log);
    wait_for_every_result(&tail, &inputs, &mut last, &log).await;
    last.terminate(Duration::from_secs(30));

    let called: Vec<String> = receiver
        .seen()
        .iter()
        .map(|s| {
            let body: serde_json::Value = serde_json::from_slice(&s.body).expect("json body");
            body["key"].as_str().expect("key in the body").to_string()
        })
        .collect();
    let mut calls: HashMap<&str, usize> = HashMap::new();
    for k in &called {
        *calls.entry(k.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "a non-forwarding sink called twice for one key: {twice:?}");
    let indeterminate: HashSet<String> =
        results(&tail).into_iter().filter(|r| r.outcome == Outcome::Indeterminate).filter_map(|r| r.key).collect();
    let never_called: Vec<&String> = indeterminate.iter().filter(|k| !calls.contains_key(k.as_str())).collect();
    tail.stop();
    receiver.stop().await;
    println!(
        "{KILLS} kills: {} indeterminate keys, {} of them never called ({:.2}%); {} calls for {COMMANDS} commands",
        indeterminate.len(),
        never_called.len(),
        100.0 * never_called.len() as f64 / indeterminate.len().max(1) as f64,
        called.len()
    );
    assert!(indeterminate.len() >= KILLS, "the kills landed during calls: {} indeterminate keys", indeterminate.len());
    assert!(
        never_called.len() * 100 <= indeterminate.len(),
        "{} of {} indeterminate keys were never called: {never_called:?}",
        never_called.len(),
        indeterminate.len()
    );
}

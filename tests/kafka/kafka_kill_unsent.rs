//! Claims only for calls that can start (src/engine/ticket.rs), seen from a crash: after
//! SIGKILLs, the `indeterminate` keys whose sink never saw a call are at most 1% of the
//! `indeterminate` keys.
//!
//! A key is `indeterminate` when a crash leaves its claim without a completion and its sink
//! does not forward the key. Such a key whose sink *never saw a call* is one an operator
//! resolves for nothing: its claim was durable while it waited for something else (a slot,
//! a rate token, a circuit). With tickets taken before the claim, what remains is the moment
//! between a claim's fsync and its request leaving, so the share of such keys is about one
//! fsync against one sink call. The sink here answers after 2–4 s, as a slow payment API
//! does; with sink calls of a few milliseconds that share grows toward one half, and no
//! ordering of the work can shrink it (a "sent" marker would need its own fsync before the
//! request, which leaves the same window). The moment runs from the claim's write (the page
//! cache outlives a SIGKILL) through the fsync to the request's arrival, so on a machine
//! whose disk is busy it grows: beside a release build, with calls of 1–2 s, 8 of 648 keys
//! (1.2%) were never called, most of them, it seems, claims one kill caught in a slow group
//! commit. Calls of 3 s on average halve that share.
//!
//! `dedupd run` on the real broker, one non-forwarding HTTP sink that records every request
//! on arrival, every command produced at the start; ten incarnations each SIGKILLed at a
//! random moment 0.3–3 s after its first request (before or after the first calls end, when
//! freed permits let other partitions claim), then one that runs until every input has
//! a result. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_kill_unsent:: -- --nocapture`.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::kafka;
use common::pay_kills::{self, calls_per_key, kill_repeatedly, results, wait_for_every_result};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, seed_from_env};
use dedupd::outcome::Outcome;

const PARTITIONS: i32 = 6;
const COMMANDS: usize = 800;
const KILLS: usize = 10;
const MAX_IN_FLIGHT: usize = 64;
/// How long the sink takes to answer, at random in this range.
const SINK_DELAY_MS: (u64, u64) = (2_000, 4_000);
/// When a kill lands, after the incarnation's first request.
const KILL_AFTER_MS: (u64, u64) = (300, 3_000);

fn commands() -> Vec<kafka::OutgoingTo> {
    (0..COMMANDS).map(|i| pay_kills::command(i, i as i32 % PARTITIONS)).collect()
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
    let toml = pay_kills::config_toml(
        &bootstrap,
        &group,
        [&input, &results_topic, &dlq],
        &dir.path().join("store"),
        &receiver.url("/pay"),
        "",
        &format!("max_in_flight = {MAX_IN_FLIGHT}"),
    );
    std::fs::write(&config, toml).expect("write config");
    let tail = TopicTail::start(&bootstrap, &results_topic, 3);
    let inputs = kafka::produce_all_to(&bootstrap, &input, commands()).await;

    kill_repeatedly(&config, &log, &receiver, KILLS, KILL_AFTER_MS, &mut rng).await;
    let mut last = DedupdProcess::run(&config, &log);
    wait_for_every_result(&tail, &inputs, &mut last, &log).await;
    last.terminate(Duration::from_secs(30));

    let calls = calls_per_key(&receiver);
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
        calls.values().sum::<usize>()
    );
    assert!(indeterminate.len() >= KILLS, "the kills landed during calls: {} indeterminate keys", indeterminate.len());
    assert!(
        never_called.len() * 100 <= indeterminate.len(),
        "{} of {} indeterminate keys were never called: {never_called:?}",
        never_called.len(),
        indeterminate.len()
    );
}

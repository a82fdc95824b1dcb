//! The crash window settled by asking the receiver (docs/contract.md §4): `dedupd run` on
//! the real broker SIGKILLed ten times while it charges cards through a slow HTTP sink that
//! does not forward the key, as tests/kafka_kill_unsent.rs does, but the sink has a check
//! (`GET /lookup?key=...`, a payments API's search by reference). A claim a kill left in
//! progress is checked when its command is redelivered: found → `succeeded` with the
//! lookup's answer as the result, absent → run. So after the kills no card is charged twice,
//! every card is charged exactly once, and no key is left `indeterminate` for a person
//! (without the check about 3% of the keys are).
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test kafka_kill_checked -- --nocapture`.

mod common;

use std::time::Duration;

use common::kafka;
use common::pay_kills::{self, calls_per_key, kill_repeatedly, results, wait_for_every_result};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, seed_from_env};
use dedupd::outcome::Outcome;

const PARTITIONS: i32 = 6;
const COMMANDS: usize = 600;
const KILLS: usize = 10;
const MAX_IN_FLIGHT: usize = 64;
/// How long the sink takes to answer, at random in this range (it records a payment when
/// the request arrives, as a payment API does before it answers).
const SINK_DELAY_MS: (u64, u64) = (1_000, 3_000);
/// When a kill lands, after the incarnation's first request.
const KILL_AFTER_MS: (u64, u64) = (300, 2_500);

/// The sink's check: the lookup by the key the payload carries, found when the answer
/// lists a payment. Its delay is short: the receiver records a request as it arrives, and
/// a killed process sends nothing more.
fn check_table(lookup: &str) -> String {
    format!(
        "\n[sinks.pay.check]\nurl = \"{lookup}?key={{/key}}\"\nfound_pointer = \"/payments/0\"\ndelay = \"500ms\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kills_every_key_is_charged_once_and_none_is_left_indeterminate() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let seed = seed_from_env("KAFKA_KILL_CHECKED_SEED");
    println!("seed {seed} (replay the kill timing with KAFKA_KILL_CHECKED_SEED={seed})");
    let mut rng = SplitMix(seed);
    let (input, results_topic, dlq) =
        (kafka::unique("checked-in"), kafka::unique("checked-out"), kafka::unique("checked-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results_topic, 3), (&dlq, 1)]).await;
    let receiver = SlowReceiver::start(SINK_DELAY_MS, seed).await;
    let dir = KeptOnFailure::new();
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let mut toml = pay_kills::config_toml(
        &bootstrap,
        &kafka::unique("checked-dedupd"),
        [&input, &results_topic, &dlq],
        &dir.path().join("store"),
        &receiver.url("/pay"),
        "",
        &format!("max_in_flight = {MAX_IN_FLIGHT}"),
    );
    toml.push_str(&check_table(&receiver.url("/lookup")));
    std::fs::write(&config, toml).expect("write config");
    let tail = TopicTail::start(&bootstrap, &results_topic, 3);
    let commands: Vec<kafka::OutgoingTo> =
        (0..COMMANDS).map(|i| pay_kills::command(i, i as i32 % PARTITIONS)).collect();
    let inputs = kafka::produce_all_to(&bootstrap, &input, commands).await;

    kill_repeatedly(&config, &log, &receiver, KILLS, KILL_AFTER_MS, &mut rng).await;
    let mut last = DedupdProcess::run(&config, &log);
    wait_for_every_result(&tail, &inputs, &mut last, &log).await;
    last.terminate(Duration::from_secs(30));

    let calls = calls_per_key(&receiver);
    let published = results(&tail);
    tail.stop();
    let lookups = receiver.lookups();
    receiver.stop().await;
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "a non-forwarding sink called twice for one key: {twice:?}");
    assert_eq!(calls.len(), COMMANDS, "every card charged: {} of {COMMANDS}", calls.len());
    let indeterminate: Vec<_> =
        published.iter().filter(|r| r.outcome == Outcome::Indeterminate).filter_map(|r| r.key.clone()).collect();
    let found_by_check =
        published.iter().filter(|r| r.outcome == Outcome::Succeeded && r.result["body"]["payments"].is_array()).count();
    println!(
        "{KILLS} kills: {} calls for {COMMANDS} commands, {lookups} lookups, {found_by_check} settled by the check, {} indeterminate",
        calls.values().sum::<usize>(),
        indeterminate.len()
    );
    assert!(indeterminate.is_empty(), "keys left indeterminate: {indeterminate:?}");
    assert!(lookups > 0 && found_by_check > 0, "the kills left claims for the check to settle ({lookups} lookups)");
    let failed: Vec<_> = published.iter().filter(|r| r.outcome == Outcome::Failed).collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}

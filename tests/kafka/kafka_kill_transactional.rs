//! Transactional results (`kafka.transactional_results = true`, src/pipeline/transactions/mod.rs)
//! across SIGKILLs: a `read_committed` reader of the results topic sees exactly one result per
//! input record, nothing is lost, and a sink that does not forward the key is called at most
//! once per key.
//!
//! `dedupd run` on the real broker (tests/common/pay_kills.rs); 3,000 commands and 900
//! repeats of them (same key and payload, on other input partitions), all produced at the
//! start; one non-forwarding HTTP sink answering in 50–250 ms, 16 calls at a time, batches
//! of 8. Twenty incarnations are SIGKILLed: ten and then nine at a random moment 0.2–1.2 s
//! after their first request, and between them one by itself at crash point
//! `transaction.delivered` (src/crash.rs), its transaction's records delivered and not
//! committed. Then one runs until every input has a committed result and is stopped with
//! SIGTERM. The input that ran each key (the store's completed record names it) has its own
//! `succeeded` as its one result, never a `duplicate` of itself, though its first result may
//! have been aborted. A `read_uncommitted` reader shows that the kills did cut transactions
//! off: of the results topic, it sees more results than inputs, which is what the topic
//! would hold without transactions; with the store on Kafka, whose commits come every round
//! so that results are seldom caught open, it sees more changelog records than a
//! `read_committed` one. The same runs with the store on Kafka (`store.changelog`), where
//! every incarnation after a kill rebuilds its store from the changelog before it processes
//! anything, once with producers keying by the idempotency key (`kafka.copartitioned`) and
//! once through the by-key topic. Run with `scripts/kafka/kafka.sh with cargo test
//! --features failpoints --test kafka kafka_kill_transactional:: -- --nocapture`.

#![cfg(feature = "failpoints")]

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::kafka;
use common::pay_kills::{
    self, calls_per_key, kill_inside_a_transaction, kill_repeatedly, results, wait_for_every_result,
};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, seed_from_env, tail_of_file};
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::pipeline::state_partition;
use dedupd::store::{Completed, KeyStore, Record, SourcePos, StoreBackend, SyncMode};

const PARTITIONS: i32 = 6;
const KEYS: usize = 3_000;
const REPEATS: usize = 900;
const KILLS: usize = 20;
/// How long the sink takes to answer, at random in this range.
const SINK_DELAY_MS: (u64, u64) = (50, 250);
/// Calls at once: with the sink's delay, about 100 commands a second, so the work outlasts
/// the kills.
const MAX_IN_FLIGHT: usize = 16;
/// Small batches publish results all the time, so that kills land in open transactions
/// (a batch's results go out when the whole batch is through its sinks).
const BATCH_SIZE: usize = 8;
/// When a kill lands, after the incarnation's first request.
const KILL_AFTER_MS: (u64, u64) = (200, 1_200);
/// The incarnation killed inside a transaction (crash point `transaction.delivered`) lets
/// this many commits through first, so that it dies in the middle of its work.
const COMMITS_BEFORE_THE_KILL_INSIDE: usize = 3;

/// Every key once, then `REPEATS` of them again: on another partition, or with the store
/// on Kafka and `kafka.copartitioned` on the key's own.
fn commands(mode: Mode) -> Vec<kafka::OutgoingTo> {
    let partition = |i: usize, repeat: bool| match mode {
        Mode::Embedded | Mode::ByKey => (i as i32 + i32::from(repeat)) % PARTITIONS,
        Mode::Changelog => state_partition(&pay_kills::key(i), PARTITIONS),
    };
    let firsts = (0..KEYS).map(|i| pay_kills::command(i, partition(i, false)));
    let repeats = (0..REPEATS).map(|r| {
        let i = r * KEYS / REPEATS;
        pay_kills::command(i, partition(i, true))
    });
    firsts.chain(repeats).collect()
}

/// Keys whose committed result is `indeterminate`.
fn indeterminate_keys(results: &[ResultRecord]) -> usize {
    results
        .iter()
        .filter(|r| r.outcome == Outcome::Indeterminate)
        .filter_map(|r| r.key.as_deref())
        .collect::<HashSet<_>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kills_a_read_committed_reader_sees_exactly_one_result_per_input() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    after_kills(&bootstrap, Mode::Embedded).await;
}

/// The same with the store on Kafka (`store.changelog`): each incarnation starts with the
/// store its predecessor left (a crash: emptied and rebuilt from the changelog), and the
/// repeats are on their key's partition (`kafka.copartitioned`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_on_kafka_after_kills_exactly_one_result_per_input() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    after_kills(&bootstrap, Mode::Changelog).await;
}

/// The same with the store on Kafka and the by-key hop: every command is forwarded to the
/// by-key topic in the transaction of its input offset, and decided there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_by_key_topic_after_kills_exactly_one_result_per_input() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    after_kills(&bootstrap, Mode::ByKey).await;
}

/// Where the store's history lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The embedded store only.
    Embedded,
    /// `store.changelog = true`, `kafka.copartitioned = true`.
    Changelog,
    /// `store.changelog = true`, through the by-key topic.
    ByKey,
}

async fn after_kills(bootstrap: &str, mode: Mode) {
    let bootstrap = bootstrap.to_string();
    let seed = seed_from_env("KAFKA_KILL_TXN_SEED");
    println!("{mode:?}: seed {seed} (replay the kill timing with KAFKA_KILL_TXN_SEED={seed})");
    let mut rng = SplitMix(seed);
    let (input, results_topic, dlq) = (kafka::unique("txn-in"), kafka::unique("txn-out"), kafka::unique("txn-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results_topic, 3), (&dlq, 1)]).await;
    let receiver = SlowReceiver::start(SINK_DELAY_MS, seed).await;
    let dir = KeptOnFailure::new();
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let group = kafka::unique("txn-dedupd");
    let toml = pay_kills::config_toml(
        &bootstrap,
        &group,
        [&input, &results_topic, &dlq],
        &dir.path().join("store"),
        &receiver.url("/pay"),
        match mode {
            Mode::Embedded | Mode::ByKey => "transactional_results = true\n",
            Mode::Changelog => "transactional_results = true\ncopartitioned = true\n",
        },
        &format!("max_in_flight = {MAX_IN_FLIGHT}\nbatch_size = {BATCH_SIZE}"),
    );
    let toml = match mode {
        Mode::Embedded => toml,
        Mode::Changelog | Mode::ByKey => toml.replace("[store]\n", "[store]\nchangelog = true\n"),
    };
    std::fs::write(&config, toml).expect("write config");
    let committed = TopicTail::start(&bootstrap, &results_topic, 3);
    let uncommitted = TopicTail::start_uncommitted(&bootstrap, &results_topic, 3);
    let inputs = kafka::produce_all_to(&bootstrap, &input, commands(mode)).await;

    // Half the kills at random moments, one inside a transaction for certain, the rest at
    // random moments again (on the state it left).
    kill_repeatedly(&config, &log, &receiver, KILLS / 2, KILL_AFTER_MS, &mut rng).await;
    kill_inside_a_transaction(&config, &log, COMMITS_BEFORE_THE_KILL_INSIDE).await;
    kill_repeatedly(&config, &log, &receiver, KILLS - KILLS / 2 - 1, KILL_AFTER_MS, &mut rng).await;
    let mut last = DedupdProcess::run(&config, &log);
    wait_for_every_result(&committed, &inputs, &mut last, &log).await;
    let status = last.terminate(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "the last run did not stop cleanly: {status:?}; log:\n{}",
        tail_of_file(&log, 40)
    );

    // Exactly one committed result per input record, each for the input's own key.
    let seen = results(&committed);
    let mut per_input: HashMap<(i32, i64), Vec<&ResultRecord>> = HashMap::new();
    for r in &seen {
        per_input.entry((r.source.partition, r.source.offset)).or_default().push(r);
    }
    let repeated: Vec<_> = per_input.iter().filter(|(_, rs)| rs.len() > 1).take(5).collect();
    assert!(repeated.is_empty(), "inputs with more than one committed result: {repeated:?}");
    let known: HashSet<&(i32, i64)> = inputs.iter().collect();
    let foreign: Vec<_> = per_input.keys().filter(|p| !known.contains(p)).collect();
    assert!(foreign.is_empty(), "results for inputs never produced: {foreign:?}");
    assert_eq!(seen.len(), inputs.len(), "one committed result per input");
    let outcomes: HashSet<Outcome> = seen.iter().map(|r| r.outcome).collect();
    let allowed = HashSet::from([Outcome::Succeeded, Outcome::Duplicate, Outcome::Indeterminate]);
    assert!(outcomes.is_subset(&allowed), "unexpected outcomes: {outcomes:?}");

    // No double effect: a non-forwarding sink is called at most once per key, and every
    // key that succeeded was called.
    let calls = calls_per_key(&receiver);
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "a non-forwarding sink called twice for one key: {twice:?}");
    let uncalled: Vec<_> = seen
        .iter()
        .filter(|r| r.outcome == Outcome::Succeeded)
        .filter_map(|r| r.key.as_deref())
        .filter(|k| !calls.contains_key(*k))
        .collect();
    assert!(uncalled.is_empty(), "succeeded without a call: {uncalled:?}");

    // No replay caused by a crash: the input that ran each key says `succeeded` (its first
    // result may have been aborted with a transaction; it was published again as it was).
    let store =
        KeyStore::open(StoreBackend::default(), &dir.path().join("store"), SyncMode::Batch).expect("open the store");
    let mut ran_by: Vec<(String, SourcePos)> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.scan_records(after.as_deref(), 1000).expect("scan the store");
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        for (key, record) in page {
            if let Record::Completed(Completed { source: Some(source), .. }) = record {
                ran_by.push((key, source));
            }
        }
    }
    assert_eq!(
        ran_by.len() + indeterminate_keys(&seen),
        KEYS,
        "every key is completed with its source, or indeterminate"
    );
    let replayed_own: Vec<_> = ran_by
        .iter()
        .filter(|(_, src)| {
            per_input
                .get(&(src.partition, src.offset))
                .is_none_or(|rs| rs.iter().any(|r| r.outcome != Outcome::Succeeded))
        })
        .take(5)
        .collect();
    assert!(replayed_own.is_empty(), "inputs that ran their key without a committed `succeeded`: {replayed_own:?}");

    // The kills did cut transactions off (at least the one inside a transaction did): without
    // them, their results would be on the topic.
    let all = results(&uncommitted);
    committed.stop();
    uncommitted.stop();
    receiver.stop().await;
    println!(
        "{mode:?}, {KILLS} kills: {} inputs, {} committed results, {} results written in all (aborted included), {} sink calls",
        inputs.len(),
        seen.len(),
        all.len(),
        calls.values().sum::<usize>()
    );
    match mode {
        // Results sit in an open transaction for up to `kafka.transaction_interval`.
        Mode::Embedded => assert!(
            all.len() > seen.len(),
            "no kill left a transaction open: {} written, {} committed",
            all.len(),
            seen.len()
        ),
        // With the store on Kafka commits come every round, so the results a kill finds in
        // an open transaction may have been published again unchanged; the claims, written
        // to the changelog, it cut off.
        Mode::Changelog | Mode::ByKey => {
            let changelog = format!("{group}.dedupd-state");
            let written = kafka::read_to_end(&bootstrap, &changelog, "read_uncommitted").await.len();
            let committed = kafka::read_to_end(&bootstrap, &changelog, "read_committed").await.len();
            println!("{mode:?}: changelog records written {written}, committed {committed}");
            assert!(
                written > committed,
                "no kill left a transaction open: {written} changelog records written, {committed} committed"
            );
        }
    }
}

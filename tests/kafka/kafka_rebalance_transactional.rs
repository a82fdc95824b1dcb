//! Transactional results across a rebalance: a partition is let go only after the open
//! results transaction committed its offsets (src/pipeline/consumer.rs, `end_transaction`),
//! so a `read_committed` reader sees exactly one result per input while partitions move
//! between two instances of one group, and neither instance stops.
//!
//! `dedupd run` on the real broker (tests/common/pay_kills.rs): 3,000 distinct commands on six
//! partitions, one HTTP sink answering in 5–20 ms. Instance A starts alone; once it is
//! working, instance B (its own store, `--accept-empty-store`: the store check would refuse
//! a partition A's store vouches for) joins, and the group moves partitions from A to B.
//! When every input has a committed result, both are stopped with SIGTERM. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_rebalance_transactional:: -- --nocapture`.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills::{self, results, wait_for_every_result};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, TopicTail, seed_from_env, tail_of_file};

const PARTITIONS: i32 = 6;
const COMMANDS: usize = 3_000;
const SINK_DELAY_MS: (u64, u64) = (5, 20);

/// Waits until `log` has a line containing `text`; fails with the log after `bound`.
async fn wait_for_log(log: &Path, text: &str, p: &mut DedupdProcess, bound: Duration) {
    let deadline = Instant::now() + bound;
    while !std::fs::read_to_string(log).unwrap_or_default().contains(text) {
        let exited = p.exited();
        assert!(
            Instant::now() < deadline && exited.is_none(),
            "no {text:?} within {bound:?} (exited: {exited:?}); log:\n{}",
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_instances_with_exactly_one_committed_result_per_input() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let seed = seed_from_env("KAFKA_REBALANCE_TXN_SEED");
    let (input, results_topic, dlq) = (kafka::unique("txr-in"), kafka::unique("txr-out"), kafka::unique("txr-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results_topic, 3), (&dlq, 1)]).await;
    let receiver = SlowReceiver::start(SINK_DELAY_MS, seed).await;
    let dir = KeptOnFailure::new();
    let group = kafka::unique("txr-dedupd");
    let instance = |name: &str| {
        let toml = pay_kills::config_toml(
            &bootstrap,
            &group,
            [&input, &results_topic, &dlq],
            &dir.path().join(format!("store-{name}")),
            &receiver.url("/pay"),
            "transactional_results = true\n",
            "max_in_flight = 16\nbatch_size = 8",
        );
        let (config, log) = (dir.path().join(format!("{name}.toml")), dir.path().join(format!("{name}.log")));
        std::fs::write(&config, toml).expect("write config");
        (config, log)
    };
    let ((config_a, log_a), (config_b, log_b)) = (instance("a"), instance("b"));
    let tail = TopicTail::start(&bootstrap, &results_topic, 3);
    let inputs = kafka::produce_all_to(
        &bootstrap,
        &input,
        (0..COMMANDS).map(|i| pay_kills::command(i, i as i32 % PARTITIONS)).collect(),
    )
    .await;

    let mut a = DedupdProcess::run(&config_a, &log_a);
    wait_for_log(&log_a, "results are published in transactions", &mut a, Duration::from_secs(60)).await;
    let started = Instant::now();
    while receiver.count() < 200 {
        assert!(started.elapsed() < Duration::from_secs(60), "A made no progress; log:\n{}", tail_of_file(&log_a, 40));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let config_b = config_b.to_str().expect("utf-8 path");
    let mut b = DedupdProcess::spawn(&["run", "-c", config_b, "--accept-empty-store"], &log_b);
    wait_for_log(&log_a, "partitions revoked", &mut a, Duration::from_secs(60)).await;
    wait_for_log(&log_b, "partitions assigned", &mut b, Duration::from_secs(60)).await;
    assert!(receiver.count() < COMMANDS, "A finished before the rebalance: the test moved nothing");
    wait_for_every_result(&tail, &inputs, &mut b, &log_b).await;
    for (name, p, log) in [("A", &mut a, &log_a), ("B", &mut b, &log_b)] {
        let status = p.terminate(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} did not stop cleanly: {status:?}; log:\n{}",
            tail_of_file(log, 40)
        );
    }

    let seen = results(&tail);
    let mut per_input: HashMap<(i32, i64), usize> = HashMap::new();
    for r in &seen {
        *per_input.entry((r.source.partition, r.source.offset)).or_default() += 1;
    }
    let repeated: Vec<_> = per_input.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(repeated.is_empty(), "inputs with more than one committed result: {repeated:?}");
    assert_eq!(seen.len(), inputs.len(), "one committed result per input");
    let b_log = std::fs::read_to_string(&log_b).unwrap_or_default();
    println!(
        "{} results for {} inputs; B was assigned partitions {} time(s); {} sink calls",
        seen.len(),
        inputs.len(),
        b_log.matches("partitions assigned").count(),
        receiver.count()
    );
    tail.stop();
    receiver.stop().await;
}

//! The store on Kafka refuses internal topics that would delete what it needs (docs/config.md,
//! `store.changelog`): a changelog topic made by hand with `cleanup.policy=delete`, or a
//! by-key topic with a retention of an hour, makes `dedupd run` stop at start naming the
//! topic and the setting to change, before it consumes anything. On the real broker.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_internal_topics::`.

use crate::common;

use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};

/// Starts `dedupd run` with the store on Kafka (`copartitioned` or through the by-key
/// topic) and waits for it to stop; returns its exit code and log.
async fn run_until_it_stops(bootstrap: &str, group: &str, input: &str, copartitioned: bool) -> (Option<i32>, String) {
    let (results, dlq) = (kafka::unique("it-out"), kafka::unique("it-dlq"));
    kafka::create_topics(bootstrap, &[(&results, 1), (&dlq, 1)]).await;
    let dir = KeptOnFailure::new();
    let kafka_extra = format!("transactional_results = true\ncopartitioned = {copartitioned}\n");
    let toml = pay_kills::config_toml(
        bootstrap,
        group,
        [input, &results, &dlq],
        &dir.path().join("store"),
        "http://127.0.0.1:9/pay",
        &kafka_extra,
        "",
    )
    .replace("[store]\n", "[store]\nchangelog = true\n");
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    std::fs::write(&config, toml).expect("config");
    let mut dedupd = DedupdProcess::run(&config, &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while dedupd.exited().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = dedupd.exited();
    if status.is_none() {
        dedupd.kill();
    }
    (status.and_then(|s| s.code()), tail_of_file(&log, 40))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_topic_that_deletes_by_time_is_refused() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, group) = (kafka::unique("it-in"), kafka::unique("it-group"));
    kafka::create_topics(&bootstrap, &[(&input, 2)]).await;
    let changelog = format!("{group}.dedupd-state");
    kafka::create_topics_with(&bootstrap, &[(&changelog, 2)], &[("cleanup.policy", "compact,delete")]).await;
    let (code, log) = run_until_it_stops(&bootstrap, &group, &input, true).await;
    assert!(code.is_some_and(|c| c != 0), "dedupd ran on a changelog that deletes: {code:?}\n{log}");
    assert!(log.contains(&changelog) && log.contains("set cleanup.policy=compact"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_by_key_topic_that_deletes_commands_within_an_hour_is_refused() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, group) = (kafka::unique("it-in"), kafka::unique("it-group"));
    kafka::create_topics(&bootstrap, &[(&input, 2)]).await;
    let by_key = format!("{group}.dedupd-by-key");
    kafka::create_topics_with(
        &bootstrap,
        &[(&by_key, 2)],
        &[("cleanup.policy", "delete"), ("retention.ms", "3600000")],
    )
    .await;
    let (code, log) = run_until_it_stops(&bootstrap, &group, &input, false).await;
    assert!(code.is_some_and(|c| c != 0), "dedupd ran on a by-key topic that deletes: {code:?}\n{log}");
    assert!(log.contains(&by_key) && log.contains("retention.ms=3600000"), "{log}");
}

//! Standby copies (`store.standby`, src/pipeline/changelog/standby.rs): an instance tails
//! the changelog partitions it does not own, so that when their owner dies it restores
//! only the tail its copy had not applied, and what it then decides from that copy is
//! right: no key runs twice, every repeat is replayed.
//!
//! Two instances with standby copies on the real broker, two partitions, a slow sink that
//! does not forward the key. A runs a first half of the keys alone; B joins, takes one
//! partition and keeps a copy of the other. A is SIGKILLed while it works through the
//! second half; B takes its partition over after A's session (6 s) and settles every input.
//! Then every key comes again, and each is a `duplicate` of its one run (or the
//! `indeterminate` of a call the kill cut off), with no new sink call. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_standby:: -- --nocapture`.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills::{self, calls_per_key, results, succeeded_and_indeterminate, wait_for_every_result};
use common::process::{DedupdProcess, TopicTail, tail_of_file, wait_for_http_addr, wait_for_line};
use common::state_group::{PATIENCE, StateGroup, changelog, metric, restores, status};
use dedupd::outcome::Outcome;
use dedupd::pipeline::state_partition;

const PARTITIONS: i32 = 2;
/// B's admin API token.
const ADMIN_TOKEN: &str = "standby-test-admin-token";
const KEYS: usize = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_restores_only_what_the_standby_copy_had_not_applied() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let group = StateGroup::new(&bootstrap, "standby", PARTITIONS, (5, 15)).await;
    let pipeline = "max_in_flight = 8\nbatch_size = 8";
    let (config_a, config_b) = (
        group.config("a", "standby = true\n", pipeline, |t| t),
        group.config("b", "standby = true\n", pipeline, |t| {
            t.replace(
                "listen = \"127.0.0.1:0\"\n",
                &format!("listen = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN_TOKEN}\"\n"),
            )
        }),
    );
    let (log_a, log_b) = (group.log("a"), group.log("b"));
    let committed = TopicTail::start(&bootstrap, &group.topics[1], 1);
    let input = &group.topics[0];

    // A runs the first half alone.
    let mut a = DedupdProcess::run(&config_a, &log_a);
    let first = kafka::produce_all_to(&bootstrap, input, (0..KEYS / 2).map(|i| group.placed(i)).collect()).await;
    wait_for_every_result(&committed, &first, &mut a, &log_a).await;

    // B joins: it restores the partition it takes and keeps a copy of A's.
    let mut b = DedupdProcess::run(&config_b, &log_b);
    let http_b = wait_for_http_addr(&log_b, &mut b, PATIENCE).await;
    let restored =
        wait_for_line(&log_b, b.log_start, "state partition restored", PATIENCE, || b.exited().is_some()).await;
    assert!(restored.is_some(), "B restored nothing:\n{}", tail_of_file(&log_b, 40));
    let deadline = Instant::now() + PATIENCE;
    while metric(&http_b, "dedupd_state_standby_partitions").await != 1.0 {
        assert!(Instant::now() < deadline, "B keeps no copy of exactly one partition:\n{}", tail_of_file(&log_b, 40));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let owned_by_b: Vec<String> = restores(&log_b).into_iter().map(|(p, _)| p).collect();
    operator_writes_go_to_the_owner(&http_b, &owned_by_b, input).await;

    // A works through the second half and is SIGKILLed halfway.
    let second = kafka::produce_all_to(&bootstrap, input, (KEYS / 2..KEYS).map(|i| group.placed(i)).collect()).await;
    let calls_before = group.receiver.count();
    let deadline = Instant::now() + PATIENCE;
    while group.receiver.count() < calls_before + KEYS / 4 {
        assert!(Instant::now() < deadline && a.exited().is_none(), "A did not work:\n{}", tail_of_file(&log_a, 40));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill();
    let copied = metric(&http_b, "dedupd_state_standby_records_total").await;
    assert!(copied > 0.0, "B's copy applied nothing of A's partition");

    // B takes A's partition over and settles every input.
    let inputs: Vec<(i32, i64)> = first.iter().chain(&second).copied().collect();
    wait_for_every_result(&committed, &inputs, &mut b, &log_b).await;
    let taken_over: Vec<(String, u64)> =
        restores(&log_b).into_iter().filter(|(p, _)| !owned_by_b.contains(p)).collect();
    let [(partition, tail)] = taken_over.as_slice() else {
        panic!("B did not take exactly A's partition over: {taken_over:?}\n{}", tail_of_file(&log_b, 40));
    };
    let state_partition: i32 = partition.rsplit('/').next().and_then(|p| p.parse().ok()).expect("a partition number");
    let records = changelog(&bootstrap, &group.changelog()).await;
    let on_it = records.iter().filter(|(p, _, _)| *p == state_partition).count() as u64;
    println!(
        "A's partition {partition}: {on_it} changelog records, {tail} restored at the takeover, {copied} copied before the kill"
    );
    assert!(
        2 * tail < on_it,
        "the takeover restored {tail} of {on_it} records: the standby copy did not spare it most"
    );

    // Every key ran at most once; every repeat now is a replay of it, with no new call.
    let calls = calls_per_key(&group.receiver);
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "keys called twice: {twice:?}");
    let seen = results(&committed);
    let (succeeded, indeterminate) = succeeded_and_indeterminate(&seen, &calls);
    assert_eq!(succeeded.len() + indeterminate.len(), KEYS, "every key succeeded or is indeterminate");
    let repeats = kafka::produce_all_to(&bootstrap, input, (0..KEYS).map(|i| group.placed(i)).collect()).await;
    wait_for_every_result(&committed, &repeats, &mut b, &log_b).await;
    let repeats: HashSet<(i32, i64)> = repeats.into_iter().collect();
    let replays: Vec<Outcome> = results(&committed)
        .into_iter()
        .filter(|r| repeats.contains(&(r.source.partition, r.source.offset)))
        .map(|r| r.outcome)
        .collect();
    assert_eq!(replays.len(), KEYS, "one result per repeat");
    let wrong: Vec<_> = replays.iter().filter(|o| !matches!(o, Outcome::Duplicate | Outcome::Indeterminate)).collect();
    assert!(wrong.is_empty(), "repeats that were not replays: {wrong:?}");
    assert_eq!(calls_per_key(&group.receiver), calls, "a repeat called the sink");
    let status = b.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "B did not stop cleanly: {status:?}\n{}", tail_of_file(&log_b, 40));
    committed.stop();
    group.receiver.stop().await;
}

/// B's admin API takes an operator's write only for a key of a state partition B holds
/// (`owned`): for A's it answers 421 and changes nothing. Resolving a completed key is
/// refused either way, so the check changes no state: 409 at the owner (not
/// indeterminate), 421 elsewhere. `/v1/status` lists B's one input partition as running.
async fn operator_writes_go_to_the_owner(http_b: &str, owned: &[String], input: &str) {
    let number = |name: &String| name.rsplit('/').next().and_then(|p| p.parse::<i32>().ok()).expect("partition");
    let owned: Vec<i32> = owned.iter().map(number).collect();
    let key_on = |want_owned: bool| {
        (0..KEYS / 2)
            .map(pay_kills::key)
            .find(|k| owned.contains(&state_partition(k, PARTITIONS)) == want_owned)
            .expect("a key of each partition")
    };
    let client = reqwest::Client::new();
    for (key, expected) in [(key_on(true), 409), (key_on(false), 421)] {
        let answer = client
            .post(format!("http://{http_b}/v1/keys/{key}/resolve"))
            .bearer_auth(ADMIN_TOKEN)
            .body(r#"{"as":"failed"}"#)
            .send()
            .await
            .expect("POST resolve");
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap_or_default();
        assert_eq!(status, expected, "resolve {key} at B (owns {owned:?}): {body}");
    }
    // The restore's log line comes before the consumer moves the partition from restoring
    // to running: wait for that, bounded.
    let expected: Vec<(String, String)> =
        owned.iter().map(|p| (format!("{input}/{p}"), "running".to_string())).collect();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = status(http_b, ADMIN_TOKEN).await;
        let shown: Vec<(String, String)> = status.partitions.into_iter().map(|p| (p.partition, p.state)).collect();
        if shown == expected {
            break;
        }
        assert!(Instant::now() < deadline, "B's partitions in /v1/status: {shown:?}, not {expected:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

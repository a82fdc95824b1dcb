//! No late writer (src/store/ownership.rs, invariant 8; src/pipeline/transactions/mod.rs,
//! invariant 9): a worker still at its sink when the drain bound of a revoke passes keeps
//! running after its partition moved, and must then publish nothing, commit no offset and
//! write nothing to the changelog for it.
//!
//! Two instances with the store on Kafka (tests/common/state_group.rs) on the real broker,
//! four partitions, an HTTP sink that does not forward the key and answers each call after
//! 15 s; the drain bound is 2 s (failpoint `consumer.drain_timeout`). A takes eight
//! commands alone and calls the sink for each; while the calls are under way B joins and
//! takes partitions over. A's workers for them do not drain in time; B finds their claims,
//! which A committed before calling, and publishes each as `indeterminate` (the sink does
//! not forward the key, so it is not called again). Then A's calls answer. Before this was
//! kept, every moved input got a second result (`succeeded`, from A) and A's completion
//! landed on the changelog over B's `indeterminate` record.
//!
//! Checked once both stopped: exactly one committed result per input, one call per key,
//! and each key's last changelog record is the one its result says (`indeterminate` for a
//! moved key, `completed` for one A kept). Needs the `failpoints` feature. Run with
//! `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_late_writer::`.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills::{calls_per_key, key, wait_for_every_result};
use common::process::{DedupdProcess, TopicTail, has_failpoints, tail_of_file, wait_for_http_addr, wait_for_line};
use common::state_group::{PATIENCE, StateGroup, last_records};
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::store::Record;
use rdkafka::message::Message;

const PARTITIONS: i32 = 4;
const COMMANDS: usize = 8;
/// How long the sink takes to answer each call: far past the drain bound, and long enough
/// for B to start and the group to move partitions meanwhile.
const SINK_MS: u64 = 15_000;
/// The drain bound the failpoint sets.
const FAILPOINT: &str = "consumer.drain_timeout=return(2000)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_outliving_the_drain_neither_publishes_nor_writes_the_changelog() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !has_failpoints("the drain bound is shortened by a failpoint") {
        return;
    }
    let group = StateGroup::new(&bootstrap, "late", PARTITIONS, (SINK_MS, SINK_MS)).await;
    let longer_calls = |t: String| t.replace("request_timeout = \"10s\"", "request_timeout = \"60s\"");
    let pipeline = "max_in_flight = 16\nbatch_size = 8";
    let (config_a, config_b) =
        (group.config("a", "", pipeline, longer_calls), group.config("b", "", pipeline, longer_calls));
    let (log_a, log_b) = (group.log("a"), group.log("b"));
    let run = |config: &std::path::Path, log: &std::path::Path| {
        let args = ["run", "-c", config.to_str().expect("utf-8 path")];
        DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", FAILPOINT)], log)
    };
    let committed = TopicTail::start(&bootstrap, &group.topics[1], 1);

    // A alone: every command's call is under way at the sink.
    let mut a = run(&config_a, &log_a);
    wait_for_http_addr(&log_a, &mut a, PATIENCE).await;
    let inputs =
        kafka::produce_all_to(&bootstrap, &group.topics[0], (0..COMMANDS).map(|i| group.placed(i)).collect()).await;
    let deadline = Instant::now() + PATIENCE;
    while group.receiver.count() < COMMANDS {
        assert!(Instant::now() < deadline && a.exited().is_none(), "A made no calls:\n{}", tail_of_file(&log_a, 40));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // B joins; A lets partitions go with their calls still under way.
    let mut b = run(&config_b, &log_b);
    let late = wait_for_line(&log_a, a.log_start, "did not drain in time", PATIENCE, || a.exited().is_some()).await;
    assert!(late.is_some(), "no worker of A outlived the drain bound:\n{}", tail_of_file(&log_a, 40));
    wait_for_every_result(&committed, &inputs, &mut b, &log_b).await;

    // A's calls answer; its late workers publish nothing.
    let deadline = Instant::now() + PATIENCE;
    while group.receiver.in_flight() > 0 {
        assert!(Instant::now() < deadline, "the sink's calls did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Until a late worker reached its publish: refused, or (what this test catches) a second
    // result committed.
    let reached_publish = || {
        let said = std::fs::read_to_string(&log_a).unwrap_or_default();
        said.contains("its results are not published") || committed.len() > COMMANDS
    };
    let deadline = Instant::now() + PATIENCE;
    while !reached_publish() {
        assert!(Instant::now() < deadline, "no late worker of A reached its publish:\n{}", tail_of_file(&log_a, 40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (name, p, log) in [("A", &mut a, &log_a), ("B", &mut b, &log_b)] {
        let status = p.terminate(Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} did not stop cleanly: {status:?}\n{}",
            tail_of_file(log, 40)
        );
    }
    committed.stop();

    // One committed result per input, one call per key.
    let published = kafka::read_to_end(&bootstrap, &group.topics[1], "read_committed").await;
    let mut per_input: HashMap<(i32, i64), Vec<Outcome>> = HashMap::new();
    for m in &published {
        let r: ResultRecord = serde_json::from_slice(m.payload().expect("payload")).expect("a result record");
        per_input.entry((r.source.partition, r.source.offset)).or_default().push(r.outcome);
    }
    let twice: Vec<_> = per_input.iter().filter(|(_, outcomes)| outcomes.len() > 1).collect();
    assert!(twice.is_empty(), "inputs with more than one committed result: {twice:?}");
    assert_eq!(per_input.len(), COMMANDS, "results: {per_input:?}");
    let calls = calls_per_key(&group.receiver);
    assert!(calls.values().all(|n| *n == 1) && calls.len() == COMMANDS, "calls per key: {calls:?}");

    // Each key's last changelog record is what its result says: B's, where B took it over.
    let last = last_records(&bootstrap, &group.changelog()).await;
    let mut moved = 0;
    for (i, &input) in inputs.iter().enumerate() {
        let outcome = per_input[&input][0];
        let record = last.get(&key(i)).cloned().flatten();
        match outcome {
            Outcome::Indeterminate => {
                moved += 1;
                assert!(matches!(record, Some(Record::Indeterminate(_))), "{}: {outcome:?} but {record:?}", key(i));
            }
            Outcome::Succeeded => {
                assert!(matches!(record, Some(Record::Completed(_))), "{}: {outcome:?} but {record:?}", key(i))
            }
            other => panic!("{}: unexpected outcome {other:?}", key(i)),
        }
    }
    assert!(moved > 0, "no key moved to B with its call under way: the test saw no late worker");
    println!("{moved} of {COMMANDS} keys moved to B with their calls under way");
}

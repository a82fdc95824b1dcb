//! A restore cut short by a crash goes on from its checkpoint (src/store/writing.rs,
//! invariants 9 and 10): a partition that was restoring, not yet owned, holds only what the
//! changelog committed up to its checkpoint, so the next start keeps it rather than
//! emptying the store and reading everything again (a crash loop for a state too large to
//! restore between two crashes).
//!
//! On the real broker: a changelog of two partitions holding a completion of each of
//! 40,000 keys (another fingerprint than the commands', so a command of one is a
//! `conflict` decided from the restored record, without a call). `dedupd run` kills itself
//! with a real SIGKILL as the restore applies its third chunk (crash point
//! `restore.applied`). Started again on the same store, it restores only what the first
//! run had not applied, and commands of keys from the start and the end of the changelog
//! are conflicts with no sink call. Needs the `failpoints` feature. Run with
//! `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_restore_resume::`.

use crate::common;

use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills::{results, wait_for_every_result};
use common::process::{DedupdProcess, TopicTail, has_failpoints, tail_of_file, wait_for_http_addr};
use common::state_group::{PATIENCE, StateGroup, restores};
use dedupd::outcome::Outcome;

const PARTITIONS: i32 = 2;
const KEYS: usize = 40_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_short_by_a_crash_goes_on_from_its_checkpoint() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !has_failpoints("the restore is cut short by a crash point") {
        return;
    }
    let group = StateGroup::new(&bootstrap, "resume", PARTITIONS, (1, 5)).await;
    group.restorable_state(KEYS).await;
    let config = group.config("a", "", "max_in_flight = 8\nbatch_size = 8", |t| t);
    let args = ["run", "-c", config.to_str().expect("utf-8 path")];

    // Killed as the third chunk of the restore is applied.
    let first_log = group.log("first");
    let mut first =
        DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", "restore.applied=2*off->return")], &first_log);
    let deadline = Instant::now() + PATIENCE;
    let killed = loop {
        if let Some(status) = first.exited() {
            break status;
        }
        assert!(Instant::now() < deadline, "never reached the crash point:\n{}", tail_of_file(&first_log, 30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!killed.success(), "the first run was to be killed: {killed:?}\n{}", tail_of_file(&first_log, 30));
    assert!(
        restores(&first_log).is_empty(),
        "a restore ended before the crash point:\n{}",
        tail_of_file(&first_log, 30)
    );

    // Started again: the partitions it restored were not its own yet, so they are kept.
    let log = group.log("again");
    let mut again = DedupdProcess::spawn(&args, &log);
    wait_for_http_addr(&log, &mut again, PATIENCE).await;
    let deadline = Instant::now() + PATIENCE;
    while restores(&log).len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline && again.exited().is_none(),
            "the restores did not end:\n{}",
            tail_of_file(&log, 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("the others kept, their restores going on from their checkpoints"),
        "{}",
        tail_of_file(&log, 30)
    );
    let read_again: u64 = restores(&log).iter().map(|(_, records)| records).sum();
    assert!(
        read_again > 0 && read_again < KEYS as u64,
        "{read_again} of {KEYS} records restored after the crash: the restore did not go on from its checkpoint\n{}",
        tail_of_file(&log, 30)
    );

    // Keys from both ends of the changelog are there: decided from the restored records.
    let committed = TopicTail::start(&bootstrap, &group.topics[1], 1);
    let chosen: Vec<usize> = (0..25).chain(KEYS - 25..KEYS).collect();
    let commands =
        kafka::produce_all_to(&bootstrap, &group.topics[0], chosen.iter().map(|&i| group.placed(i)).collect()).await;
    wait_for_every_result(&committed, &commands, &mut again, &log).await;
    let outcomes: Vec<Outcome> = results(&committed).into_iter().map(|r| r.outcome).collect();
    assert!(outcomes.iter().all(|o| *o == Outcome::Conflict), "not decided from the restore: {outcomes:?}");
    assert_eq!(group.receiver.count(), 0, "a restored key called the sink");
    let status = again.terminate(Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "did not stop cleanly: {status:?}\n{}", tail_of_file(&log, 30));
    committed.stop();
}

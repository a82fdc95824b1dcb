//! An operator's write racing a revoke (docs/contract.md §5; src/store/ownership.rs,
//! invariant 8): with the store on Kafka, a `forget` made while a partition is being let go
//! is either in the commit that lets it go, and so in the new owner's copy, or refused with
//! 421 and not written anywhere; never written here after the partition moved.
//!
//! Two instances (tests/common/state_group.rs) on the real broker, two partitions. A runs
//! twenty commands alone; B joins and takes a partition. A's revoke is held for 6 s at two
//! points (failpoints `rebalance.revoke_drained`, its workers stopped, and
//! `rebalance.revoke_let_go`, its state no longer written, both before its commit). In the
//! first window a forget of a key of the partition going is answered 200; in the second
//! another is refused 421 by the store itself (A's owner check still passes then). The
//! changelog then holds the first key's tombstone and the second key's completion as its
//! last records. Needs the `failpoints` feature. Run with
//! `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_revoke_race::`.

use crate::common;

use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills::{key, wait_for_every_result};
use common::process::{DedupdProcess, TopicTail, has_failpoints, tail_of_file, wait_for_http_addr, wait_for_line};
use common::state_group::{PATIENCE, StateGroup, last_records};
use dedupd::pipeline::state_partition;
use dedupd::store::Record;

const PARTITIONS: i32 = 2;
const COMMANDS: usize = 20;
const ADMIN_TOKEN: &str = "revoke-race-admin-token";
/// Each window of A's revoke.
const HOLD_MS: u64 = 6_000;

/// The state partitions a "revoked state partitions no longer written here" line names.
fn partitions_in(line: &str) -> Vec<i32> {
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    let list = v["fields"]["partitions"].as_str().expect("partitions in the line");
    list.trim_matches(['[', ']']).split(',').filter_map(|p| p.trim().parse().ok()).collect()
}

/// The lines of `log` from byte `from` that contain `text`.
fn lines_with(log: &std::path::Path, from: u64, text: &str) -> Vec<String> {
    let all = std::fs::read(log).unwrap_or_default();
    let tail = String::from_utf8_lossy(all.get(from as usize..).unwrap_or_default()).into_owned();
    tail.lines().filter(|l| l.contains(text)).map(str::to_string).collect()
}

/// `DELETE /v1/keys/KEY` at `http`: the status and the body.
async fn forget(http: &str, key: &str) -> (u16, String) {
    let answer = reqwest::Client::new()
        .delete(format!("http://{http}/v1/keys/{key}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("DELETE /v1/keys");
    (answer.status().as_u16(), answer.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_racing_a_revoke_is_in_its_commit_or_refused() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !has_failpoints("the revoke is held by failpoints") {
        return;
    }
    let group = StateGroup::new(&bootstrap, "race", PARTITIONS, (1, 5)).await;
    let pipeline = "max_in_flight = 8\nbatch_size = 8";
    let with_token = |t: String| {
        t.replace("listen = \"127.0.0.1:0\"\n", &format!("listen = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN_TOKEN}\"\n"))
    };
    let (config_a, config_b) = (group.config("a", "", pipeline, with_token), group.config("b", "", pipeline, |t| t));
    let (log_a, log_b) = (group.log("a"), group.log("b"));
    let committed = TopicTail::start(&bootstrap, &group.topics[1], 1);

    let held = format!("rebalance.revoke_drained=sleep({HOLD_MS});rebalance.revoke_let_go=sleep({HOLD_MS})");
    let args_a = ["run", "-c", config_a.to_str().expect("utf-8 path")];
    let mut a = DedupdProcess::spawn_with_env(&args_a, &[("FAILPOINTS", &held)], &log_a);
    let http_a = wait_for_http_addr(&log_a, &mut a, PATIENCE).await;
    let inputs =
        kafka::produce_all_to(&bootstrap, &group.topics[0], (0..COMMANDS).map(|i| group.placed(i)).collect()).await;
    wait_for_every_result(&committed, &inputs, &mut a, &log_a).await;

    // B joins; A's revoke is held with its workers stopped: a forget now is in its commit.
    let mut b = DedupdProcess::run(&config_b, &log_b);
    let revoking =
        wait_for_line(&log_a, a.log_start, "partitions revoked: draining", PATIENCE, || a.exited().is_some());
    assert!(revoking.await.is_some(), "A let nothing go:\n{}", tail_of_file(&log_a, 40));
    let going = lines_with(&log_a, a.log_start, "partitions revoked: draining");
    let first_going: serde_json::Value =
        serde_json::from_str(going.first().expect("the revoke line")).expect("a JSON log line");
    // `[("topic", 1), ...]`. Input partition p is state partition p (copartitioned).
    let first_going = first_going["fields"]["partitions"].as_str().expect("partitions in the line").to_string();
    let revoked_inputs: Vec<i32> = first_going
        .split(&format!("\"{}\", ", group.topics[0]))
        .skip(1)
        .filter_map(|rest| rest.split(')').next().and_then(|p| p.trim().parse().ok()))
        .collect();
    let keys_going: Vec<String> =
        (0..COMMANDS).map(key).filter(|k| revoked_inputs.contains(&state_partition(k, PARTITIONS))).collect();
    let [in_commit, refused, ..] = keys_going.as_slice() else {
        panic!("fewer than two keys on the partitions let go ({revoked_inputs:?}): {first_going}");
    };
    let (status, body) = forget(&http_a, in_commit).await;
    assert_eq!(status, 200, "forget {in_commit} while its partition's workers are stopped: {body}");
    assert!(
        lines_with(&log_a, a.log_start, "no longer written here").is_empty(),
        "the first window had closed before the forget answered: the test cannot tell which side it was on"
    );

    // Then held again with its state no longer written: a forget now is refused by the store.
    let let_go = wait_for_line(&log_a, a.log_start, "no longer written here", PATIENCE, || a.exited().is_some());
    assert!(let_go.await.is_some(), "A's revoke did not go on:\n{}", tail_of_file(&log_a, 40));
    let state = partitions_in(&lines_with(&log_a, a.log_start, "no longer written here")[0]);
    assert!(state.contains(&state_partition(refused, PARTITIONS)), "{refused} not in the let-go {state:?}");
    let (status, body) = forget(&http_a, refused).await;
    assert_eq!(status, 421, "forget {refused} after its partition stopped being written: {body}");
    assert!(body.contains("not written"), "refused by the store, not by the owner check: {body}");

    // Both stop once B runs; the changelog holds what the two answers said.
    let deadline = Instant::now() + PATIENCE;
    while lines_with(&log_b, b.log_start, "state partition restored").is_empty() {
        assert!(Instant::now() < deadline && b.exited().is_none(), "B restored nothing:\n{}", tail_of_file(&log_b, 40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (name, p, log) in [("B", &mut b, &log_b), ("A", &mut a, &log_a)] {
        let status = p.terminate(Duration::from_secs(90));
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} did not stop cleanly: {status:?}\n{}",
            tail_of_file(log, 40)
        );
    }
    committed.stop();
    let last = last_records(&bootstrap, &group.changelog()).await;
    assert_eq!(last.get(in_commit.as_str()), Some(&None), "{in_commit}: its forget's tombstone is not its last record");
    assert!(
        matches!(last.get(refused.as_str()), Some(Some(Record::Completed(_)))),
        "{refused}: the refused forget changed it: {:?}",
        last.get(refused.as_str())
    );
}

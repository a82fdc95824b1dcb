//! A restore runs off the rebalance path (src/pipeline/changelog/restore/mod.rs,
//! src/pipeline/consumer/restores.rs): the group consumer goes on polling while the state
//! partitions restore, so a restore longer than `max.poll.interval.ms` neither takes the
//! instance out of its group nor makes `/healthz` fail, and no fixed bound stops it.
//!
//! On the real broker: a changelog of two partitions holding a completion of each of 2,000
//! keys (with another fingerprint than the commands', so a command of one is a `conflict`
//! decided from the restored record, without a call). `dedupd run` starts with the restore
//! held for 12 s (failpoint `restore.started`) and `max.poll.interval.ms` at 7 s. Meanwhile
//! `/healthz` answers 200, `/readyz` 503 naming the restore, and `/v1/status` shows each
//! partition `restoring` with its progress; afterwards the group saw one
//! rebalance, the log no exceeded poll interval, and commands of restored keys are
//! conflicts with no sink call. Before restores left the rebalance callback, the callback
//! held the poll loop for the whole restore. Needs the `failpoints` feature. Run with
//! `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_restore_background::`.

use crate::common;

use std::time::{Duration, Instant};

use common::exposition::Exposition;
use common::kafka;
use common::pay_kills::{results, wait_for_every_result};
use common::process::{DedupdProcess, TopicTail, has_failpoints, tail_of_file, wait_for_http_addr};
use common::state_group::{PATIENCE, StateGroup, status};
use dedupd::outcome::Outcome;

const PARTITIONS: i32 = 2;
const KEYS: usize = 2_000;
/// How long the restore is held: past `max.poll.interval.ms`.
const HELD_MS: u64 = 12_000;
const ADMIN_TOKEN: &str = "background-restore-admin-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_longer_than_the_poll_interval_keeps_the_instance_in_its_group() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !has_failpoints("the restore is held by a failpoint") {
        return;
    }
    let group = StateGroup::new(&bootstrap, "bgrestore", PARTITIONS, (1, 5)).await;
    group.restorable_state(KEYS).await;
    let short_poll = |t: String| {
        t.replace("[kafka.consumer]\n", "[kafka.consumer]\n\"max.poll.interval.ms\" = \"7000\"\n").replace(
            "listen = \"127.0.0.1:0\"\n",
            &format!("listen = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN_TOKEN}\"\n"),
        )
    };
    let config = group.config("a", "", "max_in_flight = 8\nbatch_size = 8", short_poll);
    let log = group.log("a");
    let failpoint = format!("restore.started=sleep({HELD_MS})");
    let args = ["run", "-c", config.to_str().expect("utf-8 path")];
    let mut a = DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", &failpoint)], &log);
    let http = wait_for_http_addr(&log, &mut a, PATIENCE).await;

    // While it restores: alive, not ready, saying why.
    let (mut restoring_for, mut first_restoring) = (Duration::ZERO, None);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let health = reqwest::get(format!("http://{http}/healthz")).await.expect("healthz");
        let (health, said) = (health.status().as_u16(), health.text().await.unwrap_or_default());
        assert_eq!(health, 200, "/healthz while restoring: {said}\n{}", tail_of_file(&log, 20));
        let ready = reqwest::get(format!("http://{http}/readyz")).await.expect("readyz");
        let (ready, body) = (ready.status().as_u16(), ready.text().await.unwrap_or_default());
        if ready == 200 {
            break;
        }
        if body.contains("restoring its state from the changelog") {
            // The restorer marks its state partitions down (what /readyz names) just before
            // the consumer marks the input partitions it pauses as restoring, and clears them
            // just before it resumes them (src/pipeline/consumer/restores.rs): at the first
            // sighting /v1/status is given a bounded moment to catch up; later it must show
            // the restore at once, unless /readyz, asked again, no longer names it.
            let first = first_restoring.is_none();
            let since = *first_restoring.get_or_insert_with(Instant::now);
            let shown =
                status_while_restoring(&http, if first { Duration::from_secs(5) } else { Duration::ZERO }).await;
            if !all_restoring(&shown) {
                let again = reqwest::get(format!("http://{http}/readyz")).await.expect("readyz");
                let again = again.text().await.unwrap_or_default();
                assert!(
                    !first && !again.contains("restoring its state from the changelog"),
                    "/v1/status while restoring: {shown:?} (/readyz: {again})"
                );
            }
            restoring_for = since.elapsed();
        }
        assert!(
            Instant::now() < deadline && a.exited().is_none(),
            "never ready: {ready} {body}\n{}",
            tail_of_file(&log, 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        restoring_for > Duration::from_millis(7_000),
        "/readyz named the restore for only {restoring_for:?}: the failpoint did not hold it past the poll interval"
    );

    // Still in its first generation, and decided from the restored records.
    let scrape = reqwest::get(format!("http://{http}/metrics")).await.expect("metrics").text().await.expect("body");
    let rebalances = Exposition::parse(&scrape).value("dedupd_rebalances_total", &[]);
    assert_eq!(rebalances, Some(1.0), "the instance rejoined its group:\n{}", tail_of_file(&log, 30));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!said.to_lowercase().contains("max.poll.interval"), "{}", tail_of_file(&log, 30));
    let committed = TopicTail::start(&bootstrap, &group.topics[1], 1);
    let commands =
        kafka::produce_all_to(&bootstrap, &group.topics[0], (0..50).map(|i| group.placed(i)).collect()).await;
    wait_for_every_result(&committed, &commands, &mut a, &log).await;
    let outcomes: Vec<Outcome> = results(&committed).into_iter().map(|r| r.outcome).collect();
    assert!(outcomes.iter().all(|o| *o == Outcome::Conflict), "not decided from the restore: {outcomes:?}");
    assert_eq!(group.receiver.count(), 0, "a restored key called the sink");
    let status = a.terminate(Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "did not stop cleanly: {status:?}\n{}", tail_of_file(&log, 30));
    committed.stop();
}

/// `/v1/status`'s partitions as (state, detail), asked again for up to `catch_up` until they
/// all show the restore.
async fn status_while_restoring(http: &str, catch_up: Duration) -> Vec<(String, Option<String>)> {
    let deadline = Instant::now() + catch_up;
    loop {
        let shown: Vec<(String, Option<String>)> =
            status(http, ADMIN_TOKEN).await.partitions.into_iter().map(|p| (p.state, p.detail)).collect();
        if all_restoring(&shown) || Instant::now() >= deadline {
            return shown;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Some partitions, every one restoring, its detail the restore's.
fn all_restoring(shown: &[(String, Option<String>)]) -> bool {
    !shown.is_empty()
        && shown.iter().all(|(state, detail)| {
            state == "restoring"
                && detail.as_deref().is_some_and(|d| d.starts_with("restoring its state from the changelog"))
        })
}

//! Expiry with the store on Kafka (`store.changelog`, src/store/expiries.rs): the tombstone
//! that takes an expired key off the compacted changelog is written by the owner of the
//! key's state partition, and by no other instance, and a key that expired while nobody
//! held it still gets one when its partition is restored.
//!
//! - Two instances: A runs every key alone, then B joins and takes one of the two
//!   partitions, restoring it before the keys expire. Each key expires in both stores (A
//!   still holds the keys of the partition it let go), but the changelog ends with exactly
//!   one tombstone per key: A's for its partition, B's for B's. A tombstone A wrote for
//!   B's partition could land after B's claim of the key anew, and delete it.
//! - One instance, SIGKILLed after its keys completed and before they expired, started
//!   again after they expired: its rebuilt store drops them, and it writes their
//!   tombstones.
//!
//! `dedupd run` as processes on the real broker, one HTTP sink. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_expiry:: -- --nocapture`.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::kafka;
use common::pay_kills::{self, wait_for_every_result};
use common::process::{DedupdProcess, TopicTail, tail_of_file, wait_for_http_addr, wait_for_line};
use common::state_group::{StateGroup, changelog, metric};
use dedupd::store::Record;

const PARTITIONS: i32 = 2;
const KEYS: usize = 40;

/// The config of instance `name`, whose keys expire `ttl` after they complete; compaction
/// looks every 500 ms.
fn expiring(group: &StateGroup, name: &str, ttl: &str) -> PathBuf {
    group.config(name, "compaction_interval = \"500ms\"\n", "", |toml| {
        toml.replace("sink = \"pay\"\n", &format!("sink = \"pay\"\nttl = \"{ttl}\"\n"))
            // A command older than its TTL would be `stale`, never run: not what this is about.
            + "\n[envelope]\nstale_guard = false\n"
    })
}

/// Per key: its tombstones, and whether its last record is one.
fn tombstones(records: &[(i32, String, Option<Record>)]) -> HashMap<String, (usize, bool)> {
    let mut per_key: HashMap<String, (usize, bool)> = HashMap::new();
    for (_, key, record) in records {
        let entry = per_key.entry(key.clone()).or_default();
        entry.0 += usize::from(record.is_none());
        entry.1 = record.is_none();
    }
    per_key
}

/// Waits until every key's last changelog record is a tombstone; fails after `timeout`.
async fn wait_until_every_key_is_tombstoned(bootstrap: &str, topic: &str, keys: &[String], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let per_key = tombstones(&changelog(bootstrap, topic).await);
        if keys.iter().all(|k| per_key.get(k).is_some_and(|(_, last)| *last)) {
            return;
        }
        assert!(Instant::now() < deadline, "not every key tombstoned within {timeout:?}: {per_key:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn stop_cleanly(p: &mut DedupdProcess, log: &Path) {
    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "not stopped cleanly: {status:?}\n{}", tail_of_file(log, 40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_of_a_keys_partition_writes_its_expiry() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let setup = StateGroup::new(&bootstrap, "expiry-owner", PARTITIONS, (1, 2)).await;
    // Long enough for B to join and restore before any key expires.
    const TTL: Duration = Duration::from_secs(25);
    let (config_a, config_b) = (expiring(&setup, "a", "25s"), expiring(&setup, "b", "25s"));
    let (log_a, log_b) = (setup.log("a"), setup.log("b"));
    let keys: Vec<String> = (0..KEYS).map(pay_kills::key).collect();
    let tail = TopicTail::start(&bootstrap, &setup.topics[1], 1);

    // A runs every key alone.
    let started = Instant::now();
    let mut a = DedupdProcess::run(&config_a, &log_a);
    let http_a = wait_for_http_addr(&log_a, &mut a, Duration::from_secs(60)).await;
    let inputs =
        kafka::produce_all_to(&bootstrap, &setup.topics[0], (0..KEYS).map(|i| setup.placed(i)).collect()).await;
    wait_for_every_result(&tail, &inputs, &mut a, &log_a).await;

    // B joins and restores the partition it takes; A lets it go.
    let mut b = DedupdProcess::run(&config_b, &log_b);
    let restored = wait_for_line(&log_b, b.log_start, "state partition restored", Duration::from_secs(60), || {
        b.exited().is_some()
    })
    .await;
    assert!(restored.is_some(), "B restored nothing:\n{}", tail_of_file(&log_b, 40));
    let revoked =
        wait_for_line(&log_a, a.log_start, "partitions revoked", Duration::from_secs(60), || a.exited().is_some())
            .await;
    assert!(revoked.is_some(), "A let nothing go:\n{}", tail_of_file(&log_a, 40));
    assert!(started.elapsed() < TTL, "B restored after the keys could expire: this machine is too slow for the test");

    // Both stores remove their expired keys: A every key, its own and those it let go.
    let deadline = Instant::now() + TTL + Duration::from_secs(60);
    while metric(&http_a, "dedupd_compaction_removed_total").await < KEYS as f64 {
        assert!(Instant::now() < deadline, "A did not remove every expired key:\n{}", tail_of_file(&log_a, 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_until_every_key_is_tombstoned(&bootstrap, &setup.changelog(), &keys, Duration::from_secs(60)).await;
    // Stopped cleanly, each commits whatever it captured.
    stop_cleanly(&mut a, &log_a);
    stop_cleanly(&mut b, &log_b);

    let records = changelog(&bootstrap, &setup.changelog()).await;
    let per_key = tombstones(&records);
    let not_once: Vec<_> =
        keys.iter().filter(|k| per_key.get(*k) != Some(&(1, true))).map(|k| (k, per_key.get(k))).collect();
    assert!(not_once.is_empty(), "keys without exactly one tombstone, last: {not_once:?}");
    assert_eq!(records.len(), 3 * KEYS, "a claim, a completion and a tombstone per key");
    tail.stop();
    setup.receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_expired_while_nobody_held_it_is_tombstoned_when_restored() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let setup = StateGroup::new(&bootstrap, "expiry-restore", PARTITIONS, (1, 2)).await;
    let config = expiring(&setup, "only", "8s");
    let log = setup.log("only");
    let keys: Vec<String> = (0..KEYS).map(pay_kills::key).collect();
    let tail = TopicTail::start(&bootstrap, &setup.topics[1], 1);

    // Every key completes; a crash before they expire leaves no tombstone.
    let inputs =
        kafka::produce_all_to(&bootstrap, &setup.topics[0], (0..KEYS).map(|i| setup.placed(i)).collect()).await;
    let mut p = DedupdProcess::run(&config, &log);
    wait_for_every_result(&tail, &inputs, &mut p, &log).await;
    p.kill();
    let records = changelog(&bootstrap, &setup.changelog()).await;
    let per_key = tombstones(&records);
    assert!(per_key.values().all(|(n, _)| *n == 0), "a tombstone before the keys expired: {per_key:?}");
    let expires_at = records
        .iter()
        .filter_map(|(_, _, r)| match r {
            Some(Record::Completed(c)) => Some(c.expires_at_ms),
            _ => None,
        })
        .max()
        .expect("completions on the changelog");

    // Started again once every key expired: the rebuilt store drops them, and the
    // instance writes their tombstones.
    let now_ms = || SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64;
    while now_ms() <= expires_at {
        tokio::time::sleep(Duration::from_millis(u64::try_from(expires_at - now_ms()).unwrap_or(0) + 10)).await;
    }
    let mut again = DedupdProcess::run(&config, &log);
    wait_until_every_key_is_tombstoned(&bootstrap, &setup.changelog(), &keys, Duration::from_secs(60)).await;
    stop_cleanly(&mut again, &log);
    let per_key = tombstones(&changelog(&bootstrap, &setup.changelog()).await);
    assert!(keys.iter().all(|k| per_key.get(k) == Some(&(1, true))), "one tombstone per key: {per_key:?}");
    tail.stop();
    setup.receiver.stop().await;
}

//! `--takeover --state N`: a state taken over by an instance joining the group, with no
//! member leaving it (BENCHMARKS.md, "State on Kafka: a takeover"). The changelog (6
//! partitions, `kafka.copartitioned`) holds N keys; instance A starts alone and restores
//! them all (its cold restore, timed from its log). Under a steady load of `--rate`
//! commands/s, instance B then joins: the group gives it half the partitions, which it
//! restores in the background while A goes on with the rest. Printed: B's restores (records,
//! the longest's time), the time from B's start to its first result of a partition it took
//! (by the result's timestamp), and the worst latency of commands produced after B's start
//! on the partitions A kept and on those B took.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use dedupd::store::StoreBackend;
use rdkafka::producer::FutureRecord;

use super::instances::{http_addr, now_ms, restores_after, sample, spawn_dedupd};
use super::restore::{PARTITIONS, write_changelog};
use super::topics::{create_changelog_topic, create_topic, read_results, unique};
use super::{Mode, config_in};

/// How long the load runs before B starts, and after B is ready.
const BEFORE: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(10);

/// Runs the takeover of `state` keys under `rate` commands/s and prints what it measured.
pub async fn takeover(bootstrap: &str, backend: StoreBackend, (state, rate): (usize, usize)) {
    let (input, results) = (unique("bench-to-in"), unique("bench-to-out"));
    create_topic(bootstrap, &input, PARTITIONS).await;
    create_topic(bootstrap, &results, PARTITIONS).await;
    let group = unique("bench-takeover");
    let dead_letters = unique("bench-to-dlq");
    super::topics::ensure_dead_letter_topic(bootstrap, &dead_letters).await;
    let changelog = format!("{group}.dedupd-state");
    create_changelog_topic(bootstrap, &changelog, PARTITIONS).await;
    let written = Instant::now();
    write_changelog(bootstrap, &changelog, 0..state).await;
    println!("wrote {state} keys to the changelog in {:.1} s", written.elapsed().as_secs_f64());

    let dir = tempfile::tempdir().expect("tempdir");
    let logs: Vec<PathBuf> = ["a", "b"].iter().map(|n| dir.path().join(format!("{n}.log"))).collect();
    let spawn = |i: usize| -> Child {
        let mut c =
            config_in(Mode::Changelog, bootstrap, &input, &results, backend, &dir.path().join(format!("store-{i}")));
        c.kafka.group_id = group.clone();
        c.kafka.dead_letter_topic = dead_letters.clone();
        c.kafka.consumer.insert("session.timeout.ms".into(), "6000".into());
        c.kafka.consumer.insert("heartbeat.interval.ms".into(), "1000".into());
        c.log.format = dedupd::log::LogFormat::Json;
        let path = dir.path().join(format!("{i}.toml"));
        std::fs::write(&path, toml::to_string(&c).expect("config as TOML")).expect("write config");
        spawn_dedupd(&path, &logs[i])
    };
    let mut a = spawn(0);
    wait_until_ready(&logs[0]).await;
    let (records, ms) = restores_after(&logs[0], 0);
    println!("A alone restored {records} records, its longest restore {ms} ms");

    let stop = tokio_util::sync::CancellationToken::new();
    let producing = tokio::spawn(produce(bootstrap.to_string(), input.clone(), rate, stop.clone()));
    tokio::time::sleep(BEFORE).await;
    let b_started_ms = now_ms();
    let b_started = Instant::now();
    let mut b = spawn(1);
    let revoked_ms = revoked(&logs[0]).await;
    wait_until_ready(&logs[1]).await;
    println!("B ready {:.1} s after its start", b_started.elapsed().as_secs_f64());
    tokio::time::sleep(AFTER).await;
    stop.cancel();
    let produced = producing.await.expect("producer task");
    let (b2, r, n) = (bootstrap.to_string(), results.clone(), produced.len());
    let seen =
        tokio::task::spawn_blocking(move || read_results(&b2, &r, n, Duration::from_secs(300))).await.expect("read");
    let taken = taken_partitions(&logs[1]);
    let (records, ms) = restores_after(&logs[1], 0);
    let after_b = |on_b: bool| -> Vec<(i64, i64)> {
        let mut l: Vec<(i64, i64)> = produced
            .iter()
            .filter(|((p, _), t)| **t >= b_started_ms && taken.contains(p) == on_b)
            .filter_map(|(pos, t)| seen.get(pos).map(|r| (*r, r - t)))
            .collect();
        l.sort_unstable_by_key(|&(_, latency)| latency);
        l
    };
    let (kept, moved) = (after_b(false), after_b(true));
    // A publishes nothing for a partition after its revoke: the first result after it is B's.
    let first_on_b =
        moved.iter().map(|&(at, _)| at).filter(|&at| at > revoked_ms).min().map_or(-1, |at| at - revoked_ms);
    println!(
        "takeover of {state} keys at {rate} commands/s: B took partitions {taken:?} and restored {records} records (longest {ms} ms); \
         A let them go {} ms after B started, and B's first result of one came {first_on_b} ms after that; worst latency after B started: on A's partitions {} ms, \
         on B's {} ms; {} of {} results",
        revoked_ms - b_started_ms,
        kept.last().map_or(-1, |&(_, l)| l),
        moved.last().map_or(-1, |&(_, l)| l),
        seen.len(),
        produced.len()
    );
    for child in [&mut a, &mut b] {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let _ = child.wait();
    }
    if std::env::var_os("DEDUPD_BENCH_KEEP_LOGS").is_some() {
        println!("logs kept in {} (a.log, b.log)", dir.keep().display());
    }
}

/// Produces `rate` commands/s of new keys, keyed (murmur2) so as to land on their state
/// partition, until `stop`; returns each command's position and timestamp.
async fn produce(
    bootstrap: String,
    input: String,
    rate: usize,
    stop: tokio_util::sync::CancellationToken,
) -> HashMap<(i32, i64), i64> {
    let producer = super::topics::producer(&bootstrap);
    let mut acks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let per_tick = (rate / 100).max(1);
    let mut i = 0usize;
    while !stop.is_cancelled() {
        tick.tick().await;
        for _ in 0..per_tick {
            let key = format!("to-{i}");
            let v = super::topics::command(i);
            if let Ok(f) = producer.send_result(FutureRecord::to(&input).key(&key).payload(&v)) {
                acks.push(f);
            }
            i += 1;
        }
    }
    let mut produced = HashMap::new();
    for a in futures::future::join_all(acks).await {
        if let Ok(Ok(d)) = a {
            produced.insert((d.partition, d.offset), d.timestamp.to_millis().unwrap_or(0));
        }
    }
    produced
}

/// The state partitions B restored (its "state partition restored" lines).
fn taken_partitions(log: &Path) -> BTreeSet<i32> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "state partition restored")
        .filter_map(|v| v["fields"]["partition"].as_str()?.rsplit('/').next()?.parse().ok())
        .collect()
}

/// When (ms since the epoch, within 50 ms) the instance logging to `log` held fewer than
/// all the partitions: the rebalance that gave B its share.
async fn revoked(log: &Path) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(600);
    let http = http_addr(log, deadline).await;
    loop {
        let text = match reqwest::get(format!("http://{http}/metrics")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let held = sample(&text, "dedupd_assigned_partitions");
        if held > 0.0 && held < f64::from(PARTITIONS) {
            return now_ms();
        }
        assert!(Instant::now() < deadline, "A never let partitions go");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the instance logging to `log` serves `/readyz` with 200: joined, and its
/// state partitions restored.
async fn wait_until_ready(log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    let http = http_addr(log, deadline).await;
    while !reqwest::get(format!("http://{http}/readyz")).await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "not ready within an hour: {}", log.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

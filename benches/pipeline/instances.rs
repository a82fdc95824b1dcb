//! `--instances`: several `dedupd run` in one group with the store on Kafka, through the
//! by-key topic (BENCHMARKS.md, "Several instances").
//! 1. Draining the backlog with 1, 2 and 3 instances in one group, all in this process (so
//!    on the same cores: what shows is the cost of coordinating, not a speed-up): commands/s
//!    from the first result's timestamp to the last, so the joins' rebalances count.
//! 2. Failover: two `dedupd run` processes share a group under a steady load of `rate`
//!    commands/s; one is SIGKILLed and not started again. Its partitions wait for its
//!    session (6 s here) to expire, the rebalance, their restore, and for its open
//!    transaction to be aborted: a `read_committed` reader of the by-key topic (the survivor)
//!    reads nothing past it until then. The figure is the worst latency of a command
//!    produced after the kill (input timestamp to result timestamp), beside the median.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dedupd::store::StoreBackend;
use rdkafka::producer::FutureRecord;

use super::{Mode, config_in, create_topic, drain_rate, read_after_drain, read_results, start_pipeline, unique};

/// Drains the backlog of `records` in `input` with 1, 2 and 3 instances; prints each rate.
pub async fn drain_with_instances(bootstrap: &str, input: &str, backend: StoreBackend, records: usize) {
    for instances in 1..=3 {
        let results = unique("bench-results");
        create_topic(bootstrap, &results, 6).await;
        let group = unique("bench-instances");
        let dirs: Vec<tempfile::TempDir> = (0..instances).map(|_| tempfile::tempdir().expect("tempdir")).collect();
        let mut running = Vec::new();
        for dir in &dirs {
            let mut c = config_in(Mode::ByKey, bootstrap, input, &results, backend, dir.path());
            c.kafka.group_id = group.clone();
            running.push(start_pipeline(c).await);
        }
        let b = bootstrap.to_string();
        let seen =
            tokio::task::spawn_blocking(move || read_after_drain(&b, &results, records, Duration::from_secs(900)))
                .await
                .expect("read");
        for (stop, task, _) in running {
            stop.cancel();
            let _ = task.await;
        }
        println!(
            "dedupd run x{instances}, {backend:?}, store on Kafka (through the by-key topic), one group, draining the backlog: {:.0} commands/s",
            drain_rate(&seen)
        );
    }
}

/// A `dedupd run` process with its log in `dir`.
fn spawn_dedupd(config: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["run", "-c", config.to_str().expect("utf-8 path")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn dedupd")
}

/// The failover measure (see the module doc): prints the median and worst latency of the
/// commands produced before and after the kill.
pub async fn failover(bootstrap: &str, backend: StoreBackend, rate: usize) {
    const SECONDS: u64 = 40;
    const KILL_AT: Duration = Duration::from_secs(10);
    let (input, results) = (unique("bench-fo-in"), unique("bench-fo-out"));
    create_topic(bootstrap, &input, 6).await;
    create_topic(bootstrap, &results, 6).await;
    let group = unique("bench-failover");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut children: Vec<Child> = (0..2)
        .map(|i| {
            let store = dir.path().join(format!("store-{i}"));
            let mut c = config_in(Mode::ByKey, bootstrap, &input, &results, backend, &store);
            c.kafka.group_id = group.clone();
            c.kafka.consumer.insert("session.timeout.ms".into(), "6000".into());
            c.kafka.consumer.insert("heartbeat.interval.ms".into(), "1000".into());
            let path = dir.path().join(format!("{i}.toml"));
            std::fs::write(&path, toml::to_string(&c).expect("config as TOML")).expect("write config");
            spawn_dedupd(&path, &dir.path().join(format!("{i}.log")))
        })
        .collect();
    // Both join before the load starts.
    tokio::time::sleep(Duration::from_secs(8)).await;

    let producer = super::producer(bootstrap);
    let started = Instant::now();
    let mut killed_at_ms = None;
    let mut acks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let per_tick = (rate / 100).max(1);
    let mut i = 0usize;
    while started.elapsed() < Duration::from_secs(SECONDS) {
        tick.tick().await;
        for _ in 0..per_tick {
            let key = format!("fo-{i}");
            let v = super::command(i);
            if let Ok(f) = producer.send_result(FutureRecord::to(&input).key(&key).payload(&v)) {
                acks.push(f);
            }
            i += 1;
        }
        if killed_at_ms.is_none() && started.elapsed() >= KILL_AT {
            let _ = children[1].kill();
            killed_at_ms = Some(now_ms());
        }
    }
    let mut produced: HashMap<(i32, i64), i64> = HashMap::new();
    for a in futures::future::join_all(acks).await {
        if let Ok(Ok(d)) = a {
            produced.insert((d.partition, d.offset), d.timestamp.to_millis().unwrap_or(0));
        }
    }
    let (b, r, n) = (bootstrap.to_string(), results.clone(), produced.len());
    let seen =
        tokio::task::spawn_blocking(move || read_results(&b, &r, n, Duration::from_secs(300))).await.expect("read");
    let killed_at = killed_at_ms.unwrap_or(i64::MAX);
    let latencies = |after: bool| -> Vec<i64> {
        let mut l: Vec<i64> = produced
            .iter()
            .filter(|(_, t)| (**t >= killed_at) == after)
            .filter_map(|(pos, t)| seen.get(pos).map(|r| r - t))
            .collect();
        l.sort_unstable();
        l
    };
    let (before, after) = (latencies(false), latencies(true));
    let median = |l: &[i64]| l.get(l.len() / 2).copied().unwrap_or(-1);
    println!(
        "failover, 2 instances, {rate} commands/s, session 6 s: before the kill median {} ms, worst {} ms; after it median {} ms, worst {} ms; {} of {} results",
        median(&before),
        before.last().copied().unwrap_or(-1),
        median(&after),
        after.last().copied().unwrap_or(-1),
        seen.len(),
        produced.len()
    );
    let _ = Command::new("kill").arg("-TERM").arg(children[0].id().to_string()).status();
    let _ = children[0].wait();
    let _ = children[1].wait();
}

/// Milliseconds since the Unix epoch, as Kafka's timestamps count.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

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
//!    produced after the kill (input timestamp to result timestamp), beside the median, and
//!    the survivor's restores at the takeover (records, time). `--state N` writes N keys to
//!    the changelog first, so that there is a state to restore; `--standby` turns on
//!    standby copies (`store.standby`), which should leave the takeover only a tail.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dedupd::store::StoreBackend;
use rdkafka::producer::FutureRecord;

use super::topics::{create_changelog_topic, create_topic, read_after_drain, read_results, unique};
use super::{Mode, config_in, drain_rate, start_pipeline};

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
pub(super) fn spawn_dedupd(config: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["run", "-c", config.to_str().expect("utf-8 path")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn dedupd")
}

/// What a failover run sets.
pub struct Failover {
    /// Commands/s produced throughout.
    pub rate: usize,
    /// Keys written to the changelog before the instances start (a state to restore).
    pub state: usize,
    /// `store.standby` on both instances.
    pub standby: bool,
}

/// The failover measure (see the module doc): prints the median and worst latency of the
/// commands produced before and after the kill, and the survivor's restore at the takeover.
pub async fn failover(bootstrap: &str, backend: StoreBackend, run: &Failover) {
    const SECONDS: u64 = 40;
    const KILL_AT: Duration = Duration::from_secs(10);
    let (input, results) = (unique("bench-fo-in"), unique("bench-fo-out"));
    create_topic(bootstrap, &input, super::restore::PARTITIONS).await;
    create_topic(bootstrap, &results, 6).await;
    let group = unique("bench-failover");
    let dead_letters = unique("bench-fo-dlq");
    super::topics::ensure_dead_letter_topic(bootstrap, &dead_letters).await;
    if run.state > 0 {
        let changelog = format!("{group}.dedupd-state");
        create_changelog_topic(bootstrap, &changelog, super::restore::PARTITIONS).await;
        let written = Instant::now();
        super::restore::write_changelog(bootstrap, &changelog, 0..run.state).await;
        println!("wrote {} keys to the changelog in {:.1} s", run.state, written.elapsed().as_secs_f64());
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let logs: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("{i}.log"))).collect();
    let spawn = |i: usize| {
        let store = dir.path().join(format!("store-{i}"));
        let mut c = config_in(Mode::ByKey, bootstrap, &input, &results, backend, &store);
        c.kafka.group_id = group.clone();
        c.kafka.dead_letter_topic = dead_letters.clone();
        c.kafka.consumer.insert("session.timeout.ms".into(), "6000".into());
        c.kafka.consumer.insert("heartbeat.interval.ms".into(), "1000".into());
        c.store.standby = run.standby;
        c.log.format = dedupd::log::LogFormat::Json;
        let path = dir.path().join(format!("{i}.toml"));
        std::fs::write(&path, toml::to_string(&c).expect("config as TOML")).expect("write config");
        spawn_dedupd(&path, &logs[i])
    };
    // The one to be killed first, so that the survivor never owned its partitions: without
    // standby copies its takeover restores them from nothing.
    let ready = Instant::now();
    let victim = spawn(1);
    wait_until_settled(&logs[1], run).await;
    let survivor = spawn(0);
    wait_until_settled(&logs[0], run).await;
    wait_until_settled(&logs[1], run).await;
    let mut children = [survivor, victim];
    println!("both instances ready, restored and copied in {:.1} s", ready.elapsed().as_secs_f64());

    let victim = Victim { child: &mut children[1], survivor_log: &logs[0] };
    let (produced, killed_at, survivor_log_at_kill) =
        produce_and_kill(bootstrap, &input, (run.rate, SECONDS, KILL_AT), victim).await;
    let (b, r, n) = (bootstrap.to_string(), results.clone(), produced.len());
    let seen =
        tokio::task::spawn_blocking(move || read_results(&b, &r, n, Duration::from_secs(300))).await.expect("read");
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
    let takeover = restores_after(&logs[0], survivor_log_at_kill);
    println!(
        "failover, 2 instances, {} commands/s, session 6 s, state {} keys, standby {}: before the kill median {} ms, worst {} ms; after it median {} ms, worst {} ms; {} of {} results; the survivor's restores after the kill: {} records in {} ms",
        run.rate,
        run.state,
        if run.standby { "on" } else { "off" },
        median(&before),
        before.last().copied().unwrap_or(-1),
        median(&after),
        after.last().copied().unwrap_or(-1),
        seen.len(),
        produced.len(),
        takeover.0,
        takeover.1,
    );
    let _ = Command::new("kill").arg("-TERM").arg(children[0].id().to_string()).status();
    let _ = children[0].wait();
    let _ = children[1].wait();
    if std::env::var_os("DEDUPD_BENCH_KEEP_LOGS").is_some() {
        println!("logs kept in {} (0.log: the survivor, 1.log: the one killed)", dir.keep().display());
    }
}

/// The instance to kill, and the log of the one that survives it.
struct Victim<'a> {
    child: &'a mut Child,
    survivor_log: &'a Path,
}

/// Produces `rate` commands/s for `seconds`, SIGKILLing the victim at `kill_at`; returns
/// each command's position and timestamp, when the kill was (ms since the epoch), and the
/// survivor's log length then.
async fn produce_and_kill(
    bootstrap: &str,
    input: &str,
    (rate, seconds, kill_at): (usize, u64, Duration),
    victim: Victim<'_>,
) -> (HashMap<(i32, i64), i64>, i64, u64) {
    let mut log_at_kill = 0;
    let producer = super::topics::producer(bootstrap);
    let started = Instant::now();
    let mut killed_at_ms = None;
    let mut acks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let per_tick = (rate / 100).max(1);
    let mut i = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        for _ in 0..per_tick {
            let key = format!("fo-{i}");
            let v = super::topics::command(i);
            if let Ok(f) = producer.send_result(FutureRecord::to(input).key(&key).payload(&v)) {
                acks.push(f);
            }
            i += 1;
        }
        if killed_at_ms.is_none() && started.elapsed() >= kill_at {
            let _ = victim.child.kill();
            killed_at_ms = Some(now_ms());
            log_at_kill = std::fs::metadata(victim.survivor_log).map_or(0, |m| m.len());
        }
    }
    let mut produced: HashMap<(i32, i64), i64> = HashMap::new();
    for a in futures::future::join_all(acks).await {
        if let Ok(Ok(d)) = a {
            produced.insert((d.partition, d.offset), d.timestamp.to_millis().unwrap_or(0));
        }
    }
    (produced, killed_at_ms.unwrap_or(i64::MAX), log_at_kill)
}

/// Waits until the instance logging to `log` serves `/readyz` with 200 (it joined and
/// restored what it holds) and, with standby copies, until it has applied the whole state
/// (restored or copied), so that the load starts on a settled group.
async fn wait_until_settled(log: &Path, run: &Failover) {
    let deadline = Instant::now() + Duration::from_secs(900);
    let http = http_addr(log, deadline).await;
    loop {
        let ready = reqwest::get(format!("http://{http}/readyz")).await.is_ok_and(|r| r.status().is_success());
        let applied = match run.standby {
            true => {
                let text = match reqwest::get(format!("http://{http}/metrics")).await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                sample(&text, "dedupd_state_restore_records_total")
                    + sample(&text, "dedupd_state_standby_records_total")
            }
            false => f64::INFINITY,
        };
        if ready && applied >= run.state as f64 {
            return;
        }
        assert!(Instant::now() < deadline, "not settled within 900 s: {}", log.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The HTTP address the instance logging to `log` serves, once its log says it runs
/// (before `deadline`).
pub(super) async fn http_addr(log: &Path, deadline: Instant) -> String {
    loop {
        if let Some(addr) =
            logged(log, "dedupd running").and_then(|v| v["fields"]["http_addr"].as_str().map(str::to_string))
        {
            return addr;
        }
        assert!(Instant::now() < deadline, "no `dedupd running` in {}", log.display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of an unlabelled series in a scrape (0 when absent).
pub(super) fn sample(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// The first JSON line of `log` whose message is `message`.
pub(super) fn logged(log: &Path, message: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == message)
}

/// The records the "state partition restored" lines of `log` past byte `from` logged, and
/// the longest restore's milliseconds among them.
pub(super) fn restores_after(log: &Path, from: u64) -> (u64, u64) {
    let text = std::fs::read(log).unwrap_or_default();
    let after = text.get(usize::try_from(from).unwrap_or(usize::MAX)..).unwrap_or_default();
    String::from_utf8_lossy(after)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "state partition restored")
        .fold((0, 0), |(records, ms), v| {
            (records + v["fields"]["records"].as_u64().unwrap_or(0), ms.max(v["fields"]["ms"].as_u64().unwrap_or(0)))
        })
}

/// Milliseconds since the Unix epoch, as Kafka's timestamps count.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

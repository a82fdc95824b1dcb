//! Latency at a fixed rate, for `dedupd run` and for the plain relay alike, and the disk's
//! fsync latency: what issue 13 bounds dedupd's p99 by (the relay's p99 + two fsyncs' p99
//! + 5 ms, all measured in the same run).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use rdkafka::producer::FutureRecord;

use super::percentile;
use super::topics::{command, producer, read_results};

/// Two seconds at the rate (fetch positions, connections, caches) are produced before the
/// measured ones and not counted.
const WARMUP_SECONDS: usize = 2;

/// The records [`at_rate`] produces: the warm-up's and the measured ones.
pub fn records_at_rate(rate: usize, seconds: u64) -> usize {
    (WARMUP_SECONDS + seconds as usize) * rate
}

/// Produces `rate` commands a second to `input` for the warm-up and then `seconds`, reads
/// the results from `output` (each naming its input's partition and offset) and returns the
/// measured latencies, sorted: result timestamp minus the input's produce time, in ms.
pub async fn at_rate(bootstrap: &str, input: &str, output: &str, rate: usize, seconds: u64) -> Vec<i64> {
    let warmup = WARMUP_SECONDS * rate;
    let total = records_at_rate(rate, seconds);
    let p = producer(bootstrap);
    let mut acks = Vec::with_capacity(total);
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0usize;
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as usize).min(total);
        while sent < due {
            let v = command(10_000_000 + sent);
            let key = format!("bench-{}", 10_000_000 + sent);
            let now_ms = chrono::Utc::now().timestamp_millis();
            let rec = FutureRecord::to(input).key(&key).payload(&v).timestamp(now_ms);
            if let Ok(f) = p.send_result(rec) {
                acks.push((sent >= warmup, now_ms, f));
            }
            sent += 1;
        }
    }
    let mut produced: HashMap<(i32, i64), i64> = HashMap::with_capacity(total);
    let mut all = 0;
    for (measured, ts, f) in acks {
        if let Ok(Ok(d)) = f.await {
            all += 1;
            if measured {
                produced.insert((d.partition, d.offset), ts);
            }
        }
    }
    let (b, r) = (bootstrap.to_string(), output.to_string());
    let seen =
        tokio::task::spawn_blocking(move || read_results(&b, &r, all, Duration::from_secs(120))).await.expect("read");
    let mut lat: Vec<i64> = seen.iter().filter_map(|(pos, t)| produced.get(pos).map(|p| t - p)).collect();
    lat.sort_unstable();
    lat
}

/// The p99 of 200 appends of 4 KiB, each followed by an fsync, in a file under the
/// system's temporary directory (where the bench's stores are), in ms: the disk alone.
pub fn fsync_p99_ms() -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut file = std::fs::File::create(dir.path().join("fsync-probe")).expect("probe file");
    let mut took: Vec<f64> = (0..200).map(|_| append_and_sync(&mut file)).collect();
    p99(&mut took)
}

/// Appends 4 KiB to `file` and fsyncs it: how long that took, in ms.
fn append_and_sync(file: &mut std::fs::File) -> f64 {
    let t = Instant::now();
    file.write_all(&[0x5au8; 4096]).expect("write");
    file.sync_all().expect("fsync");
    t.elapsed().as_secs_f64() * 1e3
}

fn p99(took: &mut [f64]) -> f64 {
    took.sort_by(f64::total_cmp);
    took.get((took.len() * 99 / 100).min(took.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}

/// Appends of 4 KiB with an fsync each, one every 10 ms on a thread of its own, for as long
/// as it runs: the fsyncs of a process that shares the disk with the broker while the broker
/// serves a load, which is what a durability point of dedupd's costs beside it (the broker
/// writes its logs to the same disk; see docs/performance-notes.md, "The fsyncs the bound allows").
pub struct FsyncProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl FsyncProbe {
    /// Starts probing.
    pub fn start() -> FsyncProbe {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let dir = tempfile::tempdir().expect("tempdir");
                let mut file = std::fs::File::create(dir.path().join("fsync-probe")).expect("probe file");
                let mut took = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    took.push(append_and_sync(&mut file));
                    std::thread::sleep(Duration::from_millis(10));
                }
                took
            }
        });
        FsyncProbe { stop, thread }
    }

    /// Stops probing: the p99 of the fsyncs made, in ms, and how many.
    pub fn p99_ms(self) -> (f64, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut took = self.thread.join().expect("fsync probe");
        (p99(&mut took), took.len())
    }
}

/// One line: the relay's latency at the rate, the fsync p99 beside it and alone, and issue
/// 13's bound on dedupd's p99 derived from them (relay p99 + two fsync p99 + 5 ms), with the
/// fsyncs made beside the relay's run and with the disk alone, in that order.
pub fn print_bound(relay: &[i64], beside: (f64, usize), alone: f64) -> (f64, f64) {
    let relay_p99 = percentile(relay, 0.99) as f64;
    let bound = |fsync_p99: f64| relay_p99 + 2.0 * fsync_p99 + 5.0;
    println!(
        "plain relay at the same rate: p50 {} ms, p99 {} ms ({} results); fsync p99 beside it {:.2} ms ({} fsyncs), \
         alone after it {alone:.2} ms; bound on dedupd's p99 (relay p99 + 2 fsync p99 + 5 ms): {:.1} ms, \
         {:.1} ms with the fsyncs alone",
        percentile(relay, 0.5),
        relay_p99,
        relay.len(),
        beside.0,
        beside.1,
        bound(beside.0),
        bound(alone)
    );
    (bound(beside.0), bound(alone))
}

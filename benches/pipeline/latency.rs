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
/// system's temporary directory (where the bench's stores are), in ms.
pub fn fsync_p99_ms() -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut file = std::fs::File::create(dir.path().join("fsync-probe")).expect("probe file");
    let block = [0x5au8; 4096];
    let mut took: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            file.write_all(&block).expect("write");
            file.sync_all().expect("fsync");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    took.sort_by(f64::total_cmp);
    took[(took.len() * 99 / 100).min(took.len() - 1)]
}

/// One line: the relay's latency at the rate, the fsync p99, and issue 13's bound on
/// dedupd's p99 derived from them.
pub fn print_bound(relay: &[i64], fsync_p99_ms: f64) -> f64 {
    let bound = percentile(relay, 0.99) as f64 + 2.0 * fsync_p99_ms + 5.0;
    println!(
        "plain relay at the same rate: p50 {} ms, p99 {} ms ({} results); fsync p99 {fsync_p99_ms:.2} ms; \
         bound on dedupd's p99 (relay p99 + 2 fsync p99 + 5 ms): {bound:.1} ms",
        percentile(relay, 0.5),
        percentile(relay, 0.99),
        relay.len()
    );
    bound
}

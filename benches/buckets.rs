//! Expiry buckets benchmark: what keeping a TTL'd key set in one leveled fjall keyspace
//! costs against keeping it in keyspaces of its own per slice of time, dropped whole when
//! the slice expires (no dedupd code on either side).
//!
//! ```text
//! cargo bench --bench buckets -- [--keys N] [--buckets B] [--lookups N] [--sides S,..] [--dir DIR]
//! ```
//!
//! Both sides write the same `N` keys (36-byte UUID text in random order, 142-byte values, as
//! the store bench) in atomic batches of 1,000 with an fsync per batch, each in a child
//! process of its own, one after the other:
//! - `single`: one keyspace with the settings of dedupd's `records`; expiring
//!   the oldest `N/B` keys deletes them in batches of 10,000 with an fsync per batch;
//! - `buckets`: `B` keyspaces with the same settings, the keys written into them in order (the first `N/B` into the
//!   first...), as if each held the keys whose expiry falls in one slice of time; a lookup
//!   probes them newest first (each table's bloom filter is in memory) until it finds the key,
//!   and again probing only the keyspace that holds it (what a map from each key to its
//!   slice, such as a presence filter keeping one, would allow); expiring the oldest `N/B`
//!   keys drops the oldest keyspace.
//!
//! `--sides buckets` runs one side only (at 100M keys the single side's writes alone take
//! half an hour here).
//!
//! Per side: the write rate; the bytes the process wrote to the disk (`/proc/self/io`) by
//! the end of the writes and once the engine's compaction has gone idle (under 5% of a
//! core for 5 s, at most 30 min), each against the logical bytes written; lookups of a
//! random sample of the keys once idle (best of three rounds); the time to expire the
//! oldest slice. This measures, on the raw engine, what dedupd's slices of the records
//! (src/store/slices.rs) take up: compaction that rewrites less (docs/performance-notes.md,
//! "Records in slices by hour").

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/idle.rs"]
mod idle;
#[path = "support/keys.rs"]
mod keys;
use keys::{key, splitmix};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: u64 = 1_000;
const DELETE_BATCH: usize = 10_000;
const VALUE_BYTES: usize = 142;
const LOOKUP_ROUNDS: usize = 3;
const IDLE_WAIT_MAX: Duration = Duration::from_secs(1_800);

/// Random bytes, so that neither side gains from compression (a stored record has a
/// random fingerprint and result, and some text that compresses).
fn value(i: u64) -> Vec<u8> {
    let mut v: Vec<u8> =
        (0..VALUE_BYTES.div_ceil(8) as u64).flat_map(|w| splitmix(i ^ (w << 56)).to_le_bytes()).collect();
    v.truncate(VALUE_BYTES);
    v
}

/// Bytes this process has had written to the disk so far (`write_bytes` of /proc/self/io).
fn written_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")?.trim().parse().ok()).unwrap_or(0)
}

fn emit(name: &str, v: f64) {
    println!("FIG {name} {v}");
}

/// dedupd's settings for its `records` keyspace (src/store/fjall_backend.rs), on both sides:
/// with fjall's defaults, index and filter blocks below the first levels are not pinned and
/// random gets in a large single keyspace read whole blocks per probe (2.3k gets/s at 30M).
fn records_options() -> fjall::KeyspaceCreateOptions {
    use fjall::config::PinningPolicy;
    fjall::KeyspaceCreateOptions::default()
        .max_memtable_size(32 * 1024 * 1024)
        .index_block_pinning_policy(PinningPolicy::all(true))
        .filter_block_pinning_policy(PinningPolicy::all(true))
}

/// One side, in this (child) process.
fn child(side: &str, n: u64, buckets: u64, lookups: u64, dir: &Path) {
    // dedupd's database settings too: a 64 MiB block cache, journals capped at 64 MiB.
    let db = fjall::Database::builder(dir).cache_size(64 << 20).max_journaling_size(64 << 20).open().unwrap();
    let count = if side == "buckets" { buckets } else { 1 };
    let spaces: Vec<fjall::Keyspace> =
        (0..count).map(|b| db.keyspace(&format!("records-{b}"), records_options).unwrap()).collect();
    let per_space = n.div_ceil(count);
    let t = Instant::now();
    for start in (0..n).step_by(BATCH as usize) {
        let mut batch = db.batch();
        for i in start..(start + BATCH).min(n) {
            batch.insert(&spaces[(i / per_space) as usize], key(i).as_str(), value(i));
        }
        batch.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    emit("write_per_s", n as f64 / t.elapsed().as_secs_f64());
    emit("written_after_writes", written_bytes() as f64);
    emit("idle_wait_s", idle::wait_until_idle(IDLE_WAIT_MAX).as_secs_f64());
    emit("written_once_idle", written_bytes() as f64);
    emit("disk_bytes", db.disk_space().unwrap() as f64);
    let sample: Vec<(u64, String)> = (0..lookups)
        .map(|j| {
            let i = splitmix(j ^ 0x5eed) % n;
            (i, key(i))
        })
        .collect();
    let best_of_rounds = |probe: &dyn Fn(u64, &str) -> bool| {
        (0..LOOKUP_ROUNDS)
            .map(|_| {
                let t = Instant::now();
                let found = sample.iter().filter(|(i, k)| probe(*i, k));
                assert_eq!(found.count(), sample.len());
                sample.len() as f64 / t.elapsed().as_secs_f64()
            })
            .fold(0.0, f64::max)
    };
    let newest_first = |_: u64, k: &str| spaces.iter().rev().any(|s| s.get(k.as_bytes()).unwrap().is_some());
    emit("get_per_s", best_of_rounds(&newest_first));
    if count > 1 {
        let mapped = |i: u64, k: &str| spaces[(i / per_space) as usize].get(k.as_bytes()).unwrap().is_some();
        emit("get_mapped_per_s", best_of_rounds(&mapped));
    }
    let t = Instant::now();
    if side == "buckets" {
        let oldest = spaces.into_iter().next().unwrap();
        db.delete_keyspace(oldest).unwrap();
    } else {
        // The same oldest slice the other side drops: the first N/B keys written.
        let oldest: Vec<u64> = (0..n.div_ceil(buckets).min(n)).collect();
        for chunk in oldest.chunks(DELETE_BATCH) {
            let mut batch = db.batch();
            for &i in chunk {
                batch.remove(&spaces[0], key(i).as_str());
            }
            batch.commit().unwrap();
            db.persist(fjall::PersistMode::SyncAll).unwrap();
        }
    }
    emit("expire_oldest_s", t.elapsed().as_secs_f64());
}

struct Args {
    keys: u64,
    buckets: u64,
    lookups: u64,
    sides: Vec<String>,
    dir: PathBuf,
    child: Option<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        keys: 10_000_000,
        buckets: 24,
        lookups: 100_000,
        sides: vec!["single".into(), "buckets".into()],
        dir: std::env::temp_dir(),
        child: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--keys" => a.keys = val().parse().expect("--keys N"),
            "--buckets" => a.buckets = val().parse().expect("--buckets B"),
            "--lookups" => a.lookups = val().parse().expect("--lookups N"),
            "--sides" => a.sides = val().split(',').map(String::from).collect(),
            "--dir" => a.dir = PathBuf::from(val()),
            "--child" => a.child = Some(val()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(a.keys > 0 && a.buckets > 0, "--keys and --buckets must be positive");
    assert!(a.sides.iter().all(|s| s == "single" || s == "buckets"), "--sides single,buckets");
    a
}

/// Runs one side in a child process; returns its figures.
fn run_side(side: &str, a: &Args) -> Vec<(String, f64)> {
    let dir = tempfile::tempdir_in(&a.dir).expect("a directory under --dir");
    let out = Command::new(std::env::current_exe().expect("own path"))
        .args(["--keys", &a.keys.to_string(), "--buckets", &a.buckets.to_string()])
        .args(["--lookups", &a.lookups.to_string(), "--dir", dir.path().to_str().expect("utf-8 dir")])
        .args(["--child", side])
        .output()
        .expect("run the child");
    assert!(out.status.success(), "{side}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.strip_prefix("FIG ")?.split(' ');
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

fn main() {
    let a = parse_args();
    if let Some(side) = &a.child {
        return child(side, a.keys, a.buckets, a.lookups, &a.dir);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("{} keys, {} buckets, {} lookups; load average {}", a.keys, a.buckets, a.lookups, load.trim());
    let logical = a.keys as f64 * (key(0).len() + VALUE_BYTES) as f64;
    println!(
        "| side | write (keys/s) | written after the writes / once idle (× logical) | idle wait | disk | lookups (gets/s) | lookups, its slice only | expire the oldest 1/{} |",
        a.buckets
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for side in &a.sides {
        let f = run_side(side, &a);
        let get = |name: &str| f.iter().find(|(n, _)| n == name).map_or(f64::NAN, |(_, v)| *v);
        println!(
            "| {side} | {:.1} k | {:.1} / {:.1} GB ({:.1}× / {:.1}×) | {:.0} s | {:.2} GB | {:.1} k | {:.1} k | {:.2} s |",
            get("write_per_s") / 1e3,
            get("written_after_writes") / 1e9,
            get("written_once_idle") / 1e9,
            get("written_after_writes") / logical,
            get("written_once_idle") / logical,
            get("idle_wait_s"),
            get("disk_bytes") / 1e9,
            get("get_per_s") / 1e3,
            get("get_mapped_per_s") / 1e3,
            get("expire_oldest_s"),
        );
    }
}

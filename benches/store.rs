//! Store benchmark: dedupd's `KeyStore` against the raw floor of each engine, at one or
//! more store sizes.
//!
//! ```text
//! cargo bench --bench store -- [--keys N[,N...]] [--backend NAME|all] [--lookups N]
//!                              [--only raw|store] [--pairs N] [--dir DIR] [--cache BYTES]
//! ```
//!
//! For each backend and size, `--pairs` (default 3) pairs of child processes, run back to
//! back and alternating (so that RSS is never mixed, and a busy minute on a shared machine
//! skews one pair, not the comparison); figures are medians over the pairs, ratios the
//! medians of the per-pair ratios, which are printed too:
//! - `raw`: the engine used directly (no dedupd code, the crate's default configuration):
//!   N keys inserted in atomic batches of 1,000 with an fsync per batch, point gets of a
//!   random sample of them, deletes of the oldest (all, at most 1M) in batches of 10,000
//!   (the default compaction chunk) with an fsync per batch;
//! - `store`: `KeyStore` with its default cache (`--cache`: `store.cache_bytes`): claim 1,000 → `flush_claims` → complete
//!   1,000 → `flush`, its slices of the records turned 24 times over the writes (as a day of
//!   writes turns them each hour), lookups (`get`, which decodes) of the same sample, `compact_expired`
//!   of the same oldest keys in chunks of 10,000, then the store dropped and opened again
//!   (what a restart waits for: the open counts the records and fills the presence filter),
//!   then saved as a clean stop does and opened again (the open reads the filter back).
//!
//! With several sizes, a last table per backend shows how dedupd's rates move against its
//! own at the smallest size, and the memory each million keys past it added.
//!
//! Keys look like idempotency keys (36-byte UUID text, random order), generated per batch
//! outside the clock (the bench holds no list of all keys, so its RSS is the store's);
//! values are the 142-byte encoding of each key's completed record (the raw floor stores
//! the same bytes). The lookup sample is `--lookups` keys drawn at random (default 100k).
//! Disk is measured right after the writes and a flush, and again once the engine's
//! background work has settled (two readings 1 s apart within 1%, at most 60 s). Lookups run
//! 3 rounds and the best is reported, for both sides (the machine may be shared), with the
//! first round's rate (nothing cached by an earlier round); then, once the child has used
//! under 5% of a core for 5 s (the engine's compaction of what the bench just wrote has
//! finished; at most 30 min), a second sample is read once. RSS from /proc/self/status:
//! VmRSS growth over the writes, VmHWM growth at the end.

use std::collections::BTreeMap;
use std::num::NonZeroU64;

#[path = "store/args.rs"]
mod args;
#[path = "support/idle.rs"]
mod idle;
#[path = "support/keys.rs"]
mod keys;
#[path = "store/raw.rs"]
mod raw;
#[path = "store/tables.rs"]
mod tables;
use args::{parse_args, parse_backend};
use keys::{key, splitmix};
use raw::raw_child;
use tables::{print_comparison, print_scales};

/// The binary's allocator (as dedupd's own: `src/main.rs`), for both sides of every comparison.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{CacheSize, StoreBackend, StoreConfig, SyncMode};
use dedupd::store::{ClaimRequest, Completed, Completion, InProgress, KeyStore, SLICE_SPAN_MS, SourcePos};

const BATCH: usize = 1_000;
/// The hours of writes the keys stand for (a 24 h TTL's day): dedupd's store turns to a
/// new slice of the records each hour, so the bench turns it this many times over the
/// writes, at even steps, on a clock of its own.
const HOURS: u64 = 24;
const CHUNK: usize = 10_000;
/// Every completion expires at BASE_EXPIRY + i; compaction runs at a later "now".
const BASE_EXPIRY: i64 = 1_700_000_000_000;

fn fingerprint(i: u64) -> Fingerprint {
    let mut fp = [0u8; 32];
    for (n, c) in fp.chunks_mut(8).enumerate() {
        c.copy_from_slice(&splitmix(i.wrapping_mul(4).wrapping_add(n as u64)).to_le_bytes());
    }
    Fingerprint(fp)
}

fn claim_record(i: u64) -> InProgress {
    InProgress {
        fingerprint: fingerprint(i),
        claimed_at_ms: BASE_EXPIRY - 86_400_000 + i as i64,
        attempts: 1,
        source: SourcePos { topic: "commands".into(), partition: (i % 12) as i32, offset: i as i64 },
        held: None,
    }
}

fn completed_record(i: u64) -> Completed {
    Completed {
        fingerprint: fingerprint(i),
        outcome: Completion::Succeeded,
        // 58 bytes of result JSON: with its source, the record encodes to RECORD_BYTES.
        result: format!("{{\"status\":200,\"message_id\":\"msg-{:024x}\"}}", u128::from(splitmix(i)) << 32)
            .into_bytes(),
        error: None,
        first_seen_at_ms: BASE_EXPIRY - 86_400_000 + i as i64,
        completed_at_ms: BASE_EXPIRY - 86_400_000 + i as i64 + 5,
        expires_at_ms: BASE_EXPIRY + i as i64,
        attempts: 1,
        source: Some(claim_record(i).source),
        settled: None,
    }
}

fn proc_status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_bytes(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Polls `bytes` until two readings 1 s apart agree within 1% (background compaction,
/// journal and segment cleanup done), at most 60 s. Returns the last reading.
fn settled(mut bytes: impl FnMut() -> u64) -> u64 {
    let mut last = bytes();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_secs(1));
        let now = bytes();
        if now.abs_diff(last) * 100 <= last {
            return now;
        }
        last = now;
    }
    last
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Keys the lookup phase reads unless `--lookups` says: enough to reach past any cache,
/// few enough that fjall's raw floor at 10M keys (thousands of gets/s: with its default
/// configuration each get reads a large index block) ends in minutes.
const DEFAULT_LOOKUPS: u64 = 100_000;

/// Lookup rounds right after the writes; the best is reported (the machine is shared, and
/// the first round may race the engine's background compaction).
const LOOKUP_ROUNDS: usize = 3;

/// The encoded size of each key's completed record (`completed_record`).
const RECORD_BYTES: usize = 142;

/// The longest wait for the engine's background work before the second lookup phase.
const IDLE_WAIT_MAX: Duration = Duration::from_secs(30 * 60);

fn emit(name: &str, value: f64) {
    println!("METRIC {name} {value}");
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

// ---------------------------------------------------------------------------------------
// children (the raw floor's: `store/raw.rs`)

/// Keys `start..start + len`, as the bench writes them.
fn keys_of(start: u64, len: u64) -> Vec<String> {
    (start..start + len).map(key).collect()
}

/// The keys the lookup phases read: `lookups` keys drawn at random from the `n` written for
/// each phase, a different draw for the second so that the first phase's reads do not warm
/// it (built before the clock starts; a run at 100M keys samples rather than reading them all).
struct LookupSamples {
    /// Read right after the writes, while the engine may still be compacting them.
    after_writes: Vec<String>,
    /// Read once the process has gone idle (`wait_until_idle`).
    once_idle: Vec<String>,
}

impl LookupSamples {
    /// Samples of the keys `first..n`.
    fn new(first: u64, n: u64, lookups: u64) -> Self {
        let draw = |seed: u64| (0..lookups).map(|j| key(first + splitmix(j ^ seed) % (n - first))).collect();
        Self { after_writes: draw(0x5eed), once_idle: draw(0x1d1e_5eed) }
    }
}

/// How many of the `n` keys the removal phase deletes (raw) or compacts (dedupd): the
/// oldest, at most 1M, so that a run at 100M keys measures removal at that size in minutes.
fn removes(n: u64) -> u64 {
    n.min(1_000_000)
}

/// Start and length of each batch of `size` over `0..n`.
fn batches(n: u64, size: usize) -> impl Iterator<Item = (u64, u64)> {
    let size = size as u64;
    (0..n.div_ceil(size)).map(move |b| (b * size, size.min(n - b * size)))
}

/// Rates of `LOOKUP_ROUNDS` rounds of `get` over `sample`; every key must be found.
fn lookup_rounds(sample: &[String], get: &mut impl FnMut(&str) -> bool) -> Vec<f64> {
    (0..LOOKUP_ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let found = sample.iter().filter(|k| get(k)).count();
            assert_eq!(found, sample.len());
            rate(sample.len() as u64, t.elapsed())
        })
        .collect()
}

/// The lookup phases: the sample read right after the writes (`get_per_s`, the best round;
/// `get_first_round_per_s`, the round that found nothing cached by an earlier one), then,
/// once the process is idle, a second sample (`get_idle_per_s`, its first round, and how
/// long the wait took). Right after a large write the engine is still compacting what it
/// wrote on the same cores and disk; a service writing a few thousand keys a second is not.
fn measure_lookups(samples: &LookupSamples, mut get: impl FnMut(&str) -> bool) {
    let rounds = lookup_rounds(&samples.after_writes, &mut get);
    emit("get_per_s", rounds.iter().copied().fold(0.0, f64::max));
    emit("get_first_round_per_s", rounds[0]);
    emit("idle_wait_s", idle::wait_until_idle(IDLE_WAIT_MAX).as_secs_f64());
    emit("get_idle_per_s", lookup_rounds(&samples.once_idle, &mut get)[0]);
}

/// dedupd's KeyStore over the backend.
fn store_child(config: &StoreConfig, n: u64, lookups: u64) {
    if std::env::var_os("DEDUPD_BENCH_LOOKUPS_ONLY").is_some() {
        // For profiling and trials of settings that a reopen takes: the lookups alone, over
        // the store a full child of the same `--keys` left in `--dir` (its oldest removed).
        let store = KeyStore::open_configured(config).unwrap();
        measure_lookups(&LookupSamples::new(removes(n), n, lookups), |k| store.get(k).unwrap().is_some());
        return;
    }
    let samples = LookupSamples::new(0, n, lookups);
    let rss0 = proc_status_kib("VmRSS:");
    let store = KeyStore::open_configured(config).unwrap();

    // Claim + complete, group commit of BATCH.
    // Only the store's work is timed: the records are the input (the raw floor's values
    // are encoded before its clock starts, too), built before each round's clock starts.
    let (mut claim_t, mut complete_t) = (Duration::ZERO, Duration::ZERO);
    let per_hour = n.div_ceil(HOURS);
    for (i0, len) in batches(n, BATCH) {
        if i0 > 0 && i0 % per_hour < BATCH as u64 {
            // The next hour of the day these keys stand for: a new slice takes them.
            let hour = (i0 / per_hour) as i64;
            let c = Instant::now();
            store.turn_slices(hour * SLICE_SPAN_MS).unwrap();
            claim_t += c.elapsed();
        }
        let chunk = keys_of(i0, len);
        let mut claims: Vec<InProgress> = (i0..i0 + len).map(claim_record).collect();
        let done: Vec<Completed> = (i0..i0 + len).map(completed_record).collect();
        let c = Instant::now();
        // As the engine does for a round: read each key (stamped), claim them in one batch.
        let mut requests = Vec::with_capacity(chunk.len());
        for (k, claim) in chunk.into_iter().zip(claims.drain(..)) {
            let (expected, stamp) = store.get_stamped(&k).unwrap();
            assert!(expected.is_none(), "fresh key");
            requests.push(ClaimRequest { key: k, expected, stamp, claim });
        }
        let pending: Vec<_> = store.claim_batch(requests).unwrap().into_iter().map(|r| r.expect("fresh key")).collect();
        let durable = store.flush_claims(pending).unwrap();
        claim_t += c.elapsed();
        let c = Instant::now();
        // As the engine does for a round: one complete_batch (one index entry per
        // second of expiry), then one flush.
        store.complete_batch(durable.into_iter().zip(done).collect()).unwrap();
        store.flush().unwrap();
        complete_t += c.elapsed();
    }
    emit("write_per_s", rate(n, claim_t + complete_t));
    if std::env::var_os("DEDUPD_BENCH_WRITE_ONLY").is_some() {
        return; // for profiling the write path alone
    }
    emit("claim_per_s", rate(n, claim_t));
    emit("complete_per_s", rate(n, complete_t));
    emit("rss_loaded_kib", proc_status_kib("VmRSS:").saturating_sub(rss0) as f64);
    emit("disk_bytes", store.disk_bytes().unwrap() as f64);
    emit("dir_bytes", dir_bytes(&config.path) as f64);
    emit("disk_settled_bytes", settled(|| store.disk_bytes().unwrap_or(0)) as f64);

    measure_lookups(&samples, |k| store.get(k).unwrap().is_some());

    assert_eq!(store.counts().completed, n as i64);
    // Key i expires at BASE_EXPIRY + i ms, so the oldest `removes` are due one ms before.
    let t = Instant::now();
    let removed = store.compact_expired(BASE_EXPIRY + removes(n) as i64 - 1, CHUNK).unwrap();
    emit("delete_s", t.elapsed().as_secs_f64());
    assert_eq!(removed as u64, removes(n));
    assert_eq!(store.counts().completed, (n - removes(n)) as i64);
    emit("rss_hwm_kib", proc_status_kib("VmHWM:").saturating_sub(rss0) as f64);

    // A restart: opening counts the records and fills the presence filter from a full scan,
    // so how long a restarted instance is away grows with the store.
    drop(store);
    let t = Instant::now();
    let store = KeyStore::open_configured(config).unwrap();
    emit("reopen_s", t.elapsed().as_secs_f64());
    assert_eq!(store.counts().completed, (n - removes(n)) as i64);

    // A restart after a clean stop: the stop saves the filter, the open reads it back.
    let t = Instant::now();
    let saved = store.save_presence().unwrap();
    emit("save_s", t.elapsed().as_secs_f64());
    drop(store);
    let t = Instant::now();
    let store = KeyStore::open_configured(config).unwrap();
    emit("reopen_saved_s", t.elapsed().as_secs_f64());
    assert_eq!(store.opened_from_saved_filter(), saved);
    assert_eq!(store.counts().completed, (n - removes(n)) as i64);
}

// ---------------------------------------------------------------------------------------
// parent (its tables: `store/tables.rs`)

/// One child's figures (`METRIC name value` lines).
type Figures = BTreeMap<String, f64>;

fn run_child(mode: &str, backend: StoreBackend, n: u64, lookups: u64, base: &Path, cache: Option<u64>) -> Figures {
    let dir = base.join(format!("{backend}-{mode}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", mode, "--backend", backend.name(), "--keys", &n.to_string()])
        .args(["--lookups", &lookups.to_string(), "--dir", dir.to_str().unwrap()])
        .args(cache.map(|c| ["--cache".to_string(), c.to_string()]).into_iter().flatten())
        .output()
        .expect("spawn bench child");
    if !out.status.success() {
        panic!("{backend} {mode} child failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let figures: Figures = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut p = l.strip_prefix("METRIC ")?.split_whitespace();
            Some((p.next()?.to_string(), p.next()?.parse().ok()?))
        })
        .collect();
    // A long run's figures as each child ends, so an interrupted run is not lost.
    eprintln!("{backend} {mode} {n} keys: {figures:?}");
    figures
}

fn main() {
    let a = parse_args();
    let lookups = |n: u64| a.lookups.unwrap_or(DEFAULT_LOOKUPS).min(n);
    if let Some(mode) = &a.child {
        let dir = a.dir.as_deref().expect("--dir");
        let (backend, n) = (parse_backend(&a.backend), a.scales[0]);
        match mode.as_str() {
            "raw" => raw_child(backend, n, lookups(n), dir),
            "store" => {
                let config = StoreConfig {
                    backend,
                    path: dir.to_path_buf(),
                    sync: SyncMode::Batch,
                    cache_bytes: CacheSize(a.cache_bytes.and_then(NonZeroU64::new)),
                    ..StoreConfig::default()
                };
                store_child(&config, n, lookups(n))
            }
            other => panic!("unknown child mode {other}"),
        }
        return;
    }

    let base = a.dir.clone().unwrap_or_else(|| PathBuf::from("target/store-bench"));
    std::fs::create_dir_all(&base).unwrap();
    // `both` predates a third backend; it means every registered one, as `all` does.
    let backends: Vec<StoreBackend> = match a.backend.as_str() {
        "all" | "both" => StoreBackend::ALL.to_vec(),
        b => vec![parse_backend(b)],
    };
    println!(
        "store benchmark: {:?} keys, write batches of {BATCH}, compaction/delete chunks of {CHUNK}, dir {}",
        a.scales,
        base.display()
    );
    println!("load average before: {}", loadavg());
    for b in backends {
        let mut by_scale: Vec<(u64, Vec<(Figures, Figures)>)> = Vec::new();
        for &n in &a.scales {
            let t = Instant::now();
            // Alternating pairs, so that a busy minute on a shared machine hits one pair, not
            // the whole comparison; every figure is the median over the pairs and every ratio
            // the median of the per-pair ratios (the two children of a pair run back to back).
            let side = |mode: &str| match a.only.as_deref() {
                Some(only) if only != mode => Figures::new(),
                _ => run_child(mode, b, n, lookups(n), &base, a.cache_bytes),
            };
            let pairs: Vec<(Figures, Figures)> = (0..a.pairs).map(|_| (side("raw"), side("store"))).collect();
            println!();
            println!(
                "## {b}, {n} keys, {} lookups ({} pairs in {:.0?}; load average now {})",
                lookups(n),
                a.pairs,
                t.elapsed(),
                loadavg()
            );
            print_comparison(n, &pairs);
            by_scale.push((n, pairs));
        }
        if by_scale.len() > 1 {
            print_scales(b, &by_scale);
        }
    }
}

//! Store benchmark: dedupd's `KeyStore` against the raw floor of each engine, at one or
//! more store sizes.
//!
//! ```text
//! cargo bench --bench store -- [--keys N[,N...]] [--backend NAME|all] [--lookups N]
//!                              [--only raw|store] [--pairs N] [--dir DIR]
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
//! - `store`: `KeyStore` with its default cache: claim 1,000 → `flush_claims` → complete
//!   1,000 → `flush`, lookups (`get`, which decodes) of the same sample, `compact_expired`
//!   of the same oldest keys in chunks of 10,000.
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

#[path = "support/idle.rs"]
mod idle;
#[path = "support/keys.rs"]
mod keys;
use keys::{key, splitmix};

/// The binary's allocator (as dedupd's own: `src/main.rs`), for both sides of every comparison.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{ClaimRequest, Completed, Completion, InProgress, KeyStore, Record, SourcePos};
use dedupd::store::{StoreBackend, SyncMode};

const BATCH: usize = 1_000;
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
// children

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
    fn new(n: u64, lookups: u64) -> Self {
        let draw = |seed: u64| (0..lookups).map(|j| key(splitmix(j ^ seed) % n)).collect();
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

/// The raw floor: the engine's own API, default configuration, no dedupd code.
fn raw_child(backend: StoreBackend, n: u64, lookups: u64, dir: &Path) {
    emit("logical_bytes_per_key", (key(0).len() + RECORD_BYTES) as f64);
    let Some(&(_, raw_floor)) = RAW_FLOORS.iter().find(|(b, _)| *b == backend) else {
        panic!("backend {backend} has no raw floor: add one to RAW_FLOORS");
    };
    let samples = LookupSamples::new(n, lookups);
    let rss0 = proc_status_kib("VmRSS:");
    raw_floor(RawInput { n, samples: &samples, dir, rss0 });
    emit("rss_hwm_kib", proc_status_kib("VmHWM:").saturating_sub(rss0) as f64);
}

/// What a raw floor writes, reads and deletes: keys `0..n`, each with its own encoded
/// record (built per batch outside the clock: one value shared by every key would let the
/// engine's block compression shrink the floor's disk and flush work far below what records
/// of this size cost), the lookup samples, and the RSS before loading.
struct RawInput<'a> {
    n: u64,
    samples: &'a LookupSamples,
    dir: &'a Path,
    rss0: u64,
}

impl RawInput<'_> {
    /// Writes every key in batches of `BATCH` through `write` (given the batch's keys and
    /// records; it makes them durable), timing only `write`. Returns the time taken.
    fn write_all(&self, mut write: impl FnMut(&[String], &[Vec<u8>])) -> Duration {
        let mut took = Duration::ZERO;
        for (start, len) in batches(self.n, BATCH) {
            let keys = keys_of(start, len);
            let values: Vec<Vec<u8>> =
                (start..start + len).map(|i| Record::Completed(completed_record(i)).encode()).collect();
            assert!(values.iter().all(|v| v.len() == RECORD_BYTES));
            let t = Instant::now();
            write(&keys, &values);
            took += t.elapsed();
        }
        took
    }

    /// Deletes the oldest `removes()` keys in chunks of `CHUNK` through `delete`, timing
    /// only `delete`.
    fn delete_oldest(&self, mut delete: impl FnMut(&[String])) -> Duration {
        let mut took = Duration::ZERO;
        for (start, len) in batches(removes(self.n), CHUNK) {
            let keys = keys_of(start, len);
            let t = Instant::now();
            delete(&keys);
            took += t.elapsed();
        }
        took
    }

    fn emit_loaded(&self) {
        emit("rss_loaded_kib", proc_status_kib("VmRSS:").saturating_sub(self.rss0) as f64);
    }
}

/// Writes, reads and deletes the keys through one engine's own API, emitting its figures.
type RawFloor = fn(RawInput);

/// The raw floor of each backend: its engine used directly, so it cannot come from the
/// store's registration. A registered backend missing here runs in the bench only once it
/// has one.
const RAW_FLOORS: &[(StoreBackend, RawFloor)] = &[(StoreBackend::Sled, raw_sled), (StoreBackend::Fjall, raw_fjall)];

fn raw_sled(input: RawInput) {
    let db = sled::open(input.dir).unwrap();
    let took = input.write_all(|keys, values| {
        let mut b = sled::Batch::default();
        for (k, v) in keys.iter().zip(values) {
            b.insert(k.as_bytes(), v.as_slice());
        }
        db.apply_batch(b).unwrap();
        db.flush().unwrap();
    });
    emit("write_per_s", rate(input.n, took));
    input.emit_loaded();
    emit("disk_bytes", db.size_on_disk().unwrap() as f64);
    emit("dir_bytes", dir_bytes(input.dir) as f64);
    emit("disk_settled_bytes", settled(|| db.size_on_disk().unwrap_or(0)) as f64);
    measure_lookups(input.samples, |k| db.get(k.as_bytes()).unwrap().is_some());
    let took = input.delete_oldest(|keys| {
        let mut b = sled::Batch::default();
        for k in keys {
            b.remove(k.as_bytes());
        }
        db.apply_batch(b).unwrap();
        db.flush().unwrap();
    });
    emit("delete_s", took.as_secs_f64());
    assert_eq!(db.len() as u64, input.n - removes(input.n));
}

fn raw_fjall(input: RawInput) {
    let db = fjall::Database::builder(input.dir).open().unwrap();
    let ks = db.keyspace("records", fjall::KeyspaceCreateOptions::default).unwrap();
    let took = input.write_all(|keys, values| {
        let mut b = db.batch();
        for (k, v) in keys.iter().zip(values) {
            b.insert(&ks, k.as_str(), v.as_slice());
        }
        b.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    });
    emit("write_per_s", rate(input.n, took));
    input.emit_loaded();
    emit("disk_bytes", db.disk_space().unwrap() as f64);
    emit("dir_bytes", dir_bytes(input.dir) as f64);
    emit("disk_settled_bytes", settled(|| db.disk_space().unwrap_or(0)) as f64);
    measure_lookups(input.samples, |k| ks.get(k.as_bytes()).unwrap().is_some());
    let took = input.delete_oldest(|keys| {
        let mut b = db.batch();
        for k in keys {
            b.remove(&ks, k.as_str());
        }
        b.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    });
    emit("delete_s", took.as_secs_f64());
    if removes(input.n) == input.n {
        assert!(ks.is_empty().unwrap());
    }
}

/// dedupd's KeyStore over the backend.
fn store_child(kind: StoreBackend, n: u64, lookups: u64, dir: &Path) {
    let samples = LookupSamples::new(n, lookups);
    let rss0 = proc_status_kib("VmRSS:");
    let store = KeyStore::open(kind, dir, SyncMode::Batch).unwrap();

    // Claim + complete, group commit of BATCH.
    // Only the store's work is timed: the records are the input (the raw floor's values
    // are encoded before its clock starts, too), built before each round's clock starts.
    let (mut claim_t, mut complete_t) = (Duration::ZERO, Duration::ZERO);
    for (i0, len) in batches(n, BATCH) {
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
    emit("dir_bytes", dir_bytes(dir) as f64);
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
}

// ---------------------------------------------------------------------------------------
// parent

/// One child's figures (`METRIC name value` lines).
type Figures = BTreeMap<String, f64>;

fn run_child(mode: &str, backend: StoreBackend, n: u64, lookups: u64, base: &Path) -> Figures {
    let dir = base.join(format!("{backend}-{mode}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", mode, "--backend", backend.name(), "--keys", &n.to_string()])
        .args(["--lookups", &lookups.to_string(), "--dir", dir.to_str().unwrap()])
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

fn human(v: f64) -> String {
    if v.is_nan() {
        "–".into() // a side not run (`--only`)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.1}")
    }
}

/// The median (the mean of the middle two for an even count); NaN for none.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn parse_backend(name: &str) -> StoreBackend {
    name.parse().unwrap_or_else(|e| panic!("--backend: {e}"))
}

/// The command line.
struct Args {
    child: Option<String>,
    backend: String,
    /// The store sizes to run, smallest first.
    scales: Vec<u64>,
    /// Keys read by the lookup phase (default `DEFAULT_LOOKUPS`, at most all of them).
    lookups: Option<u64>,
    /// Run only this side of each pair (`raw` or `store`): a size where the other side
    /// would take too long, or is not needed.
    only: Option<String>,
    dir: Option<PathBuf>,
    pairs: usize,
}

fn parse_args() -> Args {
    let mut args = std::env::args().skip(1);
    let mut a = Args {
        child: None,
        backend: "all".into(),
        scales: vec![1_000_000],
        lookups: None,
        only: None,
        dir: None,
        pairs: 3,
    };
    let count = |v: Option<String>, what: &str| -> u64 {
        v.and_then(|v| v.replace('_', "").parse().ok()).filter(|&n| n > 0).unwrap_or_else(|| panic!("{what} N (>= 1)"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--child" => a.child = args.next(),
            "--backend" => a.backend = args.next().expect("--backend VALUE"),
            "--keys" => {
                let list = args.next().expect("--keys N[,N...]");
                a.scales = list.split(',').map(|v| count(Some(v.to_string()), "--keys")).collect();
                a.scales.sort_unstable();
            }
            "--lookups" => a.lookups = Some(count(args.next(), "--lookups")),
            "--only" => {
                a.only = args.next().filter(|s| s == "raw" || s == "store").or_else(|| panic!("--only raw|store"))
            }
            "--dir" => a.dir = args.next().map(PathBuf::from),
            "--pairs" => a.pairs = count(args.next(), "--pairs") as usize,
            "--bench" => {} // added by `cargo bench`
            other => panic!(
                "unknown argument {other}; use --keys N[,N...] --backend NAME|all [--lookups N] [--only raw|store] [--pairs N] [--dir DIR]"
            ),
        }
    }
    a
}

fn main() {
    let a = parse_args();
    let lookups = |n: u64| a.lookups.unwrap_or(DEFAULT_LOOKUPS).min(n);
    if let Some(mode) = &a.child {
        let dir = a.dir.as_deref().expect("--dir");
        let (backend, n) = (parse_backend(&a.backend), a.scales[0]);
        match mode.as_str() {
            "raw" => raw_child(backend, n, lookups(n), dir),
            "store" => store_child(backend, n, lookups(n), dir),
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
                _ => run_child(mode, b, n, lookups(n), &base),
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

/// The median of `metric` over `figures` (NaN when absent).
fn median_of<'a>(figures: impl Iterator<Item = &'a Figures>, metric: &str) -> f64 {
    median(&figures.map(|f| f.get(metric).copied().unwrap_or(f64::NAN)).collect::<Vec<_>>())
}

/// How one backend's figures move with the store's size: dedupd's rates against its own at
/// the smallest size, and memory per million keys.
fn print_scales(b: StoreBackend, by_scale: &[(u64, Vec<(Figures, Figures)>)]) {
    let store = |pairs: &[(Figures, Figures)], m: &str| median_of(pairs.iter().map(|(_, s)| s), m);
    let raw = |pairs: &[(Figures, Figures)], m: &str| median_of(pairs.iter().map(|(r, _)| r), m);
    let Some((_, first)) = by_scale.first() else { return };
    let (write0, get0) = (store(first, "write_per_s"), store(first, "get_per_s"));
    let idle_get0 = store(first, "get_idle_per_s");
    let (n0, raw_rss0, store_rss0) = (by_scale[0].0, raw(first, "rss_loaded_kib"), store(first, "rss_loaded_kib"));
    println!();
    println!("## {b} as the store grows (medians; dedupd's rates against its own at the smallest size)");
    println!();
    println!(
        "| keys | write raw / dedupd (keys/s) | dedupd write vs smallest | lookups raw / dedupd (gets/s) | dedupd lookups vs smallest | once idle: wait, lookups raw / dedupd (gets/s), dedupd vs smallest | remove the oldest 1M (or all) raw / dedupd (s per M keys) | disk settled raw / dedupd (B/key) | RSS growth raw / dedupd (MiB per M keys) | RSS each M keys past the smallest size added, raw / dedupd (MiB) |"
    );
    println!("|---:|---|---:|---|---:|---|---|---|---|---|");
    for (n, pairs) in by_scale {
        let per_m = 1e6 / *n as f64;
        let both = |m: &str, scale: f64, f: &dyn Fn(f64) -> String| {
            format!("{} / {}", f(raw(pairs, m) * scale), f(store(pairs, m) * scale))
        };
        // What each million keys past the smallest size added: the fixed costs (memtables,
        // caches, the journal's buffers) cancel out.
        let added = |rss: f64, rss0: f64| {
            if *n == n0 { "–".to_string() } else { format!("{:.1}", (rss - rss0) / 1024.0 * 1e6 / (*n - n0) as f64) }
        };
        println!(
            "| {} | {} | {:.2}× | {} | {:.2}× | {:.0} s, {}, {:.2}× | {} | {} | {} | {} / {} |",
            human(*n as f64),
            both("write_per_s", 1.0, &|v| human(v)),
            store(pairs, "write_per_s") / write0,
            both("get_per_s", 1.0, &|v| human(v)),
            store(pairs, "get_per_s") / get0,
            store(pairs, "idle_wait_s"),
            both("get_idle_per_s", 1.0, &|v| human(v)),
            store(pairs, "get_idle_per_s") / idle_get0,
            both("delete_s", 1e6 / removes(*n) as f64, &|v| format!("{v:.2}")),
            both("disk_settled_bytes", 1.0 / *n as f64, &|v| format!("{v:.0}")),
            both("rss_loaded_kib", per_m / 1024.0, &|v| format!("{v:.1}")),
            added(raw(pairs, "rss_loaded_kib"), raw_rss0),
            added(store(pairs, "rss_loaded_kib"), store_rss0),
        );
    }
}

/// The table comparing dedupd with the raw floor at one size.
fn print_comparison(n: u64, pairs: &[(Figures, Figures)]) {
    let per_m = 1e6 / n as f64;
    println!();
    println!("| measure | raw floor | dedupd KeyStore | ratio | per pair | target | met |");
    println!("|---|---:|---:|---:|---|---|---|");
    let row = |name: &str,
               raw_metric: &str,
               st_metric: &str,
               scale: f64,
               fmt: &dyn Fn(f64) -> String,
               target: Option<(&str, &dyn Fn(f64) -> bool)>| {
        let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(f64::NAN);
        let raws: Vec<f64> = pairs.iter().map(|(r, _)| get(r, raw_metric)).collect();
        let sts: Vec<f64> = pairs.iter().map(|(_, s)| get(s, st_metric)).collect();
        let ratios: Vec<f64> = raws.iter().zip(&sts).map(|(r, s)| s / r).collect();
        let ratio = median(&ratios);
        let (t, met) = match target {
            // No ratio when one side was not run (`--only`).
            Some((t, _)) if ratio.is_nan() => (t.to_string(), "–".into()),
            Some((t, ok)) => (t.to_string(), if ok(ratio) { "yes" } else { "**no**" }.to_string()),
            None => ("–".into(), "–".into()),
        };
        let each = ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
        println!(
            "| {name} | {} | {} | {ratio:.2}× | {each} | {t} | {met} |",
            fmt(median(&raws) * scale),
            fmt(median(&sts) * scale)
        );
    };
    let per_s = |v: f64| format!("{}/s", human(v));
    let secs = |v: f64| format!("{v:.2} s");
    let bytes = |v: f64| format!("{v:.0} B");
    let mib = |v: f64| format!("{:.0} MiB", v / 1024.0);
    let at_least = |min: f64| move |r: f64| r >= min;
    let at_most = |max: f64| move |r: f64| r <= max;
    let per_key = 1.0 / n as f64;
    row(
        "write: raw insert vs claim+complete (keys/s)",
        "write_per_s",
        "write_per_s",
        1.0,
        &per_s,
        Some(("≥ 0.45×", &at_least(0.45))),
    );
    row("  claim + flush_claims only (keys/s)", "write_per_s", "claim_per_s", 1.0, &per_s, None);
    row("  complete + flush only (keys/s)", "write_per_s", "complete_per_s", 1.0, &per_s, None);
    row("lookup of existing keys (gets/s)", "get_per_s", "get_per_s", 1.0, &per_s, Some(("≥ 0.8×", &at_least(0.8))));
    row(
        "  its first round, nothing read before (gets/s)",
        "get_first_round_per_s",
        "get_first_round_per_s",
        1.0,
        &per_s,
        None,
    );
    row("  wait until the process is idle", "idle_wait_s", "idle_wait_s", 1.0, &secs, None);
    row("  then another sample, first round (gets/s)", "get_idle_per_s", "get_idle_per_s", 1.0, &per_s, None);
    row(
        "remove the oldest (all, at most 1M): raw deletes vs compact_expired",
        "delete_s",
        "delete_s",
        1.0,
        &secs,
        Some(("≤ 1.5×", &at_most(1.5))),
    );
    row(
        "disk bytes per key, right after the writes",
        "disk_bytes",
        "disk_bytes",
        per_key,
        &bytes,
        Some(("≤ 1.5×", &at_most(1.5))),
    );
    row(
        "disk bytes per key, settled (background work done)",
        "disk_settled_bytes",
        "disk_settled_bytes",
        per_key,
        &bytes,
        Some(("≤ 1.5×", &at_most(1.5))),
    );
    row("  directory walk, right after the writes", "dir_bytes", "dir_bytes", per_key, &bytes, None);
    row("RSS growth after the writes, per million keys", "rss_loaded_kib", "rss_loaded_kib", per_m, &mib, None);
    row("peak RSS growth (VmHWM), per million keys", "rss_hwm_kib", "rss_hwm_kib", per_m, &mib, None);
    let logical = pairs.first().and_then(|(r, _)| r.get("logical_bytes_per_key").copied()).unwrap_or(f64::NAN);
    println!();
    println!("Logical size (key + record): {logical:.0} B per key.");
}

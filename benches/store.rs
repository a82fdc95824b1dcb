//! Store benchmark: dedupd's `KeyStore` against the raw floor of each engine.
//!
//! ```text
//! cargo bench --bench store -- [--keys N] [--backend NAME|all] [--pairs N] [--dir DIR]
//! ```
//!
//! For each backend, `--pairs` (default 3) pairs of child processes, run back to back and
//! alternating (so that RSS is never mixed, and a busy minute on a shared machine skews one
//! pair, not the comparison); figures are medians over the pairs, ratios the medians of the
//! per-pair ratios, which are printed too:
//! - `raw`: the engine used directly (no dedupd code, the crate's default configuration):
//!   N keys inserted in atomic batches of 1,000 with an fsync per batch, N point gets in a
//!   scattered order, N deletes in batches of 10,000 (the default compaction chunk) with
//!   an fsync per batch;
//! - `store`: `KeyStore`: claim 1,000 → `flush_claims` → complete 1,000 → `flush`, N
//!   lookups (`get`, which decodes), `compact_expired` of all N in chunks of 10,000.
//!
//! Keys look like idempotency keys (36-byte UUID text, random order); values are the
//! 120-byte encoding of each key's completed record (the raw floor stores the same bytes,
//! pre-encoded outside its timing).
//! Disk is measured right after the writes and a flush, and again once the engine's
//! background work has settled (two readings 1 s apart within 1%, at most 60 s). Lookups
//! run 3 rounds and the best is reported, for both sides (the machine may be shared).
//! RSS from /proc/self/status (VmRSS growth while loading, VmHWM at the end).

use std::collections::BTreeMap;

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

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// A UUID-shaped key, random-looking in `i`.
fn key(i: u64) -> String {
    let a = splitmix(i);
    let b = splitmix(i ^ 0xdead_beef_cafe_f00d);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

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
        // 58 bytes of result JSON: the record encodes to 120 bytes.
        result: format!("{{\"status\":200,\"message_id\":\"msg-{:024x}\"}}", u128::from(splitmix(i)) << 32)
            .into_bytes(),
        error: None,
        first_seen_at_ms: BASE_EXPIRY - 86_400_000 + i as i64,
        completed_at_ms: BASE_EXPIRY - 86_400_000 + i as i64 + 5,
        expires_at_ms: BASE_EXPIRY + i as i64,
        attempts: 1,
    }
}

/// A scattered visiting order of 0..n (a multiplicative permutation).
fn scattered(n: u64) -> impl Iterator<Item = u64> {
    const P: u64 = 2_147_483_647; // prime, so coprime to any n < P
    (0..n).map(move |j| (j as u128 * P as u128 % n as u128) as u64)
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

/// Lookup rounds; the best is reported (the machine is shared, and the first round may
/// race the engine's background compaction).
const LOOKUP_ROUNDS: usize = 3;

fn emit(name: &str, value: f64) {
    println!("METRIC {name} {value}");
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

// ---------------------------------------------------------------------------------------
// children

/// The raw floor: the engine's own API, default configuration, no dedupd code.
fn raw_child(backend: StoreBackend, n: u64, dir: &Path) {
    let keys: Vec<String> = (0..n).map(key).collect();
    // Each key's own record, as dedupd stores it: same size, distinct bytes (one value
    // shared by every key would let the engine's block compression shrink the floor's disk
    // and flush work far below what records of this size cost).
    let values: Vec<Vec<u8>> = (0..n).map(|i| Record::Completed(completed_record(i)).encode()).collect();
    assert!(values.iter().all(|v| v.len() == 120));
    emit("logical_bytes_per_key", keys.iter().map(|k| k.len() + 120).sum::<usize>() as f64 / n as f64);
    let Some(&(_, raw_floor)) = RAW_FLOORS.iter().find(|(b, _)| *b == backend) else {
        panic!("backend {backend} has no raw floor: add one to RAW_FLOORS");
    };
    let rss0 = proc_status_kib("VmRSS:");
    raw_floor(RawInput { keys: &keys, values: &values, n, dir, rss0 });
    emit("rss_hwm_kib", proc_status_kib("VmHWM:") as f64);
}

/// What a raw floor writes, reads and deletes: the keys, each key's encoded record, and the
/// RSS before loading.
struct RawInput<'a> {
    keys: &'a [String],
    values: &'a [Vec<u8>],
    n: u64,
    dir: &'a Path,
    rss0: u64,
}

/// Writes, reads and deletes the keys through one engine's own API, emitting its figures.
type RawFloor = fn(RawInput);

/// The raw floor of each backend: its engine used directly, so it cannot come from the
/// store's registration. A registered backend missing here runs in the bench only once it
/// has one.
const RAW_FLOORS: &[(StoreBackend, RawFloor)] = &[(StoreBackend::Sled, raw_sled), (StoreBackend::Fjall, raw_fjall)];

fn raw_sled(RawInput { keys, values, n, dir, rss0 }: RawInput) {
    let db = sled::open(dir).unwrap();
    let t = Instant::now();
    for (chunk, vals) in keys.chunks(BATCH).zip(values.chunks(BATCH)) {
        let mut b = sled::Batch::default();
        for (k, v) in chunk.iter().zip(vals) {
            b.insert(k.as_bytes(), v.as_slice());
        }
        db.apply_batch(b).unwrap();
        db.flush().unwrap();
    }
    emit("write_per_s", rate(n, t.elapsed()));
    emit("disk_bytes", db.size_on_disk().unwrap() as f64);
    emit("dir_bytes", dir_bytes(dir) as f64);
    emit("disk_settled_bytes", settled(|| db.size_on_disk().unwrap_or(0)) as f64);
    let mut best = 0f64;
    for _ in 0..LOOKUP_ROUNDS {
        let t = Instant::now();
        let mut found = 0u64;
        for i in scattered(n) {
            found += u64::from(db.get(keys[i as usize].as_bytes()).unwrap().is_some());
        }
        best = best.max(rate(n, t.elapsed()));
        assert_eq!(found, n);
    }
    emit("get_per_s", best);
    emit("rss_loaded_kib", proc_status_kib("VmRSS:").saturating_sub(rss0) as f64);
    let t = Instant::now();
    for chunk in keys.chunks(CHUNK) {
        let mut b = sled::Batch::default();
        for k in chunk {
            b.remove(k.as_bytes());
        }
        db.apply_batch(b).unwrap();
        db.flush().unwrap();
    }
    emit("delete_s", t.elapsed().as_secs_f64());
    assert!(db.is_empty());
}

fn raw_fjall(RawInput { keys, values, n, dir, rss0 }: RawInput) {
    let db = fjall::Database::builder(dir).open().unwrap();
    let ks = db.keyspace("records", fjall::KeyspaceCreateOptions::default).unwrap();
    let t = Instant::now();
    for (chunk, vals) in keys.chunks(BATCH).zip(values.chunks(BATCH)) {
        let mut b = db.batch();
        for (k, v) in chunk.iter().zip(vals) {
            b.insert(&ks, k.as_str(), v.as_slice());
        }
        b.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    emit("write_per_s", rate(n, t.elapsed()));
    emit("disk_bytes", db.disk_space().unwrap() as f64);
    emit("dir_bytes", dir_bytes(dir) as f64);
    emit("disk_settled_bytes", settled(|| db.disk_space().unwrap_or(0)) as f64);
    let mut best = 0f64;
    for _ in 0..LOOKUP_ROUNDS {
        let t = Instant::now();
        let mut found = 0u64;
        for i in scattered(n) {
            found += u64::from(ks.get(keys[i as usize].as_bytes()).unwrap().is_some());
        }
        best = best.max(rate(n, t.elapsed()));
        assert_eq!(found, n);
    }
    emit("get_per_s", best);
    emit("rss_loaded_kib", proc_status_kib("VmRSS:").saturating_sub(rss0) as f64);
    let t = Instant::now();
    for chunk in keys.chunks(CHUNK) {
        let mut b = db.batch();
        for k in chunk {
            b.remove(&ks, k.as_str());
        }
        b.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    emit("delete_s", t.elapsed().as_secs_f64());
    assert!(ks.is_empty().unwrap());
}

/// dedupd's KeyStore over the backend.
fn store_child(kind: StoreBackend, n: u64, dir: &Path) {
    let keys: Vec<String> = (0..n).map(key).collect();
    let rss0 = proc_status_kib("VmRSS:");
    let store = KeyStore::open(kind, dir, SyncMode::Batch).unwrap();

    // Claim + complete, group commit of BATCH.
    // Only the store's work is timed: the records are the input (the raw floor's values
    // are encoded before its clock starts, too), built before each round's clock starts.
    let (mut claim_t, mut complete_t) = (Duration::ZERO, Duration::ZERO);
    let mut i0 = 0u64;
    for chunk in keys.chunks(BATCH) {
        let mut claims: Vec<InProgress> = (0..chunk.len()).map(|j| claim_record(i0 + j as u64)).collect();
        let done: Vec<Completed> = (0..chunk.len()).map(|j| completed_record(i0 + j as u64)).collect();
        let c = Instant::now();
        // As the engine does for a round: read each key (stamped), claim them in one batch.
        let mut requests = Vec::with_capacity(chunk.len());
        for (k, claim) in chunk.iter().zip(claims.drain(..)) {
            let (expected, stamp) = store.get_stamped(k).unwrap();
            assert!(expected.is_none(), "fresh key");
            requests.push(ClaimRequest { key: k.clone(), expected, stamp, claim });
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
        i0 += chunk.len() as u64;
    }
    emit("write_per_s", rate(n, claim_t + complete_t));
    if std::env::var_os("DEDUPD_BENCH_WRITE_ONLY").is_some() {
        return; // for profiling the write path alone
    }
    emit("claim_per_s", rate(n, claim_t));
    emit("complete_per_s", rate(n, complete_t));
    emit("disk_bytes", store.disk_bytes().unwrap() as f64);
    emit("dir_bytes", dir_bytes(dir) as f64);
    emit("disk_settled_bytes", settled(|| store.disk_bytes().unwrap_or(0)) as f64);

    let mut best = 0f64;
    for _ in 0..LOOKUP_ROUNDS {
        let t = Instant::now();
        let mut found = 0u64;
        for i in scattered(n) {
            found += u64::from(store.get(&keys[i as usize]).unwrap().is_some());
        }
        best = best.max(rate(n, t.elapsed()));
        assert_eq!(found, n);
    }
    emit("get_per_s", best);
    emit("rss_loaded_kib", proc_status_kib("VmRSS:").saturating_sub(rss0) as f64);

    assert_eq!(store.counts().completed, n as i64);
    let t = Instant::now();
    let removed = store.compact_expired(BASE_EXPIRY + n as i64, CHUNK).unwrap();
    emit("delete_s", t.elapsed().as_secs_f64());
    assert_eq!(removed as u64, n);
    assert_eq!(store.counts().completed, 0);
    emit("rss_hwm_kib", proc_status_kib("VmHWM:") as f64);
}

// ---------------------------------------------------------------------------------------
// parent

fn run_child(mode: &str, backend: StoreBackend, n: u64, base: &Path) -> BTreeMap<String, f64> {
    let dir = base.join(format!("{backend}-{mode}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", mode, "--backend", backend.name(), "--keys", &n.to_string(), "--dir", dir.to_str().unwrap()])
        .output()
        .expect("spawn bench child");
    if !out.status.success() {
        panic!("{backend} {mode} child failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut p = l.strip_prefix("METRIC ")?.split_whitespace();
            Some((p.next()?.to_string(), p.next()?.parse().ok()?))
        })
        .collect()
}

fn human(v: f64) -> String {
    if v >= 1e6 {
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

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut child, mut backend, mut n, mut dir) = (None, "all".to_string(), 1_000_000u64, None);
    let mut rounds = 3usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--child" => child = args.next(),
            "--backend" => backend = args.next().expect("--backend VALUE"),
            "--keys" => n = args.next().and_then(|v| v.replace('_', "").parse().ok()).expect("--keys N"),
            "--dir" => dir = args.next().map(PathBuf::from),
            "--pairs" => {
                rounds = args.next().and_then(|v| v.parse().ok()).filter(|&r| r > 0).expect("--pairs N (>= 1)")
            }
            "--bench" => {} // added by `cargo bench`
            other => panic!("unknown argument {other}; use --keys N --backend NAME|all [--pairs N] [--dir DIR]"),
        }
    }
    if let Some(mode) = child {
        let dir = dir.expect("--dir");
        match mode.as_str() {
            "raw" => raw_child(parse_backend(&backend), n, &dir),
            "store" => store_child(parse_backend(&backend), n, &dir),
            other => panic!("unknown child mode {other}"),
        }
        return;
    }

    let base = dir.unwrap_or_else(|| PathBuf::from("target/store-bench"));
    std::fs::create_dir_all(&base).unwrap();
    // `both` predates a third backend; it means every registered one, as `all` does.
    let backends: Vec<StoreBackend> = match backend.as_str() {
        "all" | "both" => StoreBackend::ALL.to_vec(),
        b => vec![parse_backend(b)],
    };
    println!(
        "store benchmark: {n} keys, write batches of {BATCH}, compaction/delete chunks of {CHUNK}, dir {}",
        base.display()
    );
    println!("load average before: {}", loadavg());
    for b in backends {
        let t = Instant::now();
        // Alternating pairs, so that a busy minute on a shared machine hits one pair, not
        // the whole comparison; every figure is the median over the pairs and every ratio
        // the median of the per-pair ratios (the two children of a pair run back to back).
        let pairs: Vec<(BTreeMap<String, f64>, BTreeMap<String, f64>)> =
            (0..rounds).map(|_| (run_child("raw", b, n, &base), run_child("store", b, n, &base))).collect();
        let per_m = 1e6 / n as f64;
        println!();
        println!("## {b} ({rounds} pairs in {:.0?}; load average now {})", t.elapsed(), loadavg());
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
        row(
            "lookup of existing keys (gets/s)",
            "get_per_s",
            "get_per_s",
            1.0,
            &per_s,
            Some(("≥ 0.8×", &at_least(0.8))),
        );
        row(
            "remove all: raw deletes vs compact_expired",
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
        row("RSS growth loading, per million keys", "rss_loaded_kib", "rss_loaded_kib", per_m, &mib, None);
        row("peak RSS (VmHWM), per million keys", "rss_hwm_kib", "rss_hwm_kib", per_m, &mib, None);
        let logical = pairs.first().and_then(|(r, _)| r.get("logical_bytes_per_key").copied()).unwrap_or(f64::NAN);
        println!();
        println!("Logical size (key + record): {logical:.0} B per key.");
    }
}

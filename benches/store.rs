//! Store benchmark: dedupd's `KeyStore` against the raw floor of each engine.
//!
//! ```text
//! cargo bench --bench store -- [--keys N] [--backend sled|fjall|both] [--dir DIR]
//! ```
//!
//! For each backend, two child processes (so that RSS is never mixed):
//! - `raw`: the engine used directly (no dedupd code, the crate's default configuration):
//!   N keys inserted in atomic batches of 1,000 with an fsync per batch, N point gets in a
//!   scattered order, N deletes in batches of 10,000 (the default compaction chunk) with
//!   an fsync per batch;
//! - `store`: `KeyStore`: claim 1,000 → `flush_claims` → complete 1,000 → `flush`, N
//!   lookups (`get`, which decodes), `compact_expired` of all N in chunks of 10,000.
//!
//! Keys look like idempotency keys (36-byte UUID text, random order); values are the
//! 120-byte encoding of a completed record (the raw floor stores the same bytes).
//! Disk is measured right after the writes and a flush, and again once the engine's
//! background work has settled (two readings 1 s apart within 1%, at most 60 s). Lookups
//! run 3 rounds and the best is reported, for both sides (the machine may be shared).
//! RSS from /proc/self/status (VmRSS growth while loading, VmHWM at the end).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dedupd::config::{StoreBackend, SyncMode};
use dedupd::fingerprint::Fingerprint;
use dedupd::store::{ClaimRequest, Completed, Completion, InProgress, KeyStore, Record, SourcePos};

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
fn raw_child(backend: &str, n: u64, dir: &Path) {
    let keys: Vec<String> = (0..n).map(key).collect();
    let value = Record::Completed(completed_record(0)).encode();
    assert_eq!(value.len(), 120);
    emit("logical_bytes_per_key", keys.iter().map(|k| k.len() + value.len()).sum::<usize>() as f64 / n as f64);
    let rss0 = proc_status_kib("VmRSS:");
    match backend {
        "sled" => {
            let db = sled::open(dir).unwrap();
            let t = Instant::now();
            for chunk in keys.chunks(BATCH) {
                let mut b = sled::Batch::default();
                for k in chunk {
                    b.insert(k.as_bytes(), value.as_slice());
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
        "fjall" => {
            let db = fjall::Database::builder(dir).open().unwrap();
            let ks = db.keyspace("records", fjall::KeyspaceCreateOptions::default).unwrap();
            let t = Instant::now();
            for chunk in keys.chunks(BATCH) {
                let mut b = db.batch();
                for k in chunk {
                    b.insert(&ks, k.as_str(), value.as_slice());
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
        other => panic!("unknown backend {other}"),
    }
    emit("rss_hwm_kib", proc_status_kib("VmHWM:") as f64);
}

/// dedupd's KeyStore over the backend.
fn store_child(backend: &str, n: u64, dir: &Path) {
    let kind = match backend {
        "sled" => StoreBackend::Sled,
        "fjall" => StoreBackend::Fjall,
        other => panic!("unknown backend {other}"),
    };
    let keys: Vec<String> = (0..n).map(key).collect();
    let rss0 = proc_status_kib("VmRSS:");
    let store = KeyStore::open(kind, dir, SyncMode::Batch).unwrap();

    // Claim + complete, group commit of BATCH.
    let (mut claim_t, mut complete_t) = (Duration::ZERO, Duration::ZERO);
    let t = Instant::now();
    let mut i0 = 0u64;
    for chunk in keys.chunks(BATCH) {
        let c = Instant::now();
        // As the engine does for a round: read each key (stamped), claim them in one batch.
        let mut requests = Vec::with_capacity(chunk.len());
        for (j, k) in chunk.iter().enumerate() {
            let (expected, stamp) = store.get_stamped(k).unwrap();
            assert!(expected.is_none(), "fresh key");
            requests.push(ClaimRequest { key: k.clone(), expected, stamp, claim: claim_record(i0 + j as u64) });
        }
        let pending: Vec<_> = store.claim_batch(requests).unwrap().into_iter().map(|r| r.expect("fresh key")).collect();
        let durable = store.flush_claims(pending).unwrap();
        claim_t += c.elapsed();
        let c = Instant::now();
        // As the engine does for a round: one complete_batch (one index entry per
        // second of expiry), then one flush.
        let items = durable.into_iter().enumerate().map(|(j, d)| (d, completed_record(i0 + j as u64))).collect();
        store.complete_batch(items).unwrap();
        store.flush().unwrap();
        complete_t += c.elapsed();
        i0 += chunk.len() as u64;
    }
    emit("write_per_s", rate(n, t.elapsed()));
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

fn run_child(mode: &str, backend: &str, n: u64, base: &Path) -> BTreeMap<String, f64> {
    let dir = base.join(format!("{backend}-{mode}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", mode, "--backend", backend, "--keys", &n.to_string(), "--dir", dir.to_str().unwrap()])
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

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut child, mut backend, mut n, mut dir) = (None, "both".to_string(), 1_000_000u64, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--child" => child = args.next(),
            "--backend" => backend = args.next().expect("--backend VALUE"),
            "--keys" => n = args.next().and_then(|v| v.replace('_', "").parse().ok()).expect("--keys N"),
            "--dir" => dir = args.next().map(PathBuf::from),
            "--bench" => {} // added by `cargo bench`
            other => panic!("unknown argument {other}; use --keys N --backend sled|fjall|both [--dir DIR]"),
        }
    }
    if let Some(mode) = child {
        let dir = dir.expect("--dir");
        match mode.as_str() {
            "raw" => raw_child(&backend, n, &dir),
            "store" => store_child(&backend, n, &dir),
            other => panic!("unknown child mode {other}"),
        }
        return;
    }

    let base = dir.unwrap_or_else(|| PathBuf::from("target/store-bench"));
    std::fs::create_dir_all(&base).unwrap();
    let backends: Vec<&str> = match backend.as_str() {
        "both" => vec!["sled", "fjall"],
        b => vec![b],
    };
    println!(
        "store benchmark: {n} keys, write batches of {BATCH}, compaction/delete chunks of {CHUNK}, dir {}",
        base.display()
    );
    println!("load average before: {}", loadavg());
    for b in backends {
        let t = Instant::now();
        let raw = run_child("raw", b, n, &base);
        let st = run_child("store", b, n, &base);
        let m = |map: &BTreeMap<String, f64>, k: &str| map.get(k).copied().unwrap_or(f64::NAN);
        let per_m = 1e6 / n as f64;
        println!();
        println!("## {b} ({:.0?} for both children; load average now {})", t.elapsed(), loadavg());
        println!();
        println!("| measure | raw floor | dedupd KeyStore | ratio | target | met |");
        println!("|---|---:|---:|---:|---|---|");
        let row = |name: &str, r: f64, s: f64, fmt: &dyn Fn(f64) -> String, target: Option<(&str, bool)>| {
            let ratio = s / r;
            let (t, met) = match target {
                Some((t, ok)) => (t.to_string(), if ok { "yes" } else { "**no**" }.to_string()),
                None => ("–".into(), "–".into()),
            };
            println!("| {name} | {} | {} | {ratio:.2}× | {t} | {met} |", fmt(r), fmt(s));
        };
        let per_s = |v: f64| format!("{}/s", human(v));
        let secs = |v: f64| format!("{v:.2} s");
        let bytes = |v: f64| format!("{v:.0} B");
        let mib = |v: f64| format!("{:.0} MiB", v / 1024.0);
        let w = m(&st, "write_per_s") / m(&raw, "write_per_s");
        row(
            "write: raw insert vs claim+complete (keys/s)",
            m(&raw, "write_per_s"),
            m(&st, "write_per_s"),
            &per_s,
            Some(("≥ 0.45×", w >= 0.45)),
        );
        row("  claim + flush_claims only (keys/s)", m(&raw, "write_per_s"), m(&st, "claim_per_s"), &per_s, None);
        row("  complete + flush only (keys/s)", m(&raw, "write_per_s"), m(&st, "complete_per_s"), &per_s, None);
        let g = m(&st, "get_per_s") / m(&raw, "get_per_s");
        row(
            "lookup of existing keys (gets/s)",
            m(&raw, "get_per_s"),
            m(&st, "get_per_s"),
            &per_s,
            Some(("≥ 0.8×", g >= 0.8)),
        );
        let d = m(&st, "delete_s") / m(&raw, "delete_s");
        row(
            "remove all: raw deletes vs compact_expired",
            m(&raw, "delete_s"),
            m(&st, "delete_s"),
            &secs,
            Some(("≤ 1.5×", d <= 1.5)),
        );
        let disk = m(&st, "disk_bytes") / m(&raw, "disk_bytes");
        row(
            "disk bytes per key, right after the writes",
            m(&raw, "disk_bytes") / n as f64,
            m(&st, "disk_bytes") / n as f64,
            &bytes,
            Some(("≤ 1.5×", disk <= 1.5)),
        );
        let settled = m(&st, "disk_settled_bytes") / m(&raw, "disk_settled_bytes");
        row(
            "disk bytes per key, settled (background work done)",
            m(&raw, "disk_settled_bytes") / n as f64,
            m(&st, "disk_settled_bytes") / n as f64,
            &bytes,
            Some(("≤ 1.5×", settled <= 1.5)),
        );
        row(
            "  directory walk, right after the writes",
            m(&raw, "dir_bytes") / n as f64,
            m(&st, "dir_bytes") / n as f64,
            &bytes,
            None,
        );
        let logical = m(&raw, "logical_bytes_per_key");
        row(
            "disk per key (settled) vs logical key+record bytes",
            logical,
            m(&st, "disk_settled_bytes") / n as f64,
            &bytes,
            None,
        );
        row(
            "RSS growth loading, per million keys",
            m(&raw, "rss_loaded_kib") * per_m,
            m(&st, "rss_loaded_kib") * per_m,
            &mib,
            None,
        );
        row(
            "peak RSS (VmHWM), per million keys",
            m(&raw, "rss_hwm_kib") * per_m,
            m(&st, "rss_hwm_kib") * per_m,
            &mib,
            None,
        );
    }
}

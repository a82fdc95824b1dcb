//! Crash test of the key store (docs/contract.md §3: a claim is durable before its sink runs).
//!
//! A child process (`src/bin/store-crash-child.rs`) claims, flushes, completes and compacts
//! batches of fresh keys, reporting on stdout what it has flushed. The parent SIGKILLs it
//! at a random moment, reopens the store and checks:
//! - the store opens (recovering what its claim journal held), every record decodes, the
//!   live counts equal a recount;
//! - every key reported `DURABLE` is present (in_progress or completed), every key reported
//!   `COMPLETED` is completed, with exactly the contents the child wrote;
//! - the expiry index holds exactly the completed records' expiries (a record and its
//!   index entry were written and removed in one atomic batch);
//! - within a run, the present keys and the completed keys are each a prefix of the
//!   sequence the child wrote (no later write survived an earlier one that was lost);
//! - the watermark is at least the last offset reported completed.
//!
//! Every registered backend, one after the other. Kills per backend: `STORE_CRASH_KILLS` (default 200), on a fresh store every
//! `STORE_CRASH_KILLS_PER_STORE` kills (default 25: fjall replays its whole journal at every
//! open, which in a debug build costs ~0.5 s per MB, so one store for all kills would make
//! the test quadratic). Seed: `STORE_CRASH_SEED` (default: from the clock; printed, to
//! replay a failure).
#![cfg(feature = "failpoints")] // its child process (src/bin/store-crash-child.rs) needs the feature

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{CacheSize, StoreBackend, SyncMode};
use dedupd::store::{KeyStore, Record, Tree, decode_index_entry, open_backend};

const RUN_STRIDE: i64 = 10_000_000;
const FAR: i64 = 4_000_000_000_000;

/// The fingerprint the child claims `key` with (the project's own, of a fixed command).
fn fingerprint_of(key: &str) -> Fingerprint {
    dedupd::fingerprint::fingerprint("crash-test", &serde_json::Value::String(key.to_string()), &[])
        .unwrap_or(Fingerprint([0; 32]))
}

/// splitmix64: small, seedable, good enough to pick kill times.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one child run reported before it was killed.
#[derive(Debug, Default, Clone)]
struct Run {
    batch: i64,
    /// Keys `0..durable` were reported durable.
    durable: i64,
    /// Keys `0..completed` were reported completed.
    completed: i64,
    /// How the kill was timed, for failure messages.
    how: String,
}

impl Run {
    fn expiring(&self, i: i64) -> bool {
        (i / self.batch) % 4 == 3
    }
}

fn parse_key(key: &str) -> Option<(usize, i64)> {
    let rest = key.strip_prefix('r')?;
    let (run, i) = rest.split_once('-')?;
    if run.len() != 4 || i.len() != 7 {
        return None;
    }
    Some((run.parse().ok()?, i.parse().ok()?))
}

fn crash_loop(kind: StoreBackend) {
    let name = kind.name();
    let kills: usize = std::env::var("STORE_CRASH_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let seed: u64 = std::env::var("STORE_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("[{name}] {kills} kills, STORE_CRASH_SEED={seed}");
    let mut rng = Rng(seed ^ name.len() as u64);
    let dir = tempfile::tempdir().unwrap();
    let per_store: usize =
        std::env::var("STORE_CRASH_KILLS_PER_STORE").ok().and_then(|v| v.parse().ok()).unwrap_or(25).max(1);
    let started = Instant::now();
    let mut runs: Vec<Run> = Vec::new();
    let mut all_runs: Vec<Run> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut stats = [0usize; 3]; // kills before OPEN, before the first DURABLE, after
    let mut checking = Duration::ZERO;
    // Slices dropped by the children, emptied by compaction (`SLICES` lines).
    let mut slices_dropped = 0;

    for kill in 0..kills {
        // `run` numbers the children of one store; the keys are named after it.
        let run = kill % per_store;
        let path = dir.path().join(format!("store{}", kill / per_store));
        if run == 0 {
            all_runs.append(&mut runs);
        }
        let batch = 1 + rng.below(100) as i64;
        // When to kill: 20% a few to tens of ms after spawn (often inside open/recovery),
        // 40% soon after the store is open, 40% soon after the first DURABLE line.
        let (wait_for, delay) = match rng.below(10) {
            0..=1 => (None, Duration::from_micros(1_000 + rng.below(40_000))),
            2..=5 => (Some("OPEN"), Duration::from_micros(rng.below(30_000))),
            _ => (Some("DURABLE"), Duration::from_micros(rng.below(15_000))),
        };
        let how = match wait_for {
            None => format!("store {} run {run}: batch {batch}, killed {delay:?} after spawn", kill / per_store),
            Some(w) => {
                format!("store {} run {run}: batch {batch}, killed {delay:?} after the first {w}", kill / per_store)
            }
        };

        let mut child = Command::new(env!("CARGO_BIN_EXE_store-crash-child"))
            .args([name, path.to_str().unwrap(), &run.to_string(), &batch.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        if let Some(marker) = wait_for {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(l) => {
                        let hit = l.starts_with(marker);
                        lines.push(l);
                        if hit {
                            break;
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if child.try_wait().unwrap().is_some() {
                            break;
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
        }
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        if status.code().is_some() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            failures.push(format!("{how}: child exited by itself ({status}): {err}"));
            break;
        }

        let mut r = Run { batch, how, ..Run::default() };
        let mut saw_open = false;
        for l in &lines {
            let mut parts = l.split_whitespace();
            match (
                parts.next(),
                parts.next().and_then(|x| x.parse::<i64>().ok()),
                parts.next().and_then(|x| x.parse::<i64>().ok()),
            ) {
                (Some("OPEN"), _, _) => saw_open = true,
                (Some("SLICES"), Some(dropped), Some(_)) => slices_dropped += dropped as usize,
                (Some("DURABLE"), Some(a), Some(b)) => {
                    assert_eq!(a, r.durable, "{}: DURABLE lines out of sequence: {lines:?}", r.how);
                    r.durable = b + 1;
                }
                (Some("COMPLETED"), Some(a), Some(b)) => {
                    assert_eq!(a, r.completed, "{}: COMPLETED lines out of sequence: {lines:?}", r.how);
                    r.completed = b + 1;
                }
                _ => panic!("{}: unexpected child output {l:?}", r.how),
            }
        }
        stats[if !saw_open {
            0
        } else if r.durable == 0 {
            1
        } else {
            2
        }] += 1;
        runs.push(r);

        let t = Instant::now();
        let checked = check(kind, &path, &runs);
        checking += t.elapsed();
        if let Err(e) = checked {
            failures.push(format!("{}: {e}", runs.last().unwrap().how));
            // Later runs would only repeat the same finding.
            break;
        }
    }

    all_runs.append(&mut runs);
    let runs = all_runs;
    let total_durable: i64 = runs.iter().map(|r| r.durable).sum();
    let total_completed: i64 = runs.iter().map(|r| r.completed).sum();
    eprintln!(
        "[{name}] {} kills in {:?} ({checking:?} of it reopening and checking): {} before open, \
         {} before the first DURABLE, {} after; {total_durable} keys reported durable, \
         {total_completed} completed, {slices_dropped} slices dropped; {} failure(s)",
        runs.len(),
        started.elapsed(),
        stats[0],
        stats[1],
        stats[2],
        failures.len()
    );
    assert!(failures.is_empty(), "[{name}] seed {seed}: {failures:#?}");
    if kind == StoreBackend::Fjall && kills >= 50 {
        // Kills land among slices that open and drop only if some do.
        assert!(slices_dropped > 0, "[{name}] no slice was dropped: the kills never met one");
    }
}

/// Reopens the store after a kill and checks everything reported so far.
fn check(kind: StoreBackend, path: &Path, runs: &[Run]) -> Result<(), String> {
    if !path.exists() {
        // Killed before the very first open created anything.
        return Ok(());
    }
    // The store opens; opening also turns the claims the claim journal held into records.
    drop(KeyStore::open(kind, path, SyncMode::Batch).map_err(|e| format!("reopen failed: {e}"))?);
    let backend = open_backend(kind, path, CacheSize::default()).map_err(|e| format!("backend reopen failed: {e}"))?;

    // Every record, decoded, from every slice of the records.
    let mut records: BTreeMap<String, Record> = BTreeMap::new();
    for (slice, _) in backend.slices() {
        let mut start: Vec<u8> = Vec::new();
        loop {
            let page = backend.scan(Tree::Records(slice), &start, None, 10_000).map_err(|e| format!("scan: {e}"))?;
            let Some((last, _)) = page.last() else { break };
            start = last.clone();
            start.push(0);
            for (k, v) in page {
                let key = String::from_utf8(k).map_err(|e| format!("non-UTF-8 key: {e}"))?;
                let rec = Record::decode(&v).map_err(|e| format!("key {key}: {e}"))?;
                if records.insert(key.clone(), rec).is_some() {
                    return Err(format!("key {key} is in two slices"));
                }
            }
        }
    }

    // The expiry index is exactly the completed records' expiries.
    let mut index: Vec<(i64, String)> = Vec::new();
    for (k, v) in backend.scan(Tree::Expiry, &[], None, usize::MAX).map_err(|e| format!("scan expiry: {e}"))? {
        if k.len() != 16 {
            return Err(format!("expiry entry key of {} bytes, not 16: {k:?}", k.len()));
        }
        let pairs = decode_index_entry(&v).map_err(|e| format!("expiry entry {k:?}: {e}"))?;
        if pairs.is_empty() {
            return Err(format!("empty expiry entry {k:?}"));
        }
        index.extend(pairs.into_iter().map(|(key, at)| (at, key)));
    }
    index.sort();
    let mut want: Vec<(i64, String)> =
        records.iter().filter_map(|(k, r)| r.expires_at_ms().map(|at| (at, k.clone()))).collect();
    want.sort();
    if index != want {
        let extra: Vec<_> = index.iter().filter(|e| !want.contains(e)).take(5).collect();
        let missing: Vec<_> = want.iter().filter(|e| !index.contains(e)).take(5).collect();
        return Err(format!(
            "expiry index out of step with records: {} entries vs {} completed; extra {extra:?}, missing {missing:?}",
            index.len(),
            want.len()
        ));
    }

    // Per run: contents, reported durability and completion, prefix order.
    let mut present: Vec<Vec<(i64, &Record)>> = vec![Vec::new(); runs.len()];
    for (key, rec) in &records {
        let Some((run, i)) = parse_key(key) else { return Err(format!("unknown key {key:?}")) };
        if run >= runs.len() {
            return Err(format!("key {key} of a run that never happened"));
        }
        let expiring = runs[run].expiring(i);
        let fp = fingerprint_of(key);
        let ok = match rec {
            Record::InProgress(p) => {
                p.fingerprint == fp
                    && p.attempts == 1
                    && p.claimed_at_ms == 1_000 + i
                    && p.source.topic == "crash"
                    && p.source.offset == run as i64 * RUN_STRIDE + i
            }
            Record::Completed(c) => {
                c.fingerprint == fp
                    && c.result == format!("{{\"n\":{i}}}").into_bytes()
                    && c.first_seen_at_ms == 1_000 + i
                    && c.expires_at_ms == if expiring { 1 } else { FAR }
            }
            Record::Indeterminate(_) => false,
        };
        if !ok {
            return Err(format!("key {key}: unexpected record {rec:?}"));
        }
        present[run].push((i, rec));
    }
    let mut max_completed_offset: Option<i64> = None;
    for (run, r) in runs.iter().enumerate() {
        let by_i: BTreeMap<i64, &Record> = present[run].iter().copied().collect();
        for i in 0..r.durable {
            if r.expiring(i) {
                continue; // may have been compacted since
            }
            match (by_i.get(&i), i < r.completed) {
                (None, _) => return Err(format!("key r{run:04}-{i:07} was reported durable but is gone")),
                (Some(Record::InProgress(_)), true) => {
                    return Err(format!("key r{run:04}-{i:07} was reported completed but is in_progress"));
                }
                _ => {}
            }
        }
        // Prefix order of the non-expiring keys: present ones, then completed ones.
        let steady: Vec<(i64, &Record)> =
            by_i.iter().filter(|(i, _)| !r.expiring(**i)).map(|(i, r)| (*i, *r)).collect();
        let expected_seq = (0..).filter(|i| !r.expiring(*i));
        for ((i, _), want_i) in steady.iter().zip(expected_seq) {
            if *i != want_i {
                return Err(format!(
                    "run {run}: key r{run:04}-{i:07} survived but r{run:04}-{want_i:07} (written before it) is gone"
                ));
            }
        }
        let mut seen_in_progress = None;
        for (i, rec) in &steady {
            match rec {
                Record::InProgress(_) => seen_in_progress = seen_in_progress.or(Some(*i)),
                Record::Completed(_) => {
                    if let Some(j) = seen_in_progress {
                        return Err(format!(
                            "run {run}: completion of r{run:04}-{i:07} survived but that of r{run:04}-{j:07} (written before it) is gone"
                        ));
                    }
                }
                Record::Indeterminate(_) => unreachable!("rejected above"),
            }
        }
        if r.completed > 0 {
            max_completed_offset = Some(run as i64 * RUN_STRIDE + r.completed - 1);
        }
    }

    // Counts, watermark through the KeyStore itself.
    drop(backend);
    let store = KeyStore::open(kind, path, SyncMode::Batch).map_err(|e| format!("KeyStore open: {e}"))?;
    let counts = store.counts();
    let by_scan = records.values().fold([0i64; 3], |mut c, r| {
        c[match r {
            Record::InProgress(_) => 0,
            Record::Completed(_) => 1,
            Record::Indeterminate(_) => 2,
        }] += 1;
        c
    });
    if [counts.in_progress, counts.completed, counts.indeterminate] != by_scan {
        return Err(format!("counts {counts:?} differ from the scan {by_scan:?}"));
    }
    if let Some(off) = max_completed_offset {
        let wm = store.watermark("crash", 0).map_err(|e| format!("watermark: {e}"))?;
        if wm.is_none_or(|w| w < off) {
            return Err(format!("watermark {wm:?} below the last completed offset {off}"));
        }
    }
    Ok(())
}

/// Kills during the very first open of a store (creating it): the next open must work.
fn first_creation_killed(kind: StoreBackend) {
    let name = kind.name();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed ^ name.len() as u64);
    let mut opened_before_kill = 0;
    for attempt in 0..40 {
        let path = dir.path().join(format!("s{attempt}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_store-crash-child"))
            .args([name, path.to_str().unwrap(), "0", "10"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        std::thread::sleep(Duration::from_micros(rng.below(25_000)));
        let _ = child.kill();
        child.wait().unwrap();
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out);
        opened_before_kill += usize::from(out.starts_with("OPEN"));
        let store = KeyStore::open(kind, &path, SyncMode::Batch)
            .unwrap_or_else(|e| panic!("[{name}] attempt {attempt}: reopen after a kill during creation: {e}"));
        store.recount().unwrap();
    }
    eprintln!("[{name}] 40 kills during creation, {opened_before_kill} of them after the open had finished");
}

#[test]
fn each_backend_reopens_after_kill_during_creation() {
    for &kind in StoreBackend::ALL {
        first_creation_killed(kind);
    }
}

#[test]
fn each_backend_survives_sigkill() {
    for &kind in StoreBackend::ALL {
        crash_loop(kind);
    }
}

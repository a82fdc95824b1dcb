//! The claim journal (`store::journal`): claims of fresh keys are held there, survive a
//! crash as `in_progress` records, and never come back once something replaced them
//! (completion, forget, compaction), whatever the file still held.

use super::*;
use crate::store::journal::{self, ClaimJournal};

each_backend!(
    fresh_claims_are_journaled_not_written_to_the_backend,
    a_crash_leaves_journaled_claims_in_progress,
    completed_forgotten_and_compacted_claims_stay_gone,
    the_file_is_rewritten_past_its_bound,
    a_rewrite_cut_short_leaves_nothing_behind,
    a_bad_frame_before_valid_ones_refuses_the_open_and_keeps_the_file,
    a_torn_tail_is_dropped_at_open,
);

/// Claims of absent keys, made durable together; returns them in key order.
fn claim_all(store: &KeyStore, keys: &[String], b: u8) -> Vec<DurableClaim> {
    let pending = keys.iter().map(|k| store.claim(k, None, in_progress(b, 1)).unwrap().unwrap()).collect();
    store.flush_claims(pending).unwrap()
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:05}")).collect()
}

fn fresh_claims_are_journaled_not_written_to_the_backend(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let ks = keys("j", 10);
    let claims = claim_all(&f.store, &ks, 1);
    for k in &ks {
        assert_eq!(
            f.store.backend.get(Tree::Records(Slice::FIRST), k.as_bytes()).unwrap(),
            None,
            "{k} not in the backend"
        );
        assert_eq!(f.store.get(k).unwrap(), Some(Record::InProgress(in_progress(1, 1))), "{k} is in_progress");
    }
    assert!(f.store.journal.as_ref().unwrap().len() > 0, "the claims are in the file");
    assert_eq!(f.store.journal.as_ref().unwrap().live_count(), 10);
    // A completion goes to the backend and releases the claim.
    let done: Vec<_> = claims.into_iter().map(|c| (c, completed(1, 5_000))).collect();
    f.store.complete_batch(done).unwrap();
    for k in &ks {
        assert!(
            f.store.backend.get(Tree::Records(Slice::FIRST), k.as_bytes()).unwrap().is_some(),
            "{k} completed in the backend"
        );
    }
    assert_eq!(f.store.journal.as_ref().unwrap().live_count(), 0);
    check_invariants(&f.store);
}

fn a_crash_leaves_journaled_claims_in_progress(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let open = keys("open", 20);
    let done = keys("done", 20);
    let _out = claim_all(&f.store, &open, 1);
    let to_complete = claim_all(&f.store, &done, 2);
    f.store.complete_batch(to_complete.into_iter().map(|c| (c, completed(2, 9_000_000_000_000))).collect()).unwrap();
    f.store.flush().unwrap();
    // The process dies with 20 claims out; the next one finds them in_progress, in the
    // backend, and the journal empty.
    let f = f.reopen();
    for k in &open {
        assert_eq!(
            f.store
                .backend
                .get(Tree::Records(Slice::FIRST), k.as_bytes())
                .unwrap()
                .map(|v| Record::decode(&v).unwrap()),
            Some(Record::InProgress(in_progress(1, 1))),
            "{k} recovered as in_progress"
        );
    }
    for k in &done {
        assert!(matches!(f.store.get(k).unwrap(), Some(Record::Completed(_))), "{k} stays completed");
    }
    assert_eq!(f.store.counts().in_progress, 20);
    assert_eq!(f.store.journal.as_ref().unwrap().len(), 0, "recovery starts an empty journal");
    check_invariants(&f.store);
    // Recovered claims are orphans the engine can replace like any backend record.
    let orphan = Record::InProgress(in_progress(1, 1));
    let again = f.store.claim(&open[0], Some(&orphan), in_progress(1, 2)).unwrap().unwrap();
    f.store.flush_claims(vec![again]).unwrap();
    assert_eq!(f.store.get(&open[0]).unwrap(), Some(Record::InProgress(in_progress(1, 2))));
}

fn completed_forgotten_and_compacted_claims_stay_gone(kind: StoreBackend) {
    let f = Fixture::new(kind);
    // Completed with an expiry already past, then compacted: the file still holds their
    // claims until compaction rewrites it first.
    let expired = keys("expired", 30);
    let claims = claim_all(&f.store, &expired, 1);
    f.store.complete_batch(claims.into_iter().map(|c| (c, completed(1, 10))).collect()).unwrap();
    f.store.flush().unwrap();
    assert_eq!(f.store.compact_expired(1_000, 7).unwrap(), 30);
    let f = f.reopen();
    for k in &expired {
        assert_eq!(f.store.get(k).unwrap(), None, "{k} must not come back after compaction");
    }
    // Forgotten while out: no record anywhere, and none after a restart.
    let forgotten = keys("forgotten", 3);
    let _claims = claim_all(&f.store, &forgotten, 2);
    for k in &forgotten {
        assert!(f.store.forget(k).unwrap().is_some());
    }
    // Replaced while out by compare-and-swap (what the engine does to an orphan).
    let swapped = claim_all(&f.store, &keys("swapped", 1), 3);
    let mine = Record::InProgress(swapped[0].record().clone());
    let ind = Record::Indeterminate(indeterminate(3));
    f.store.compare_and_swap(swapped[0].key(), Some(&mine), Some(&ind)).unwrap().unwrap();
    f.store.flush().unwrap();
    check_invariants(&f.store);
    let f = f.reopen();
    for k in expired.iter().chain(&forgotten) {
        assert_eq!(f.store.get(k).unwrap(), None, "{k} must not come back");
    }
    assert_eq!(f.store.get("swapped00000").unwrap(), Some(ind));
    assert_eq!(f.store.counts(), StateCounts { in_progress: 0, completed: 0, indeterminate: 1 });
    check_invariants(&f.store);
}

fn the_file_is_rewritten_past_its_bound(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let mut out = Vec::new();
    // Claims until the file has been rewritten at least twice (the bound is 256 KiB in
    // unit tests).
    let mut rewrites = 0;
    let mut last_len = 0;
    let mut batch = 0;
    while rewrites < 2 {
        assert!(batch < 2_000, "the file never shrank: no rewrite");
        let ks = keys(&format!("b{batch:04}-"), 500);
        let mut claims = claim_all(&f.store, &ks, 1);
        // One claim of each batch stays out; the others complete.
        out.push(claims.pop().unwrap().key().to_string());
        f.store.complete_batch(claims.into_iter().map(|c| (c, completed(1, 9_000_000_000_000))).collect()).unwrap();
        f.store.flush().unwrap();
        let len = f.store.journal.as_ref().unwrap().len();
        if len < last_len {
            rewrites += 1;
        }
        last_len = len;
        batch += 1;
    }
    assert_eq!(f.store.journal.as_ref().unwrap().live_count(), out.len());
    let f = f.reopen();
    assert_eq!(f.store.counts().in_progress, out.len() as i64);
    for k in &out {
        assert_eq!(f.store.get(k).unwrap(), Some(Record::InProgress(in_progress(1, 1))), "{k} survives rewrites");
    }
    check_invariants(&f.store);
}

/// An encoded `in_progress` record with fingerprint `b`.
fn rec(b: u8) -> Vec<u8> {
    Record::InProgress(in_progress(b, 1)).encode()
}

/// A journal with no store around it (its directory, file path and the journal).
fn bare_journal() -> (tempfile::TempDir, std::path::PathBuf, ClaimJournal) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(journal::FILE_NAME);
    let j = ClaimJournal::create_empty(&path).unwrap();
    (dir, path, j)
}

/// What a rewrite flushes first, when there is no backend.
fn no_backend() -> Result<(), StoreError> {
    Ok(())
}

/// A file cut anywhere loses at most its last frame, never an earlier one; a frame whose
/// checksum holds but whose content does not decode is an error, not a torn write.
#[test]
fn a_torn_tail_loses_only_the_last_frame() {
    let (_dir, path, j) = bare_journal();
    j.append(vec![("a".into(), rec(1)), ("b".into(), rec(2))], &no_backend).unwrap();
    j.append(vec![("a".into(), rec(3))], &no_backend).unwrap();
    j.append(vec![("c".into(), rec(4))], &no_backend).unwrap();
    let whole = std::fs::read(&path).unwrap();
    let (claims, torn) = journal::decode_file(&whole).unwrap();
    assert!(!torn);
    let names: Vec<_> = claims.iter().map(|(k, c)| (k.as_str(), c.fingerprint)).collect();
    assert_eq!(names, vec![("a", fp(3)), ("b", fp(2)), ("c", fp(4))], "the last claim of a key wins");
    for cut in 1..whole.len() {
        let (claims, _) = journal::decode_file(&whole[..cut]).unwrap();
        assert!(claims.iter().all(|(k, _)| k == "a" || k == "b"), "the last frame (c) is lost when cut at {cut}");
    }
    assert!(journal::decode_file(&whole[..whole.len() - 1]).unwrap().1, "a cut frame is reported torn");
    // A checksummed frame that holds garbage.
    let mut bad = Vec::new();
    let body = b"\x05\x00\x00\x00abc";
    bad.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bad.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    bad.extend_from_slice(body);
    assert!(journal::decode_file(&bad).is_err());
}

/// A tombstone (a claim deleted while out) hides the key's earlier claims, and a later
/// claim of the key hides the tombstone.
#[test]
fn a_tombstone_hides_earlier_claims_only() {
    let (_dir, path, j) = bare_journal();
    j.append(vec![("a".into(), rec(1)), ("b".into(), rec(2)), ("c".into(), rec(3))], &no_backend).unwrap();
    j.forget("a").unwrap();
    j.forget("c").unwrap();
    j.append(vec![("c".into(), rec(4))], &no_backend).unwrap();
    j.sync_all().unwrap();
    assert_eq!(j.live_count(), 2, "b and the second c are out");
    let claims = ClaimJournal::read(&path).unwrap();
    let names: Vec<_> = claims.iter().map(|(k, c)| (k.as_str(), c.fingerprint)).collect();
    assert_eq!(names, vec![("b", fp(2)), ("c", fp(4))]);
}

/// A failed append is an error, leaves nothing out, and (when the file cannot be cut back)
/// every later append fails too instead of landing behind a torn frame; a rewrite starts
/// a good file again.
#[test]
fn a_failed_append_refuses_later_ones() {
    let (_dir, path, j) = bare_journal();
    j.append(vec![("a".into(), rec(1))], &no_backend).unwrap();
    j.make_writes_fail();
    assert!(j.append(vec![("b".into(), rec(2))], &no_backend).is_err());
    assert_eq!(j.live_count(), 1, "b is not out");
    let later = j.append(vec![("c".into(), rec(3))], &no_backend).unwrap_err().to_string();
    assert!(later.contains("earlier write failed"), "{later}");
    j.release("a");
    j.drop_stale(&no_backend).unwrap();
    j.append(vec![("d".into(), rec(4))], &no_backend).unwrap();
    j.sync_all().unwrap();
    let names: Vec<_> = ClaimJournal::read(&path).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, vec!["d"]);
}

/// A crash between writing a rewrite's temporary file and renaming it leaves the file in the
/// store directory; the next open removes it and keeps the journal's own claims.
fn a_rewrite_cut_short_leaves_nothing_behind(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let open = keys("open", 3);
    let _out = claim_all(&f.store, &open, 1);
    let leftover = f.dir.path().join("dedupd-claims.journal.a1b2c3.tmp");
    std::fs::write(&leftover, b"half a rewrite").unwrap();
    let f = f.reopen();
    assert!(!leftover.exists(), "the leftover is removed at open");
    for k in &open {
        assert_eq!(f.store.get(k).unwrap(), Some(Record::InProgress(in_progress(1, 1))), "{k} recovered");
    }
    check_invariants(&f.store);
}

/// Flips a byte inside the first frame of the journal in `dir`, whose later frames stay
/// valid; returns the file's bytes as corrupted.
fn corrupt_first_frame(dir: &std::path::Path) -> Vec<u8> {
    let path = dir.join(journal::FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[12] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    bytes
}

/// Recovery drops only a torn tail: a bad frame followed by valid ones is corruption. The
/// open fails naming the file and the frame's offset, and the file is kept byte for byte
/// (not replaced by an empty journal), for the operator.
fn a_bad_frame_before_valid_ones_refuses_the_open_and_keeps_the_file(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let _first = claim_all(&f.store, &keys("first", 2), 1);
    let _later = claim_all(&f.store, &keys("later", 2), 2);
    let Fixture { dir, kind, store } = f;
    drop(store);
    let corrupted = corrupt_first_frame(dir.path());
    let path = dir.path().join(journal::FILE_NAME);
    let err = match KeyStore::open(kind, dir.path(), SyncMode::Batch) {
        Ok(_) => panic!("a store whose journal is corrupt must not open"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(matches!(err, StoreError::JournalCorrupt { offset: 0, .. }), "{message}");
    assert!(message.contains(&path.display().to_string()) && message.contains("byte 0"), "{message}");
    assert_eq!(std::fs::read(&path).unwrap(), corrupted, "the file is kept as it was");
    let backend = open_backend(kind, dir.path(), CacheSize::default()).unwrap();
    for k in keys("later", 2) {
        assert_eq!(
            backend.get(Tree::Records(Slice::FIRST), k.as_bytes()).unwrap(),
            None,
            "{k}: nothing written past the bad frame"
        );
    }
}

/// A frame cut short at the end of the file (a crash mid-append) is dropped and the open
/// goes on with every earlier claim.
fn a_torn_tail_is_dropped_at_open(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let _first = claim_all(&f.store, &keys("first", 2), 1);
    let _torn = claim_all(&f.store, &keys("torn", 1), 2);
    let Fixture { dir, kind, store } = f;
    drop(store);
    let path = dir.path().join(journal::FILE_NAME);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let store = KeyStore::open(kind, dir.path(), SyncMode::Batch).expect("a torn tail opens");
    for k in keys("first", 2) {
        assert_eq!(store.get(&k).unwrap(), Some(Record::InProgress(in_progress(1, 1))), "{k} recovered");
    }
    assert_eq!(store.get("torn00000").unwrap(), None, "the torn claim was never acknowledged");
}

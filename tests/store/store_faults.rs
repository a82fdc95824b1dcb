//! Faults injected at the store's I/O boundaries (named failpoints, feature `failpoints`):
//! a failed fsync poisons the claim journal, a failed rewrite never leaves appends on a file
//! that is no longer the journal, a full disk is reported as one, at the journal and at
//! the backend, without losing a claim that was reported durable, and a slice of the
//! records that fails to drop stays open for a later turn.
//!
//! Run with `cargo test --features failpoints --test store store_faults::`. Failpoints are global to
//! the process: every test holds a `FailScenario`, which runs them one at a time.
#![cfg(feature = "failpoints")]

use std::path::Path;

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{Completed, Completion, DurableClaim, InProgress, KeyStore, Record, SLICE_SPAN_MS, SourcePos};
use dedupd::store::{StoreBackend, StoreError, SyncMode};

fn claim_of(n: u8) -> InProgress {
    InProgress {
        fingerprint: Fingerprint([n; 32]),
        claimed_at_ms: 1_000,
        attempts: 1,
        source: SourcePos { topic: "faults".into(), partition: 0, offset: i64::from(n) },
        held: None,
    }
}

fn completion_of(claim: &DurableClaim) -> Completed {
    Completed {
        fingerprint: claim.record().fingerprint,
        outcome: Completion::Succeeded,
        result: b"{}".to_vec(),
        error: None,
        first_seen_at_ms: 1_000,
        completed_at_ms: 2_000,
        expires_at_ms: 4_000_000_000_000,
        attempts: 1,
        source: None,
        settled: None,
    }
}

fn open(kind: StoreBackend, dir: &Path) -> KeyStore {
    KeyStore::open(kind, dir, SyncMode::Batch).expect("open the store")
}

/// Claims `key` (absent) and makes the claim durable.
fn claim_durably(store: &KeyStore, key: &str, n: u8) -> Result<DurableClaim, StoreError> {
    let pending = store.claim(key, None, claim_of(n))?.expect("the key is absent");
    Ok(store.flush_claims(vec![pending])?.remove(0))
}

/// The store's record of `key` after a restart.
fn after_restart(kind: StoreBackend, dir: &Path, key: &str) -> Option<Record> {
    open(kind, dir).get(key).expect("read")
}

/// A store whose journal holds a released (stale) claim, `done`, and a claim that is out,
/// `open`: deleting a record (forget) then rewrites the journal first.
fn store_with_stale_claim(kind: StoreBackend, dir: &Path) -> KeyStore {
    let store = open(kind, dir);
    let done = claim_durably(&store, "done", 1).expect("claim");
    let completed = completion_of(&done);
    store.complete(done, completed).expect("complete");
    store.flush().expect("flush");
    claim_durably(&store, "open", 2).expect("claim");
    store
}

#[test]
fn a_failed_fsync_poisons_the_journal_until_a_restart() {
    let scenario = fail::FailScenario::setup();
    for &kind in StoreBackend::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(kind, dir.path());
        claim_durably(&store, "before", 1).expect("a claim before the fault");
        fail::cfg("journal.fsync", "return").expect("failpoint");
        let failed = claim_durably(&store, "synced-badly", 2);
        assert!(failed.is_err(), "{kind}: the claim whose fsync failed is never reported durable");
        fail::remove("journal.fsync");
        // The fsync works again, but the pages the failed one dropped are gone: refused.
        let later = store.claim("later", None, claim_of(3)).expect_err("a claim after a failed fsync is an error");
        assert!(matches!(later, StoreError::JournalPoisoned { .. }), "{kind}: {later}");
        assert!(later.to_string().contains("fsync failed"), "{kind}: {later}");
        assert!(store.flush_always().is_err(), "{kind}: a sync after a failed fsync is an error");
        drop(store);
        assert_eq!(after_restart(kind, dir.path(), "before"), Some(Record::InProgress(claim_of(1))), "{kind}");
        assert_eq!(after_restart(kind, dir.path(), "later"), None, "{kind}");
    }
    scenario.teardown();
}

#[test]
fn a_rewrite_failing_after_its_rename_poisons_the_journal() {
    let scenario = fail::FailScenario::setup();
    for &kind in StoreBackend::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_stale_claim(kind, dir.path());
        fail::cfg("journal.rewrite.dirsync", "return").expect("failpoint");
        assert!(store.forget("done").is_err(), "{kind}: the rewrite before the delete fails");
        fail::remove("journal.rewrite.dirsync");
        let later = store.claim("later", None, claim_of(3)).expect_err("refused");
        assert!(matches!(later, StoreError::JournalPoisoned { .. }), "{kind}: {later}");
        drop(store);
        assert_eq!(after_restart(kind, dir.path(), "open"), Some(Record::InProgress(claim_of(2))), "{kind}");
        assert!(matches!(after_restart(kind, dir.path(), "done"), Some(Record::Completed(_))), "{kind}");
    }
    scenario.teardown();
}

#[test]
fn a_rewrite_failing_before_its_rename_leaves_appends_in_the_journal() {
    let scenario = fail::FailScenario::setup();
    for point in ["journal.rewrite.write", "journal.rewrite.reopen", "journal.rewrite.persist"] {
        for &kind in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = store_with_stale_claim(kind, dir.path());
            fail::cfg(point, "return").expect("failpoint");
            assert!(store.forget("done").is_err(), "{kind} {point}: the rewrite fails");
            fail::remove(point);
            // Acknowledged as durable after the failed rewrite: it must be in the file
            // that recovery reads.
            claim_durably(&store, "after", 3).expect("the journal still takes claims");
            drop(store);
            let recovered = after_restart(kind, dir.path(), "after");
            assert_eq!(recovered, Some(Record::InProgress(claim_of(3))), "{kind} {point}");
            assert_eq!(after_restart(kind, dir.path(), "open"), Some(Record::InProgress(claim_of(2))), "{kind}");
        }
    }
    scenario.teardown();
}

/// The error of a full disk names the store directory and says "no space left".
fn assert_disk_full(e: &StoreError, dir: &Path, what: &str) {
    assert!(e.is_disk_full(), "{what}: {e}");
    assert_eq!(e.write_error_kind(), Some("disk_full"), "{what}");
    let message = e.to_string();
    assert!(message.contains("no space left") && message.contains(&dir.display().to_string()), "{what}: {message}");
}

#[test]
fn a_full_disk_at_the_journal_is_reported_as_one() {
    let scenario = fail::FailScenario::setup();
    for &kind in StoreBackend::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(kind, dir.path());
        claim_durably(&store, "before", 1).expect("claim");
        fail::cfg("journal.write", "return(enospc)").expect("failpoint");
        let e = store.claim("full", None, claim_of(2)).expect_err("no space for the claim");
        assert_disk_full(&e, dir.path(), &format!("{kind} journal"));
        fail::remove("journal.write");
        drop(store);
        assert_eq!(after_restart(kind, dir.path(), "before"), Some(Record::InProgress(claim_of(1))), "{kind}");
        assert_eq!(after_restart(kind, dir.path(), "full"), None, "{kind}: never acknowledged");
    }
    scenario.teardown();
}

#[test]
fn a_full_disk_at_the_backend_is_reported_as_one_and_loses_no_claim() {
    let scenario = fail::FailScenario::setup();
    for &kind in StoreBackend::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(kind, dir.path());
        let claim = claim_durably(&store, "claimed", 1).expect("claim");
        let completed = completion_of(&claim);
        fail::cfg("backend.apply", "return(enospc)").expect("failpoint");
        // fjall writes at once; sled's writes reach its tree at the flush.
        let e = match store.complete(claim, completed) {
            Err(e) => e,
            Ok(_) => store.flush().expect_err("no space for the completion"),
        };
        assert_disk_full(&e, dir.path(), &format!("{kind} backend"));
        fail::remove("backend.apply");
        drop(store);
        let record = after_restart(kind, dir.path(), "claimed");
        assert!(
            matches!(record, Some(Record::InProgress(_) | Record::Completed(_))),
            "{kind}: the claim is kept: {record:?}"
        );
    }
    scenario.teardown();
}

#[test]
fn journal_rewrite_at_makes_rewrites_frequent_and_keeps_every_claim() {
    let scenario = fail::FailScenario::setup();
    fail::cfg("journal.rewrite_at", "return(256)").expect("failpoint");
    for &kind in StoreBackend::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(kind, dir.path());
        let journal = dir.path().join("dedupd-claims.journal");
        let mut largest = 0;
        // Each claim completed once the next is out: the file holds one or two claims'
        // worth once rewritten, and grows without bound if it never is.
        let mut previous: Option<DurableClaim> = None;
        for n in 0..40u8 {
            let claim = claim_durably(&store, &format!("k{n}"), n).expect("claim");
            if let Some(done) = previous.replace(claim) {
                let completed = completion_of(&done);
                store.complete(done, completed).expect("complete");
            }
            largest = largest.max(std::fs::metadata(&journal).expect("journal").len());
        }
        assert!(largest < 1024, "{kind}: the journal is rewritten past 256 bytes (largest {largest})");
        drop(store);
        let store = open(kind, dir.path());
        for n in 0..39u8 {
            assert!(matches!(store.get(&format!("k{n}")).expect("read"), Some(Record::Completed(_))), "{kind} k{n}");
        }
        assert_eq!(store.get("k39").expect("read"), Some(Record::InProgress(claim_of(39))), "{kind}");
    }
    fail::remove("journal.rewrite_at");
    scenario.teardown();
}

/// fjall: the slice emptied by compaction meets a full disk as it is dropped (its clear
/// done, the write marking its number free refused). It stays open and read, and the next
/// turn drops it.
#[test]
fn a_slice_that_fails_to_drop_stays_open_until_a_later_turn() {
    let scenario = fail::FailScenario::setup();
    let kind = StoreBackend::Fjall;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(kind, dir.path());
    let early = claim_durably(&store, "early", 1).expect("claim");
    let expiring = Completed { expires_at_ms: 100, ..completion_of(&early) };
    store.complete(early, expiring).expect("complete");
    let turned = store.turn_slices(SLICE_SPAN_MS).expect("turn");
    assert!(turned.opened.is_some(), "a second slice");
    let late = claim_durably(&store, "late", 2).expect("claim");
    let completed = completion_of(&late);
    store.complete(late, completed).expect("complete");
    let live = |store: &KeyStore| {
        store.slice_keys().into_iter().map(|(slice, keys)| (slice.number(), keys)).collect::<Vec<_>>()
    };
    // The compaction's delete passes; the drop's write after it fails.
    fail::cfg("backend.apply", "1*off->return(enospc)").expect("failpoint");
    let e = store.compact_expired(SLICE_SPAN_MS + 1, 10).expect_err("no space to mark the slice free");
    assert_disk_full(&e, dir.path(), "the drop");
    fail::remove("backend.apply");
    assert_eq!(live(&store), vec![(0, 0), (1, 1)], "the first slice is still open, empty");
    let keys: Vec<String> =
        store.scan_records(None, 10).expect("scan every slice").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec!["late".to_string()]);
    assert_eq!(store.turn_slices(SLICE_SPAN_MS + 2).expect("turn").dropped.len(), 1, "dropped now");
    assert_eq!(live(&store), vec![(1, 1)]);
    drop(store);
    assert_eq!(after_restart(kind, dir.path(), "early"), None);
    assert!(matches!(after_restart(kind, dir.path(), "late"), Some(Record::Completed(_))));
    scenario.teardown();
}

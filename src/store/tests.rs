//! Store tests, run against every registered backend: each test is a function of the
//! backend kind, and [`each_backend!`] instantiates it once per backend as
//! `store::tests::<backend module>::NAME` (e.g. `store::tests::fjall_backend::NAME`).

use std::collections::BTreeMap;
use std::sync::Barrier;

use super::*;
use crate::fingerprint::Fingerprint;

/// `each_backend!(test_a, test_b)`: one `#[test]` per test and registered backend.
macro_rules! each_backend {
    ($($test:ident),* $(,)?) => {
        registered_backends!(backend_test_modules!($($test),*));
    };
}

/// Called by `registered_backends!`: a module per backend, named after the backend's module.
macro_rules! backend_test_modules {
    ($tests:tt $($(#[$attr:meta])* $name:literal => $variant:ident($module:ident::$backend:ident),)+) => {
        $(backend_test_modules!(@one $module $variant $tests);)+
    };
    (@one $module:ident $variant:ident ($($test:ident),*)) => {
        mod $module {
            $( #[test] fn $test() { super::$test(crate::store::StoreBackend::$variant) } )*
        }
    };
}

each_backend!(
    claim_of_absent_key,
    claim_cas_failure_returns_current,
    racing_claims_one_winner,
    complete_writes_expiry_entry,
    complete_after_forget_is_claim_lost,
    reclaim_of_expired_completed,
    orphan_reclaim_bumps_attempts,
    indeterminate_has_no_expiry,
    forget_removes_any_state,
    counts_follow_transitions,
    compaction_removes_only_expired_completed,
    compaction_chunks_and_next_expiry,
    watermarks_never_lower,
    reopen_keeps_flushed_data,
    scan_records_pages,
    sync_none_still_works,
    empty_and_reversed_scans,
    reads_see_unflushed_writes,
    clean_drop_keeps_unflushed_writes,
    complete_batch_shares_index_entries,
    old_index_is_rebuilt_at_open,
    format_2_index_is_rebuilt_at_open,
    stamped_claims_never_trust_a_stale_read,
    claim_batch_mixes_fresh_stale_and_expired,
);

mod completing;
mod filter;
mod journal;
mod lock;

// ---------------------------------------------------------------------------------------
// helpers

struct Fixture {
    dir: tempfile::TempDir,
    kind: StoreBackend,
    store: KeyStore,
}

impl Fixture {
    fn new(kind: StoreBackend) -> Fixture {
        Self::with_sync(kind, SyncMode::Batch)
    }

    fn with_sync(kind: StoreBackend, sync: SyncMode) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = KeyStore::open(kind, dir.path(), sync).expect("open");
        Fixture { dir, kind, store }
    }

    /// Drops the store and opens it again in the same directory.
    fn reopen(self) -> Fixture {
        let Fixture { dir, kind, store } = self;
        drop(store);
        let store = KeyStore::open(kind, dir.path(), SyncMode::Batch).expect("reopen");
        Fixture { dir, kind, store }
    }
}

fn fp(b: u8) -> Fingerprint {
    Fingerprint([b; 32])
}

fn in_progress(b: u8, attempts: u32) -> InProgress {
    InProgress {
        fingerprint: fp(b),
        claimed_at_ms: 1_000,
        attempts,
        source: SourcePos { topic: "commands".into(), partition: 1, offset: 42 },
    }
}

pub(super) fn completed(b: u8, expires_at_ms: i64) -> Completed {
    Completed {
        fingerprint: fp(b),
        outcome: Completion::Succeeded,
        result: br#"{"ok":true}"#.to_vec(),
        error: None,
        first_seen_at_ms: 1_000,
        completed_at_ms: 2_000,
        expires_at_ms,
        attempts: 1,
        source: None,
    }
}

fn indeterminate(b: u8) -> Indeterminate {
    Indeterminate { fingerprint: fp(b), claimed_at_ms: 1_000, attempts: 1, why: "crashed mid-call".into() }
}

/// Claims an absent key and makes the claim durable.
fn durable(store: &KeyStore, key: &str, b: u8) -> DurableClaim {
    let pending = store.claim(key, None, in_progress(b, 1)).unwrap().expect("key was absent");
    let mut d = store.flush_claims(vec![pending]).unwrap();
    d.pop().unwrap()
}

/// A completed record at `key` expiring at `at`.
fn put_completed(store: &KeyStore, key: &str, b: u8, at: i64) {
    let claim = durable(store, key, b);
    store.complete(claim, completed(b, at)).unwrap();
}

fn put_indeterminate(store: &KeyStore, key: &str, b: u8) {
    let claim = durable(store, key, b);
    let expected = Record::InProgress(claim.record().clone());
    store
        .compare_and_swap(key, Some(&expected), Some(&Record::Indeterminate(indeterminate(b))))
        .unwrap()
        .expect("in_progress → indeterminate");
}

fn expiry_entries(store: &KeyStore) -> Vec<(i64, String)> {
    let mut entries = store
        .backend
        .scan(Tree::Expiry, &[], None, usize::MAX)
        .unwrap()
        .into_iter()
        .flat_map(|(k, v)| {
            let (entry_at, _) = split_expiry_key(&k).expect("index key");
            let pairs = decode_index_entry(&v).expect("index entry");
            assert!(!pairs.is_empty(), "empty index entry");
            // An entry sits at the latest expiry of its pairs, all in one span.
            assert_eq!(entry_at, pairs.iter().map(|p| p.1).max().unwrap());
            assert!(pairs.iter().all(|p| p.1.div_euclid(GROUP_MS) == entry_at.div_euclid(GROUP_MS)));
            pairs.into_iter().map(|(key, at)| (at, key))
        })
        .collect::<Vec<_>>();
    entries.sort();
    entries
}

fn all_records(store: &KeyStore) -> BTreeMap<String, Record> {
    let mut out = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.scan_records(after.as_deref(), 1000).unwrap();
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        out.extend(page);
    }
    out
}

/// The store's invariants: the expiry index holds exactly the completed records' expiries,
/// and the live counts equal a full recount.
fn check_invariants(store: &KeyStore) {
    let records = all_records(store);
    let mut want: Vec<(i64, String)> =
        records.iter().filter_map(|(k, r)| r.expires_at_ms().map(|at| (at, k.clone()))).collect();
    want.sort();
    assert_eq!(expiry_entries(store), want, "expiry index out of step with the records");
    let live = store.counts();
    let mut by_scan = StateCounts::default();
    for r in records.values() {
        match r.state() {
            State::InProgress => by_scan.in_progress += 1,
            State::Completed => by_scan.completed += 1,
            State::Indeterminate => by_scan.indeterminate += 1,
        }
    }
    assert_eq!(live, by_scan, "live counts differ from the records");
    assert_eq!(store.recount().unwrap(), by_scan);
    filter::check_presence(store, &records);
}

fn counts(in_progress: i64, completed: i64, indeterminate: i64) -> StateCounts {
    StateCounts { in_progress, completed, indeterminate }
}

// ---------------------------------------------------------------------------------------
// tests

fn claim_of_absent_key(kind: StoreBackend) {
    let f = Fixture::new(kind);
    assert_eq!(f.store.get("k").unwrap(), None);
    let pending = f.store.claim("k", None, in_progress(1, 1)).unwrap().expect("absent key is claimable");
    assert_eq!(pending.key(), "k");
    let durable = f.store.flush_claims(vec![pending]).unwrap();
    assert_eq!(durable.len(), 1);
    assert_eq!(durable[0].key(), "k");
    assert_eq!(durable[0].record(), &in_progress(1, 1));
    assert_eq!(f.store.get("k").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
    assert_eq!(f.store.counts(), counts(1, 0, 0));
    assert!(expiry_entries(&f.store).is_empty());
    check_invariants(&f.store);
}

fn claim_cas_failure_returns_current(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let _ = durable(&f.store, "k", 1);
    // A second claim expecting absence loses and sees the winner's record.
    let lost = f.store.claim("k", None, in_progress(2, 1)).unwrap().expect_err("key is taken");
    assert_eq!(lost, Some(Record::InProgress(in_progress(1, 1))));
    // Expecting a record that is not the stored one also loses.
    let stale = Record::InProgress(in_progress(9, 1));
    let lost = f.store.claim("k", Some(&stale), in_progress(2, 2)).unwrap().expect_err("stale expectation");
    assert_eq!(lost, Some(Record::InProgress(in_progress(1, 1))));
    // Expecting a record when there is none loses with None.
    let lost = f.store.claim("other", Some(&stale), in_progress(2, 2)).unwrap().expect_err("absent");
    assert_eq!(lost, None);
    assert_eq!(f.store.get("k").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
    assert_eq!(f.store.counts(), counts(1, 0, 0));
    check_invariants(&f.store);
}

fn racing_claims_one_winner(kind: StoreBackend) {
    const THREADS: usize = 8;
    const ROUNDS: usize = 200;
    let f = Fixture::new(kind);
    let barrier = Barrier::new(THREADS);
    let winners: Vec<Vec<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = &f.store;
                let barrier = &barrier;
                s.spawn(move || {
                    let mut won = Vec::new();
                    for round in 0..ROUNDS {
                        barrier.wait();
                        let key = format!("race-{round}");
                        match store.claim(&key, None, in_progress(t as u8, 1)).unwrap() {
                            Ok(p) => {
                                let _ = store.flush_claims(vec![p]).unwrap();
                                won.push(round);
                            }
                            Err(current) => {
                                assert!(matches!(current, Some(Record::InProgress(_))), "{current:?}");
                            }
                        }
                    }
                    won
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut per_round = vec![Vec::new(); ROUNDS];
    for (t, won) in winners.iter().enumerate() {
        for &r in won {
            per_round[r].push(t);
        }
    }
    for (round, w) in per_round.iter().enumerate() {
        assert_eq!(w.len(), 1, "round {round}: winners {w:?}");
        let stored = f.store.get(&format!("race-{round}")).unwrap();
        assert_eq!(stored, Some(Record::InProgress(in_progress(w[0] as u8, 1))), "round {round}");
    }
    assert_eq!(f.store.counts(), counts(ROUNDS as i64, 0, 0));
    check_invariants(&f.store);
}

fn complete_writes_expiry_entry(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let claim = durable(&f.store, "k", 1);
    let rec = f.store.complete(claim, completed(1, 50_000)).unwrap();
    assert_eq!(rec, Record::Completed(completed(1, 50_000)));
    f.store.flush().unwrap();
    assert_eq!(f.store.get("k").unwrap(), Some(rec));
    assert_eq!(expiry_entries(&f.store), vec![(50_000, "k".to_string())]);
    assert_eq!(f.store.next_expiry().unwrap(), Some(50_000));
    assert_eq!(f.store.counts(), counts(0, 1, 0));
    check_invariants(&f.store);
}

fn complete_after_forget_is_claim_lost(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let claim = durable(&f.store, "k", 1);
    assert_eq!(f.store.forget("k").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
    match f.store.complete(claim, completed(1, 50_000)) {
        Err(StoreError::ClaimLost(k)) => assert_eq!(k, "k"),
        other => panic!("expected ClaimLost, got {other:?}"),
    }
    assert_eq!(f.store.get("k").unwrap(), None);
    assert!(expiry_entries(&f.store).is_empty());

    // Forgotten and re-claimed by someone else: the old claim is still lost.
    let old = durable(&f.store, "j", 1);
    f.store.forget("j").unwrap();
    let _new = durable(&f.store, "j", 2);
    assert!(matches!(f.store.complete(old, completed(1, 50_000)), Err(StoreError::ClaimLost(_))));
    assert_eq!(f.store.get("j").unwrap(), Some(Record::InProgress(in_progress(2, 1))));
    assert_eq!(f.store.counts(), counts(1, 0, 0));
    check_invariants(&f.store);
}

fn reclaim_of_expired_completed(kind: StoreBackend) {
    let f = Fixture::new(kind);
    put_completed(&f.store, "k", 1, 5_000);
    let old = f.store.get("k").unwrap().unwrap();
    assert!(old.is_expired(5_000) && !old.is_expired(4_999));
    let pending = f.store.claim("k", Some(&old), in_progress(2, 1)).unwrap().expect("expired record is claimable");
    let claim = f.store.flush_claims(vec![pending]).unwrap().pop().unwrap();
    // The old expiry entry went with the completed record.
    assert!(expiry_entries(&f.store).is_empty());
    assert_eq!(f.store.next_expiry().unwrap(), None);
    assert_eq!(f.store.counts(), counts(1, 0, 0));
    f.store.complete(claim, completed(2, 90_000)).unwrap();
    assert_eq!(expiry_entries(&f.store), vec![(90_000, "k".to_string())]);
    assert_eq!(f.store.counts(), counts(0, 1, 0));
    check_invariants(&f.store);
}

fn orphan_reclaim_bumps_attempts(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let first = durable(&f.store, "k", 1);
    // After a crash the engine finds the in_progress record and re-runs it.
    let orphan = f.store.get("k").unwrap().unwrap();
    assert_eq!(orphan, Record::InProgress(first.record().clone()));
    let mut again = in_progress(1, 2);
    again.source.offset = 43;
    let pending = f.store.claim("k", Some(&orphan), again.clone()).unwrap().expect("orphan re-claim");
    let second = f.store.flush_claims(vec![pending]).unwrap().pop().unwrap();
    assert_eq!(second.record().attempts, 2);
    assert_eq!(f.store.get("k").unwrap(), Some(Record::InProgress(again)));
    assert_eq!(f.store.counts(), counts(1, 0, 0));
    // The superseded claim can no longer complete; the new one can.
    assert!(matches!(f.store.complete(first, completed(1, 9_000)), Err(StoreError::ClaimLost(_))));
    let mut done = completed(1, 9_000);
    done.attempts = 2;
    f.store.complete(second, done).unwrap();
    assert_eq!(f.store.counts(), counts(0, 1, 0));
    check_invariants(&f.store);
}

fn indeterminate_has_no_expiry(kind: StoreBackend) {
    let f = Fixture::new(kind);
    put_indeterminate(&f.store, "k", 1);
    f.store.flush().unwrap();
    assert_eq!(f.store.get("k").unwrap(), Some(Record::Indeterminate(indeterminate(1))));
    assert!(expiry_entries(&f.store).is_empty());
    assert_eq!(f.store.counts(), counts(0, 0, 1));
    // Not claimable by a plain claim.
    let lost = f.store.claim("k", None, in_progress(2, 1)).unwrap().expect_err("indeterminate is taken");
    assert_eq!(lost, Some(Record::Indeterminate(indeterminate(1))));
    // Operator resolve: indeterminate → completed gets an expiry entry.
    let cur = f.store.get("k").unwrap().unwrap();
    f.store.compare_and_swap("k", Some(&cur), Some(&Record::Completed(completed(1, 7_000)))).unwrap().unwrap();
    assert_eq!(expiry_entries(&f.store), vec![(7_000, "k".to_string())]);
    assert_eq!(f.store.counts(), counts(0, 1, 0));
    check_invariants(&f.store);
}

fn forget_removes_any_state(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let _ = durable(&f.store, "a", 1);
    put_completed(&f.store, "b", 2, 10_000);
    put_indeterminate(&f.store, "c", 3);
    assert_eq!(f.store.counts(), counts(1, 1, 1));
    assert_eq!(f.store.forget("absent").unwrap(), None);
    assert_eq!(f.store.forget("a").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
    assert_eq!(f.store.forget("b").unwrap(), Some(Record::Completed(completed(2, 10_000))));
    assert_eq!(f.store.forget("c").unwrap(), Some(Record::Indeterminate(indeterminate(3))));
    assert_eq!(f.store.forget("c").unwrap(), None);
    assert_eq!(f.store.counts(), counts(0, 0, 0));
    assert!(expiry_entries(&f.store).is_empty());
    assert!(all_records(&f.store).is_empty());
    // A forgotten key is claimable again.
    let _ = durable(&f.store, "b", 4);
    check_invariants(&f.store);
    // forget flushes on its own: it survives a reopen without an explicit flush.
    assert!(f.store.forget("b").unwrap().is_some());
    let f = f.reopen();
    assert_eq!(f.store.get("b").unwrap(), None);
    check_invariants(&f.store);
}

fn counts_follow_transitions(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let mut claims = Vec::new();
    for i in 0..30 {
        claims.push(f.store.claim(&format!("k{i:02}"), None, in_progress(1, 1)).unwrap().unwrap());
    }
    assert_eq!(f.store.counts(), counts(30, 0, 0));
    let claims = f.store.flush_claims(claims).unwrap();
    let mut it = claims.into_iter();
    for (i, c) in it.by_ref().take(10).enumerate() {
        f.store.complete(c, completed(1, 1_000 + i as i64)).unwrap();
    }
    assert_eq!(f.store.counts(), counts(20, 10, 0));
    for c in it.by_ref().take(5) {
        let exp = Record::InProgress(c.record().clone());
        f.store.compare_and_swap(c.key(), Some(&exp), Some(&Record::Indeterminate(indeterminate(1)))).unwrap().unwrap();
    }
    assert_eq!(f.store.counts(), counts(15, 10, 5));
    check_invariants(&f.store);
    // Re-claims of expired completions: completed → in_progress.
    for i in 0..3 {
        let key = format!("k{i:02}");
        let cur = f.store.get(&key).unwrap().unwrap();
        let _ = f.store.claim(&key, Some(&cur), in_progress(2, 1)).unwrap().unwrap();
    }
    assert_eq!(f.store.counts(), counts(18, 7, 5));
    // Forget one of each.
    f.store.forget("k05").unwrap(); // completed
    f.store.forget("k12").unwrap(); // indeterminate
    f.store.forget("k20").unwrap(); // in_progress
    assert_eq!(f.store.counts(), counts(17, 6, 4));
    // Failed CAS changes nothing.
    let _ = f.store.claim("k21", None, in_progress(3, 1)).unwrap().unwrap_err();
    assert_eq!(f.store.counts(), counts(17, 6, 4));
    // Compaction removes expired completions only.
    assert_eq!(f.store.compact_expired(i64::MAX, 4).unwrap(), 6);
    assert_eq!(f.store.counts(), counts(17, 0, 4));
    check_invariants(&f.store);
    // Counts survive a reopen (recount at open).
    let f = f.reopen();
    assert_eq!(f.store.counts(), counts(17, 0, 4));
    check_invariants(&f.store);
}

fn compaction_removes_only_expired_completed(kind: StoreBackend) {
    let f = Fixture::new(kind);
    for i in 0..20 {
        put_completed(&f.store, &format!("old{i:02}"), 1, 1_000 + i);
        put_completed(&f.store, &format!("new{i:02}"), 1, 100_000 + i);
        let _ = durable(&f.store, &format!("run{i:02}"), 1);
        put_indeterminate(&f.store, &format!("ind{i:02}"), 1);
    }
    f.store.flush().unwrap();
    assert_eq!(f.store.counts(), counts(20, 40, 20));
    // Exactly at the expiry of old19 (1_019): inclusive.
    assert_eq!(f.store.compact_expired(1_019, 7).unwrap(), 20);
    assert_eq!(f.store.counts(), counts(20, 20, 20));
    let left = all_records(&f.store);
    assert_eq!(left.len(), 60);
    assert!(left.keys().all(|k| !k.starts_with("old")));
    for i in 0..20 {
        assert_eq!(left[&format!("run{i:02}")].state(), State::InProgress);
        assert_eq!(left[&format!("ind{i:02}")].state(), State::Indeterminate);
        assert_eq!(left[&format!("new{i:02}")].state(), State::Completed);
    }
    // Nothing else expired yet.
    assert_eq!(f.store.compact_expired(99_999, 7).unwrap(), 0);
    // Far in the future: only the completed ones go, in_progress and indeterminate stay.
    assert_eq!(f.store.compact_expired(i64::MAX, 1000).unwrap(), 20);
    assert_eq!(f.store.counts(), counts(20, 0, 20));
    check_invariants(&f.store);
    // And it is durable: compaction flushes each chunk.
    let f = f.reopen();
    assert_eq!(f.store.counts(), counts(20, 0, 20));
    check_invariants(&f.store);
}

fn compaction_chunks_and_next_expiry(kind: StoreBackend) {
    let f = Fixture::new(kind);
    assert_eq!(f.store.next_expiry().unwrap(), None);
    assert_eq!(f.store.compact_chunk(i64::MAX, 10).unwrap(), 0);
    for i in 0..25 {
        // Keys in the reverse order of their expiry: the index orders by time, not key.
        put_completed(&f.store, &format!("k{:02}", 24 - i), 1, 10_000 + i);
    }
    assert_eq!(f.store.next_expiry().unwrap(), Some(10_000));
    assert_eq!(f.store.compact_chunk(9_999, 10).unwrap(), 0);
    assert_eq!(f.store.compact_chunk(20_000, 10).unwrap(), 10);
    assert_eq!(f.store.counts(), counts(0, 15, 0));
    // The earliest ten went: k24..k15.
    assert_eq!(f.store.get("k24").unwrap(), None);
    assert_eq!(f.store.get("k15").unwrap(), None);
    assert!(f.store.get("k14").unwrap().is_some());
    assert_eq!(f.store.next_expiry().unwrap(), Some(10_010));
    // A chunk bounded by time, not size.
    assert_eq!(f.store.compact_chunk(10_012, 10).unwrap(), 3);
    assert_eq!(f.store.next_expiry().unwrap(), Some(10_013));
    assert_eq!(f.store.compact_chunk(20_000, 10).unwrap(), 10);
    assert_eq!(f.store.compact_chunk(20_000, 10).unwrap(), 2);
    assert_eq!(f.store.compact_chunk(20_000, 10).unwrap(), 0);
    assert_eq!(f.store.next_expiry().unwrap(), None);
    assert_eq!(f.store.counts(), counts(0, 0, 0));
    // compact_expired stops on a short chunk and reports the total.
    for i in 0..30 {
        put_completed(&f.store, &format!("m{i:02}"), 1, 5_000);
    }
    assert_eq!(f.store.compact_expired(5_000, 10).unwrap(), 30);
    assert_eq!(f.store.counts(), counts(0, 0, 0));
    check_invariants(&f.store);
}

fn watermarks_never_lower(kind: StoreBackend) {
    let f = Fixture::new(kind);
    assert_eq!(f.store.watermark("t", 0).unwrap(), None);
    f.store.raise_watermarks(&[("t".into(), 0, 10), ("t".into(), 1, 5), ("u".into(), 0, 7)]).unwrap();
    assert_eq!(f.store.watermark("t", 0).unwrap(), Some(10));
    assert_eq!(f.store.watermark("t", 1).unwrap(), Some(5));
    assert_eq!(f.store.watermark("u", 0).unwrap(), Some(7));
    f.store.raise_watermarks(&[("t".into(), 0, 3), ("t".into(), 1, 6)]).unwrap();
    assert_eq!(f.store.watermark("t", 0).unwrap(), Some(10), "lowered");
    assert_eq!(f.store.watermark("t", 1).unwrap(), Some(6));
    f.store.raise_watermarks(&[("t".into(), 0, 10)]).unwrap();
    assert_eq!(f.store.watermark("t", 0).unwrap(), Some(10));
    f.store.raise_watermarks(&[]).unwrap();
    // Watermarks are not records.
    assert_eq!(f.store.counts(), counts(0, 0, 0));
    assert!(all_records(&f.store).is_empty());
    f.store.flush().unwrap();
    let f = f.reopen();
    assert_eq!(f.store.watermark("t", 0).unwrap(), Some(10));
    assert_eq!(f.store.watermark("t", 1).unwrap(), Some(6));
    assert_eq!(f.store.watermark("u", 0).unwrap(), Some(7));
    assert_eq!(f.store.watermark("u", 1).unwrap(), None);
}

fn reopen_keeps_flushed_data(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let mut pending = Vec::new();
    for i in 0..100 {
        pending.push(f.store.claim(&format!("k{i:03}"), None, in_progress(1, 1)).unwrap().unwrap());
    }
    let claims = f.store.flush_claims(pending).unwrap();
    for (i, c) in claims.into_iter().enumerate() {
        if i % 2 == 0 {
            f.store.complete(c, completed(1, 50_000 + i as i64)).unwrap();
        }
    }
    put_indeterminate(&f.store, "ind", 2);
    f.store.raise_watermarks(&[("t".into(), 3, 99)]).unwrap();
    f.store.flush().unwrap();
    let before = all_records(&f.store);
    let index_before = expiry_entries(&f.store);
    let f = f.reopen();
    assert_eq!(all_records(&f.store), before);
    assert_eq!(expiry_entries(&f.store), index_before);
    assert_eq!(f.store.counts(), counts(50, 50, 1));
    assert_eq!(f.store.watermark("t", 3).unwrap(), Some(99));
    check_invariants(&f.store);
    // Reopened twice, and writable after a reopen.
    let f = f.reopen();
    let _ = durable(&f.store, "after", 3);
    assert_eq!(f.store.counts(), counts(51, 50, 1));
    check_invariants(&f.store);
}

fn scan_records_pages(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let mut want = Vec::new();
    for i in 0..57 {
        let key = format!("key-{i:03}");
        let _ = durable(&f.store, &key, 1);
        want.push(key);
    }
    // Keys that are prefixes of one another, and non-ASCII ones, page correctly too.
    for key in ["key", "key-", "key-000x", "kéy", "z"] {
        let _ = durable(&f.store, key, 1);
        want.push(key.to_string());
    }
    want.sort();
    f.store.raise_watermarks(&[("t".into(), 0, 1)]).unwrap();
    put_completed(&f.store, "zz", 1, 5); // has an expiry entry, which must not show up
    want.push("zz".into());
    let mut got = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = f.store.scan_records(after.as_deref(), 10).unwrap();
        assert!(page.len() <= 10);
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        got.extend(page.into_iter().map(|(k, _)| k));
        pages += 1;
    }
    assert_eq!(got, want);
    assert_eq!(pages, want.len().div_ceil(10));
    assert_eq!(f.store.scan_records(Some("zz"), 10).unwrap(), vec![]);
    let first = f.store.scan_records(None, 1).unwrap();
    assert_eq!(first[0].0, "key");
    assert_eq!(f.store.scan_records(Some("key-000"), 1).unwrap()[0].0, "key-000x");
}

fn sync_none_still_works(kind: StoreBackend) {
    let f = Fixture::with_sync(kind, SyncMode::None);
    let pending = f.store.claim("k", None, in_progress(1, 1)).unwrap().unwrap();
    let claim = f.store.flush_claims(vec![pending]).unwrap().pop().unwrap();
    f.store.complete(claim, completed(1, 10)).unwrap();
    f.store.flush().unwrap();
    assert_eq!(f.store.get("k").unwrap(), Some(Record::Completed(completed(1, 10))));
    assert_eq!(f.store.compact_expired(10, 100).unwrap(), 1);
    assert_eq!(f.store.get("k").unwrap(), None);
    let _ = durable(&f.store, "j", 1);
    check_invariants(&f.store);
    // A clean shutdown keeps the data even when nothing was fsynced on the way.
    f.store.flush_always().unwrap();
    let f = f.reopen();
    assert_eq!(f.store.get("j").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
    assert_eq!(f.store.get("k").unwrap(), None);
}

fn empty_and_reversed_scans(kind: StoreBackend) {
    let f = Fixture::new(kind);
    // Written through compare-and-swap, so into the backend (a claim would be journaled).
    let rec = Record::InProgress(in_progress(1, 1));
    f.store.compare_and_swap("b", None, Some(&rec)).unwrap().unwrap();
    let b = &f.store.backend;
    assert_eq!(b.scan(Tree::Records, b"c", Some(b"a"), 10).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Records, b"b", Some(b"b"), 10).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Records, b"a", None, 0).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Records, b"a", Some(b"c"), 10).unwrap().len(), 1);
    assert_eq!(b.scan(Tree::Meta, b"", None, 10).unwrap(), vec![(b"index-format".to_vec(), b"3".to_vec())]);
    assert!(f.store.disk_bytes().unwrap() > 0);
    // Compaction with a time before any expiry is a no-op.
    assert_eq!(f.store.compact_expired(i64::MIN, 10).unwrap(), 0);
}

/// Backend level: gets and scans see applied ops before any flush, over flushed data
/// (puts shadow, deletes hide), page by page, in every keyspace.
fn reads_see_unflushed_writes(kind: StoreBackend) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_backend(kind, dir.path(), CacheSize::default()).unwrap();
    let put = |t: Tree, k: &str, v: &str| Op::Put(t, k.as_bytes().to_vec(), v.as_bytes().to_vec());
    let del = |t: Tree, k: &str| Op::Delete(t, k.as_bytes().to_vec());
    b.apply(vec![put(Tree::Records, "a", "1"), put(Tree::Records, "c", "1"), put(Tree::Records, "e", "1")]).unwrap();
    b.apply(vec![put(Tree::Expiry, "c", ""), put(Tree::Meta, "m", "1")]).unwrap();
    b.flush().unwrap();
    b.apply(vec![put(Tree::Records, "b", "2"), del(Tree::Records, "c"), put(Tree::Records, "e", "2")]).unwrap();
    b.apply(vec![put(Tree::Records, "f", "2"), del(Tree::Records, "zz"), del(Tree::Expiry, "c")]).unwrap();
    let kv = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
    let all = vec![kv("a", "1"), kv("b", "2"), kv("e", "2"), kv("f", "2")];
    assert_eq!(b.scan(Tree::Records, b"", None, 100).unwrap(), all);
    assert_eq!(b.scan(Tree::Records, b"", None, 2).unwrap(), all[..2].to_vec());
    assert_eq!(b.scan(Tree::Records, b"b\0", None, 2).unwrap(), all[2..].to_vec());
    assert_eq!(b.scan(Tree::Records, b"b", Some(b"f"), 100).unwrap(), all[1..3].to_vec());
    assert_eq!(b.scan(Tree::Expiry, b"", None, 100).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Meta, b"", None, 100).unwrap(), vec![kv("m", "1")]);
    assert_eq!(b.get(Tree::Records, b"c").unwrap(), None);
    assert_eq!(b.get(Tree::Records, b"e").unwrap(), Some(b"2".to_vec()));
    assert_eq!(b.get(Tree::Records, b"b").unwrap(), Some(b"2".to_vec()));
    // The same after the flush, and after a reopen.
    b.flush().unwrap();
    assert_eq!(b.scan(Tree::Records, b"", None, 100).unwrap(), all);
    drop(b);
    let b = open_backend(kind, dir.path(), CacheSize::default()).unwrap();
    assert_eq!(b.scan(Tree::Records, b"", None, 100).unwrap(), all);
    assert_eq!(b.scan(Tree::Expiry, b"", None, 100).unwrap(), vec![]);
}

/// Dropping the store without a flush (clean shutdown, `sync = "none"`) keeps what was
/// applied.
fn clean_drop_keeps_unflushed_writes(kind: StoreBackend) {
    let f = Fixture::with_sync(kind, SyncMode::None);
    let p = f.store.claim("k", None, in_progress(1, 1)).unwrap().unwrap();
    let c = f.store.flush_claims(vec![p]).unwrap().pop().unwrap();
    f.store.complete(c, completed(1, 10)).unwrap();
    f.store.raise_watermarks(&[("t".into(), 0, 5)]).unwrap();
    let f = f.reopen();
    assert_eq!(f.store.get("k").unwrap(), Some(Record::Completed(completed(1, 10))));
    assert_eq!(f.store.watermark("t", 0).unwrap(), Some(5));
    check_invariants(&f.store);
}

// ---------------------------------------------------------------------------------------
// fjall only

/// A crash during fjall's first creation of a database leaves `lock`, an empty
/// `keyspaces/` and `0.jnl` without a `version` marker; the next open must succeed.
#[test]
fn fjall_opens_over_an_unfinished_creation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    std::fs::create_dir_all(path.join("keyspaces")).unwrap();
    std::fs::write(path.join("lock"), b"").unwrap();
    std::fs::write(path.join("0.jnl"), vec![0u8; 4096]).unwrap();
    let store = KeyStore::open(StoreBackend::Fjall, &path, SyncMode::Batch).expect("open over leftovers");
    let _ = durable(&store, "k", 1);
    drop(store);
    // A torn marker (created, header not yet written) counts as unfinished too.
    let path2 = dir.path().join("store2");
    std::fs::create_dir_all(path2.join("keyspaces")).unwrap();
    std::fs::write(path2.join("0.jnl"), b"").unwrap();
    std::fs::write(path2.join("version"), b"FJ").unwrap();
    KeyStore::open(StoreBackend::Fjall, &path2, SyncMode::Batch).expect("open over a torn marker");
    // The real store reopens with its data.
    let store = KeyStore::open(StoreBackend::Fjall, &path, SyncMode::Batch).unwrap();
    assert_eq!(store.get("k").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
}

/// A directory without a fjall marker that holds anything else is left alone.
#[test]
fn fjall_refuses_a_foreign_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conf"), b"someone else's").unwrap();
    std::fs::write(dir.path().join("0.jnl"), b"").unwrap();
    let e = KeyStore::open(StoreBackend::Fjall, dir.path(), SyncMode::Batch).err().expect("must refuse");
    assert!(e.to_string().contains("no fjall database"), "{e}");
    assert!(dir.path().join("conf").exists() && dir.path().join("0.jnl").exists());
    // An empty directory is fine.
    let empty = tempfile::tempdir().unwrap();
    KeyStore::open(StoreBackend::Fjall, empty.path(), SyncMode::Batch).unwrap();
}

/// Index entries stored, as (entry time, number of pairs).
fn raw_entries(store: &KeyStore) -> Vec<(i64, usize)> {
    let entries = store.backend.scan(Tree::Expiry, &[], None, usize::MAX).unwrap();
    entries.iter().map(|(k, v)| (split_expiry_key(k).unwrap().0, decode_index_entry(v).unwrap().len())).collect()
}

fn complete_batch_shares_index_entries(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let keys = ["a", "b", "c", "d", "e"];
    let pendings = keys.iter().map(|k| f.store.claim(k, None, in_progress(1, 1)).unwrap().unwrap()).collect();
    let claims = f.store.flush_claims(pendings).unwrap();
    // a, b, c expire in the same second, d and e in later ones.
    let ats = [10_100, 10_500, 10_999, 11_000, 30_000];
    let items = claims.into_iter().zip(ats).map(|(c, at)| (c, completed(1, at))).collect();
    assert_eq!(f.store.complete_batch(items).unwrap(), 5);
    assert_eq!(raw_entries(&f.store), vec![(10_999, 3), (11_000, 1), (30_000, 1)]);
    assert_eq!(f.store.counts(), counts(0, 5, 0));
    check_invariants(&f.store);

    // Forgetting one key of a shared entry rewrites the entry without it.
    f.store.forget("b").unwrap();
    assert_eq!(raw_entries(&f.store), vec![(10_999, 2), (11_000, 1), (30_000, 1)]);
    check_invariants(&f.store);
    // Re-claiming an expired one takes it out too; the last one out deletes the entry.
    let old = f.store.get("d").unwrap().unwrap();
    let _ = f.store.claim("d", Some(&old), in_progress(2, 1)).unwrap().unwrap();
    assert_eq!(raw_entries(&f.store), vec![(10_999, 2), (30_000, 1)]);
    check_invariants(&f.store);

    // Due at 10_999 (the entry's time): a and c go, whole entry at once; e stays.
    assert_eq!(f.store.next_expiry().unwrap(), Some(10_999));
    assert_eq!(f.store.compact_expired(10_998, 100).unwrap(), 0);
    assert_eq!(f.store.compact_expired(10_999, 1).unwrap(), 2);
    assert_eq!(f.store.get("a").unwrap(), None);
    assert!(f.store.get("e").unwrap().is_some());
    assert_eq!(f.store.counts(), counts(1, 1, 0));
    check_invariants(&f.store);

    // A lost claim in a batch: the others are still completed.
    let p1 = f.store.claim("x", None, in_progress(1, 1)).unwrap().unwrap();
    let p2 = f.store.claim("y", None, in_progress(1, 1)).unwrap().unwrap();
    let mut claims = f.store.flush_claims(vec![p1, p2]).unwrap();
    f.store.forget("x").unwrap();
    let y = claims.pop().unwrap();
    let x = claims.pop().unwrap();
    match f.store.complete_batch(vec![(x, completed(1, 50_000)), (y, completed(1, 50_000))]) {
        Err(StoreError::ClaimLost(k)) => assert_eq!(k, "x"),
        other => panic!("expected ClaimLost, got {other:?}"),
    }
    assert_eq!(f.store.get("y").unwrap(), Some(Record::Completed(completed(1, 50_000))));
    assert_eq!(f.store.get("x").unwrap(), None);
    check_invariants(&f.store);
    let f = f.reopen();
    check_invariants(&f.store);
}

fn old_index_is_rebuilt_at_open(kind: StoreBackend) {
    // What a store of the first format holds: a completed record with a one-key entry
    // whose value is empty, and no format mark.
    assert_rebuilt_at_open(
        kind,
        vec![
            Op::Put(Tree::Expiry, expiry_key(5_000, b"old"), Vec::new()),
            Op::Delete(Tree::Meta, b"index-format".to_vec()),
        ],
    );
}

fn format_2_index_is_rebuilt_at_open(kind: StoreBackend) {
    // Format 2: `[u16 key length][key][i64 big-endian expiry]` pairs, mark "2".
    let mut pairs = Vec::new();
    pairs.extend_from_slice(&3u16.to_be_bytes());
    pairs.extend_from_slice(b"old");
    pairs.extend_from_slice(&5_000i64.to_be_bytes());
    assert_rebuilt_at_open(
        kind,
        vec![
            Op::Put(Tree::Expiry, expiry_key(5_000, b"12345678"), pairs),
            Op::Put(Tree::Meta, b"index-format".to_vec(), b"2".to_vec()),
        ],
    );
}

/// A store holding a completed record "old" (expiring at 5,000) indexed by `old_index`
/// and one written now ("new", 7,000) is re-indexed in the current format at open.
fn assert_rebuilt_at_open(kind: StoreBackend, old_index: Vec<Op>) {
    let f = Fixture::new(kind);
    put_completed(&f.store, "new", 1, 7_000);
    let old = Record::Completed(completed(2, 5_000)).encode();
    let mut ops = vec![Op::Put(Tree::Records, b"old".to_vec(), old)];
    ops.extend(old_index);
    f.store.backend.apply(ops).unwrap();
    f.store.flush().unwrap();
    let f = f.reopen();
    assert_eq!(expiry_entries(&f.store), vec![(5_000, "old".to_string()), (7_000, "new".to_string())]);
    check_invariants(&f.store);
    assert_eq!(f.store.compact_expired(i64::MAX, 10).unwrap(), 2);
    check_invariants(&f.store);
}

fn stamped_claims_never_trust_a_stale_read(kind: StoreBackend) {
    let f = Fixture::new(kind);
    // The losing side's record comes back by value, as `claim_batch` returns it.
    #[allow(clippy::result_large_err)]
    let claim_one = |key: &str, expected: Option<Record>, stamp| {
        let req = ClaimRequest { key: key.into(), expected, stamp, claim: in_progress(1, 1) };
        f.store.claim_batch(vec![req]).unwrap().pop().unwrap()
    };
    // Unchanged since the read: the claim goes through.
    let (seen, stamp) = f.store.get_stamped("a").unwrap();
    assert_eq!(seen, None);
    assert!(claim_one("a", None, stamp).is_ok());

    // The key changed after the read: the stale read is not trusted.
    let (seen, stamp) = f.store.get_stamped("b").unwrap();
    assert_eq!(seen, None);
    let _ = durable(&f.store, "b", 2);
    match claim_one("b", None, stamp) {
        Err(Some(current)) => assert_eq!(current, Record::InProgress(in_progress(2, 1))),
        other => panic!("expected the current record, got {other:?}"),
    }

    // An expired completion read, then compacted away: not trusted either.
    put_completed(&f.store, "c", 1, 5_000);
    let (seen, stamp) = f.store.get_stamped("c").unwrap();
    let seen = seen.expect("completed");
    assert_eq!(f.store.compact_expired(6_000, 100).unwrap(), 1);
    match claim_one("c", Some(seen), stamp) {
        Err(None) => {}
        other => panic!("expected absent, got {other:?}"),
    }
    // Read again, the claim goes through.
    let (seen, stamp) = f.store.get_stamped("c").unwrap();
    assert!(claim_one("c", seen, stamp).is_ok());

    // A claim forgotten and re-claimed by someone else is lost to its first holder, even
    // though the record looks the same (same fingerprint, same attempt).
    let old = durable(&f.store, "d", 1);
    f.store.forget("d").unwrap();
    let newer = durable(&f.store, "d", 1);
    assert!(matches!(f.store.complete(old, completed(1, 50_000)), Err(StoreError::ClaimLost(_))));
    assert_eq!(f.store.get("d").unwrap(), Some(Record::InProgress(in_progress(1, 1))));
    f.store.complete(newer, completed(1, 50_000)).unwrap();
    check_invariants(&f.store);
}

fn claim_batch_mixes_fresh_stale_and_expired(kind: StoreBackend) {
    let f = Fixture::new(kind);
    put_completed(&f.store, "expired", 1, 5_000);
    put_completed(&f.store, "sibling", 1, 5_000); // same index entry span as `expired`
    let read = |k: &str| f.store.get_stamped(k).unwrap();
    let (fresh, s_fresh) = read("fresh");
    let (stale, s_stale) = read("stale");
    let (expired, s_expired) = read("expired");
    // `stale` is claimed by someone else after it was read.
    let _ = durable(&f.store, "stale", 9);
    let req = |key: &str, expected: Option<Record>, stamp| ClaimRequest {
        key: key.into(),
        expected,
        stamp,
        claim: in_progress(1, 1),
    };
    let out = f
        .store
        .claim_batch(vec![
            req("fresh", fresh.clone(), s_fresh),
            req("stale", stale, s_stale),
            req("expired", expired.clone(), s_expired),
            req("fresh", fresh, s_fresh),
        ])
        .unwrap();
    assert!(out[0].is_ok());
    assert_eq!(out[1].as_ref().unwrap_err(), &Some(Record::InProgress(in_progress(9, 1))));
    assert!(out[2].is_ok(), "an expired completion is claimable");
    assert!(out[3].is_err(), "a key twice in one batch");
    let claims: Vec<PendingClaim> = out.into_iter().filter_map(Result::ok).collect();
    let durable = f.store.flush_claims(claims).unwrap();
    assert_eq!(f.store.counts(), counts(3, 1, 0));
    check_invariants(&f.store);
    // The claims are current: they complete.
    let items = durable.into_iter().map(|d| (d, completed(1, 60_000))).collect();
    assert_eq!(f.store.complete_batch(items).unwrap(), 2);
    assert_eq!(f.store.counts(), counts(1, 3, 0));
    check_invariants(&f.store);
    let f = f.reopen();
    check_invariants(&f.store);
}

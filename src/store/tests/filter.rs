//! The presence filter (`store::presence`): a key that holds a record is never taken for
//! absent, whoever wrote it (a claim, an import, a store opened from disk), a fingerprint
//! shared with another key means a real read, and deletes (forget, compaction) take keys
//! out exactly. [`check_presence`] is part of every test's `check_invariants`.

use super::*;
use crate::store::presence::key_hash;
use crate::store::transfer::Imported;

each_backend!(
    keys_present_at_open_are_never_claimed_over,
    imported_keys_are_never_claimed_over,
    forget_and_compaction_take_keys_out,
    a_shared_fingerprint_means_a_real_read,
    a_store_of_many_pages_opens_with_every_key_in_the_filter,
    a_record_whose_header_is_not_one_stops_the_open,
);

/// Every key that holds a record is in its stripe's filter, and the filter counts nothing
/// else (so deletes are accounted for exactly, and the filter stays as small as the store).
/// The filter is of the backend's keys: a claim held by the claim journal is not in it.
pub(super) fn check_presence(store: &KeyStore, records: &BTreeMap<String, Record>) {
    let mut in_backend = 0;
    let mut per_slice = [0u64; Slice::MAX];
    for key in records.keys() {
        let (stripe, fp) = key_hash(key);
        let stripe = store.locks.stripe_at(stripe);
        if stripe.journaled(key).is_some() {
            continue;
        }
        in_backend += 1;
        // In exactly one slice, which the filter names (`slices`, invariant 1).
        let holding: Vec<Slice> = (store.slices.live().into_iter())
            .filter(|&slice| store.backend.get(Tree::Records(slice), key.as_bytes()).unwrap().is_some())
            .collect();
        assert_eq!(holding.len(), 1, "{key:?} is in slices {holding:?}");
        assert!(
            stripe.present.slices(fp).iter().any(|slice| slice == holding[0]),
            "{key:?} holds a record in {:?} but the filter does not name it",
            holding[0]
        );
        per_slice[holding[0].number()] += 1;
    }
    let counted: usize = store.locks.stripes_in_order().map(|s| s.present.len()).sum();
    assert_eq!(counted, in_backend, "the filter counts keys that hold no record");
    for (slice, keys) in store.slice_keys() {
        assert_eq!(keys, per_slice[slice.number()], "the filter's count of {slice:?}'s keys");
    }
}

/// Far in the future: never due.
pub(super) const LATER: i64 = 9_000_000_000_000;

/// Every way of claiming `key` as if it were absent is refused, and the record stays.
pub(super) fn assert_not_claimable_as_absent(store: &KeyStore, key: &str) {
    let stored = store.get(key).unwrap();
    assert!(stored.is_some(), "{key:?} should hold a record");
    let (seen, _) = store.get_stamped(key).unwrap();
    assert_eq!(seen, stored, "the engine's read of {key:?}");
    assert_eq!(store.claim(key, None, in_progress(7, 1)).unwrap().unwrap_err(), stored);
    let new = Record::InProgress(in_progress(7, 1));
    assert_eq!(store.compare_and_swap(key, None, Some(&new)).unwrap().unwrap_err(), stored);
    assert_eq!(store.get(key).unwrap(), stored, "{key:?} unchanged");
}

/// A stamp that `claim_batch` will not trust: a compaction ran after it.
fn stale_stamp(store: &KeyStore, key: &str) -> ReadStamp {
    let (_, stamp) = store.get_stamped(key).unwrap();
    put_completed(store, "short-lived", 9, 5_000);
    assert_eq!(store.compact_expired(6_000, 100).unwrap(), 1);
    stamp
}

fn keys_present_at_open_are_never_claimed_over(kind: StoreBackend) {
    let f = Fixture::new(kind);
    put_completed(&f.store, "done", 1, LATER);
    let _ = durable(&f.store, "claimed", 2);
    put_indeterminate(&f.store, "unsure", 3);
    let f = f.reopen();
    check_invariants(&f.store);
    for key in ["done", "claimed", "unsure"] {
        assert_not_claimable_as_absent(&f.store, key);
        // A batch claim whose read is not trusted reads the key again, under its lock.
        let stored = f.store.get(key).unwrap();
        let stamp = stale_stamp(&f.store, key);
        let req = ClaimRequest { key: key.into(), expected: None, stamp, claim: in_progress(7, 1) };
        assert_eq!(f.store.claim_batch(vec![req]).unwrap().pop().unwrap().unwrap_err(), stored);
        assert_eq!(f.store.get(key).unwrap(), stored);
    }
    check_invariants(&f.store);
}

fn imported_keys_are_never_claimed_over(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let options = ImportOptions { overwrite: false, force: false, now_ms: 0 };
    let done = Record::Completed(completed(4, LATER));
    let unsure = Record::Indeterminate(indeterminate(5));
    assert_eq!(f.store.import_record("imported-done", &done, options).unwrap(), Imported::Written);
    assert_eq!(f.store.import_record("imported-unsure", &unsure, options).unwrap(), Imported::Written);
    check_invariants(&f.store);
    assert_not_claimable_as_absent(&f.store, "imported-done");
    assert_not_claimable_as_absent(&f.store, "imported-unsure");
    assert_eq!(f.store.get("imported-done").unwrap(), Some(done));
    check_invariants(&f.store);
}

fn forget_and_compaction_take_keys_out(kind: StoreBackend) {
    let f = Fixture::new(kind);
    put_completed(&f.store, "a", 1, 5_000);
    put_completed(&f.store, "b", 1, 5_000);
    let _ = durable(&f.store, "c", 2);
    put_completed(&f.store, "kept", 3, LATER);
    check_invariants(&f.store);

    f.store.forget("c").unwrap();
    check_invariants(&f.store);
    assert_eq!(f.store.compact_expired(6_000, 100).unwrap(), 2);
    check_invariants(&f.store);
    assert_eq!(all_records(&f.store).len(), 1);

    // Absent again: claimed without a read, and back in the filter.
    let mut requests = Vec::new();
    for key in ["a", "b", "c"] {
        let (seen, stamp) = f.store.get_stamped(key).unwrap();
        assert_eq!(seen, None);
        requests.push(ClaimRequest { key: key.into(), expected: None, stamp, claim: in_progress(4, 1) });
    }
    let pending: Vec<PendingClaim> = f.store.claim_batch(requests).unwrap().into_iter().map(Result::unwrap).collect();
    let _ = f.store.flush_claims(pending).unwrap();
    check_invariants(&f.store);
    for key in ["a", "b", "c", "kept"] {
        assert_not_claimable_as_absent(&f.store, key);
    }
    let f = f.reopen();
    check_invariants(&f.store);
}

fn a_shared_fingerprint_means_a_real_read(kind: StoreBackend) {
    // Two keys of the same stripe with the same fingerprint (found by a birthday search
    // over "key-N"): the filter cannot tell them apart.
    let (one, two) = ("key-603870", "key-2445306");
    assert_eq!(key_hash(one), key_hash(two), "key_hash changed: find a new pair");
    let f = Fixture::new(kind);
    put_completed(&f.store, one, 1, LATER);
    // `two` is found in the filter but is absent: the real read says so, the claim goes on.
    let (seen, stamp) = f.store.get_stamped(two).unwrap();
    assert_eq!(seen, None);
    let req = ClaimRequest { key: two.into(), expected: None, stamp, claim: in_progress(2, 1) };
    let pending = f.store.claim_batch(vec![req]).unwrap().pop().unwrap().expect("absent");
    let _ = f.store.flush_claims(vec![pending]).unwrap();
    check_invariants(&f.store);
    // Deleting one leaves the other in the filter.
    f.store.forget(one).unwrap();
    check_invariants(&f.store);
    assert_not_claimable_as_absent(&f.store, two);
    let f = f.reopen();
    check_invariants(&f.store);
    assert_not_claimable_as_absent(&f.store, two);
    f.store.forget(two).unwrap();
    check_invariants(&f.store);
}

/// Records a previous process left: `n` keys, in_progress and indeterminate in turn, written
/// straight to the backend (no expiry entries are needed for these states).
fn leave_records(store: &KeyStore, n: usize) {
    let ops = (0..n)
        .map(|i| {
            let record = if i % 2 == 0 {
                Record::InProgress(in_progress(1, 1))
            } else {
                Record::Indeterminate(indeterminate(2))
            };
            Op::Put(Tree::Records(Slice::FIRST), format!("left-{i:06}").into_bytes(), record.encode())
        })
        .collect();
    store.backend.apply(ops).unwrap();
    store.backend.flush().unwrap();
}

/// The open reads the backend in one pass (sled in pages of 10,000, fjall lending its
/// entries) and adds fingerprints a buffer per stripe at a time: over several pages and many
/// full buffers, every key is in the filter and the counts are exact.
fn a_store_of_many_pages_opens_with_every_key_in_the_filter(kind: StoreBackend) {
    let f = Fixture::new(kind);
    leave_records(&f.store, 25_001);
    put_completed(&f.store, "done", 3, LATER);
    let f = f.reopen();
    assert_eq!(f.store.counts(), counts(12_501, 1, 12_500));
    check_invariants(&f.store);
    for key in ["left-000000", "left-012345", "left-025000", "done"] {
        assert_not_claimable_as_absent(&f.store, key);
    }
}

/// A value whose header is not a record's stops the open, naming its key, as a record that
/// does not decode always did: counting it as some state would be a guess.
fn a_record_whose_header_is_not_one_stops_the_open(kind: StoreBackend) {
    let f = Fixture::new(kind);
    leave_records(&f.store, 10);
    f.store.backend.apply(vec![Op::Put(Tree::Records(Slice::FIRST), b"broken".to_vec(), vec![9, 2, 0])]).unwrap();
    f.store.backend.flush().unwrap();
    let Fixture { dir, kind, store } = f;
    drop(store);
    match KeyStore::open(kind, dir.path(), SyncMode::Batch) {
        Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "broken"),
        Err(other) => panic!("expected the broken record named, got {other}"),
        Ok(_) => panic!("a store with a record that is not one opened"),
    }
}

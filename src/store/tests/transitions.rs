//! Record transitions past a claim: completion (with its expiry entry), completion of a
//! claim that was forgotten, indeterminate records (no expiry), forget of any state, and the
//! live counts following every transition.

use super::*;

each_backend!(
    complete_writes_expiry_entry,
    complete_after_forget_is_claim_lost,
    indeterminate_has_no_expiry,
    forget_removes_any_state,
    counts_follow_transitions,
);

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

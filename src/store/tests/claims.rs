//! Claims: of an absent key, lost to a current record (returned to the loser), racing for
//! one key, re-claims of expired completions and of orphans, and batches of stamped claims
//! that never trust a read the key has moved on from.

use std::sync::Barrier;

use super::*;

each_backend!(
    claim_of_absent_key,
    claim_cas_failure_returns_current,
    racing_claims_one_winner,
    reclaim_of_expired_completed,
    orphan_reclaim_bumps_attempts,
    stamped_claims_never_trust_a_stale_read,
    claim_batch_mixes_fresh_stale_and_expired,
    a_claim_over_an_indeterminate_record_takes_its_key_out_of_doubt,
    a_claim_that_keeps_its_command_stays_in_doubt_until_it_completes,
);

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

/// The engine never claims an `indeterminate` key (the decision table reports it), but the
/// store does not rely on that: a claim replacing one takes its key out of its sink's.
fn a_claim_over_an_indeterminate_record_takes_its_key_out_of_doubt(kind: StoreBackend) {
    let f = Fixture::new(kind);
    put_in_doubt(&f.store, "k", 1, Some("pay"));
    put_in_doubt(&f.store, "other", 1, Some("pay"));
    let current = f.store.get("k").unwrap();
    let pending = f.store.claim("k", current.as_ref(), in_progress(1, 2)).unwrap().expect("claimable");
    f.store.flush_claims(vec![pending]).unwrap();
    assert_eq!(f.store.indeterminate_keys("pay"), vec!["other".to_string()]);
    assert_eq!(f.store.counts(), counts(1, 0, 1));
    check_invariants(&f.store);
}

/// The reconciler's run of a key in doubt claims it keeping its command: the key stays in
/// its sink's keys in doubt while the claim is out (also as a reopen's scan or saved filter
/// finds it, a crash having left it) and leaves them when the claim completes.
fn a_claim_that_keeps_its_command_stays_in_doubt_until_it_completes(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let mut durable = Vec::new();
    for key in ["done", "left"] {
        put_in_doubt(&f.store, key, 1, Some("pay"));
        let Some(Record::Indeterminate(ind)) = f.store.get(key).unwrap() else { panic!("{key} is in doubt") };
        let claim = InProgress { held: ind.held.clone(), ..in_progress(1, 2) };
        let pending = f.store.claim(key, Some(&Record::Indeterminate(ind)), claim).unwrap().expect("claimable");
        durable.extend(f.store.flush_claims(vec![pending]).unwrap());
    }
    assert_eq!(f.store.indeterminate_keys("pay"), ["done", "left"], "in doubt while their runs are out");
    assert_eq!(f.store.counts(), counts(2, 0, 0));
    check_invariants(&f.store);
    let done = durable.into_iter().find(|d| d.key() == "done").expect("claimed");
    f.store.complete_batch(vec![(done, completed(1, 60_000))]).unwrap();
    assert_eq!(f.store.indeterminate_keys("pay"), ["left"], "a completion takes its key out");
    check_invariants(&f.store);
    let f = f.reopen();
    assert_eq!(f.store.indeterminate_keys("pay"), ["left"], "a claim left in progress is still in doubt");
    let Some(Record::InProgress(left)) = f.store.get("left").unwrap() else { panic!("left is claimed") };
    assert_eq!(left.held.map(|h| h.sink), Some("pay".to_string()), "it keeps its command");
    check_invariants(&f.store);
}

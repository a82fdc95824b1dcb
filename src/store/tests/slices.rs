//! Slices of the records (`slices`): new keys go to the current slice, a slice turns after
//! [`SLICE_SPAN_MS`], a replaced record moves to the current slice, and a slice whose keys
//! have all gone is dropped; all of it survives a reopen, by scan and by saved filter.

use super::filter::LATER;
use super::*;

each_backend!(
    keys_go_to_the_current_slice_and_empty_slices_are_dropped,
    a_replaced_record_moves_to_the_current_slice,
    slices_survive_a_reopen,
    a_slice_with_an_unfinished_record_stays,
    pages_over_several_slices_hold_every_key_once
);

/// The slice holding `key` in the backend, read there.
fn slice_of(store: &KeyStore, key: &str) -> Option<Slice> {
    let holding: Vec<Slice> = (store.slices.live().into_iter())
        .filter(|&slice| store.backend.get(Tree::Records(slice), key.as_bytes()).unwrap().is_some())
        .collect();
    assert!(holding.len() <= 1, "{key:?} is in slices {holding:?}");
    holding.first().copied()
}

/// Whether the backend keeps slices apart (fjall) or holds one (sled).
fn sliced(kind: StoreBackend) -> bool {
    kind == StoreBackend::Fjall
}

fn keys_go_to_the_current_slice_and_empty_slices_are_dropped(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let first = f.store.current_slice();
    put_completed(&f.store, "early", 1, 100);
    put_completed(&f.store, "kept", 2, LATER);
    assert_eq!(slice_of(&f.store, "early"), Some(first));
    // Not yet a span since the first slice opened (at 0 for a new store: "long ago").
    let turned = f.store.turn_slices(SLICE_SPAN_MS).unwrap();
    if !sliced(kind) {
        assert_eq!(turned, SlicesTurned::default());
        assert_eq!(f.store.backend.slices().len(), 1);
        return;
    }
    let second = turned.opened.expect("a new slice a span after the first");
    assert_eq!(turned.dropped, vec![], "the first slice holds keys");
    assert_eq!(f.store.current_slice(), second);
    put_completed(&f.store, "late", 3, LATER);
    assert_eq!(slice_of(&f.store, "late"), Some(second));
    assert_eq!(f.store.get("early").unwrap().map(|r| r.state()), Some(State::Completed), "read from its slice");
    check_invariants(&f.store);
    // Less than a span later: nothing turns.
    assert_eq!(f.store.turn_slices(SLICE_SPAN_MS * 2 - 1).unwrap(), SlicesTurned::default());
    // "early" expires; "kept" still holds the first slice.
    assert_eq!(f.store.compact_expired(SLICE_SPAN_MS * 2 - 1, 10).unwrap(), 1);
    assert_eq!(f.store.slice_keys(), vec![(first, 1), (second, 1)]);
    f.store.forget("kept").unwrap();
    let turned = f.store.turn_slices(SLICE_SPAN_MS * 2).unwrap();
    assert_eq!(turned.dropped, vec![first], "emptied");
    // The second slice is a span old; the dropped slice's number is free again.
    assert_eq!(turned.opened, Some(first), "a new, empty slice numbered as the dropped one");
    assert_eq!(f.store.backend.slices(), vec![(first, SLICE_SPAN_MS * 2), (second, SLICE_SPAN_MS)]);
    assert_eq!(slice_of(&f.store, "kept"), None);
    assert_eq!(f.store.get("late").unwrap().map(|r| r.state()), Some(State::Completed));
    put_completed(&f.store, "latest", 4, LATER);
    assert_eq!(slice_of(&f.store, "latest"), Some(first));
    check_invariants(&f.store);
    // The reopened store holds the same slices and takes new keys in the newest.
    let f = f.reopen();
    assert_eq!(f.store.backend.slices(), vec![(first, SLICE_SPAN_MS * 2), (second, SLICE_SPAN_MS)]);
    assert_eq!(f.store.current_slice(), first);
    assert_eq!(f.store.get("latest").unwrap().map(|r| r.state()), Some(State::Completed));
    assert_eq!(f.store.get("kept").unwrap(), None);
    check_invariants(&f.store);
}

fn a_replaced_record_moves_to_the_current_slice(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let first = f.store.current_slice();
    put_completed(&f.store, "again", 1, 100);
    put_indeterminate(&f.store, "unsure", 2);
    let second = f.store.turn_slices(SLICE_SPAN_MS).unwrap().opened;
    // The expired completion is replaced by a new claim: compare-and-swap writes it in
    // the current slice and deletes it from the first in the same write.
    let expired = f.store.get("again").unwrap();
    let claim = Record::InProgress(in_progress(3, 1));
    f.store.compare_and_swap("again", expired.as_ref(), Some(&claim)).unwrap().expect("replaces the expired one");
    let resolved = Record::Completed(completed(2, LATER));
    let unsure = f.store.get("unsure").unwrap();
    f.store.compare_and_swap("unsure", unsure.as_ref(), Some(&resolved)).unwrap().expect("resolved");
    let now = second.unwrap_or(first);
    assert_eq!(slice_of(&f.store, "again"), Some(now));
    assert_eq!(slice_of(&f.store, "unsure"), Some(now));
    assert_eq!(f.store.get("again").unwrap(), Some(claim));
    check_invariants(&f.store);
    if sliced(kind) {
        assert_eq!(f.store.turn_slices(SLICE_SPAN_MS + 1).unwrap().dropped, vec![first], "both keys left it");
    }
    check_invariants(&f.store);
}

fn slices_survive_a_reopen(kind: StoreBackend) {
    let f = Fixture::new(kind);
    for i in 0..50 {
        put_completed(&f.store, &format!("old-{i}"), 1, LATER);
    }
    let second = f.store.turn_slices(SLICE_SPAN_MS).unwrap().opened;
    for i in 0..50 {
        put_completed(&f.store, &format!("new-{i}"), 2, LATER);
    }
    let f = f.reopen();
    assert!(!f.store.opened_from_saved_filter());
    assert_eq!(f.store.current_slice(), second.unwrap_or(Slice::FIRST), "the newest slice takes new keys");
    check_invariants(&f.store);
    assert_eq!(f.store.slice_keys().iter().map(|s| s.1).sum::<u64>(), 100);
    if f.store.save_presence().unwrap() {
        let f = f.reopen();
        assert!(f.store.opened_from_saved_filter());
        check_invariants(&f.store);
        assert_eq!(f.store.get("old-7").unwrap().map(|r| r.state()), Some(State::Completed));
        assert_eq!(f.store.get("new-7").unwrap().map(|r| r.state()), Some(State::Completed));
    }
}

/// An `in_progress` record never expires: its slice is not dropped, and its completion is
/// written where it is.
fn a_slice_with_an_unfinished_record_stays(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let first = f.store.current_slice();
    // Left by a crash: the claim journal's recovery writes it to the backend.
    let claim = durable(&f.store, "unfinished", 1);
    let f = f.reopen();
    assert_eq!(slice_of(&f.store, "unfinished"), Some(first));
    let turned = f.store.turn_slices(SLICE_SPAN_MS).unwrap();
    let turned = f.store.turn_slices(SLICE_SPAN_MS * 2).unwrap().dropped.into_iter().chain(turned.dropped);
    assert!(turned.into_iter().all(|dropped| dropped != first), "the first slice holds a record");
    let record = f.store.get("unfinished").unwrap().expect("still there");
    assert_eq!(record, Record::InProgress(claim.record().clone()));
    let pending = f.store.claim("unfinished", Some(&record), in_progress(2, 2)).unwrap().expect("claimed again");
    let durable = f.store.flush_claims(vec![pending]).unwrap().pop().unwrap();
    f.store.complete(durable, completed(2, LATER)).unwrap();
    assert_eq!(slice_of(&f.store, "unfinished"), Some(first), "completed in its slice");
    check_invariants(&f.store);
}

/// `scan_records` reads each slice for its share of a page: whatever the page size, the
/// pages hold every record once, in key order, a claim the journal holds among them.
fn pages_over_several_slices_hold_every_key_once(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let mut want = Vec::new();
    for hour in 1..=3 {
        // Keys of every slice interleave in key order: k-00-1, k-00-2, k-00-3, k-01-1, …
        for i in 0..12 {
            let key = format!("k-{i:02}-{hour}");
            put_completed(&f.store, &key, 1, LATER);
            want.push(key);
        }
        f.store.turn_slices(SLICE_SPAN_MS * hour).unwrap();
    }
    // Only a few keys in one slice, and a claim held by the journal.
    put_completed(&f.store, "k-05-9", 2, LATER);
    let _claim = durable(&f.store, "k-07-9", 3);
    want.extend(["k-05-9".to_string(), "k-07-9".to_string()]);
    want.sort();
    for limit in [1, 2, 3, 5, 7, 40] {
        let mut got = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = f.store.scan_records(after.as_deref(), limit).unwrap();
            assert!(page.len() <= limit, "a page of {limit} holds {}", page.len());
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            got.extend(page.into_iter().map(|(key, _)| key));
        }
        assert_eq!(got, want, "pages of {limit}");
    }
}

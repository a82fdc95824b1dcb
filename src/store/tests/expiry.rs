//! The expiry index and compaction: only expired completions go, chunk by chunk in expiry
//! order; completions in one batch share index entries; an index of an older format is
//! rebuilt at open.

use super::*;

each_backend!(
    compaction_removes_only_expired_completed,
    compaction_chunks_and_next_expiry,
    complete_batch_shares_index_entries,
    old_index_is_rebuilt_at_open,
    format_2_index_is_rebuilt_at_open,
);

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
    let mut ops = vec![Op::Put(Tree::Records(Slice::FIRST), b"old".to_vec(), old)];
    ops.extend(old_index);
    f.store.backend.apply(ops).unwrap();
    f.store.flush().unwrap();
    let f = f.reopen();
    assert_eq!(expiry_entries(&f.store), vec![(5_000, "old".to_string()), (7_000, "new".to_string())]);
    check_invariants(&f.store);
    assert_eq!(f.store.compact_expired(i64::MAX, 10).unwrap(), 2);
    check_invariants(&f.store);
}

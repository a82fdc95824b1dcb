//! The presence filter saved at a clean stop (`store::scan::saved`): the next open reads it
//! back only while the store holds exactly what it was taken from, and otherwise scans;
//! either way every key that holds a record is in the filter and the counts are exact
//! (`check_invariants`).

use super::filter::assert_not_claimable_as_absent;
use super::*;
use crate::store::presence::{entry, key_hash};

each_backend!(
    a_clean_stop_saves_what_the_next_open_reads_back,
    a_write_after_the_save_makes_the_open_scan,
    a_claim_a_crash_left_makes_the_open_scan,
    a_damaged_saved_filter_is_never_used,
    another_stores_saved_filter_is_never_used,
);

/// Far in the future: never due.
const LATER: i64 = 9_000_000_000_000;

/// Fifty completed keys named after `prefix`: two stores filled alike make the same writes
/// in the same order, so they reach the same write sequence number.
fn fill_named(store: &KeyStore, prefix: &str) {
    for i in 0..50 {
        put_completed(store, &format!("{prefix}-{i}"), 1, LATER);
    }
}

/// Keys of every kind a filter holds: completed, indeterminate, two sharing a fingerprint,
/// and forgotten ones (out of the filter again). Returns the keys that hold a record.
fn fill(store: &KeyStore) -> Vec<String> {
    let mut present = Vec::new();
    for i in 0..300 {
        let key = format!("done-{i}");
        put_completed(store, &key, 1, LATER + i);
        present.push(key);
    }
    for i in 0..20 {
        let key = format!("unsure-{i}");
        // Some keep their command (per sink), some do not (written before records kept it).
        let sink = [None, Some("pay"), Some("mail")][i % 3];
        put_in_doubt(store, &key, 2, sink);
        present.push(key);
    }
    // The pair of `filter::a_shared_fingerprint_means_a_real_read`: counted twice.
    let (one, two) = ("key-603870", "key-2445306");
    assert_eq!(key_hash(one), key_hash(two), "key_hash changed: find a new pair");
    for key in [one, two] {
        put_completed(store, key, 3, LATER);
        present.push(key.to_string());
    }
    for i in 0..10 {
        let key = format!("forgotten-{i}");
        put_completed(store, &key, 4, LATER);
        store.forget(&key).unwrap();
    }
    present
}

fn saved_file(f: &Fixture) -> std::path::PathBuf {
    f.dir.path().join(crate::store::scan::SAVED_FILTER_FILE)
}

/// Whether this backend can save the filter (it keeps a write sequence number).
fn saves(kind: StoreBackend) -> bool {
    kind == StoreBackend::Fjall
}

fn a_clean_stop_saves_what_the_next_open_reads_back(kind: StoreBackend) {
    let f = Fixture::new(kind);
    let present = fill(&f.store);
    let counts_before = f.store.counts();
    assert_eq!(f.store.save_presence().unwrap(), saves(kind));
    assert_eq!(saved_file(&f).exists(), saves(kind));
    let f = f.reopen();
    assert_eq!(f.store.opened_from_saved_filter(), saves(kind));
    assert_eq!(f.store.counts(), counts_before);
    // Exactly the present keys, each counted once: as a scan would have filled it.
    check_invariants(&f.store);
    for key in &present {
        assert_not_claimable_as_absent(&f.store, key);
    }
    assert_eq!(f.store.get("forgotten-3").unwrap(), None);
    assert_eq!(f.store.get("never-written").unwrap(), None);
    // Reads alone leave the store as it was saved: the next open reads it back again.
    let f = f.reopen();
    assert_eq!(f.store.opened_from_saved_filter(), saves(kind));
    check_invariants(&f.store);
}

fn a_write_after_the_save_makes_the_open_scan(kind: StoreBackend) {
    let f = Fixture::new(kind);
    fill(&f.store);
    f.store.save_presence().unwrap();
    put_completed(&f.store, "after-the-save", 5, LATER);
    f.store.forget("done-7").unwrap();
    let f = f.reopen();
    assert!(!f.store.opened_from_saved_filter());
    assert!(!saved_file(&f).exists(), "a stale saved filter is removed");
    check_invariants(&f.store);
    assert_not_claimable_as_absent(&f.store, "after-the-save");
    assert_eq!(f.store.get("done-7").unwrap(), None);
}

fn a_claim_a_crash_left_makes_the_open_scan(kind: StoreBackend) {
    let f = Fixture::new(kind);
    fill(&f.store);
    f.store.save_presence().unwrap();
    // Durable in the claim journal only, as a crash before its completion leaves it: the
    // backend is untouched until the open's recovery writes it there.
    let claim = durable(&f.store, "left-by-a-crash", 6);
    let f = f.reopen();
    assert!(!f.store.opened_from_saved_filter());
    check_invariants(&f.store);
    assert_eq!(f.store.get("left-by-a-crash").unwrap(), Some(Record::InProgress(claim.record().clone())));
    assert_not_claimable_as_absent(&f.store, "left-by-a-crash");
}

/// A change made to the saved file's bytes.
type Damage = dyn Fn(&mut Vec<u8>);

fn a_damaged_saved_filter_is_never_used(kind: StoreBackend) {
    let mut f = Fixture::new(kind);
    let present = fill(&f.store);
    // Each damage in turn, on a file saved afresh: one bit of a present key's entry
    // flipped (only the checksum tells: the stripe still reads as a filter, without that
    // key), the end cut off, bytes added after the checksum, another file altogether.
    let fingerprint = entry(key_hash("done-0").1, f.store.current_slice()).to_le_bytes();
    let flip_fingerprint = move |bytes: &mut Vec<u8>| {
        let header = 16 + 16 + 4 + 8 + 3 * 8;
        let at = bytes[header..].windows(4).position(|w| w == fingerprint).expect("the key's fingerprint is saved");
        bytes[header + at + 3] ^= 0x40;
    };
    let damages: [Box<Damage>; 4] = [
        Box::new(flip_fingerprint),
        Box::new(|bytes| bytes.truncate(bytes.len() - 9)),
        Box::new(|bytes| bytes.extend_from_slice(b"more")),
        Box::new(|bytes| *bytes = b"not a saved filter at all".to_vec()),
    ];
    for damage in damages {
        if !f.store.save_presence().unwrap() {
            return; // nothing saved on this backend: covered by the tests above
        }
        let mut bytes = std::fs::read(saved_file(&f)).unwrap();
        damage(&mut bytes);
        std::fs::write(saved_file(&f), &bytes).unwrap();
        f = f.reopen();
        assert!(!f.store.opened_from_saved_filter());
        check_invariants(&f.store);
        for key in &present {
            assert_not_claimable_as_absent(&f.store, key);
        }
    }
}

fn another_stores_saved_filter_is_never_used(kind: StoreBackend) {
    let (a, b) = (Fixture::new(kind), Fixture::new(kind));
    fill_named(&a.store, "a");
    fill_named(&b.store, "b");
    if !a.store.save_presence().unwrap() {
        return; // nothing saved on this backend
    }
    assert!(b.store.save_presence().unwrap());
    // The same number of writes: only the save's id tells the two files apart.
    assert_eq!(a.store.backend.write_seqno(), b.store.backend.write_seqno());
    std::fs::copy(saved_file(&a), saved_file(&b)).unwrap();
    let b = b.reopen();
    assert!(!b.store.opened_from_saved_filter());
    check_invariants(&b.store);
    assert_not_claimable_as_absent(&b.store, "b-7");
}

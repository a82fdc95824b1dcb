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
    the_keys_in_doubt_per_sink_are_saved_and_scanned_alike,
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
    let damages: [Box<Damage>; 5] = [
        Box::new(flip_fingerprint),
        // A file of the last format (counts per sink, not keys): not read.
        Box::new(|bytes| bytes[..16].copy_from_slice(b"dedupd-presence3")),
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

/// The keys each sink's `indeterminate_keys` lists, in order: `""`, `mail`, `pay`.
fn keys_in_doubt(store: &KeyStore) -> [Vec<String>; 3] {
    ["", "mail", "pay"].map(|sink| store.indeterminate_keys(sink))
}

fn strings(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// What the reconciler of indeterminate keys reads: each sink's keys, the same after an
/// open that reads the saved filter, one that scans, a settle and a forget.
fn the_keys_in_doubt_per_sink_are_saved_and_scanned_alike(kind: StoreBackend) {
    let f = Fixture::new(kind);
    fill_named(&f.store, "done");
    for (key, sink) in [("pay-2", "pay"), ("mail-1", "mail"), ("pay-1", "pay"), ("mail-2", "mail"), ("pay-3", "pay")] {
        put_in_doubt(&f.store, key, 2, Some(sink));
    }
    put_in_doubt(&f.store, "unkept", 2, None);
    let want = [strings(&["unkept"]), strings(&["mail-1", "mail-2"]), strings(&["pay-1", "pay-2", "pay-3"])];
    assert_eq!(keys_in_doubt(&f.store), want);
    assert!(f.store.indeterminate_keys("other").is_empty());
    assert_eq!(f.store.save_presence().unwrap(), saves(kind));
    let f = f.reopen();
    assert_eq!(f.store.opened_from_saved_filter(), saves(kind));
    assert_eq!(keys_in_doubt(&f.store), want, "read back with the saved filter");
    check_invariants(&f.store);
    let _ = std::fs::remove_file(saved_file(&f));
    let f = f.reopen();
    assert!(!f.store.opened_from_saved_filter());
    assert_eq!(keys_in_doubt(&f.store), want, "found by the open's scan");
    // One settled, the mail sink's two forgotten: it stays listed, with no key.
    let Some(Record::Indeterminate(was)) = f.store.get("pay-2").unwrap() else { panic!("pay-2 is in doubt") };
    let settled = Settlement::found(&serde_json::json!({}));
    assert!(f.store.settle("pay-2", &was, settled, 5_000, 60_000).unwrap().is_some());
    f.store.forget("mail-1").unwrap();
    f.store.forget("mail-2").unwrap();
    let want = [strings(&["unkept"]), Vec::new(), strings(&["pay-1", "pay-3"])];
    assert_eq!(keys_in_doubt(&f.store), want);
    let by_sink = |mail: Option<i64>| {
        let mut counts = BTreeMap::from([(String::new(), 1), ("pay".to_string(), 2)]);
        counts.extend(mail.map(|n| ("mail".to_string(), n)));
        counts
    };
    assert_eq!(f.store.indeterminate_by_sink(), by_sink(Some(0)));
    // Saved as they are, the empty sink too; a scan finds no key of that sink.
    assert_eq!(f.store.save_presence().unwrap(), saves(kind));
    let f = f.reopen();
    assert_eq!(keys_in_doubt(&f.store), want);
    assert_eq!(f.store.indeterminate_by_sink(), by_sink(saves(kind).then_some(0)));
    check_invariants(&f.store);
}

//! What the backends keep and read back: watermarks, data across a reopen, with `sync =
//! "none"` and after a clean drop; scans (paged, empty, reversed, over unflushed writes); and
//! fjall's checks of its directory at open.

use super::*;

each_backend!(
    watermarks_never_lower,
    reopen_keeps_flushed_data,
    scan_records_pages,
    sync_none_still_works,
    empty_and_reversed_scans,
    reads_see_unflushed_writes,
    clean_drop_keeps_unflushed_writes,
);

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
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"c", Some(b"a"), 10).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"b", Some(b"b"), 10).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"a", None, 0).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"a", Some(b"c"), 10).unwrap().len(), 1);
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
    b.apply(vec![
        put(Tree::Records(Slice::FIRST), "a", "1"),
        put(Tree::Records(Slice::FIRST), "c", "1"),
        put(Tree::Records(Slice::FIRST), "e", "1"),
    ])
    .unwrap();
    b.apply(vec![put(Tree::Expiry, "c", ""), put(Tree::Meta, "m", "1")]).unwrap();
    b.flush().unwrap();
    b.apply(vec![
        put(Tree::Records(Slice::FIRST), "b", "2"),
        del(Tree::Records(Slice::FIRST), "c"),
        put(Tree::Records(Slice::FIRST), "e", "2"),
    ])
    .unwrap();
    b.apply(vec![
        put(Tree::Records(Slice::FIRST), "f", "2"),
        del(Tree::Records(Slice::FIRST), "zz"),
        del(Tree::Expiry, "c"),
    ])
    .unwrap();
    let kv = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
    let all = vec![kv("a", "1"), kv("b", "2"), kv("e", "2"), kv("f", "2")];
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"", None, 100).unwrap(), all);
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"", None, 2).unwrap(), all[..2].to_vec());
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"b\0", None, 2).unwrap(), all[2..].to_vec());
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"b", Some(b"f"), 100).unwrap(), all[1..3].to_vec());
    assert_eq!(b.scan(Tree::Expiry, b"", None, 100).unwrap(), vec![]);
    assert_eq!(b.scan(Tree::Meta, b"", None, 100).unwrap(), vec![kv("m", "1")]);
    assert_eq!(b.get(Tree::Records(Slice::FIRST), b"c").unwrap(), None);
    assert_eq!(b.get(Tree::Records(Slice::FIRST), b"e").unwrap(), Some(b"2".to_vec()));
    assert_eq!(b.get(Tree::Records(Slice::FIRST), b"b").unwrap(), Some(b"2".to_vec()));
    // The same after the flush, and after a reopen.
    b.flush().unwrap();
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"", None, 100).unwrap(), all);
    drop(b);
    let b = open_backend(kind, dir.path(), CacheSize::default()).unwrap();
    assert_eq!(b.scan(Tree::Records(Slice::FIRST), b"", None, 100).unwrap(), all);
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

//! Store tests, run against every registered backend: each test is a function of the
//! backend kind, and [`each_backend!`] instantiates it once per backend as
//! `store::tests::<topic>::<backend module>::NAME` (e.g.
//! `store::tests::claims::fjall_backend::NAME`). The topics are the child modules below;
//! the fixture and helpers they share are here.

use std::collections::BTreeMap;

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

mod backends;
mod claims;
mod completing;
mod expiry;
mod filter;
mod journal;
mod lock;
mod saved;
mod slices;
mod transitions;

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

/// A changelog `log` of two partitions: keys `p1-…` on partition 1, the others on 0.
pub(super) fn two_partitions() -> super::CacheOf {
    super::CacheOf {
        topic: "log".into(),
        partitions: 2,
        partition_of: Box::new(|key| i32::from(key.starts_with("p1-"))),
    }
}

pub(super) fn in_progress(b: u8, attempts: u32) -> InProgress {
    InProgress {
        fingerprint: fp(b),
        claimed_at_ms: 1_000,
        attempts,
        source: SourcePos { topic: "commands".into(), partition: 1, offset: 42 },
        held: None,
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
        settled: None,
    }
}

pub(super) fn indeterminate(b: u8) -> Indeterminate {
    Indeterminate { fingerprint: fp(b), claimed_at_ms: 1_000, attempts: 1, why: "crashed mid-call".into(), held: None }
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
    put_in_doubt(store, key, b, None);
}

/// An `indeterminate` record at `key` (claimed first, as the engine does), keeping its
/// command when a `sink` is named.
fn put_in_doubt(store: &KeyStore, key: &str, b: u8, sink: Option<&str>) {
    let claim = durable(store, key, b);
    let expected = Record::InProgress(claim.record().clone());
    let held = sink.map(|sink| {
        Box::new(super::Held {
            sink: sink.into(),
            route: "r".into(),
            kind: "t".into(),
            payload: b"{}".to_vec(),
            source: SourcePos { topic: "in".into(), partition: 0, offset: 1 },
            intake_client: None,
        })
    });
    store
        .compare_and_swap(
            key,
            Some(&expected),
            Some(&Record::Indeterminate(Indeterminate { held, ..indeterminate(b) })),
        )
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
    let mut by_sink = super::doubts::KeysBySink::new();
    records.iter().for_each(|(k, r)| super::doubts::tally(&mut by_sink, k, r));
    check_doubts(store, &by_sink, "live");
    assert_eq!(store.recount().unwrap(), by_scan);
    check_doubts(store, &by_sink, "recounted");
    filter::check_presence(store, &records);
}

/// The keys in doubt per sink (and their number) are those of `by_scan`; a sink whose last
/// key was settled may stay listed, empty.
fn check_doubts(store: &KeyStore, by_scan: &super::doubts::KeysBySink, when: &str) {
    let counted = store.indeterminate_by_sink();
    let want: BTreeMap<String, i64> = by_scan.iter().map(|(sink, keys)| (sink.clone(), keys.len() as i64)).collect();
    let nonzero = counted.iter().filter(|(_, n)| **n != 0).map(|(s, n)| (s.clone(), *n)).collect::<BTreeMap<_, _>>();
    assert_eq!(nonzero, want, "{when}: indeterminate records per sink");
    for sink in counted.keys().chain(by_scan.keys()) {
        let want: Vec<String> = by_scan.get(sink).map(|keys| keys.iter().cloned().collect()).unwrap_or_default();
        assert_eq!(store.indeterminate_keys(sink), want, "{when}: indeterminate keys of sink {sink:?}");
    }
}

fn counts(in_progress: i64, completed: i64, indeterminate: i64) -> StateCounts {
    StateCounts { in_progress, completed, indeterminate }
}

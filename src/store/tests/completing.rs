//! A completion is written to the backend with no stripe held (`claims::completions`): while
//! its write is under way, reads see the claim (never an absent key), writes of the key wait
//! for it or are refused, scans wait, and a failed write puts the claim back. The backend
//! here holds (or fails) one chosen write, so each test stands inside that window.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use parking_lot::Mutex;

use super::*;

each_backend!(
    a_completion_being_written_is_read_and_no_write_overtakes_it,
    a_claim_of_a_key_being_completed_is_refused,
    a_read_made_mid_write_is_not_trusted_once_the_completion_landed,
    a_failed_completion_write_puts_the_claim_back,
);

/// How long a test waits for a thread that must not finish while a write is held: a thread
/// that finished early fails the test; one not yet started just makes it prove less.
const MUST_WAIT: Duration = Duration::from_millis(200);
/// Bound on every wait for something that must happen.
const BOUND: Duration = Duration::from_secs(20);

/// What the backend does to its next `apply`.
enum Next {
    Pass,
    /// Says so on the first sender, then waits for the second to be dropped.
    Hold(mpsc::Sender<()>, mpsc::Receiver<()>),
    Fail,
}

/// A real backend whose next write can be held or failed.
struct Holding {
    inner: Box<dyn Backend>,
    next: NextWrite,
}

impl Backend for Holding {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(tree, key)
    }
    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        match std::mem::replace(&mut *self.next.lock(), Next::Pass) {
            Next::Pass => {}
            Next::Hold(entered, release) => {
                entered.send(()).expect("test alive");
                // Released when the test drops its sender (Err: disconnected).
                let _ = release.recv_timeout(BOUND);
            }
            Next::Fail => return Err(StoreError::Backend { backend: "test", message: "write refused".into() }),
        }
        self.inner.apply(ops)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn write_out(&self) -> Result<(), StoreError> {
        self.inner.write_out()
    }
    fn index_entry_keys(&self) -> usize {
        self.inner.index_entry_keys()
    }
    fn scan(&self, tree: Tree, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.scan(tree, start, end, limit)
    }
    fn disk_bytes(&self) -> Result<u64, StoreError> {
        self.inner.disk_bytes()
    }
}

/// What the test holds of a [`Holding`] backend: its next write.
type NextWrite = Arc<Mutex<Next>>;

/// A store with a claim journal over a [`Holding`] backend.
fn holding_store(kind: StoreBackend, dir: &std::path::Path) -> (Arc<KeyStore>, NextWrite) {
    let next: NextWrite = Arc::new(Mutex::new(Next::Pass));
    let inner = open_backend(kind, dir, CacheSize::default()).expect("open backend");
    let holding = Holding { inner, next: Arc::clone(&next) };
    let journal = crate::store::journal::ClaimJournal::recover(&holding, &dir.join(crate::store::journal::FILE_NAME))
        .expect("journal");
    let store = KeyStore::build(Box::new(holding), Some(journal), SyncMode::Batch, None).expect("build");
    (Arc::new(store), next)
}

/// Starts completing `claim` of `key` on a thread whose backend write is held; returns
/// once the write is under way, with what releases it and the thread.
fn complete_held(
    store: &Arc<KeyStore>,
    next: &NextWrite,
    claim: DurableClaim,
    done: &Completed,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<Result<usize, StoreError>>) {
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    *next.lock() = Next::Hold(entered_tx, release_rx);
    let (store, done) = (Arc::clone(store), done.clone());
    let completing = std::thread::spawn(move || store.complete_batch(vec![(claim, done)]));
    entered.recv_timeout(BOUND).expect("the completion's write started");
    (release, completing)
}

fn a_completion_being_written_is_read_and_no_write_overtakes_it(kind: StoreBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, next) = holding_store(kind, dir.path());
    let done = completed(7, FAR_AWAY);
    // A fresh key's claim is held by the journal: mid-write, the key is in neither home.
    let (release, completing) = complete_held(&store, &next, durable(&store, "k", 7), &done);

    let claim = Some(Record::InProgress(in_progress(7, 1)));
    let record = Some(Record::Completed(done.clone()));
    assert_eq!(store.get("k").expect("get"), claim, "a read mid-write sees the claim, not an absent key");
    assert_eq!(store.get_stamped("k").expect("get_stamped").0, claim);

    // An operator forgets the key, and a scan runs, while the completion is written.
    let (forgot_tx, forgot) = mpsc::channel();
    let forgetting = {
        let store = Arc::clone(&store);
        let claim = claim.clone();
        std::thread::spawn(move || {
            let r = store.compare_and_swap("k", claim.as_ref(), None);
            let _ = forgot_tx.send(());
            r
        })
    };
    let (scanned_tx, scanned) = mpsc::channel();
    let scanning = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            let page = store.scan_records(None, 10);
            let _ = scanned_tx.send(());
            page
        })
    };
    assert!(forgot.recv_timeout(MUST_WAIT).is_err(), "the forget did not wait for the completion's write");
    assert!(scanned.recv_timeout(MUST_WAIT).is_err(), "the scan did not wait for the completion's write");
    drop(release);

    assert_eq!(completing.join().expect("completing thread").expect("completed"), 1);
    let page = scanning.join().expect("scan thread").expect("scan");
    assert!(
        page.is_empty() || page == vec![("k".to_string(), record.clone().expect("some"))],
        "a scan sees the key completed or forgotten, never missing mid-write: {page:?}"
    );
    // The forget waited for the completion, then found it, not the claim it meant to remove.
    assert_eq!(forgetting.join().expect("forget thread").expect("forget"), Err(record.clone()));
    assert_eq!(store.get("k").expect("get"), record);
    store.flush().expect("flush");
    drop(store);
    let reopened = KeyStore::open(kind, dir.path(), SyncMode::Batch).expect("reopen");
    assert_eq!(reopened.get("k").expect("get"), record, "the completion stands");
    assert_eq!(reopened.counts(), counts(0, 1, 0));
}

/// A store whose key `k` is being completed (already expired: a read of the completion
/// decides on a new claim), and a read of `k` made meanwhile, with its stamp.
struct MidWrite {
    _dir: tempfile::TempDir,
    store: Arc<KeyStore>,
    done: Completed,
    release: mpsc::Sender<()>,
    completing: std::thread::JoinHandle<Result<usize, StoreError>>,
    read: Option<Record>,
    stamp: ReadStamp,
}

fn mid_write(kind: StoreBackend) -> MidWrite {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, next) = holding_store(kind, dir.path());
    let done = completed(7, 1);
    let (release, completing) = complete_held(&store, &next, durable(&store, "k", 7), &done);
    let (read, stamp) = store.get_stamped("k").expect("get_stamped");
    assert_eq!(read, Some(Record::InProgress(in_progress(7, 1))), "the claim, until the completion lands");
    MidWrite { _dir: dir, store, done, release, completing, read, stamp }
}

/// A claim of `k` over `expected`, read with `stamp`.
fn claim_k(store: &KeyStore, expected: Option<Record>, stamp: ReadStamp) -> Vec<Result<PendingClaim, Option<Record>>> {
    store
        .claim_batch(vec![ClaimRequest { key: "k".into(), expected, stamp, claim: in_progress(8, 2) }])
        .expect("claim_batch")
}

fn a_claim_of_a_key_being_completed_is_refused(kind: StoreBackend) {
    let MidWrite { _dir, store, done, release, completing, read, stamp } = mid_write(kind);
    let refused = claim_k(&store, read.clone(), stamp);
    assert!(matches!(refused.as_slice(), [Err(current)] if *current == read), "{refused:?}");
    drop(release);
    completing.join().expect("completing thread").expect("completed");
    // The stamp of the read made mid-write is not trusted once the completion landed.
    let refused = claim_k(&store, read, stamp);
    assert!(matches!(refused.as_slice(), [Err(Some(Record::Completed(c)))] if *c == done), "{refused:?}");
    // Read again, the completion is claimed.
    let (read, stamp) = store.get_stamped("k").expect("get_stamped");
    assert_eq!(read, Some(Record::Completed(done.clone())));
    assert!(matches!(claim_k(&store, read, stamp).as_slice(), [Ok(_)]));
}

/// The completer drops its marks only where it finds a stripe free; here the key's stripe is
/// held as the write lands, so the mark stays for the next claim to settle.
fn a_read_made_mid_write_is_not_trusted_once_the_completion_landed(kind: StoreBackend) {
    let MidWrite { _dir, store, done, release, completing, read, stamp } = mid_write(kind);
    {
        let _held = store.locks.stripe("k");
        drop(release);
        completing.join().expect("completing thread").expect("completed");
    }
    let refused = claim_k(&store, read, stamp);
    assert!(matches!(refused.as_slice(), [Err(Some(Record::Completed(c)))] if *c == done), "{refused:?}");
    assert_eq!(store.get("k").expect("get"), Some(Record::Completed(done)));
}

fn a_failed_completion_write_puts_the_claim_back(kind: StoreBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, next) = holding_store(kind, dir.path());
    let claim = durable(&store, "k", 7);
    let claimed = store.get("k").expect("get");
    *next.lock() = Next::Fail;
    assert!(store.complete_batch(vec![(claim, completed(7, FAR_AWAY))]).is_err());
    assert_eq!(store.get("k").expect("get"), claimed, "the claim is the key's record again");
    assert_eq!(store.counts(), counts(1, 0, 0));
    // Nothing is left waiting on the key: an operator's forget goes through.
    assert_eq!(store.compare_and_swap("k", claimed.as_ref(), None).expect("forget"), Ok(()));
    assert_eq!(store.get("k").expect("get"), None);
}

/// An expiry far ahead (year 2096).
const FAR_AWAY: i64 = 4_000_000_000_000;

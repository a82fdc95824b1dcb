//! sled 0.34 backend. One tree; the keyspaces are byte prefixes so that a batch touching
//! a record and its expiry entry is one atomic `apply_batch` (sled's multi-tree
//! transactions are much slower).
//!
//! Write-behind group commit. sled's `apply_batch` is expensive per call: to make the
//! batch recoverable atomically it rolls (writes out) the log's IO buffer before and after
//! it, ~100–200 µs each, and a later `flush` then has to sync every one of those small
//! buffers. One `apply_batch` per claim and per completion made claim+complete ~20× slower
//! than sled's own batched insert. So [`Backend::apply`] only records its ops in an
//! in-memory overlay, and [`Backend::flush`] (and [`Backend::write_out`]) hands everything
//! applied since the previous one to sled as ONE `apply_batch`, then syncs. This keeps the
//! trait's contract:
//! - atomic: the ops of one `apply` reach sled in the same `apply_batch` (possibly with
//!   other applies), so after a crash all or none of them are there;
//! - durable after `flush`: `flush` writes the overlay out before it syncs;
//! - reads see every applied op: `get` and `scan` read through the overlay;
//! - order: write-outs are serialized, so batches reach sled in apply order.
//!
//! With `store.sync = "none"` the store calls `write_out` instead of `flush`, so ops still
//! reach sled's own buffers (which sled writes to the OS every 500 ms) at the same points.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

#[cfg(test)]
use super::Slice;
use super::fault::{failpoint, io_error};
use super::{Backend, CacheSize, Op, StoreError, Tree};

/// Full key (with the keyspace prefix) → `Some(value)` for a put, `None` for a delete.
type Overlay = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

#[derive(Default)]
struct Pending {
    /// Ops applied since the last write-out began.
    current: Overlay,
    /// The ops being handed to sled right now; readers still see them here until sled has
    /// them.
    writing: Option<Arc<Overlay>>,
}

pub struct SledBackend {
    db: sled::Db,
    tree: sled::Tree,
    pending: Mutex<Pending>,
    /// Serializes write-outs (so batches reach sled in order) and keeps sled still while a
    /// scan merges it with the overlay.
    write_lock: Mutex<()>,
    /// The store directory, named by write errors (a full disk).
    path: PathBuf,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { backend: "sled", message: e.to_string() }
}

/// A write error, a full disk told by its I/O error's kind.
fn write_err(path: &Path, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(io) => io_error("sled", path, io),
        e => err(e),
    }
}

fn prefix(tree: Tree) -> u8 {
    match tree {
        // sled never opens a slice beyond the first (`Backend::open_slice`).
        Tree::Records(_) => b'r',
        Tree::Expiry => b'x',
        Tree::Meta => b'm',
    }
}

fn full_key(tree: Tree, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(prefix(tree));
    k.extend_from_slice(key);
    k
}

impl SledBackend {
    /// Whether `path` holds a sled database: its config and its data file.
    pub fn holds_store(path: &Path) -> bool {
        path.join("conf").is_file() && path.join("db").is_file()
    }

    pub fn open(path: &Path, cache: CacheSize) -> Result<SledBackend, StoreError> {
        remove_unfinished_snapshots(path)?;
        remove_torn_config(path)?;
        let db = open_db(path, cache.or(CacheSize::SLED_DEFAULT))?;
        let tree = db.open_tree("dedupd").map_err(err)?;
        Ok(SledBackend {
            db,
            tree,
            pending: Mutex::new(Pending::default()),
            write_lock: Mutex::new(()),
            path: path.to_path_buf(),
        })
    }

    /// Hands the overlay to sled as one atomic batch (no sync).
    fn write_pending(&self) -> Result<(), StoreError> {
        let _w = self.write_lock.lock();
        let batch_ops = {
            let mut p = self.pending.lock();
            if p.current.is_empty() {
                return Ok(());
            }
            let ops = Arc::new(std::mem::take(&mut p.current));
            p.writing = Some(Arc::clone(&ops));
            ops
        };
        let mut batch = sled::Batch::default();
        for (k, v) in batch_ops.iter() {
            match v {
                Some(v) => batch.insert(k.as_slice(), v.as_slice()),
                None => batch.remove(k.as_slice()),
            }
        }
        let result = failpoint("backend.apply")
            .map_err(|e| io_error("sled", &self.path, e))
            .and_then(|()| self.tree.apply_batch(batch).map_err(|e| write_err(&self.path, e)));
        let mut p = self.pending.lock();
        p.writing = None;
        if result.is_err() {
            // Put the ops back under anything applied since, so that nothing applied is
            // silently dropped; the next flush retries them.
            for (k, v) in batch_ops.iter() {
                p.current.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        result
    }
}

impl Backend for SledBackend {
    fn name(&self) -> &'static str {
        "sled"
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let k = full_key(tree, key);
        {
            let p = self.pending.lock();
            if let Some(v) = p.current.get(&k) {
                return Ok(v.clone());
            }
            if let Some(v) = p.writing.as_ref().and_then(|w| w.get(&k)) {
                return Ok(v.clone());
            }
        }
        Ok(self.tree.get(k).map_err(err)?.map(|v| v.to_vec()))
    }

    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut p = self.pending.lock();
        for op in ops {
            match op {
                Op::Put(t, k, v) => p.current.insert(full_key(t, &k), Some(v)),
                Op::Delete(t, k) => p.current.insert(full_key(t, &k), None),
            };
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.write_pending()?;
        self.tree.flush().map(|_| ()).map_err(|e| write_err(&self.path, e))
    }

    fn write_out(&self) -> Result<(), StoreError> {
        self.write_pending()
    }

    fn scan(
        &self,
        tree: Tree,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        if end.is_some_and(|e| e <= start) || limit == 0 {
            return Ok(Vec::new());
        }
        let lo = full_key(tree, start);
        let hi = match end {
            Some(e) => full_key(tree, e),
            None => vec![prefix(tree) + 1],
        };
        // No write-out while we merge: sled holds still, and the overlay snapshot plus
        // sled is exactly the state at the snapshot.
        let _w = self.write_lock.lock();
        let overlay: Vec<(Vec<u8>, Option<Vec<u8>>)> = {
            let p = self.pending.lock();
            let range = (Bound::Included(lo.clone()), Bound::Excluded(hi.clone()));
            let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            if let Some(w) = &p.writing {
                merged.extend(w.range(range.clone()).map(|(k, v)| (k.clone(), v.clone())));
            }
            merged.extend(p.current.range(range).map(|(k, v)| (k.clone(), v.clone())));
            merged.into_iter().collect()
        };
        let mut overlay = overlay.into_iter().peekable();
        let mut disk = self.tree.range(lo..hi);
        let mut next_disk = disk.next().transpose().map_err(err)?;
        let mut out = Vec::new();
        while out.len() < limit {
            let take_overlay = match (&next_disk, overlay.peek()) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((dk, _)), Some((ok, _))) => ok.as_slice() <= dk.as_ref(),
            };
            if take_overlay {
                let Some((k, v)) = overlay.next() else { break };
                if next_disk.as_ref().is_some_and(|(dk, _)| dk.as_ref() == k.as_slice()) {
                    next_disk = disk.next().transpose().map_err(err)?; // shadowed by the overlay
                }
                if let Some(v) = v {
                    out.push((k[1..].to_vec(), v));
                }
            } else {
                let Some((k, v)) = next_disk.take() else { break };
                out.push((k[1..].to_vec(), v.to_vec()));
                next_disk = disk.next().transpose().map_err(err)?;
            }
        }
        Ok(out)
    }

    fn disk_bytes(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk().map_err(err)
    }
}

impl Drop for SledBackend {
    /// A clean shutdown keeps what was applied, as sled itself does.
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!(error = %e, "sled store: final flush failed");
        }
    }
}

/// How long `open` waits for sled's directory lock (3 s in unit tests, which check that a
/// held lock is refused).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(if cfg!(test) { 3 } else { 10 });

/// Opens the sled database, waiting (bounded) for its directory lock. A sled `Db` dropped
/// in this process releases the lock only when its background flusher thread has exited,
/// shortly after the drop, so reopening right away (a restart in process, tests) can find
/// it still held. Another process holding it makes this fail after `LOCK_WAIT` with
/// [`StoreError::Locked`].
fn open_db(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    // An `Other` error while the lock was free: retried once, in case the lock was
    // released between sled's attempt and the probe.
    let mut retried_while_free = false;
    loop {
        match sled::Config::new().path(path).mode(sled::Mode::HighThroughput).cache_capacity(cache_bytes).open() {
            Ok(db) => return Ok(db),
            // sled reports a held lock only as an `Other` I/O error (with text): see
            // `lock_is_held`.
            Err(sled::Error::Io(e)) if e.kind() == std::io::ErrorKind::Other => match lock_is_held(path) {
                true if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                true => return Err(StoreError::Locked { backend: "sled", path: path.to_path_buf() }),
                false if !retried_while_free => retried_while_free = true,
                false => return Err(err(e)),
            },
            Err(e) => return Err(err(e)),
        }
    }
}

/// Removes the snapshot files sled was still writing when its process died.
///
/// sled 0.34 writes a snapshot to `snap.<lsn>.generating`, syncs it, then renames it to
/// `snap.<lsn>`; but when it opens it reads whichever `snap.*` file sorts last, an
/// unfinished `.generating` one included, and refuses to open on its torn contents
/// ("empty/corrupt snapshot file found": spacejam/sled#1387, #1527, #1533). A
/// `.generating` file was never renamed, so sled never relied on it: the previous snapshot
/// and the log it was built from are still there, and recovery replays that log as after
/// any crash. The files are removed only while this process holds sled's lock on `db`,
/// so a live sled elsewhere is never writing the file being removed.
fn remove_unfinished_snapshots(path: &Path) -> Result<(), StoreError> {
    let Ok(db_file) = std::fs::OpenOptions::new().read(true).write(true).open(path.join("db")) else {
        return Ok(()); // a new store: nothing written yet
    };
    if db_file.try_lock().is_err() {
        return Ok(()); // held elsewhere: `open_db` waits for it, or reports it
    }
    let entries = std::fs::read_dir(path).map_err(|e| io_error("sled", path, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(file = %entry.path().display(), "removing a sled snapshot its process did not finish writing");
            std::fs::remove_file(entry.path()).map_err(|e| io_error("sled", path, e))?;
        }
    }
    Ok(()) // the probe's lock is released as `db_file` closes
}

/// Removes a `conf` file that a process killed while creating the store left torn.
///
/// sled 0.34 writes `conf` (its storage parameters, then their CRC-32) when it is absent,
/// before it creates `db`, without syncing it; and on open it refuses a `conf` whose text
/// does not parse ("Read corrupted data at file offset None"), so a kill during the first
/// open of a store leaves one that never opens again. A `conf` whose CRC fails while `db`
/// is absent or empty belongs to a store that holds nothing yet: removed, sled writes it
/// again from the same parameters (dedupd always opens sled with the same ones). A torn
/// `conf` beside data is left for sled to report: that is not what a creation leaves.
fn remove_torn_config(path: &Path) -> Result<(), StoreError> {
    let conf = path.join("conf");
    let Ok(bytes) = std::fs::read(&conf) else { return Ok(()) }; // absent: sled writes it
    let holds_data = std::fs::metadata(path.join("db")).is_ok_and(|m| m.len() > 0);
    if holds_data || config_is_whole(&bytes) {
        return Ok(());
    }
    tracing::warn!(file = %conf.display(), "removing the torn sled config of a store whose creation was interrupted");
    std::fs::remove_file(&conf).map_err(|e| io_error("sled", path, e))
}

/// Whether `bytes` are a `conf` as sled writes it: text, then the CRC-32 of that text as
/// four little-endian bytes.
fn config_is_whole(bytes: &[u8]) -> bool {
    let Some((text, crc)) = bytes.split_last_chunk::<4>() else { return false };
    !text.is_empty() && crc32fast::hash(text) == u32::from_le_bytes(*crc)
}

/// Whether another handle holds sled's lock on the store at `path`. sled takes an exclusive
/// `flock` on the `db` file and reports failing to get it only as an `ErrorKind::Other` I/O
/// error, so the lock is probed the same way and the answer comes from the probe's error
/// type ([`std::fs::TryLockError::WouldBlock`]). The probe's own lock, if it got one, is
/// released when the file closes.
fn lock_is_held(path: &Path) -> bool {
    match std::fs::OpenOptions::new().read(true).write(true).open(path.join("db")) {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Backend;

    /// A process killed while sled wrote a snapshot leaves a torn `snap.*.generating` file,
    /// which sled 0.34 alone refuses to open on; the store opens with its data.
    #[test]
    fn opens_over_an_unfinished_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sled");
        {
            let backend = SledBackend::open(&path, CacheSize::default()).expect("open");
            backend.apply(vec![Op::Put(Tree::Records(Slice::FIRST), b"k".to_vec(), b"v".to_vec())]).expect("apply");
            backend.flush().expect("flush");
        }
        let torn = path.join("snap.FFFFFFFFFFFFFFFF.generating");
        std::fs::write(&torn, b"torn").expect("write torn snapshot");

        let backend = SledBackend::open(&path, CacheSize::default()).expect("reopen over a torn snapshot");
        assert_eq!(backend.get(Tree::Records(Slice::FIRST), b"k").expect("get"), Some(b"v".to_vec()));
        assert!(!torn.exists(), "the unfinished snapshot is removed");
    }

    /// A process killed while sled wrote `conf` during the store's first open leaves it torn
    /// (text without its CRC); sled 0.34 alone refuses to open it. The store opens, and
    /// the `conf` sled writes again is whole.
    #[test]
    fn opens_over_a_config_torn_during_creation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let whole = {
            let path = dir.path().join("whole");
            drop(SledBackend::open(&path, CacheSize::default()).expect("open"));
            std::fs::read(path.join("conf")).expect("conf")
        };
        assert!(config_is_whole(&whole), "sled's own conf passes the check");
        let path = dir.path().join("torn");
        std::fs::create_dir_all(&path).expect("dir");
        // The text written, the CRC not yet: sled reads the last four bytes as the CRC and
        // fails on the truncated text.
        std::fs::write(path.join("conf"), &whole[..whole.len() - 4]).expect("write torn conf");
        assert!(sled::Config::new().path(&path).open().is_err(), "sled alone refuses it");

        let backend = SledBackend::open(&path, CacheSize::default()).expect("open over a torn conf");
        backend.apply(vec![Op::Put(Tree::Records(Slice::FIRST), b"k".to_vec(), b"v".to_vec())]).expect("apply");
        assert_eq!(std::fs::read(path.join("conf")).expect("conf"), whole, "rewritten whole");
    }
}

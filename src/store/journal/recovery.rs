//! Opening a journal: the claims a crash left in the file become `in_progress` records in
//! the backend, then the journal starts empty. A file that is corrupt (not merely torn at
//! its end) stops the open and is kept as it is, for the operator (invariant 6).

use std::path::Path;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use super::super::{Backend, InProgress, Op, Record, Slice, StoreError, Tree};
use super::reader::decode_file;
use super::writer::{ReplaceError, TMP_PREFIX, TMP_SUFFIX, dir_of, io_err, replace_file};
use super::{ClaimJournal, Inner};

/// Removes the temporary files of rewrites that a crash interrupted (never read: recovery
/// reads only the journal itself).
fn remove_leftovers(path: &Path) -> Result<(), StoreError> {
    let dir = dir_of(path);
    for entry in std::fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TMP_PREFIX) && name.ends_with(TMP_SUFFIX) {
            std::fs::remove_file(entry.path()).map_err(|e| io_err(&entry.path(), e))?;
        }
    }
    Ok(())
}

impl ClaimJournal {
    /// Reads what a journal at `path` holds (nothing if there is none): the last claim of
    /// every key, for recovery. A torn last frame is dropped with a warning; a bad frame
    /// followed by valid ones is [`StoreError::JournalCorrupt`].
    pub(in crate::store) fn read(path: &Path) -> Result<Vec<(String, InProgress)>, StoreError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(path, e)),
        };
        let decoded = decode_file(&bytes).map_err(|bad| StoreError::JournalCorrupt {
            path: path.to_path_buf(),
            offset: bad.offset,
            why: bad.why,
        })?;
        if let Some(at) = decoded.torn_at {
            tracing::warn!(path = %path.display(), offset = at, dropped_bytes = bytes.len() as u64 - at,
                "claim journal ends in a torn frame (a crash mid-append); the frame is dropped");
        }
        Ok(decoded.claims)
    }

    /// Recovery: every claim of the journal at `path` whose key has no record
    /// in the backend is written there as `in_progress` and flushed; then the journal starts
    /// empty. A crash in between repeats it: the claims written are then found in the backend.
    /// A corrupt file fails the open before anything is written, and stays in place.
    pub(in crate::store) fn recover(backend: &dyn Backend, path: &Path) -> Result<ClaimJournal, StoreError> {
        let mut ops = Vec::new();
        // Before the presence filter exists: every slice is read, and the claims go to the
        // newest, which the store's current slice will be (`slices`).
        let slices = backend.slices();
        let newest = Slice::newest(&slices);
        for (key, claim) in ClaimJournal::read(path)? {
            let mut held = false;
            for &(slice, _) in &slices {
                held = held || backend.get(Tree::Records(slice), key.as_bytes())?.is_some();
            }
            if !held {
                ops.push(Op::Put(Tree::Records(newest), key.into_bytes(), Record::InProgress(claim).encode()));
            }
        }
        if !ops.is_empty() {
            tracing::info!(claims = ops.len(), "claims left out by a crash recovered from the claim journal");
            backend.apply(ops)?;
        }
        backend.flush()?;
        remove_leftovers(path)?;
        ClaimJournal::create_empty(path)
    }

    /// Starts an empty journal at `path`, replacing any file there. Call only once what
    /// the old one held is durable elsewhere (after recovery).
    pub(in crate::store) fn create_empty(path: &Path) -> Result<ClaimJournal, StoreError> {
        let file = match replace_file(path, &[]) {
            Ok(file) => file,
            // Not opened: nothing was acknowledged from it, and the next open starts over.
            Err(ReplaceError::Before(e) | ReplaceError::After(_, e)) => return Err(e),
        };
        Ok(ClaimJournal {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                file: std::sync::Arc::new(file),
                len: 0,
                position: 0,
                live: foldhash::HashMap::default(),
                stale: false,
                broken: false,
                poisoned: None,
            }),
            sync_lock: Mutex::new(()),
            synced: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
        })
    }
}

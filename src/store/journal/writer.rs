//! Writing the journal file: frames appended, synced, and the whole file replaced by a
//! rewrite, each failure leaving the journal either as it was or refusing every later write.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::StoreError;
use super::super::fault::{failpoint, io_error};
use super::reader::FRAME_HEADER;
use super::{BACKEND, ClaimJournal, Inner};

/// Name parts of the temporary files a rewrite writes before renaming one over the journal;
/// one left by a crash mid-rewrite is removed at the next open (see `recovery`).
pub(super) const TMP_PREFIX: &str = "dedupd-claims.journal.";
pub(super) const TMP_SUFFIX: &str = ".tmp";

pub(super) fn io_err(path: &Path, e: std::io::Error) -> StoreError {
    io_error(BACKEND, path, e)
}

/// Appends one frame holding `entries` to `buf`.
pub(super) fn encode_frame<'a>(buf: &mut Vec<u8>, entries: impl Iterator<Item = (&'a str, &'a [u8])>) {
    let start = buf.len();
    buf.extend_from_slice(&[0; FRAME_HEADER]);
    for (key, record) in entries {
        buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
        buf.extend_from_slice(key.as_bytes());
        buf.extend_from_slice(&(record.len() as u32).to_le_bytes());
        buf.extend_from_slice(record);
    }
    let body_len = (buf.len() - start - FRAME_HEADER) as u32;
    let crc = crc32fast::hash(&buf[start + FRAME_HEADER..]);
    buf[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The directory holding the journal at `path`.
pub(super) fn dir_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// How a [`replace_file`] failed: before the rename (the old file is still the journal and
/// its handle still good) or after it (the new file is the journal, but the rename may not
/// be durable: the journal must refuse further writes).
pub(super) enum ReplaceError {
    /// Nothing changed at `path`.
    Before(StoreError),
    /// The new file is at `path` (its append handle given); the directory sync failed.
    After(File, StoreError),
}

/// Writes `bytes` as the journal at `path`: to a temporary file in the same directory,
/// fsynced, renamed over the old one (`persist`), then the directory fsynced, so that the
/// rename itself is durable before this returns. A crash leaves either the old file or the
/// new one, which is what invariants 3 and 4 need of a rewrite: the stale frames are gone
/// for good (on disk) before the caller goes on to delete records in the backend.
///
/// The handle returned is opened in append mode *before* the rename, on the temporary
/// file: after the rename it is the file at `path`, so no failure after the rename can
/// leave the caller appending to a file that is no longer the journal. (Append mode:
/// `write_locked` cuts a failed write off with `set_len`, and only appends, not a cursor left
/// past the cut, then land at the file's real end.)
pub(super) fn replace_file(path: &Path, bytes: &[u8]) -> Result<File, ReplaceError> {
    let dir = dir_of(path);
    let before = ReplaceError::Before;
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .suffix(TMP_SUFFIX)
        .tempfile_in(dir)
        .map_err(|e| before(io_err(dir, e)))?;
    failpoint("journal.rewrite.write")
        .and_then(|()| tmp.write_all(bytes))
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| before(io_err(tmp.path(), e)))?;
    let handle = failpoint("journal.rewrite.reopen")
        .and_then(|()| std::fs::OpenOptions::new().append(true).open(tmp.path()))
        .map_err(|e| before(io_err(tmp.path(), e)))?;
    crate::crash::point("journal.rewrite");
    failpoint("journal.rewrite.persist").map_err(|e| before(io_err(path, e)))?;
    tmp.persist(path).map_err(|e| before(io_err(path, e.error)))?;
    match failpoint("journal.rewrite.dirsync").and_then(|()| File::open(dir)?.sync_all()) {
        Ok(()) => Ok(handle),
        Err(e) => Err(ReplaceError::After(handle, io_err(dir, e))),
    }
}

impl ClaimJournal {
    /// The error of every write once the journal is poisoned.
    pub(super) fn refuse_if_poisoned(&self, inner: &Inner) -> Result<(), StoreError> {
        match &inner.poisoned {
            Some(cause) => Err(StoreError::JournalPoisoned { path: self.path.clone(), cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Appends encoded frames to the file (to the OS, not yet synced). A failed write is
    /// cut off again: recovery refuses a bad frame followed by valid ones, so a torn frame
    /// left in the middle would stop the next start. If it cannot be cut off, the journal
    /// refuses all further appends until a rewrite starts a good file.
    pub(super) fn write_locked(&self, inner: &mut Inner, frames: &[u8]) -> Result<(), StoreError> {
        self.refuse_if_poisoned(inner)?;
        if inner.broken {
            return Err(io_err(&self.path, std::io::Error::other("an earlier write failed and could not be undone")));
        }
        if let Err(e) = failpoint("journal.write").and_then(|()| (&*inner.file).write_all(frames)) {
            inner.broken = inner.file.set_len(inner.len).is_err();
            return Err(io_err(&self.path, e));
        }
        inner.len += frames.len() as u64;
        inner.position += frames.len() as u64;
        Ok(())
    }

    /// Returns once everything appended up to `position` is on disk (one fsync, shared by
    /// the callers waiting at the same time). A failed fsync poisons the journal
    /// (invariant 5): this and every later call fails.
    pub(in crate::store) fn sync(&self, position: u64) -> Result<(), StoreError> {
        let _one_at_a_time = self.sync_lock.lock();
        let (file, upto) = {
            let inner = self.inner.lock();
            self.refuse_if_poisoned(&inner)?;
            (inner.file.clone(), inner.position)
        };
        if self.synced.load(Ordering::Acquire) >= position {
            return Ok(());
        }
        if let Err(e) = failpoint("journal.fsync").and_then(|()| file.sync_data()) {
            let e = io_err(&self.path, e);
            self.poison(&mut self.inner.lock(), &format!("fsync failed: {e}"));
            return Err(e);
        }
        self.synced.fetch_max(upto, Ordering::AcqRel);
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// fsyncs of appended claims made so far.
    pub(in crate::store) fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// From now on every append, sync and rewrite fails, naming `cause`.
    pub(super) fn poison(&self, inner: &mut Inner, cause: &str) {
        if inner.poisoned.is_none() {
            tracing::error!(path = %self.path.display(), cause, "claim journal refuses further writes; restart dedupd to recover");
            inner.poisoned = Some(cause.to_string());
        }
    }

    /// Invariant 3: the backend is flushed first, under the lock (no release can happen
    /// meanwhile), then the file is replaced by one frame of the claims that are out.
    pub(super) fn rewrite_locked(
        &self,
        inner: &mut Inner,
        flush_backend: &dyn Fn() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.refuse_if_poisoned(inner)?;
        flush_backend()?;
        let mut buf = Vec::new();
        if !inner.live.is_empty() {
            encode_frame(&mut buf, inner.live.iter().map(|(k, r)| (k.as_str(), r.as_slice())));
        }
        let file = match replace_file(&self.path, &buf) {
            Ok(file) => file,
            Err(ReplaceError::Before(e)) => return Err(e),
            Err(ReplaceError::After(file, e)) => {
                // The new file is the journal now: appends go there, but whether the rename
                // survives a crash is unknown, so nothing may be reported durable again.
                inner.file = Arc::new(file);
                inner.len = buf.len() as u64;
                self.poison(inner, &format!("a rewrite's directory sync failed: {e}"));
                return Err(e);
            }
        };
        inner.file = Arc::new(file);
        inner.len = buf.len() as u64;
        inner.stale = false;
        inner.broken = false;
        // Everything appended so far is either in the new, synced file or was released.
        self.synced.fetch_max(inner.position, Ordering::AcqRel);
        Ok(())
    }
}

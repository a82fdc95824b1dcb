//! The claim journal: where the claim of a fresh key becomes durable.
//!
//! Why a journal beside the backend: a claim lives for the length of one sink call, yet
//! writing it into the backend costs as much as writing the completion that replaces it
//! (a memtable insert in fjall, a tree write in sled, and the garbage both leave behind).
//! Measured on fjall, claims in the backend held the write path to ~0.55× of one raw insert
//! per key even without any dedupd code; an appended, checksummed frame per batch plus one
//! fsync costs a fraction of that. So a claim of a key that has no record at all is
//! appended here (one frame per batch, one fsync per batch in `sync = "batch"`), kept in
//! memory while it is out, and only its completion is written to the backend. Claims that
//! replace a record (an expired completion, an orphan) still go to the backend, where the
//! record they replace is.
//!
//! The file holds frames `[u32 len][u32 crc32][entries]`, each entry `[u32 key len][key]
//! [u32 record len][record]` (the store's binary encoding of an `in_progress` record, or
//! nothing: a tombstone for a claim deleted while out). The last entry of a key wins. A
//! torn last frame (a crash mid-append) fails its checksum and is ignored with what follows.
//!
//! **Invariant, which recovery relies on:** if the file holds a claim of a key and the
//! backend holds no record of it, that claim is the key's current record (out, or orphaned
//! by a crash). It is kept by:
//! 1. only a key with no record anywhere is claimed here (see `KeyStore::claim_batch`);
//! 2. a claim is *released* (dropped from the claims that are out) only after the backend
//!    write that replaced it was applied; its frame stays in the file, *stale*. A claim
//!    deleted with nothing to replace it (`forget`, a claim put back because its sink never
//!    ran) gets a tombstone frame instead, which recovery honours;
//! 3. stale frames leave the file only by a rewrite, and a rewrite flushes the backend
//!    first, under the journal lock, so every write that replaced a dropped claim is durable
//!    by then;
//! 4. before the backend deletes a record (compaction, `forget`), a journal holding stale
//!    frames is rewritten, so a stale claim can never outlive the record that replaced it.
//!
//! Recovery (at open) is then: every key whose last claim in the file has no record in the
//! backend gets that claim written to the backend as `in_progress`, the backend is flushed,
//! and the file starts empty.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Backend, InProgress, Op, Record, StoreError, Tree};

/// The journal's file name inside the store directory.
pub(super) const FILE_NAME: &str = "dedupd-claims.journal";

/// Above this size the file is rewritten with only the claims that are out: recovery reads
/// at most this much, the file adds at most ~4 bytes per key to a 1M-key store, and a
/// rewrite costs a few fsyncs every ~35,000 claims.
/// (256 KiB in unit tests, so that they rewrite often.)
const REWRITE_AT_BYTES: u64 = if cfg!(test) { 256 * 1024 } else { 4 * 1024 * 1024 };

const FRAME_HEADER: usize = 8;

fn io_err(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Backend { backend: "claim journal", message: format!("{}: {e}", path.display()) }
}

/// Claims appended to a file, the ones still out kept in memory.
pub(super) struct ClaimJournal {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Serialises fsyncs, so that waiting callers find their bytes synced by the one ahead.
    sync_lock: Mutex<()>,
    /// Journal position (bytes ever appended, over all files) known to be on disk.
    synced: AtomicU64,
    /// How many claims are out (`Inner::live.len()`), readable without the lock.
    out: AtomicU64,
}

struct Inner {
    file: Arc<File>,
    /// Bytes in the current file.
    len: u64,
    /// Bytes ever appended, over all files: a position that rewrites do not reset.
    position: u64,
    /// The claims that are out: key → encoded record, what a rewrite keeps. The stripes
    /// know them too, but a rewrite runs under this lock while `claim_batch` holds stripe
    /// locks and waits for it, so it cannot read them from the stripes.
    live: HashMap<String, Vec<u8>>,
    /// The file holds claims that were released since it was last rewritten.
    stale: bool,
    /// A failed write could not be cut off (see `write_locked`).
    broken: bool,
}

/// Appends one frame holding `entries` to `buf`.
fn encode_frame<'a>(buf: &mut Vec<u8>, entries: impl Iterator<Item = (&'a str, &'a [u8])>) {
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

fn take_u32(bytes: &[u8], at: &mut usize) -> Option<usize> {
    let v = u32::from_le_bytes(bytes.get(*at..*at + 4)?.try_into().ok()?);
    *at += 4;
    Some(v as usize)
}

fn take_slice<'a>(bytes: &'a [u8], at: &mut usize, len: usize) -> Option<&'a [u8]> {
    let v = bytes.get(*at..at.checked_add(len)?)?;
    *at += len;
    Some(v)
}

/// The last claim of every key in a journal file's bytes, in file order, and whether the
/// file ended in a torn frame. A frame whose checksum holds but whose entries do not decode
/// is corruption, not a torn write: an error.
pub(super) fn decode_file(bytes: &[u8]) -> Result<(Vec<(String, InProgress)>, bool), StoreError> {
    let mut last: HashMap<String, usize> = HashMap::new();
    let mut claims: Vec<(String, Option<InProgress>)> = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let mut p = at;
        let frame = take_u32(bytes, &mut p).and_then(|len| {
            let crc = take_u32(bytes, &mut p)? as u32;
            let body = take_slice(bytes, &mut p, len)?;
            (crc32fast::hash(body) == crc).then_some(body)
        });
        let Some(body) = frame else {
            return Ok((claims.into_iter().filter_map(|(k, c)| Some((k, c?))).collect(), true));
        };
        at = p;
        let corrupt = |why: &str| StoreError::Corrupt {
            key: format!("claim journal frame at byte {at}"),
            source: super::record::DecodeError(why.into()),
        };
        let mut q = 0;
        while q < body.len() {
            let key = take_u32(body, &mut q).and_then(|n| take_slice(body, &mut q, n)).ok_or_else(|| corrupt("key"))?;
            let rec =
                take_u32(body, &mut q).and_then(|n| take_slice(body, &mut q, n)).ok_or_else(|| corrupt("record"))?;
            let key = std::str::from_utf8(key).map_err(|_| corrupt("key is not UTF-8"))?.to_string();
            // An empty record is a tombstone (see `ClaimJournal::forget`).
            let claim = match rec {
                [] => None,
                rec => match Record::decode(rec).map_err(|e| corrupt(&e.0))? {
                    Record::InProgress(claim) => Some(claim),
                    _ => return Err(corrupt("not an in_progress record")),
                },
            };
            match last.get(&key) {
                Some(&i) => claims[i].1 = claim,
                None => {
                    last.insert(key.clone(), claims.len());
                    claims.push((key, claim));
                }
            }
        }
    }
    Ok((claims.into_iter().filter_map(|(k, c)| Some((k, c?))).collect(), false))
}

/// Name parts of the temporary files a rewrite writes before renaming one over the journal;
/// one left by a crash mid-rewrite is removed at the next open (see `remove_leftovers`).
const TMP_PREFIX: &str = "dedupd-claims.journal.";
const TMP_SUFFIX: &str = ".tmp";

/// The directory holding the journal at `path`.
fn dir_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Writes `bytes` as the journal at `path`: to a temporary file in the same directory,
/// fsynced, renamed over the old one (`persist`), then the directory fsynced, so that the
/// rename itself is durable before this returns. A crash leaves either the old file or the
/// new one, which is what invariants 3 and 4 need of a rewrite: the stale frames are gone
/// for good (on disk) before the caller goes on to delete records in the backend.
///
/// The handle returned is opened again in append mode: `write_locked` cuts a failed write
/// off with `set_len`, and only appends (not a cursor left past the cut) then land at the
/// file's real end.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<File, StoreError> {
    let dir = dir_of(path);
    let mut tmp =
        tempfile::Builder::new().prefix(TMP_PREFIX).suffix(TMP_SUFFIX).tempfile_in(dir).map_err(|e| io_err(dir, e))?;
    tmp.write_all(bytes).and_then(|()| tmp.as_file().sync_all()).map_err(|e| io_err(tmp.path(), e))?;
    tmp.persist(path).map_err(|e| io_err(path, e.error))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err(dir, e))?;
    std::fs::OpenOptions::new().append(true).open(path).map_err(|e| io_err(path, e))
}

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
    /// every key, for recovery.
    pub(super) fn read(path: &Path) -> Result<Vec<(String, InProgress)>, StoreError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(path, e)),
        };
        let (claims, torn) = decode_file(&bytes)?;
        if torn {
            tracing::warn!(path = %path.display(), "claim journal ends in a torn frame (a crash mid-append); ignored");
        }
        Ok(claims)
    }

    /// Recovery: every claim of the journal at `path` whose key has no record
    /// in the backend is written there as `in_progress` and flushed; then the journal starts
    /// empty. A crash in between repeats it: the claims written are then found in the backend.
    pub(super) fn recover(backend: &dyn Backend, path: &Path) -> Result<ClaimJournal, StoreError> {
        let mut ops = Vec::new();
        for (key, claim) in ClaimJournal::read(path)? {
            if backend.get(Tree::Records, key.as_bytes())?.is_none() {
                ops.push(Op::Put(Tree::Records, key.into_bytes(), Record::InProgress(claim).encode()));
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
    pub(super) fn create_empty(path: &Path) -> Result<ClaimJournal, StoreError> {
        let file = replace_file(path, &[])?;
        Ok(ClaimJournal {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                file: Arc::new(file),
                len: 0,
                position: 0,
                live: HashMap::new(),
                stale: false,
                broken: false,
            }),
            sync_lock: Mutex::new(()),
            synced: AtomicU64::new(0),
            out: AtomicU64::new(0),
        })
    }

    /// Appends claims (key, encoded `in_progress` record) as one frame, which a crash keeps
    /// whole or not at all. Returns the position to pass to [`ClaimJournal::sync`]. When
    /// the file has grown past its bound it is rewritten, after `flush_backend`.
    pub(super) fn append(
        &self,
        claims: Vec<(String, Vec<u8>)>,
        flush_backend: &dyn Fn() -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        let mut buf =
            Vec::with_capacity(FRAME_HEADER + claims.iter().map(|(k, r)| 8 + k.len() + r.len()).sum::<usize>());
        encode_frame(&mut buf, claims.iter().map(|(k, r)| (k.as_str(), r.as_slice())));
        let mut inner = self.inner.lock();
        self.write_locked(&mut inner, &buf)?;
        inner.live.extend(claims);
        self.out.store(inner.live.len() as u64, Ordering::Release);
        let position = inner.position;
        if inner.len > REWRITE_AT_BYTES {
            self.rewrite_locked(&mut inner, flush_backend)?;
        }
        Ok(position)
    }

    /// Appends encoded frames to the file (to the OS, not yet synced). A failed write is
    /// cut off again: recovery stops at the first bad frame, so a torn frame left in the
    /// middle would hide every claim appended after it. If it cannot be cut off, the
    /// journal refuses all further appends.
    fn write_locked(&self, inner: &mut Inner, frames: &[u8]) -> Result<(), StoreError> {
        if inner.broken {
            return Err(io_err(&self.path, std::io::Error::other("an earlier write failed and could not be undone")));
        }
        if let Err(e) = (&*inner.file).write_all(frames) {
            inner.broken = inner.file.set_len(inner.len).is_err();
            return Err(io_err(&self.path, e));
        }
        inner.len += frames.len() as u64;
        inner.position += frames.len() as u64;
        Ok(())
    }

    /// The claim of `key` is no longer out: the backend write that replaced it has been
    /// applied (invariant 2).
    pub(super) fn release(&self, key: &str) {
        self.release_all(std::iter::once(key));
    }

    /// Deletes a claim that is out and that nothing replaces (an operator's `forget`, a
    /// claim put back because its sink never ran): a tombstone frame, so that recovery does
    /// not bring it back. Written to the OS now, durable with the next sync.
    pub(super) fn forget(&self, key: &str) -> Result<(), StoreError> {
        let mut buf = Vec::with_capacity(FRAME_HEADER + 8 + key.len());
        encode_frame(&mut buf, std::iter::once((key, &[][..])));
        let mut inner = self.inner.lock();
        self.write_locked(&mut inner, &buf)?;
        inner.live.remove(key);
        self.out.store(inner.live.len() as u64, Ordering::Release);
        Ok(())
    }

    /// Releases several keys under one lock.
    pub(super) fn release_all<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        let mut inner = self.inner.lock();
        for key in keys {
            if inner.live.remove(key).is_some() {
                inner.stale = true;
            }
        }
        self.out.store(inner.live.len() as u64, Ordering::Release);
    }

    /// Whether any claim is out: when none is, a read need not look for one.
    pub(super) fn any_out(&self) -> bool {
        self.out.load(Ordering::Acquire) > 0
    }

    /// Returns once everything appended up to `position` is on disk (one fsync, shared by
    /// the callers waiting at the same time).
    pub(super) fn sync(&self, position: u64) -> Result<(), StoreError> {
        let _one_at_a_time = self.sync_lock.lock();
        if self.synced.load(Ordering::Acquire) >= position {
            return Ok(());
        }
        let (file, upto) = {
            let inner = self.inner.lock();
            (inner.file.clone(), inner.position)
        };
        file.sync_data().map_err(|e| io_err(&self.path, e))?;
        self.synced.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// Returns once everything appended so far is on disk.
    pub(super) fn sync_all(&self) -> Result<(), StoreError> {
        let position = self.inner.lock().position;
        self.sync(position)
    }

    /// Rewrites the file without its released claims, if it holds any (invariant 4: call
    /// before the backend deletes a record).
    pub(super) fn drop_stale(&self, flush_backend: &dyn Fn() -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        if inner.stale { self.rewrite_locked(&mut inner, flush_backend) } else { Ok(()) }
    }

    /// Bytes the file holds.
    pub(super) fn len(&self) -> u64 {
        self.inner.lock().len
    }

    /// Swaps the file for a read-only handle, so that writes fail (for tests).
    #[cfg(test)]
    pub(super) fn make_writes_fail(&self) {
        let read_only = File::open(&self.path).expect("journal file");
        self.inner.lock().file = Arc::new(read_only);
    }

    /// Claims out, as the journal knows them (for tests).
    #[cfg(test)]
    pub(super) fn live_count(&self) -> usize {
        self.inner.lock().live.len()
    }

    /// Invariant 3: the backend is flushed first, under the lock (no release can happen
    /// meanwhile), then the file is replaced by one frame of the claims that are out.
    fn rewrite_locked(
        &self,
        inner: &mut Inner,
        flush_backend: &dyn Fn() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        flush_backend()?;
        let mut buf = Vec::new();
        if !inner.live.is_empty() {
            encode_frame(&mut buf, inner.live.iter().map(|(k, r)| (k.as_str(), r.as_slice())));
        }
        let file = replace_file(&self.path, &buf)?;
        inner.file = Arc::new(file);
        inner.len = buf.len() as u64;
        inner.stale = false;
        inner.broken = false;
        // Everything appended so far is either in the new, synced file or was released.
        self.synced.fetch_max(inner.position, Ordering::AcqRel);
        Ok(())
    }
}

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
//! nothing: a tombstone for a claim deleted while out). The last entry of a key wins.
//! Components: `writer` (appends, fsyncs, rewrites), `reader` (decoding a file),
//! `recovery` (opening one).
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
//! **Claims reported durable are in the file recovery reads.** Kept by:
//!
//! 5. a failed fsync *poisons* the journal: that sync and every later append, sync and
//!    rewrite fail until a restart. The kernel may have dropped the dirty pages the fsync
//!    failed to write and marked them clean, so a later fsync can succeed without them
//!    (PostgreSQL's "fsyncgate"): retrying would report durable what is not. A rewrite
//!    appends only to the file at the journal's path: its append handle is opened on the
//!    new file before the rename, and a failure after the rename (the directory sync)
//!    poisons the journal too, as the rename may not survive a crash;
//! 6. recovery drops only a torn *tail*: a bad frame followed by valid frames is corruption,
//!    not a crash mid-append (nothing is appended behind a failed write: it is cut off, or
//!    the journal refuses further appends), so the open fails naming the file and the
//!    frame's byte offset, and the file is kept as it is for the operator (runbook).
//!
//! Recovery (at open) is then: every key whose last claim in the file has no record in the
//! backend gets that claim written to the backend as `in_progress`, the backend is flushed,
//! and the file starts empty.

mod reader;
mod recovery;
mod writer;

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use super::StoreError;
use reader::FRAME_HEADER;
use writer::encode_frame;

/// The journal's file name inside the store directory.
pub(super) const FILE_NAME: &str = "dedupd-claims.journal";

/// What errors of the journal name as their "backend".
const BACKEND: &str = "claim journal";

/// Above this size the file is rewritten with only the claims that are out: recovery reads
/// at most this much, the file adds at most ~4 bytes per key to a 1M-key store, and a
/// rewrite costs a few fsyncs every ~35,000 claims.
/// (256 KiB in unit tests, so that they rewrite often.)
const REWRITE_AT_BYTES: u64 = if cfg!(test) { 256 * 1024 } else { 4 * 1024 * 1024 };

/// The last claim of every key in a journal file's bytes and whether the file ends in a
/// torn frame (for tests; recovery reads through [`ClaimJournal::read`]).
#[cfg(test)]
pub(super) fn decode_file(bytes: &[u8]) -> Result<(Vec<(String, super::InProgress)>, bool), reader::BadFrame> {
    reader::decode_file(bytes).map(|d| (d.claims, d.torn_at.is_some()))
}

/// The size past which the file is rewritten: [`REWRITE_AT_BYTES`], or (feature
/// `failpoints`) what the failpoint `journal.rewrite_at` returns, `return(BYTES)`, so that a
/// crash test can make rewrites happen all the time.
fn rewrite_at_bytes() -> u64 {
    fail::fail_point!("journal.rewrite_at", |bytes: Option<String>| {
        bytes.and_then(|b| b.parse().ok()).unwrap_or(REWRITE_AT_BYTES)
    });
    REWRITE_AT_BYTES
}

/// Claims appended to a file, the ones still out kept in memory.
pub(super) struct ClaimJournal {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Serialises fsyncs, so that waiting callers find their bytes synced by the one ahead.
    sync_lock: Mutex<()>,
    /// Journal position (bytes ever appended, over all files) known to be on disk.
    synced: AtomicU64,
    /// fsyncs of appended claims made so far (each shared by the callers it covered).
    fsyncs: AtomicU64,
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
    live: foldhash::HashMap<String, Vec<u8>>,
    /// The file holds claims that were released since it was last rewritten.
    stale: bool,
    /// A failed write could not be cut off (see `write_locked`); a rewrite clears it.
    broken: bool,
    /// Why every write is refused until a restart (invariant 5), once it is.
    poisoned: Option<String>,
}

impl ClaimJournal {
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
        let position = inner.position;
        if inner.len > rewrite_at_bytes() {
            self.rewrite_locked(&mut inner, flush_backend)?;
        }
        Ok(position)
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
}

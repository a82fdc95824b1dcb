//! fjall 3 backend (LSM tree).
//!
//! Keyspaces `expiry` and `meta`, and one per slice of the records (`records` for the
//! first, `records.N` for slice N; see `slices`), in one [`fjall::Database`]. fjall writes
//! every keyspace through one shared journal, and a [`fjall::OwnedWriteBatch`] is one
//! checksummed journal entry, so a batch touching a record and its expiry entry is atomic
//! across keyspaces (a torn tail batch is dropped at recovery). Separate keyspaces (rather
//! than one with prefixes, as sled needs) keep the expiry index's tombstones out of the
//! records tree, give each tree its own bloom filters, and let compaction range-scan a
//! small index.
//!
//! Settings, for a dedup store (small values of ~60–150 bytes, most claims look up a key
//! that is absent, the expiry index is a FIFO queue written once and deleted once):
//! - `records` and every slice: bloom filters on every level (`expect_point_read_hits` stays `false`),
//!   because the common read is a miss (a fresh key); 4 KiB blocks (point reads); a 32 MiB
//!   memtable (≈200k claims): big enough that flushes are rare, small enough that restart
//!   (journal replay) stays well under a second and memory stays bounded; every table's
//!   index and filter blocks pinned in memory (see `records_options`).
//! - `expiry`: one entry per round of completions, scanned by compaction, never
//!   point-read; an 8 MiB memtable.
//! - `meta`: a handful of watermarks; a 1 MiB memtable so that it never pins old journals.
//! - Database: the journal total is capped at 64 MiB (default 512 MiB) to bound replay
//!   time after a crash and the disk the journals take (each command is journaled twice,
//!   claim and completion: at 128 MiB the journals alone were ~130 B/key of a 1M-key store,
//!   at 64 MiB the store settles at ~1.25× the raw floor's disk); fjall flushes the
//!   memtables holding the oldest journal when it is exceeded.
//! - Durability: a committed batch waits in the journal's 8 KiB buffer inside this
//!   process; [`Backend::write_out`] hands it to the OS (`persist(Buffer)`), which a process
//!   crash keeps (`store.sync = "none"`), and [`Backend::flush`] is `persist(SyncAll)`, an
//!   fsync. fjall holds its journal's lock during that fsync, so writes of other threads
//!   wait for it; syncing the file from a handle of our own instead measured no gain
//!   (docs/decisions.md).
//! - Block cache: `store.cache_bytes`, 64 MiB when unset (fjall's default is 32 MiB): the
//!   working set of a dedup store is the recent keys; more does not help claims of fresh
//!   keys, which the presence filter answers without a read.

use std::path::{Path, PathBuf};

use fjall::config::PinningPolicy;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use parking_lot::RwLock;

use super::fault::{engine_write_error, failpoint, io_error};
use super::{Backend, CacheSize, Op, Slice, StoreError, Tree, Visit};

pub struct FjallBackend {
    db: Database,
    /// Each slice's keyspace and when it was opened, by slice number.
    records: RwLock<Vec<Option<(Keyspace, i64)>>>,
    expiry: Keyspace,
    meta: Keyspace,
    /// The store directory, named by write errors (a full disk).
    path: PathBuf,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { backend: "fjall", message: e.to_string() }
}

/// An error opening the database; fjall reports a lock held elsewhere as its own variant.
fn open_err(path: &Path, e: fjall::Error) -> StoreError {
    match e {
        fjall::Error::Locked => StoreError::Locked { backend: "fjall", path: path.to_path_buf() },
        e => err(e),
    }
}

const MIB: u64 = 1024 * 1024;

/// Clears what a crash in the middle of fjall's *first* creation of a database leaves behind.
///
/// `Database::create_new` makes `lock`, `keyspaces/` and `0.jnl` before it writes and fsyncs
/// the `version` marker; killed in between, the directory has no valid marker, so the next
/// open tries to create the database again and fails on the existing `0.jnl` ("File exists")
/// — forever (found by `tests/store/store_crash.rs`). Nothing can have been stored yet: the
/// marker is synced before `open` returns. So when the marker is missing or shorter than
/// its 4-byte header, and the directory holds only those leftovers (with `keyspaces/`
/// empty), they are removed and creation starts over. Anything else in a directory
/// without a marker is not ours: refuse rather than delete or mix files.
fn clear_unfinished_creation(path: &Path) -> Result<(), StoreError> {
    let io = |e: std::io::Error| err(format!("{}: {e}", path.display()));
    if !path.exists() {
        return Ok(());
    }
    let marker = path.join("version");
    if marker.metadata().is_ok_and(|m| m.len() >= 4) {
        return Ok(());
    }
    let mut leftovers = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().map_err(io)?.is_dir();
        let ours = match name.as_str() {
            "lock" | "version" => !is_dir,
            "keyspaces" => is_dir && std::fs::read_dir(entry.path()).map_err(io)?.next().is_none(),
            n => !is_dir && n.strip_suffix(".jnl").is_some_and(|id| id.bytes().all(|b| b.is_ascii_digit())),
        };
        if !ours {
            return Err(err(format!(
                "{} holds {name:?} but no fjall database (no version marker); refusing to create one in it",
                path.display()
            )));
        }
        leftovers.push((entry.path(), is_dir));
    }
    if leftovers.is_empty() {
        return Ok(());
    }
    tracing::warn!(path = %path.display(), "removing the leftovers of an unfinished fjall store creation");
    for (p, is_dir) in leftovers {
        if is_dir { std::fs::remove_dir(&p) } else { std::fs::remove_file(&p) }.map_err(io)?;
    }
    std::fs::File::open(path).and_then(|d| d.sync_all()).map_err(io)
}

/// The `records` keyspace's settings (fjall stores them when it creates the keyspace; a
/// store created before a change keeps its own).
fn records_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
        .max_memtable_size(32 * MIB)
        // Every table's index and filter blocks stay in memory, outside the block cache:
        // with fjall's default (pinned on the first levels only) random gets in a store of
        // 10M keys read 32–85 KiB per read call, at 0.28× the rate at 1M (docs/performance-notes.md,
        // "fjall's index and filter blocks, and its block cache").
        .index_block_pinning_policy(PinningPolicy::all(true))
        .filter_block_pinning_policy(PinningPolicy::all(true))
}

impl FjallBackend {
    /// Whether `path` holds a fjall database: its version marker is written (the last step
    /// of a creation, see `clear_unfinished_creation`).
    pub fn holds_store(path: &Path) -> bool {
        path.join("version").metadata().is_ok_and(|m| m.len() >= 4)
    }

    pub fn open(path: &Path, cache: CacheSize) -> Result<FjallBackend, StoreError> {
        clear_unfinished_creation(path)?;
        let db = Database::builder(path)
            .cache_size(cache.or(CacheSize::FJALL_DEFAULT))
            .max_journaling_size(64 * MIB)
            .open()
            .map_err(|e| open_err(path, e))?;
        let expiry =
            db.keyspace("expiry", || KeyspaceCreateOptions::default().max_memtable_size(8 * MIB)).map_err(err)?;
        let meta = db.keyspace("meta", || KeyspaceCreateOptions::default().max_memtable_size(MIB)).map_err(err)?;
        let records = open_slices(&db, &meta)?;
        Ok(FjallBackend { db, records: RwLock::new(records), expiry, meta, path: path.to_path_buf() })
    }

    fn keyspace(&self, tree: Tree) -> Result<Keyspace, StoreError> {
        match tree {
            Tree::Records(slice) => match self.records.read().get(slice.number()) {
                Some(Some((keyspace, _))) => Ok(keyspace.clone()),
                _ => Err(err(format!("slice {} of the records is not open", slice.number()))),
            },
            Tree::Expiry => Ok(self.expiry.clone()),
            Tree::Meta => Ok(self.meta.clone()),
        }
    }
}

/// The keyspace holding slice `slice`: `records` for the first (a store from before slices
/// holds every record there), `records.N` for the others.
fn slice_name(slice: Slice) -> String {
    match slice.number() {
        0 => "records".to_string(),
        n => format!("records.{n}"),
    }
}

/// The `meta` key holding when slice `slice` was opened (ms since the epoch, little-endian).
fn slice_opened_key(slice: Slice) -> Vec<u8> {
    format!("slice-opened/{}", slice.number()).into_bytes()
}

/// What `meta` holds for a slice that was dropped: its keyspace stays, cleared, for the
/// next slice of that number (see [`FjallBackend::drop_slice`]).
const SLICE_FREE: i64 = -1;

/// The slices the database holds, by number, and when each was opened. A new store (or one
/// from before slices) has `records` only, opened at 0 as far as anyone knows.
fn open_slices(db: &Database, meta: &Keyspace) -> Result<Vec<Option<(Keyspace, i64)>>, StoreError> {
    let mut slices = vec![None; Slice::MAX];
    let exists = |n: usize| Slice::new(n).is_some_and(|slice| db.keyspace_exists(&slice_name(slice)));
    // The first slice is made for a store that has none (a new one).
    let none = !(0..Slice::MAX).any(exists);
    for (n, entry) in slices.iter_mut().enumerate() {
        let Some(slice) = Slice::new(n) else { continue };
        if !(exists(n) || (n == 0 && none)) {
            continue;
        }
        let opened = match meta.get(slice_opened_key(slice)).map_err(err)? {
            Some(v) => v.as_ref().try_into().map(i64::from_le_bytes).unwrap_or(0),
            None => 0,
        };
        if opened != SLICE_FREE {
            *entry = Some((db.keyspace(&slice_name(slice), records_options).map_err(err)?, opened));
        }
    }
    Ok(slices)
}

impl Backend for FjallBackend {
    fn name(&self) -> &'static str {
        "fjall"
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.keyspace(tree)?.get(key).map_err(err)?.map(|v| v.to_vec()))
    }

    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut batch = fjall::OwnedWriteBatch::with_capacity(self.db.clone(), ops.len());
        for op in ops {
            match op {
                Op::Put(t, k, v) => batch.insert(&self.keyspace(t)?, k, v),
                Op::Delete(t, k) => batch.remove(&self.keyspace(t)?, k),
            }
        }
        failpoint("backend.apply").map_err(|e| io_error("fjall", &self.path, e))?;
        batch.commit().map_err(|e| engine_write_error("fjall", &self.path, &e))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.persist(PersistMode::SyncAll).map_err(|e| engine_write_error("fjall", &self.path, &e))
    }

    /// A batch's commit leaves it in the journal's 8 KiB buffer inside this process (only
    /// single-key writes are handed to the OS at once): handed over here, so that a process
    /// crash keeps it with `store.sync = "none"`.
    fn write_out(&self) -> Result<(), StoreError> {
        self.db.persist(PersistMode::Buffer).map_err(|e| engine_write_error("fjall", &self.path, &e))
    }

    /// A round's completions in one or two entries: an LSM tree stores a 45 KiB value in
    /// its journal and blocks like any other, and fewer entries mean fewer index writes and
    /// fewer index tombstones for compaction to step over.
    fn index_entry_keys(&self) -> usize {
        1024
    }

    fn scan(
        &self,
        tree: Tree,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        let ks = self.keyspace(tree)?;
        if end.is_some_and(|e| e <= start) || limit == 0 {
            return Ok(Vec::new());
        }
        let iter = match end {
            Some(e) => ks.range(start..e),
            None => ks.range(start..),
        };
        let mut out = Vec::with_capacity(limit.min(1024));
        for guard in iter.take(limit) {
            let (k, v) = guard.into_inner().map_err(err)?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn for_each(&self, tree: Tree, start: &[u8], end: Option<&[u8]>, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        if end.is_some_and(|e| e <= start) {
            return Ok(());
        }
        let keyspace = self.keyspace(tree)?;
        let iter = match end {
            Some(e) => keyspace.range(start..e),
            None => keyspace.range(start..),
        };
        for guard in iter {
            let (key, value) = guard.into_inner().map_err(err)?;
            visit(&key, &value)?;
        }
        Ok(())
    }

    fn last_key(&self, tree: Tree) -> Result<Option<Vec<u8>>, StoreError> {
        match self.keyspace(tree)?.last_key_value() {
            Some(guard) => Ok(Some(guard.key().map_err(err)?.to_vec())),
            None => Ok(None),
        }
    }

    /// fjall numbers every write batch from one counter for the whole database, which its
    /// recovery sets again from the journals and tables it finds.
    fn write_seqno(&self) -> Option<u64> {
        Some(self.db.seqno())
    }

    fn disk_bytes(&self) -> Result<u64, StoreError> {
        self.db.disk_space().map_err(err)
    }

    fn slices(&self) -> Vec<(Slice, i64)> {
        let records = self.records.read();
        (0..Slice::MAX).filter_map(|n| Some((Slice::new(n)?, records.get(n)?.as_ref()?.1))).collect()
    }

    /// Creates its keyspace (or takes the one a dropped slice of that number left, empty),
    /// then writes when it was opened: a crash in between leaves an empty slice opened "at
    /// 0" or a free one, which the store drops as it drops any empty old slice.
    fn open_slice(&self, slice: Slice, opened_ms: i64) -> Result<bool, StoreError> {
        let keyspace = self.db.keyspace(&slice_name(slice), records_options).map_err(err)?;
        self.apply(vec![Op::Put(Tree::Meta, slice_opened_key(slice), opened_ms.to_le_bytes().to_vec())])?;
        if let Some(entry) = self.records.write().get_mut(slice.number()) {
            *entry = Some((keyspace, opened_ms));
        }
        Ok(true)
    }

    /// Flushes its memtable in the background: otherwise the memtables of up to 31 old
    /// slices, each below the size that flushes it, stayed in memory (and in the journal,
    /// replayed at the next open) until the journal cap forced them out.
    fn seal_slice(&self, slice: Slice) -> Result<(), StoreError> {
        self.keyspace(Tree::Records(slice))?.rotate_memtable().map_err(err)?;
        Ok(())
    }

    /// Clears the slice's keyspace (one journaled step, its tables let go at once) and
    /// marks the number free. The keyspace itself stays: deleting keyspaces and creating
    /// others lost a new keyspace's writes after a SIGKILL in `tests/store/store_crash.rs`
    /// (fjall 3.1), where a cleared one is written and recovered as any other.
    fn drop_slice(&self, slice: Slice) -> Result<(), StoreError> {
        let keyspace = match self.records.read().get(slice.number()) {
            Some(Some((keyspace, _))) => keyspace.clone(),
            _ => return Ok(()),
        };
        // Taken out of the table only once both steps are done: a slice that failed to
        // drop stays open (and empty), to be dropped at a later turn.
        keyspace.clear().map_err(|e| engine_write_error("fjall", &self.path, &e))?;
        self.apply(vec![Op::Put(Tree::Meta, slice_opened_key(slice), SLICE_FREE.to_le_bytes().to_vec())])?;
        if let Some(entry) = self.records.write().get_mut(slice.number()) {
            *entry = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FjallBackend;
    use crate::store::{Backend, CacheSize, Op, Slice, Tree};

    /// `write_out` hands a committed batch to the OS (what a process crash keeps), not
    /// only to fjall's buffer: its bytes are in the journal file.
    #[test]
    fn write_out_puts_a_small_batch_in_the_journal_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = FjallBackend::open(dir.path(), CacheSize::default()).unwrap();
        db.apply(vec![Op::Put(Tree::Records(Slice::FIRST), b"small".to_vec(), b"small-value".to_vec())]).unwrap();
        db.write_out().unwrap();
        // A new store has one journal, `0.jnl`.
        let journal = std::fs::read(dir.path().join("0.jnl")).unwrap();
        assert!(journal.windows(11).any(|w| w == b"small-value"));
    }
}

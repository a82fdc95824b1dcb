//! The byte-level interface a storage engine offers the store ([`Backend`]), and the
//! keyspaces and writes it is spoken to in. Implementations live in one file each
//! (`sled_backend`, `fjall_backend`); `backends` registers them.

use super::{StoreError, index};

/// A key and its value, as a scan returns them.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// What [`Backend::for_each`] lends each entry to (its key, then its value).
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'a;

/// One slice of the records (see `slices`): a backend that keeps them apart (fjall) holds
/// each in a keyspace of its own; one that does not (sled) holds every slice in one tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slice(u8);

impl Slice {
    /// How many slices a store can hold at once: a slice is named by 5 bits beside each
    /// fingerprint of the presence filter.
    pub const MAX: usize = 32;
    /// The slice a new store writes into first; a store from before slices holds all its
    /// records there.
    pub const FIRST: Slice = Slice(0);

    /// The slice numbered `n`, if there is one.
    pub fn new(n: usize) -> Option<Slice> {
        u8::try_from(n).ok().filter(|&n| usize::from(n) < Self::MAX).map(Slice)
    }

    /// Its number, below [`Slice::MAX`].
    pub fn number(self) -> usize {
        usize::from(self.0)
    }

    /// The slice opened last among `slices` (as [`Backend::slices`] lists them): the one
    /// new keys go to.
    pub fn newest(slices: &[(Slice, i64)]) -> Slice {
        slices.iter().max_by_key(|&&(slice, opened)| (opened, slice)).map_or(Slice::FIRST, |&(s, _)| s)
    }
}

/// The keyspaces a backend keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// key → encoded [`Record`](super::Record), in one slice of the records.
    Records(Slice),
    /// big-endian expiry ms ++ random id → `(key, expires_at)` pairs (see `index`).
    Expiry,
    /// small metadata: watermarks.
    Meta,
}

/// One write of an atomic batch.
#[derive(Debug, Clone)]
pub enum Op {
    /// Insert or replace.
    Put(Tree, Vec<u8>, Vec<u8>),
    /// Remove if present.
    Delete(Tree, Vec<u8>),
}

/// What a storage engine must offer. Implementations live in one file each.
pub trait Backend: Send + Sync + 'static {
    /// `sled` or `fjall`, for errors and metrics.
    fn name(&self) -> &'static str;
    /// Point read.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Applies all ops atomically (all or none visible after a crash).
    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError>;
    /// Makes every applied op durable (fsync). Returns only once it is.
    fn flush(&self) -> Result<(), StoreError>;
    /// Hands every applied op to the engine and the OS without waiting for the disk: what
    /// `sync = "none"` does where `batch` flushes. A backend whose `apply` already does
    /// that keeps this default.
    fn write_out(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// At most this many keys per expiry-index entry (see `index`): the default keeps
    /// entries around 3 KiB.
    fn index_entry_keys(&self) -> usize {
        index::SMALL_ENTRY_KEYS
    }
    /// Up to `limit` entries with `start <= key < end`, ascending.
    fn scan(&self, tree: Tree, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>, StoreError>;
    /// Every entry of `tree` with `start <= key < end`, ascending, lent to `visit` until it
    /// returns an error. For the open's full scan, with nothing else using the store: the
    /// default reads pages through [`Backend::scan`]; a backend that can lend its entries
    /// without copying overrides it.
    fn for_each(&self, tree: Tree, start: &[u8], end: Option<&[u8]>, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        let mut start = start.to_vec();
        loop {
            let page = self.scan(tree, &start, end, 10_000)?;
            let Some((last, _)) = page.last() else { return Ok(()) };
            // The next page starts just after this one's last key.
            start.clone_from(last);
            start.push(0);
            for (key, value) in &page {
                visit(key, value)?;
            }
        }
    }
    /// The last key of `tree`, if the backend can tell it cheaply: the open splits its scan
    /// into ranges between the first key and this one. `None` (the default) scans whole.
    fn last_key(&self, _tree: Tree) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    /// A number that moves with every write the backend applies and comes back unchanged
    /// when it is opened again with nothing written since (fjall's sequence number), if it
    /// keeps one. A presence filter saved at a clean stop is used only at the number it was
    /// saved at (`scan::saved`); `None` (the default) means it is never used.
    fn write_seqno(&self) -> Option<u64> {
        None
    }
    /// Bytes the store occupies on disk.
    fn disk_bytes(&self) -> Result<u64, StoreError>;
    /// The slices of the records it holds, each with when it was opened (ms since the
    /// epoch; 0 when not known). The default: one slice holding every record, as a backend
    /// that does not keep slices apart has.
    fn slices(&self) -> Vec<(Slice, i64)> {
        vec![(Slice::FIRST, 0)]
    }
    /// Opens `slice`, empty, as of `opened_ms`. Returns `false` (the default) when the
    /// backend does not keep slices apart: then every record stays in [`Slice::FIRST`].
    fn open_slice(&self, _slice: Slice, _opened_ms: i64) -> Result<bool, StoreError> {
        Ok(false)
    }
    /// `slice` takes no new keys any more: what it holds in memory can go to disk.
    fn seal_slice(&self, _slice: Slice) -> Result<(), StoreError> {
        Ok(())
    }
    /// Removes `slice`, which holds no record, and all it takes on disk.
    fn drop_slice(&self, _slice: Slice) -> Result<(), StoreError> {
        Ok(())
    }
}

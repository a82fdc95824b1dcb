//! The byte-level interface a storage engine offers the store ([`Backend`]), and the
//! keyspaces and writes it is spoken to in. Implementations live in one file each
//! (`sled_backend`, `fjall_backend`); `backends` registers them.

use super::{StoreError, index};

/// A key and its value, as a scan returns them.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// What [`Backend::for_each`] lends each entry to (its key, then its value).
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'a;

/// The keyspaces a backend keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// key → encoded [`Record`](super::Record).
    Records,
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
}

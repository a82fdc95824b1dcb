//! TTL compaction: removes expired `completed` records through the expiry index, in
//! bounded chunks. Only the index is read: by the store's invariant, an index entry
//! `(at, key)` exists exactly while `key` holds a completed record expiring at `at`, so
//! `in_progress` and `indeterminate` records (which have no entry) are never touched.

use std::sync::atomic::Ordering;

use super::{KeyStore, Op, StoreError, Tree, expiry_key, split_expiry_key, state_index};
use crate::store::State;

impl KeyStore {
    /// Removes up to `limit` records that expired at or before `now_ms`, in one atomic
    /// batch, and flushes it. Returns how many were removed (0 = nothing left to do).
    pub fn compact_chunk(&self, now_ms: i64, limit: usize) -> Result<usize, StoreError> {
        Ok(self.compact_chunk_from(now_ms, limit, &[])?.0)
    }

    /// [`KeyStore::compact_chunk`] over index keys `>= from`; also returns the last index
    /// key it removed, where the next chunk can start.
    fn compact_chunk_from(&self, now_ms: i64, limit: usize, from: &[u8]) -> Result<(usize, Vec<u8>), StoreError> {
        // Exclusive gate: no claim can replace a record between the index read and the
        // delete. Held for one bounded chunk only.
        let _gate = self.gate.write();
        let end = expiry_key(now_ms.saturating_add(1), b"");
        let entries = self.backend.scan(Tree::Expiry, from, Some(&end), limit)?;
        let Some((last, _)) = entries.last() else {
            return Ok((0, Vec::new()));
        };
        let last = last.clone();
        let mut ops = Vec::with_capacity(entries.len() * 2);
        for (index_key, _) in entries {
            if let Some((_, key)) = split_expiry_key(&index_key) {
                ops.push(Op::Delete(Tree::Records, key.to_vec()));
            }
            ops.push(Op::Delete(Tree::Expiry, index_key));
        }
        let removed = ops.len() / 2;
        self.backend.apply(ops)?;
        self.flush()?;
        self.counts[state_index(State::Completed)].fetch_sub(removed as i64, Ordering::Relaxed);
        Ok((removed, last))
    }

    /// Runs chunks until nothing expired at `now_ms` is left. Returns the total removed.
    ///
    /// Each chunk resumes after the last index key the previous one removed instead of
    /// at the start of the index: in an LSM tree (fjall) the removed entries stay behind
    /// as tombstones until a background compaction, and scanning from the start every
    /// time made a large run quadratic. Entries that appear behind the cursor meanwhile
    /// (a completion already expired at `now_ms`) are caught by a last pass from the start,
    /// so the result is the same as always scanning from the start.
    pub fn compact_expired(&self, now_ms: i64, chunk: usize) -> Result<usize, StoreError> {
        let mut total = 0;
        let mut from: Vec<u8> = Vec::new();
        loop {
            let (n, last) = self.compact_chunk_from(now_ms, chunk, &from)?;
            total += n;
            if n < chunk {
                if from.is_empty() {
                    return Ok(total);
                }
                from.clear(); // the last pass, from the start
            } else {
                from = last;
                from.push(0);
            }
        }
    }

    /// The earliest expiry in the index, for a purge task that sleeps until then.
    pub fn next_expiry(&self) -> Result<Option<i64>, StoreError> {
        let first = self.backend.scan(Tree::Expiry, &[], None, 1)?;
        Ok(first.first().and_then(|(k, _)| split_expiry_key(k)).map(|(at, _)| at))
    }
}

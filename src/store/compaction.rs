//! TTL compaction: removes expired `completed` records through the expiry index, in
//! bounded chunks. Only the index is read: by the store's invariant (see `index`), the
//! index lists a key exactly while it holds a completed record expiring at the listed
//! time, so `in_progress` and `indeterminate` records (never listed) are never touched.

use super::{KeyStore, Op, StoreError, Tree, presence};
use crate::store::State;

impl KeyStore {
    /// Removes about `limit` records that are due at `now_ms` (whole index entries, so up
    /// to one entry's worth more), in one atomic batch, and flushes it. Returns how many
    /// were removed (0 = nothing left to do).
    pub fn compact_chunk(&self, now_ms: i64, limit: usize) -> Result<usize, StoreError> {
        Ok(self.compact_chunk_from(now_ms, limit, &[])?.0)
    }

    /// [`KeyStore::compact_chunk`] over index keys `>= from`; also returns the last index
    /// key it removed, where the next chunk can start.
    fn compact_chunk_from(&self, now_ms: i64, limit: usize, from: &[u8]) -> Result<(usize, Vec<u8>), StoreError> {
        // Exclusive gate: no mutation can replace a record or rewrite an entry between the
        // index read and the delete. Held for one bounded chunk only.
        let _gate = self.locks.exclusive();
        // `expiries`, invariant 6.
        if self.restore_running() {
            return Ok((0, Vec::new()));
        }
        let entries = self.due_entries(now_ms, limit, from)?;
        let Some((last, _)) = entries.last() else {
            return Ok((0, Vec::new()));
        };
        let last = last.clone();
        self.drop_stale_claims()?;
        let mut ops = Vec::with_capacity(entries.iter().map(|(_, p)| p.len() + 1).sum());
        let mut removed = 0;
        let mut held = Vec::with_capacity(ops.capacity());
        for (entry_key, pairs) in entries {
            removed += pairs.len();
            // Tombstones for the changelog (invariant 1 of `changelog`, 5 of `expiries`),
            // under the exclusive gate.
            self.capture_expiries(pairs.iter().map(|(key, _)| key.as_str()));
            for (key, _) in pairs {
                let (at, fp) = presence::key_hash(&key);
                // No stripe lock is held by anyone else under the exclusive gate, so these
                // are uncontended.
                if let Some(slice) = self.slice_holding(&self.locks.stripe_at(at), &key)? {
                    ops.push(Op::Delete(Tree::Records(slice), key.into_bytes()));
                    held.push((at, fp, slice));
                }
            }
            ops.push(Op::Delete(Tree::Expiry, entry_key));
        }
        self.backend.apply(ops)?;
        // Out of the presence filter once deleted, one stripe lock at a time.
        held.sort_unstable();
        for same_stripe in held.chunk_by(|a, b| a.0 == b.0) {
            let mut stripe = self.locks.stripe_at(same_stripe[0].0);
            for &(_, fp, slice) in same_stripe {
                stripe.present.remove(fp, slice);
            }
        }
        // Still under the exclusive gate: a ReadStamp from before this chunk is now stale.
        self.locks.count_compaction();
        self.flush()?;
        self.counts.add(State::Completed, -(removed as i64));
        Ok((removed, last))
    }

    /// Runs chunks until nothing expired at `now_ms` is left, then drops the slices that
    /// emptied and opens a new one when it is due ([`KeyStore::turn_slices`]). Returns the
    /// total removed.
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
            if n > 0 {
                crate::crash::point("compaction.chunk");
            }
            if n < chunk {
                if from.is_empty() {
                    self.turn_slices(now_ms)?;
                    return Ok(total);
                }
                from.clear(); // the last pass, from the start
            } else {
                from = last;
                from.push(0);
            }
        }
    }
}

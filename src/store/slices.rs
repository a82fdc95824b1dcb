//! Slices of the records by the hour they were written, each a tree of its own in a backend
//! that keeps them apart (fjall; sled keeps one), so that the store's cost stays that of
//! its newest hour's keys as it grows.
//!
//! Why: in one leveled LSM tree every key is rewritten once per level on its way down; at
//! 100M keys that was about fifteen times, which set the write rate, and every lookup
//! probed a table per level of the whole store. A tree per hour never carries a key past
//! its own few levels, and a lookup that knows the slice of its key (the presence filter
//! names it beside the fingerprint) probes that one tree (BENCHMARKS.md, "Expiry buckets
//! against one leveled keyspace"). A slice whose keys have all expired holds nothing and
//! is dropped whole.
//!
//! Kept:
//! 1. A key that holds a record in slice S has the entry (its fingerprint, S) in the
//!    presence filter: it is added before the write into S and removed only after the
//!    delete from S (`presence`). So the filter's count of S's keys is 0 only when S holds
//!    no record.
//! 2. Every write of a record is made holding the gate (shared; compaction's deletes
//!    exclusively), into the current slice read under it, or into the slice that already
//!    holds the key.
//! 3. A slice is dropped only holding the gate exclusively, when it is not the current one
//!    and the filter counts none of its keys (and a read of it, made before, found none).
//!    By 1 and 2 it holds no record then, and no write can land in it after.
//! 4. A new key goes to the current slice. A record replaced by compare-and-swap (a claim
//!    over an expired completion, a restore, an operator's resolve or import) moves to the
//!    current slice, its delete from the old one in the same atomic write; a claim or a
//!    completion of a record the backend holds rewrites it where it is. So a slice gains
//!    keys only while it is current, and empties as they expire.
//!
//! The current slice changes at the first compaction pass an hour after it was opened
//! ([`KeyStore::turn_slices`]). A store holds at most [`Slice::MAX`] slices: with TTLs of
//! more than a day they run out, and the current slice then takes every new key until an
//! old one empties.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::claims::Stripe;
use super::{KeyStore, Slice, StoreError, Tree, presence};

/// How long a slice takes new keys.
pub const SLICE_SPAN_MS: i64 = 3_600_000;

/// The slices a store holds and which one takes new keys.
#[derive(Debug)]
pub(super) struct SliceTable {
    current: AtomicUsize,
    /// Every slice the backend holds, with when it was opened (ms since the epoch).
    live: Mutex<Vec<(Slice, i64)>>,
}

impl SliceTable {
    /// The slices the backend holds; the newest opened takes new keys.
    pub(super) fn new(live: Vec<(Slice, i64)>) -> SliceTable {
        let newest = Slice::newest(&live);
        SliceTable { current: AtomicUsize::new(newest.number()), live: Mutex::new(live) }
    }

    pub(super) fn current(&self) -> Slice {
        Slice::new(self.current.load(Ordering::Acquire)).unwrap_or(Slice::FIRST)
    }

    pub(super) fn live(&self) -> Vec<Slice> {
        self.live.lock().iter().map(|&(slice, _)| slice).collect()
    }
}

/// What one [`KeyStore::turn_slices`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlicesTurned {
    /// Slices dropped, emptied by expiry.
    pub dropped: Vec<Slice>,
    /// The slice opened to take new keys, if one was.
    pub opened: Option<Slice>,
}

impl KeyStore {
    /// The slice a new key's record goes to (invariant 2: read holding the gate).
    pub(super) fn current_slice(&self) -> Slice {
        self.slices.current()
    }

    /// The slice holding `key`'s record in the backend and the record's bytes, read with its
    /// stripe held: each slice the presence filter names for it is read in turn.
    pub(super) fn read_slices(&self, stripe: &Stripe, key: &str) -> Result<Option<(Slice, Vec<u8>)>, StoreError> {
        for slice in stripe.present.slices(presence::key_hash(key).1).iter() {
            if let Some(value) = self.backend.get(Tree::Records(slice), key.as_bytes())? {
                return Ok(Some((slice, value)));
            }
        }
        Ok(None)
    }

    /// The slice holding `key`'s record in the backend, for a key known to be there: the
    /// one the presence filter names, without a read, unless it names several.
    pub(super) fn slice_holding(&self, stripe: &Stripe, key: &str) -> Result<Option<Slice>, StoreError> {
        let slices = stripe.present.slices(presence::key_hash(key).1);
        if let Some(only) = slices.only() {
            return Ok(Some(only));
        }
        Ok(self.read_slices(stripe, key)?.map(|(slice, _)| slice))
    }

    /// Keys per slice, as the presence filter counts them.
    pub fn slice_keys(&self) -> Vec<(Slice, u64)> {
        let mut total = [0u64; Slice::MAX];
        for stripe in self.locks.stripes_in_order() {
            for (sum, &n) in total.iter_mut().zip(stripe.present.per_slice()) {
                *sum += u64::from(n);
            }
        }
        self.slices.live().into_iter().map(|slice| (slice, total[slice.number()])).collect()
    }

    /// Drops the old slices whose keys have all gone, and opens a new current slice when
    /// the current one has taken new keys for [`SLICE_SPAN_MS`] at `now_ms` (see the module
    /// doc). Run after each compaction pass.
    pub fn turn_slices(&self, now_ms: i64) -> Result<SlicesTurned, StoreError> {
        let dropped = self.drop_empty_slices()?;
        // Held while a slice opens, so that two turns at once open one. No gate: a slice is
        // open before any writer can read it as the current one.
        let mut live = self.slices.live.lock();
        let current = self.current_slice();
        let opened_at = live.iter().find(|&&(s, _)| s == current).map_or(0, |&(_, at)| at);
        let mut opened = None;
        if now_ms.saturating_sub(opened_at) >= SLICE_SPAN_MS
            && let Some(free) = (0..Slice::MAX).filter_map(Slice::new).find(|n| live.iter().all(|&(s, _)| s != *n))
            && self.backend.open_slice(free, now_ms)?
        {
            live.push((free, now_ms));
            self.slices.current.store(free.number(), Ordering::Release);
            if let Err(e) = self.backend.seal_slice(current) {
                // Only memory and replay time: its memtable goes to disk with the journal cap.
                tracing::warn!(error = %e, slice = current.number(), "could not flush an old slice's memtable");
            }
            opened = Some(free);
        }
        let turned = SlicesTurned { dropped, opened };
        if turned != SlicesTurned::default() {
            tracing::info!(dropped = ?turned.dropped, opened = ?turned.opened, slices = live.len(),
                "slices of the records turned");
        }
        Ok(turned)
    }

    /// Drops the slices other than the current one that hold no key (invariant 3).
    fn drop_empty_slices(&self) -> Result<Vec<Slice>, StoreError> {
        // Read before the gate, which it would hold for as long as a slice's tombstones
        // take to step over: an old slice gains no key (invariant 4), so one found empty
        // and still counted empty under the gate is.
        let empty: Vec<Slice> = (self.slice_keys().into_iter())
            .filter(|&(slice, keys)| keys == 0 && slice != self.current_slice())
            .map(|(slice, _)| slice)
            .filter(|&slice| self.backend.scan(Tree::Records(slice), &[], None, 1).is_ok_and(|page| page.is_empty()))
            .collect();
        if empty.is_empty() {
            return Ok(empty);
        }
        let _gate = self.locks.exclusive();
        let counted = self.slice_keys();
        let mut dropped = Vec::with_capacity(empty.len());
        for slice in empty {
            let still_empty = counted.iter().any(|&(s, keys)| s == slice && keys == 0);
            if still_empty && slice != self.current_slice() {
                self.backend.drop_slice(slice)?;
                self.slices.live.lock().retain(|&(s, _)| s != slice);
                dropped.push(slice);
            }
        }
        Ok(dropped)
    }
}

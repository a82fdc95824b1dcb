//! Records read back from the changelog (a restore, a standby, invariant 2 of `changelog`)
//! written in bulk: a chunk's keys new to the store go in one backend write with one
//! expiry-index entry per span, where a write per key cost a journal append, a batch commit
//! and an index entry each (about a fifth of the restore thread's CPU:
//! docs/performance-notes.md, "Restore").
//!
//! Why no stripe is held through the write, as a completion's is not: the keys of a
//! partition being read back have one writer, the reader (its partition is not owned here,
//! so nothing captured writes them: `ownership`, invariant 8; a restore and a standby never
//! read the same partition at once, and a partition's restores apply their chunks one at a
//! time). Each key's stripe is locked to read it and to enter it in the presence filter
//! before the write (the filter stays a superset of the keys present); a read between the
//! two answers the record before it, as a read before the chunk would. Keys with a record
//! or a claim, and removals, take the one-key path (`KeyStore::swap_locked`).
//!
//! The partitions a crash may have left uncommitted changes in are emptied here too, a page
//! of keys at a time (`writing`, invariant 10).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::changelog::{Change, checkpoint_key};
use super::locks::Locks;
use super::writing::CacheOf;
use super::{KeyStore, Op, Record, StoreError, Tree, index, presence};

/// Records removed per page when a partition is emptied.
const EMPTY_PAGE: usize = 10_000;

impl KeyStore {
    /// Applies records read back from the changelog, uncaptured, in their order (a key's
    /// last record is the one kept). A completion expired at `now_ms` is not kept: its key
    /// is added to `expired`, and any other record takes it out again (`expiries`,
    /// invariant 7). Returns how many records it applied.
    pub(super) fn apply_read(
        &self,
        changes: Vec<Change>,
        now_ms: i64,
        expired: &mut HashSet<String>,
    ) -> Result<usize, StoreError> {
        let applied = changes.len();
        let mut last: HashMap<String, Option<Record>> = HashMap::with_capacity(changes.len());
        for Change { key, value } in changes {
            let read = value.map(|v| super::decode(key.as_bytes(), &v)).transpose()?;
            let expired_now = read.as_ref().and_then(Record::expires_at_ms).is_some_and(|at| at <= now_ms);
            if expired_now {
                expired.insert(key.clone());
            } else {
                expired.remove(&key);
            }
            last.insert(key, if expired_now { None } else { read });
        }
        let others = self.insert_fresh(last)?;
        for (key, new) in others {
            let _gate = self.locks.shared();
            let mut stripe = self.lock_settled(&key);
            let current = self.get_locked(&stripe, &key)?;
            if current != new {
                self.swap_locked(&mut stripe, &key, current, new.as_ref(), false)?;
            }
        }
        Ok(applied)
    }

    /// Writes the records of `last` whose keys hold nothing here in one backend write.
    /// Returns the others (a record to replace, a claim, a removal), for the one-key path.
    fn insert_fresh(&self, last: HashMap<String, Option<Record>>) -> Result<Vec<(String, Option<Record>)>, StoreError> {
        let mut by_stripe: BTreeMap<usize, Vec<(String, Option<Record>)>> = BTreeMap::new();
        for (key, new) in last {
            by_stripe.entry(Locks::stripe_of(&key)).or_default().push((key, new));
        }
        let _gate = self.locks.shared();
        let slice = self.current_slice();
        let (mut fresh, mut others) = (Vec::new(), Vec::new());
        for (at, items) in by_stripe {
            let mut stripe = self.locks.stripe_at(at);
            let oldest = self.under_way.oldest();
            stripe.settle(oldest);
            let before = fresh.len();
            for (key, new) in items {
                let claimed = stripe.has_claim(&key);
                match new {
                    Some(record) if !claimed && self.get_locked(&stripe, &key)?.is_none() => {
                        stripe.present.add(presence::key_hash(&key).1, slice);
                        fresh.push((key, record));
                    }
                    new => others.push((key, new)),
                }
            }
            if fresh.len() > before {
                stripe.bump();
            }
        }
        if fresh.is_empty() {
            return Ok(others);
        }
        let mut ops = Vec::with_capacity(fresh.len() + 1);
        let mut expiring = Vec::with_capacity(fresh.len());
        for (key, record) in &fresh {
            ops.push(Op::Put(Tree::Records(slice), key.as_bytes().to_vec(), record.encode()));
            if let Some(at) = record.expires_at_ms() {
                expiring.push((key.as_str(), at));
            }
        }
        ops.extend(index::entry_ops(&expiring, self.backend.index_entry_keys())?);
        self.backend.apply(ops)?;
        for (key, record) in &fresh {
            self.counts.add(record.state(), 1);
            self.doubts.changed(key, None, Some(record));
        }
        Ok(others)
    }

    /// Removes every record of `partitions` of `of`'s changelog and their checkpoints, and
    /// makes that durable (invariant 10). The records are read back, not captured (a
    /// changelog's tombstones would delete what it committed). Returns how many it removed.
    pub(super) fn empty_partitions(&self, partitions: &BTreeSet<i32>, of: &CacheOf) -> Result<u64, StoreError> {
        let mut removed = 0u64;
        self.for_each_record_page(EMPTY_PAGE, |page| {
            let tombstones: Vec<Change> = page
                .into_iter()
                .filter(|(key, _)| partitions.contains(&(of.partition_of)(key)))
                .map(|(key, _)| Change { key, value: None })
                .collect();
            removed += tombstones.len() as u64;
            self.apply_read(tombstones, 0, &mut HashSet::new()).map(|_| ())
        })?;
        let checkpoints = partitions.iter().map(|&p| Op::Delete(Tree::Meta, checkpoint_key(&of.topic, p))).collect();
        self.backend.apply(checkpoints)?;
        self.flush_always()?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{completed, in_progress, indeterminate, two_partitions};
    use crate::store::{StoreBackend, StoreConfig};

    /// An expiry far ahead (year 2096).
    const FAR: i64 = 4_000_000_000_000;

    fn change(key: &str, record: Option<Record>) -> Change {
        Change { key: key.into(), value: record.map(|r| r.encode()) }
    }

    #[test]
    fn a_chunk_keeps_each_keys_last_record_whether_new_replaced_or_removed() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let config = StoreConfig { backend, path: dir.path().to_path_buf(), ..StoreConfig::default() };
            let (store, _) = KeyStore::open_as_cache(&config, two_partitions()).expect("open");
            let old = Record::Completed(completed(1, FAR));
            let first = vec![change("replaced", Some(old.clone())), change("removed", Some(old.clone()))];
            store.restore_batch(("log", 1), first, 2, 100, &mut HashSet::new()).expect("restore");

            let soon = Record::Completed(completed(2, 500));
            let doubt = Record::Indeterminate(indeterminate(3));
            let chunk = vec![
                change("twice", Some(Record::InProgress(in_progress(4, 1)))),
                change("soon", Some(soon.clone())),
                change("doubt", Some(doubt.clone())),
                change("replaced", Some(soon.clone())),
                change("removed", None),
                change("expired", Some(Record::Completed(completed(5, 50)))),
                change("twice", Some(old.clone())),
            ];
            let mut expired = HashSet::new();
            assert_eq!(store.restore_batch(("log", 1), chunk, 9, 100, &mut expired).expect("restore"), 7);
            assert_eq!(expired, HashSet::from(["expired".to_string()]), "{backend}");
            assert!(store.take_changes().is_empty(), "{backend}: nothing captured");
            assert_eq!(store.get("twice").expect("get"), Some(old.clone()), "{backend}: the last of two");
            assert_eq!(store.get("soon").expect("get"), Some(soon.clone()), "{backend}");
            assert_eq!(store.get("doubt").expect("get"), Some(doubt), "{backend}");
            assert_eq!(store.get("replaced").expect("get"), Some(soon), "{backend}");
            assert_eq!(store.get("removed").expect("get"), None, "{backend}");
            assert_eq!(store.get("expired").expect("get"), None, "{backend}");
            assert_eq!(store.checkpoint("log", 1).expect("checkpoint"), Some(9), "{backend}");
            let counts = store.counts();
            assert_eq!((counts.in_progress, counts.completed, counts.indeterminate), (0, 3, 1), "{backend}");
            assert_eq!(store.recount().expect("recount"), counts, "{backend}: the counts kept in step");

            // Both keys expiring at 500 are indexed, the new one and the replaced one.
            assert_eq!(store.compact_expired(1_000, 10).expect("compact"), 2, "{backend}");
            assert_eq!(store.get("soon").expect("get"), None, "{backend}");
            assert_eq!(store.get("replaced").expect("get"), None, "{backend}");
            assert_eq!(store.get("twice").expect("get"), Some(old), "{backend}");
        }
    }
}

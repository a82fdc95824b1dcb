//! Whose expiries go to the changelog (`store.changelog`, with one instance or several):
//! every store removes a completion once it expires, but the tombstone that takes the key
//! off the compacted topic is written only by the owner of the key's state partition. A
//! tombstone written by any other instance, or by an owner after it let the partition go,
//! could land after a newer record of the key (its new owner's claim once the key expired)
//! and delete that record from the topic: a repeat would then run its sink again.
//!
//! The store keeps, continuing the invariants of `changelog`:
//! 5. An expiry's tombstone is captured only for a key of a partition this store owns
//!    (`ownership`), checked under the capture lock; those captured and not yet taken when
//!    the partition is let go ([`KeyStore::let_go_partitions`]) are dropped under the same
//!    lock. The pipeline lets a partition go before the commit that ends its generation
//!    here and takes captured changes only inside a member of the transaction
//!    (`pipeline::changelog::writer`), so every expiry tombstone is committed by the
//!    partition's owner, in a generation that owns it.
//! 6. No compaction chunk starts while a restore applies records ([`KeyStore::restoring`]):
//!    a key a restore applied that expired meanwhile is removed with its tombstone once
//!    its partition is this store's, not before without one.
//! 7. A key whose last record a restore read is an expired completion is not kept, and its
//!    tombstone is captured once its partition is this store's
//!    ([`KeyStore::write_restored_expiries`]), so that an expiry nobody held when it came
//!    (a store rebuilt after it) still leaves the topic.
//!
//! A store that is no changelog's cache captures every expiry (a store alone).

use std::collections::HashSet;

use super::changelog::Change;
use super::ownership::Scope;
use super::{KeyStore, StoreError};

/// The captured changes not yet taken, and whose expiries may be among them.
#[derive(Default)]
pub(super) struct Captured {
    /// Oldest first; `true` marks an expiry's tombstone.
    changes: Vec<(Change, bool)>,
    /// Under `store.changelog`: the state partitions this store owns (`ownership`).
    pub(super) scope: Option<Scope>,
}

impl Captured {
    pub(super) fn push(&mut self, change: Change) {
        self.changes.push((change, false));
    }

    /// Captures the tombstone of expired `key`, if its partition's expiries are this
    /// store's (invariant 5); says whether it did.
    pub(super) fn push_expiry(&mut self, key: &str) -> bool {
        let writes = self.scope.as_ref().is_none_or(|scope| scope.owns(key));
        if writes {
            self.changes.push((Change { key: key.to_string(), value: None }, true));
        }
        writes
    }

    pub(super) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Drops the captured expiry tombstones of keys this store no longer owns (invariant
    /// 5); returns how many.
    pub(super) fn drop_expiries_not_owned(&mut self) -> usize {
        let Some(scope) = &self.scope else { return 0 };
        let before = self.changes.len();
        self.changes.retain(|(change, expiry)| !*expiry || scope.owns(&change.key));
        before - self.changes.len()
    }

    pub(super) fn take(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes).into_iter().map(|(change, _)| change).collect()
    }
}

/// Ends [`KeyStore::restoring`] when dropped.
pub struct Restoring<'a>(&'a KeyStore);

impl Drop for Restoring<'_> {
    fn drop(&mut self) {
        self.0.changes.restore_ended();
    }
}

impl KeyStore {
    /// Whether captured changes wait to be taken.
    pub fn has_changes(&self) -> bool {
        !self.changes.lock().is_empty()
    }

    /// Marks a restore as running until the guard is dropped: no compaction chunk starts
    /// meanwhile (invariant 6).
    pub fn restoring(&self) -> Restoring<'_> {
        self.changes.restore_began();
        Restoring(self)
    }

    /// Whether a restore is running (invariant 6).
    pub(super) fn restore_running(&self) -> bool {
        self.changes.restore_running()
    }

    /// Captures the tombstone of each of `keys` that holds no record, as an expiry
    /// (invariants 5 and 7): the keys a restore found expired as their last record. Returns
    /// how many it captured.
    pub fn write_restored_expiries(&self, keys: HashSet<String>) -> Result<usize, StoreError> {
        let mut captured = 0;
        for key in keys {
            let _gate = self.locks.shared();
            let stripe = self.locks.stripe(&key);
            if self.get_locked(&stripe, &key)?.is_none() && self.changes.lock().push_expiry(&key) {
                captured += 1;
            }
        }
        Ok(captured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, StoreBackend, StoreConfig};

    /// An expiry far ahead (year 2096).
    const FAR: i64 = 4_000_000_000_000;

    fn completed(expires_at_ms: i64) -> Record {
        Record::Completed(crate::store::tests::completed(1, expires_at_ms))
    }

    /// A cache store whose keys `p0-…` are on partition 0 and `p1-…` on partition 1.
    fn two_partitions(dir: &std::path::Path, backend: StoreBackend) -> KeyStore {
        let config = StoreConfig { backend, path: dir.to_path_buf(), ..StoreConfig::default() };
        let (store, _) = KeyStore::open_as_cache(&config, crate::store::tests::two_partitions()).expect("open");
        store
    }

    fn put(store: &KeyStore, key: &str, record: &Record) {
        store.compare_and_swap(key, None, Some(record)).expect("cas").expect("swapped");
    }

    fn tombstones(changes: &[Change]) -> Vec<&str> {
        changes.iter().filter(|c| c.value.is_none()).map(|c| c.key.as_str()).collect()
    }

    #[test]
    fn an_expiry_is_removed_everywhere_and_tombstoned_only_where_its_partition_is_owned() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = two_partitions(dir.path(), backend);
            store.own_partitions(&[0, 1]).expect("own");
            for key in ["p0-a", "p1-a"] {
                put(&store, key, &completed(50));
            }
            store.let_go_partitions(&[1]);
            store.take_changes();
            assert_eq!(store.compact_expired(100, 10).expect("compact"), 2, "{backend}: both removed");
            assert_eq!(store.get("p1-a").expect("get"), None, "{backend}");
            assert_eq!(tombstones(&store.take_changes()), vec!["p0-a"], "{backend}: only the written partition's");
            assert!(!store.has_changes(), "{backend}");
        }
    }

    #[test]
    fn letting_a_partition_go_drops_its_captured_expiry_tombstones_and_nothing_else() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = two_partitions(dir.path(), backend);
            store.own_partitions(&[0, 1]).expect("own");
            for key in ["p0-a", "p1-a"] {
                put(&store, key, &completed(50));
            }
            put(&store, "p1-c", &completed(150));
            store.take_changes();
            store.compact_expired(100, 10).expect("compact");
            // A claim's put-back tombstone of partition 1 is not an expiry: it stays.
            put(&store, "p1-b", &completed(FAR));
            store.compare_and_swap("p1-b", Some(&completed(FAR)), None).expect("cas").expect("swapped");
            assert_eq!(store.let_go_partitions(&[1]), 1, "{backend}");
            let changes = store.take_changes();
            assert_eq!(tombstones(&changes), vec!["p0-a", "p1-b"], "{backend}");
            assert_eq!(store.compact_expired(200, 10).expect("compact"), 1, "{backend}: p1-c removed");
            assert!(!store.has_changes(), "{backend}: partition 1's expiries no longer captured");
        }
    }

    #[test]
    fn no_compaction_runs_while_a_restore_does() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = two_partitions(dir.path(), backend);
            store.own_partitions(&[0]).expect("own");
            put(&store, "p0-a", &completed(50));
            {
                let _restoring = store.restoring();
                assert_eq!(store.compact_expired(100, 10).expect("compact"), 0, "{backend}");
                assert!(store.get("p0-a").expect("get").is_some(), "{backend}: kept while restoring");
            }
            assert_eq!(store.compact_expired(100, 10).expect("compact"), 1, "{backend}: once it ended");
        }
    }

    #[test]
    fn keys_a_restore_found_expired_get_their_tombstone_once_the_partition_is_written() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = two_partitions(dir.path(), backend);
            let read = vec![
                Change { key: "p0-old".into(), value: Some(completed(50).encode()) },
                Change { key: "p0-again".into(), value: Some(completed(50).encode()) },
                Change { key: "p0-again".into(), value: Some(completed(FAR).encode()) },
                Change { key: "p0-gone".into(), value: Some(completed(50).encode()) },
                Change { key: "p0-gone".into(), value: None },
            ];
            let mut expired = HashSet::new();
            store.restore_batch(("log", 0), read, 5, 100, &mut expired).expect("restore");
            assert_eq!(expired, HashSet::from(["p0-old".to_string()]), "{backend}: the last record of each");
            assert_eq!(store.write_restored_expiries(expired.clone()).expect("write"), 0, "{backend}: not yet written");
            store.own_partitions(&[0]).expect("own");
            assert_eq!(store.write_restored_expiries(expired).expect("write"), 1, "{backend}");
            assert_eq!(tombstones(&store.take_changes()), vec!["p0-old"], "{backend}");
        }
    }
}

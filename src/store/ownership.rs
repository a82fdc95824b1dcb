//! Which state partitions this store owns (`store.changelog`, with one instance or several):
//! a key's record is this store's to write only while it owns the key's state partition.
//! Continuing the invariants of `changelog` and `expiries`:
//! 8. Every write that captures a change ([`KeyStore::compare_and_swap`] and what is built
//!    on it, claims, completions) checks under the shared gate that the store owns the
//!    key's partition, and is refused with [`StoreError::NotOwned`] otherwise, with nothing
//!    written. Ownership changes only under the exclusive gate
//!    ([`KeyStore::own_partitions`], [`KeyStore::let_go_partitions`]). So a write is made
//!    either before its partition is let go, and then captured in time for the commit that
//!    lets the partition go (the pipeline sends every captured change in it), or not at
//!    all. A worker still at its sink when its partition moved (past the drain bound), the
//!    reconciler, or an operator's write racing a revoke can never write the changelog
//!    after the new owner restored it, nor make this copy differ from it.
//!
//! Records read back from the changelog (a restore, a standby) are the changelog's, not
//! this store's writes, and are not checked (invariant 2). A store that is no changelog's
//! cache owns every key (a store alone).

use std::collections::BTreeSet;

use super::writing::{CacheOf, WritingFile};
use super::{KeyStore, StoreError};

/// The state partitions a store owns, how keys map to them, and the file naming those it
/// may hold uncommitted changes of (`writing`).
pub(super) struct Scope {
    of: CacheOf,
    pub(super) owned: BTreeSet<i32>,
    pub(super) writing: WritingFile,
}

impl Scope {
    /// The state partition of `key`.
    pub(super) fn partition(&self, key: &str) -> i32 {
        (self.of.partition_of)(key)
    }

    /// Whether the store owns `key`'s partition.
    pub(super) fn owns(&self, key: &str) -> bool {
        self.owned.contains(&self.partition(key))
    }
}

impl KeyStore {
    /// From now on the store owns the keys of the partitions of `of` that
    /// [`KeyStore::own_partitions`] names (none yet): no other key's record is written, and
    /// no other key's expiry tombstone captured; `writing` names those it owns.
    pub(super) fn owned_by_partition(&self, of: CacheOf, writing: WritingFile) {
        self.changes.lock().scope = Some(Scope { of, owned: BTreeSet::new(), writing });
    }

    /// The store owns `partitions` from now on (restored: invariant 8 and `expiries`,
    /// invariant 5), named in its `writing` file first (invariant 9).
    pub fn own_partitions(&self, partitions: &[i32]) -> Result<(), StoreError> {
        let _gate = self.locks.exclusive();
        if let Some(scope) = &mut self.changes.lock().scope {
            scope.writing.add(partitions)?;
            scope.owned.extend(partitions);
        }
        Ok(())
    }

    /// The store no longer owns `partitions`: a write of one of their keys that did not
    /// start before this call is refused (invariant 8), and their expiry tombstones captured
    /// and not yet taken are dropped (`expiries`, invariant 5). What else was captured stays,
    /// for the commit that lets them go. Returns how many tombstones were dropped.
    pub fn let_go_partitions(&self, partitions: &[i32]) -> usize {
        let _gate = self.locks.exclusive();
        let mut captured = self.changes.lock();
        let Some(scope) = &mut captured.scope else { return 0 };
        for p in partitions {
            scope.owned.remove(p);
        }
        captured.drop_expiries_not_owned()
    }

    /// Keeps of `items` those whose key (`key_of`) the store owns, under one look at the
    /// ownership (invariant 8), and says why the first other one is refused; call it under
    /// the shared gate, before writing anything.
    pub(super) fn owned_only<T>(&self, items: Vec<T>, key_of: impl Fn(&T) -> &str) -> (Vec<T>, Option<StoreError>) {
        if !self.changes.is_on() {
            return (items, None);
        }
        let captured = self.changes.lock();
        let Some(scope) = &captured.scope else { return (items, None) };
        let mut refused = None;
        let owned = items
            .into_iter()
            .filter(|item| {
                let key = key_of(item);
                let owns = scope.owns(key);
                if !owns && refused.is_none() {
                    refused = Some(StoreError::NotOwned { key: key.to_string(), partition: scope.partition(key) });
                }
                owns
            })
            .collect();
        (owned, refused)
    }

    /// Refuses a write of any of `keys` whose partition the store does not own (invariant
    /// 8); call it under the shared gate, before writing anything.
    pub(super) fn check_owned<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Result<(), StoreError> {
        if !self.changes.is_on() {
            return Ok(());
        }
        let captured = self.changes.lock();
        let Some(scope) = &captured.scope else { return Ok(()) };
        match keys.into_iter().find(|key| !scope.owns(key)) {
            Some(key) => Err(StoreError::NotOwned { key: key.to_string(), partition: scope.partition(key) }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, StoreBackend, StoreConfig};

    /// An expiry far ahead (year 2096).
    const FAR: i64 = 4_000_000_000_000;

    /// A cache store whose keys `p0-…` are on partition 0 and `p1-…` on partition 1, owning
    /// both.
    fn two_partitions(dir: &std::path::Path, backend: StoreBackend) -> KeyStore {
        let config = StoreConfig { backend, path: dir.to_path_buf(), ..StoreConfig::default() };
        let (store, _) = KeyStore::open_as_cache(&config, crate::store::tests::two_partitions()).expect("open");
        store.own_partitions(&[0, 1]).expect("own");
        store
    }

    fn claim() -> crate::store::InProgress {
        crate::store::tests::in_progress(1, 1)
    }

    fn completed() -> crate::store::Completed {
        crate::store::tests::completed(1, FAR)
    }

    fn not_owned(e: StoreError) -> (String, i32) {
        match e {
            StoreError::NotOwned { key, partition } => (key, partition),
            other => panic!("expected NotOwned, got {other:?}"),
        }
    }

    #[test]
    fn a_let_go_partitions_keys_are_not_written_and_what_came_before_is_kept_for_the_commit() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = two_partitions(dir.path(), backend);
            let pending = store.claim("p1-a", None, claim()).expect("claim").expect("won");
            let durable = store.flush_claims(vec![pending]).expect("flush").pop().expect("one");
            store.let_go_partitions(&[1]);

            // The claim captured before the let-go stays, for the commit that lets it go.
            let before = store.take_changes();
            assert_eq!(before.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), vec!["p1-a"], "{backend}");

            // A late completion, a put-back, an operator's forget, a new claim: all refused.
            let late = store.complete(durable, completed()).expect_err("a late completion");
            assert_eq!(not_owned(late), ("p1-a".to_string(), 1), "{backend}");
            let mine = Record::InProgress(claim());
            assert_eq!(
                not_owned(store.compare_and_swap("p1-a", Some(&mine), None).expect_err("put-back")).1,
                1,
                "{backend}"
            );
            assert_eq!(not_owned(store.forget("p1-a").expect_err("forget")).1, 1, "{backend}");
            assert_eq!(not_owned(store.claim("p1-b", None, claim()).expect_err("claim")).1, 1, "{backend}");

            // Nothing written: the copy still holds the claim, and nothing was captured.
            assert_eq!(store.get("p1-a").expect("get"), Some(mine), "{backend}");
            assert_eq!(store.get("p1-b").expect("get"), None, "{backend}");
            assert!(!store.has_changes(), "{backend}: nothing captured after the let-go");

            // The partition still owned is written as before; owned again, so is the other.
            store.compare_and_swap("p0-a", None, Some(&Record::Completed(completed()))).expect("cas").expect("swapped");
            store.own_partitions(&[1]).expect("own");
            store.compare_and_swap("p1-b", None, Some(&Record::Completed(completed()))).expect("cas").expect("swapped");
            let keys: Vec<String> = store.take_changes().into_iter().map(|c| c.key).collect();
            assert_eq!(keys, vec!["p0-a".to_string(), "p1-b".to_string()], "{backend}");
        }
    }

    #[test]
    fn a_completion_batch_writes_its_owned_keys_and_refuses_the_others() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = two_partitions(dir.path(), backend);
            let claims: Vec<_> = ["p0-a", "p1-a"]
                .into_iter()
                .map(|key| store.claim(key, None, claim()).expect("claim").expect("won"))
                .collect();
            let durable = store.flush_claims(claims).expect("flush");
            store.take_changes();
            store.let_go_partitions(&[1]);
            let items = durable.into_iter().map(|c| (c, completed())).collect();
            assert_eq!(not_owned(store.complete_batch(items).expect_err("one refused")).0, "p1-a", "{backend}");
            assert_eq!(store.get("p0-a").expect("get"), Some(Record::Completed(completed())), "{backend}");
            assert_eq!(store.get("p1-a").expect("get"), Some(Record::InProgress(claim())), "{backend}");
            let keys: Vec<String> = store.take_changes().into_iter().map(|c| c.key).collect();
            assert_eq!(keys, vec!["p0-a".to_string()], "{backend}");
        }
    }

    #[test]
    fn a_store_alone_owns_every_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = StoreConfig { path: dir.path().to_path_buf(), ..StoreConfig::default() };
        let store = KeyStore::open_configured(&config).expect("open");
        store.let_go_partitions(&[0, 1]);
        store.compare_and_swap("p1-a", None, Some(&Record::Completed(completed()))).expect("cas").expect("swapped");
    }
}

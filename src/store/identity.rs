//! The store's identity: a random id made when the store is first opened and kept in its
//! metadata for the store's life.
//!
//! Why the store names the instance: dedupd's state is the store, and the consumer group
//! must give a partition back to the process that holds that partition's store. The id is
//! the default Kafka `group.instance.id` (static membership), so a process restarted on the
//! same store rejoins as the same member and gets its partitions back at once, instead of
//! waiting out the dead member's session. Two processes cannot open one store (its lock),
//! so two live members never share an id; a copy of the store (a backup restored beside
//! the original) does share it, and Kafka then fences one of them, which is what should
//! happen to two processes claiming the same history.

use super::{KeyStore, Op, StoreError, Tree};

const IDENTITY_KEY: &[u8] = b"identity";

impl KeyStore {
    /// The store's id (16 hex digits), made and flushed on first use.
    pub fn identity(&self) -> Result<String, StoreError> {
        if let Some(id) = self.backend.get(Tree::Meta, IDENTITY_KEY)? {
            return String::from_utf8(id).map_err(|_| StoreError::Corrupt {
                key: "store identity".into(),
                source: super::record::DecodeError("not UTF-8".into()),
            });
        }
        let id = format!("{:016x}", rand::random::<u64>());
        self.set_identity(&id)?;
        Ok(id)
    }

    /// Makes `id` the store's identity, flushed (a store rebuilt in place keeps its old one).
    pub(super) fn set_identity(&self, id: &str) -> Result<(), StoreError> {
        self.backend.apply(vec![Op::Put(Tree::Meta, IDENTITY_KEY.to_vec(), id.as_bytes().to_vec())])?;
        self.backend.flush()
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{KeyStore, StoreBackend, SyncMode};

    #[test]
    fn the_identity_is_made_once_and_kept_across_opens() {
        for &kind in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let first = {
                let store = KeyStore::open(kind, dir.path(), SyncMode::Batch).expect("open");
                let id = store.identity().expect("identity");
                assert_eq!(store.identity().expect("identity again"), id, "{kind}");
                id
            };
            assert_eq!(first.len(), 16, "{kind}: {first}");
            let store = KeyStore::open(kind, dir.path(), SyncMode::Batch).expect("reopen");
            assert_eq!(store.identity().expect("identity after reopen"), first, "{kind}");
            let other = tempfile::tempdir().expect("tempdir");
            let other = KeyStore::open(kind, other.path(), SyncMode::Batch).expect("open other");
            assert_ne!(other.identity().expect("other identity"), first, "{kind}: two stores, two ids");
        }
    }
}

//! A store held by another handle is refused with [`StoreError::Locked`], decided by each
//! backend from its engine's error type (the CLI relies on it to point at `--admin`).

use super::*;

each_backend!(a_held_store_is_refused_as_locked);

fn a_held_store_is_refused_as_locked(kind: StoreBackend) {
    let held = Fixture::new(kind);
    match KeyStore::open(kind, held.dir.path(), SyncMode::Batch) {
        Err(StoreError::Locked { backend, path }) => {
            assert_eq!(backend, kind.name());
            assert_eq!(path, held.dir.path());
        }
        Err(other) => panic!("expected Locked, got {other}"),
        Ok(_) => panic!("opened a store another handle holds"),
    }
    // Released with its holder.
    let Fixture { dir, store, .. } = held;
    drop(store);
    KeyStore::open(kind, dir.path(), SyncMode::Batch).expect("open once released");
}

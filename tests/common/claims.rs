//! Durable claims for tests that call a sink directly: a `SinkRequest` can only be built
//! from a claim that reached the disk, so these tests claim their keys in a real store, as
//! the engine does.

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{DurableClaim, InProgress, KeyStore, SourcePos};
use dedupd::store::{StoreBackend, SyncMode};

/// Durable claims of `keys` (each absent before), made in a fresh temporary store. The
/// claims outlive the store: a sink reads only the key from one.
pub fn durable_claims(keys: &[&str]) -> Vec<DurableClaim> {
    durable_claims_at(keys, 0)
}

/// Like [`durable_claims`], each first claimed at `claimed_at_ms` (Unix ms): for a check,
/// which looks for the effect from the claim time on.
pub fn durable_claims_at(keys: &[&str], claimed_at_ms: i64) -> Vec<DurableClaim> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = KeyStore::open(StoreBackend::Sled, dir.path(), SyncMode::Batch).expect("open a store");
    let pending = keys
        .iter()
        .map(|key| {
            let claim = InProgress {
                fingerprint: Fingerprint([0; 32]),
                claimed_at_ms,
                attempts: 1,
                source: SourcePos::default(),
                held: None,
            };
            store.claim(key, None, claim).expect("claim").expect("the key was absent")
        })
        .collect();
    store.flush_claims(pending).expect("flush the claims")
}

/// A durable claim of `key`, made in a fresh temporary store.
pub fn durable_claim(key: &str) -> DurableClaim {
    durable_claims(&[key]).pop().expect("one claim")
}

/// A durable claim of `key` first claimed at `claimed_at_ms` (Unix ms).
pub fn durable_claim_at(key: &str, claimed_at_ms: i64) -> DurableClaim {
    durable_claims_at(&[key], claimed_at_ms).pop().expect("one claim")
}

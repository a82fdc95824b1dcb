//! The store floor shared by the benches: what the store alone does per command, with no
//! engine and no Kafka around it.

use std::time::Instant;

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{ClaimRequest, Completed, Completion, InProgress, KeyStore, SourcePos};
use dedupd::store::{StoreBackend, SyncMode};

/// The store floor: claim + flush + complete_batch + flush in batches of 500, as the engine does.
pub fn store_floor(backend: StoreBackend, n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store");
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + 500).min(n);
        let mut pending = Vec::with_capacity(500);
        for k in i..end {
            let key = format!("bench-{k}");
            let claim = InProgress {
                fingerprint: Fingerprint([7; 32]),
                claimed_at_ms: 1,
                attempts: 1,
                source: SourcePos { topic: "in".into(), partition: 0, offset: k as i64 },
                held: None,
            };
            let (expected, stamp) = store.get_stamped(&key).expect("read");
            pending.push(ClaimRequest { key, expected, stamp, claim });
        }
        let claimed = store.claim_batch(pending).expect("claim").into_iter().map(|r| r.expect("won")).collect();
        let durable = store.flush_claims(claimed).expect("flush");
        // As the engine does for a round: one complete_batch, then one flush.
        let done = durable
            .into_iter()
            .map(|d| {
                let c = Completed {
                    fingerprint: Fingerprint([7; 32]),
                    outcome: Completion::Succeeded,
                    result: b"{}".to_vec(),
                    error: None,
                    first_seen_at_ms: 1,
                    completed_at_ms: 2,
                    expires_at_ms: 86_400_000,
                    attempts: 1,
                    // As the engine stores it: the claim's source.
                    source: Some(d.record().source.clone()),
                    settled: None,
                };
                (d, c)
            })
            .collect();
        store.complete_batch(done).expect("complete");
        store.flush().expect("flush");
        i = end;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

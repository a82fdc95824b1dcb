//! Group commit across partitions: the claims (and then the completions) of every
//! partition pending at one moment become durable with one fsync of the claim journal (one
//! flush of the store), not one per partition.
//!
//! Six partitions' batches run at once. The first claim fsync is held at the `journal.fsync`
//! failpoint (`pause`) until every partition has written its claims; the first store flush
//! is held at `store.flush` until every partition has written its completions. Then the
//! store's own count of fsyncs ([`KeyStore::fsyncs`], exported as
//! `dedupd_store_fsyncs_total`) says how many durable writes the twelve durability points
//! (six claim flushes, six completion flushes) took: the held one and one more for the
//! others, per file. Needs the `failpoints` feature.
#![cfg(feature = "failpoints")]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::engine::{ManualClock, ScriptedSink, item, router, test_retry};
use dedupd::engine::{Engine, EngineParts, Item, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::store::{Fsyncs, KeyStore, StoreBackend, SyncMode};
use tokio_util::sync::CancellationToken;

const PARTITIONS: usize = 6;
const KEYS_PER_PARTITION: usize = 4;

/// Polls `done` every millisecond until it holds or ten seconds pass; returns whether it held.
async fn poll_until(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

async fn one_fsync_carries_every_partition(backend: StoreBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store"));
    let sink = Arc::new(ScriptedSink::new("s", false));
    let engine = Arc::new(
        Engine::new(EngineParts {
            store: Arc::clone(&store),
            router: Arc::new(router(Duration::from_secs(3600))),
            sinks: HashMap::from([("s".to_string(), sink.as_sink())]),
            max_in_flight: PARTITIONS * KEYS_PER_PARTITION,
            retry: test_retry(),
            stale_guard: true,
            clock: Arc::new(ManualClock::new(1_000_000)),
        })
        .expect("engine"),
    );
    let before = store.fsyncs();
    fail::cfg("journal.fsync", "pause").expect("failpoint");
    fail::cfg("store.flush", "pause").expect("failpoint");
    let ttl = Duration::from_secs(3600);
    let batches: Vec<tokio::task::JoinHandle<Vec<ItemResult>>> = (0..PARTITIONS)
        .map(|p| {
            let items: Vec<Item> =
                (0..KEYS_PER_PARTITION).map(|i| item(&format!("p{p}-k{i}"), 1, 1_000_000, ttl, i as i64)).collect();
            let engine = Arc::clone(&engine);
            tokio::spawn(async move { engine.process_batch(&items, &CancellationToken::new()).await.expect("batch") })
        })
        .collect();
    let all = (PARTITIONS * KEYS_PER_PARTITION) as i64;

    // Every partition's claims are written while the first fsync is held.
    let claimed = poll_until(|| store.counts().in_progress == all).await;
    fail::remove("journal.fsync");
    assert!(claimed, "{backend:?}: only {} claims written", store.counts().in_progress);
    // Every partition's completions are written while the first store flush is held.
    let completed = poll_until(|| store.counts().completed == all).await;
    fail::remove("store.flush");
    assert!(completed, "{backend:?}: only {} completions written", store.counts().completed);

    for batch in batches {
        for r in batch.await.expect("batch task") {
            match r {
                ItemResult::Done(p) => assert_eq!(p.result.outcome, Outcome::Succeeded, "{backend:?}"),
                ItemResult::Abandoned => panic!("{backend:?}: abandoned"),
            }
        }
    }
    assert_eq!(sink.effects().len(), PARTITIONS * KEYS_PER_PARTITION, "{backend:?}: one call per key");
    let after = store.fsyncs();
    let made = Fsyncs { journal: after.journal - before.journal, store: after.store - before.store };
    println!("{backend:?}: {PARTITIONS} partitions, 12 durability points: {made:?}");
    // The held fsync, and one more for everything written meanwhile (or none more, if every
    // claim was written before the first fsync read the journal's end).
    assert!((1..=2).contains(&made.journal), "{backend:?}: claim journal fsyncs {made:?}");
    assert!((1..=2).contains(&made.store), "{backend:?}: store flushes {made:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fsync_carries_the_claims_of_every_partition_waiting() {
    let scenario = fail::FailScenario::setup();
    for backend in StoreBackend::ALL {
        one_fsync_carries_every_partition(*backend).await;
    }
    scenario.teardown();
}

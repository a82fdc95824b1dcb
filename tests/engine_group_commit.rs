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

use std::sync::Arc;
use std::time::Duration;

use common::engine::{ScriptedSink, engine_with, poll_until, spawn_partition_batches};
use dedupd::engine::ItemResult;
use dedupd::outcome::Outcome;
use dedupd::store::{Fsyncs, KeyStore, StoreBackend, SyncMode};

const PARTITIONS: usize = 6;
const KEYS_PER_PARTITION: usize = 4;

async fn one_fsync_carries_every_partition(backend: StoreBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store"));
    let sink = Arc::new(ScriptedSink::new("s", false));
    let engine = Arc::new(engine_with(Arc::clone(&store), sink.as_sink(), PARTITIONS * KEYS_PER_PARTITION));
    let before = store.fsyncs();
    fail::cfg("journal.fsync", "pause").expect("failpoint");
    fail::cfg("store.flush", "pause").expect("failpoint");
    let batches = spawn_partition_batches(&engine, PARTITIONS, KEYS_PER_PARTITION);
    let all = (PARTITIONS * KEYS_PER_PARTITION) as i64;

    // Every partition's claims are written while the first fsync is held.
    let claimed = poll_until(Duration::from_secs(10), || store.counts().in_progress == all).await;
    fail::remove("journal.fsync");
    assert!(claimed, "{backend:?}: only {} claims written", store.counts().in_progress);
    // Every partition's completions are written while the first store flush is held.
    let completed = poll_until(Duration::from_secs(10), || store.counts().completed == all).await;
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

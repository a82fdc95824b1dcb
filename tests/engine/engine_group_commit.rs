//! Group commit across partitions: the claims (and then the completions) of every
//! partition pending at one moment become durable with one fsync of the claim journal (one
//! flush of the store), not one per partition.
//!
//! Six partitions' batches run at once. The first claim fsync is held at the `journal.fsync`
//! failpoint (`pause`) until every partition has written its claims; every store flush is
//! held at `store.flush` (a callback that counts its callers) until every partition has
//! come to flush its completions: written completions are not enough, as a partition asks
//! for its flush a moment after writing them, and one that came after the release paid a
//! flush of its own (found by a clean-clone run on a busy machine). Then the store's own
//! count of fsyncs ([`KeyStore::fsyncs`], exported as `dedupd_store_fsyncs_total`) says how
//! many durable writes the twelve durability points (six claim flushes, six completion
//! flushes) took: for the claim journal the held one and one more for the others, for the
//! store one. Needs the `failpoints` feature.
#![cfg(feature = "failpoints")]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::engine::{ScriptedSink, engine_with, poll_until, spawn_partition_batches};
use dedupd::engine::ItemResult;
use dedupd::outcome::Outcome;
use dedupd::store::{Fsyncs, KeyStore, StoreBackend, SyncMode};

const PARTITIONS: usize = 6;
const KEYS_PER_PARTITION: usize = 4;

/// Callers held at `store.flush`, and whether they may go on.
static FLUSH_CALLERS: AtomicUsize = AtomicUsize::new(0);
static FLUSHES_RELEASED: AtomicBool = AtomicBool::new(false);

/// Holds every store flush until `FLUSHES_RELEASED` (or 30 s, so that no thread waits forever),
/// counting the callers held.
fn hold_store_flushes() {
    FLUSH_CALLERS.store(0, Ordering::SeqCst);
    FLUSHES_RELEASED.store(false, Ordering::SeqCst);
    fail::cfg_callback("store.flush", || {
        FLUSH_CALLERS.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !FLUSHES_RELEASED.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .expect("failpoint");
}

async fn one_fsync_carries_every_partition(backend: StoreBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store"));
    let sink = Arc::new(ScriptedSink::new("s", false));
    let engine = Arc::new(engine_with(Arc::clone(&store), sink.as_sink(), PARTITIONS * KEYS_PER_PARTITION));
    let before = store.fsyncs();
    fail::cfg("journal.fsync", "pause").expect("failpoint");
    hold_store_flushes();
    let batches = spawn_partition_batches(&engine, PARTITIONS, KEYS_PER_PARTITION);
    let all = (PARTITIONS * KEYS_PER_PARTITION) as i64;

    // Every partition's claims are written while the first fsync is held.
    let claimed = poll_until(Duration::from_secs(10), || store.counts().in_progress == all).await;
    fail::remove("journal.fsync");
    assert!(claimed, "{backend:?}: only {} claims written", store.counts().in_progress);
    // Every partition has come to flush its completions while the store's flushes are held.
    let waiting = poll_until(Duration::from_secs(10), || FLUSH_CALLERS.load(Ordering::SeqCst) == PARTITIONS).await;
    FLUSHES_RELEASED.store(true, Ordering::SeqCst);
    fail::remove("store.flush");
    assert!(waiting, "{backend:?}: {} of {PARTITIONS} partitions came to flush", FLUSH_CALLERS.load(Ordering::SeqCst));
    assert_eq!(store.counts().completed, all, "{backend:?}: completions written");

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
    // Every caller came before any flush started: the first one's flush is everyone's.
    assert_eq!(made.store, 1, "{backend:?}: store flushes {made:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fsync_carries_the_claims_of_every_partition_waiting() {
    let scenario = fail::FailScenario::setup();
    for backend in StoreBackend::ALL {
        one_fsync_carries_every_partition(*backend).await;
    }
    scenario.teardown();
}

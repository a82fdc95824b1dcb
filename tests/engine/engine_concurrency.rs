//! Two partitions carrying the same commands in opposite orders, processed at the same
//! time. Each batch marks its keys as executing here before it writes their claims (one
//! write per round), so each can see keys the other is about to claim with no record in
//! the store yet. That must mean "wait for it", never "decide again" in a loop: the two
//! batches once spun on each other's keys forever (the demo hung).

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::engine::{ManualClock, ScriptedSink, item, router, test_retry};
use dedupd::engine::{Engine, EngineParts, Item, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::sinks::Sink;
use dedupd::store::KeyStore;
use dedupd::store::{StoreBackend, SyncMode};
use tokio_util::sync::CancellationToken;

const KEYS: usize = 200;
const TRIALS: usize = 15;

fn outcomes(results: &[ItemResult]) -> Vec<Outcome> {
    results
        .iter()
        .map(|r| match r {
            ItemResult::Done(p) => p.result.outcome,
            ItemResult::Abandoned => panic!("abandoned"),
        })
        .collect()
}

/// One trial: returns the sink's effects and both batches' outcomes.
fn trial(backend: StoreBackend) -> (Vec<(String, i64)>, Vec<Outcome>, Vec<Outcome>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).unwrap());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let sink = Arc::new(ScriptedSink::new("s", true));
    let mut sinks: HashMap<String, Arc<Sink>> = HashMap::new();
    sinks.insert("s".into(), sink.as_sink());
    let engine = Arc::new(
        Engine::new(EngineParts {
            store,
            router: Arc::new(router(Duration::from_secs(3600))),
            sinks,
            max_in_flight: KEYS,
            retry: test_retry(),
            stale_guard: true,
            clock,
        })
        .unwrap(),
    );
    let ttl = Duration::from_secs(3600);
    let forward: Vec<Item> = (0..KEYS).map(|i| item(&format!("k{i}"), 1, 1_000_000, ttl, i as i64)).collect();
    // The same commands read a second time from other offsets (repeats, not one record
    // read twice).
    let backward: Vec<Item> =
        (0..KEYS).rev().map(|i| item(&format!("k{i}"), 1, 1_000_000, ttl, (KEYS + i) as i64)).collect();
    // Each batch on its own thread and runtime, released together: tasks of one runtime
    // woken by each other would often run one after the other on the same worker.
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let run = |items: Vec<Item>| {
        let (engine, barrier) = (Arc::clone(&engine), Arc::clone(&barrier));
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            barrier.wait();
            rt.block_on(engine.process_batch(&items, &CancellationToken::new())).expect("batch")
        })
    };
    let (a, b) = (run(forward), run(backward));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    (sink.effects(), outcomes(&a), outcomes(&b))
}

#[test]
fn batches_sharing_keys_in_opposite_orders_finish_and_execute_each_key_once() {
    for &backend in StoreBackend::ALL {
        for n in 0..TRIALS {
            // A livelock spins on the batches' threads: the watchdog is this one.
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(trial(backend));
            });
            let (effects, a, b) = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{backend:?} trial {n}: the two batches did not finish within 60 s"));
            let mut per_key: HashMap<String, usize> = HashMap::new();
            for (key, _) in &effects {
                *per_key.entry(key.clone()).or_default() += 1;
            }
            assert_eq!(per_key.len(), KEYS, "{backend:?} trial {n}: every key ran");
            assert!(per_key.values().all(|c| *c == 1), "{backend:?} trial {n}: a key ran twice: {per_key:?}");
            // Per key: one batch executed it, the other replayed that result.
            for i in 0..KEYS {
                let pair = [a[i], b[KEYS - 1 - i]];
                assert!(
                    pair.contains(&Outcome::Succeeded) && pair.contains(&Outcome::Duplicate),
                    "{backend:?} trial {n}: key k{i} got {pair:?}"
                );
            }
        }
    }
}

//! Overlapping rounds (src/engine/batch.rs): a round's claims and the previous round's
//! completions become durable at one durability point, and the previous round's keys are
//! held until then. A batch of 12 fresh keys (and a repeat) behind `max_in_flight = 4`
//! runs in four rounds; the claims of rounds two to four each carry the completions of the
//! round before. Observed from inside that durability point (the `claim.appended_with_completions`
//! crash point, with a callback instead of a kill): the previous round's completions are
//! written, its keys still held, this round's claims written. Needs the `failpoints` feature.
#![cfg(feature = "failpoints")]

use crate::common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::engine::{ScriptedSink, engine_with, item};
use dedupd::engine::{Engine, Item, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::store::{KeyStore, StoreBackend, SyncMode};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 12;
const MAX_IN_FLIGHT: usize = 4;

/// The store and engine as seen at one durability point that carries completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AtTheDurabilityPoint {
    completed: i64,
    in_progress: i64,
    keys_held: usize,
}

async fn claims_carry_the_previous_rounds_completions(backend: StoreBackend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store"));
    let sink = Arc::new(ScriptedSink::new("s", false));
    let engine = Arc::new(engine_with(Arc::clone(&store), sink.as_sink(), MAX_IN_FLIGHT));
    let seen: Arc<Mutex<Vec<AtTheDurabilityPoint>>> = Arc::new(Mutex::new(Vec::new()));
    let for_callback: Arc<OnceLock<Arc<Engine>>> = Arc::new(OnceLock::new());
    let _ = for_callback.set(Arc::clone(&engine));
    {
        let (seen, store, engine) = (Arc::clone(&seen), Arc::clone(&store), Arc::clone(&for_callback));
        fail::cfg_callback("claim.appended_with_completions", move || {
            let counts = store.counts();
            let keys_held = engine.get().map_or(0, |e| e.in_flight());
            seen.lock().push(AtTheDurabilityPoint {
                completed: counts.completed,
                in_progress: counts.in_progress,
                keys_held,
            });
        })
        .expect("failpoint callback");
    }

    let ttl = Duration::from_secs(3600);
    // Twelve fresh keys, then a repeat of the first (replayed from its completion).
    let mut items: Vec<Item> = (0..KEYS).map(|i| item(&format!("k{i}"), 1, 1_000_000, ttl, i as i64)).collect();
    items.push(item("k0", 1, 1_000_000, ttl, KEYS as i64));
    let report = engine.process_batch_reporting_flush(&items, &CancellationToken::new()).await.expect("batch");
    fail::remove("claim.appended_with_completions");

    // Heads are taken per key in order of first appearance, so the repeat of k0 is a head
    // of round two, replayed from k0's completion (written, not yet durable: its result is
    // returned only after the batch's last flush) while k0 is still held. Round two
    // therefore claims k4–k6, round three k7–k10, round four k11.
    let point = |completed, in_progress, keys_held| AtTheDurabilityPoint { completed, in_progress, keys_held };
    let want = vec![
        // k0–k3 completed and held, k4–k6 claimed.
        point(4, 3, 4 + 3),
        // k4–k6 completed and held, k7–k10 claimed.
        point(7, 4, 3 + 4),
        // k7–k10 completed and held, k11 claimed.
        point(11, 1, 4 + 1),
    ];
    assert_eq!(*seen.lock(), want, "{backend:?}: every round after the first carries completions");
    assert!(report.flushed, "{backend:?}");
    for (i, r) in report.results.iter().enumerate() {
        match r {
            ItemResult::Done(p) if i < KEYS => assert_eq!(p.result.outcome, Outcome::Succeeded, "{backend:?} item {i}"),
            ItemResult::Done(p) => assert_eq!(p.result.outcome, Outcome::Duplicate, "{backend:?}: the repeat"),
            ItemResult::Abandoned => panic!("{backend:?}: item {i} abandoned"),
        }
    }
    let mut effects: Vec<String> = sink.effects().into_iter().map(|(key, _)| key).collect();
    effects.sort();
    let mut want_effects: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    want_effects.sort();
    assert_eq!(effects, want_effects, "{backend:?}: one call per key");
    assert_eq!(engine.in_flight(), 0, "{backend:?}: every key let go");
    assert_eq!(store.counts().completed, KEYS as i64, "{backend:?}");
    assert_eq!(store.counts().in_progress, 0, "{backend:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_claims_carry_the_previous_rounds_completions() {
    let scenario = fail::FailScenario::setup();
    for backend in StoreBackend::ALL {
        claims_carry_the_previous_rounds_completions(*backend).await;
    }
    scenario.teardown();
}

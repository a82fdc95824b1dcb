//! One command whose calls always fail transiently, among commands of the same sink that
//! succeed, cannot hold the sink's circuit open (docs/sinks.md, "Circuit breaker and
//! backpressure"): it ends `failed` within `retry.max_attempts`, and the sink's other
//! commands, of its batch and of later batches, go on.
//!
//! Time is tokio's paused clock. Run with `cargo test --test engine circuit_lone_command::`.

use crate::common;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use common::engine::{ManualClock, item, router};
use dedupd::engine::{Engine, EngineParts, Item, ItemResult, RetryConfig};
use dedupd::outcome::Outcome;
use dedupd::sinks::circuit::CircuitConfig;
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{Completion, KeyStore, Record};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(3600);
const MAX_ATTEMPTS: u32 = 5;
/// Far more than the failing command's retries take: a batch still running then is stuck.
const STUCK: Duration = Duration::from_secs(600);

/// A sink on which the key `bad` always fails transiently; other keys fail transiently
/// until `others_up_at`, then succeed.
struct OneBadKey {
    others_up_at: Instant,
    /// Every call: (key, whether it did the effect).
    calls: Mutex<Vec<(String, bool)>>,
}

#[async_trait::async_trait]
impl SinkEffect for OneBadKey {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let ok = request.key() != "bad" && Instant::now() >= self.others_up_at;
        self.calls.lock().push((request.key().to_string(), ok));
        if ok {
            Ok(serde_json::json!({"done": request.key()}))
        } else {
            Err(SinkError::Transient { message: "HTTP 503".into(), retry_after: None })
        }
    }
}

fn engine(store: &Arc<KeyStore>, sink: Arc<Sink>) -> Engine {
    let mut sinks: HashMap<String, Arc<Sink>> = HashMap::new();
    sinks.insert("s".into(), sink);
    Engine::new(EngineParts {
        store: store.clone(),
        router: Arc::new(router(TTL)),
        sinks,
        max_in_flight: 8,
        retry: RetryConfig {
            max_attempts: NonZeroU32::new(MAX_ATTEMPTS).expect("nonzero"),
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
        },
        stale_guard: true,
        clock: Arc::new(ManualClock::new(1_700_000_000_000)),
    })
    .expect("engine")
}

/// The sink with the default threshold's shape: fewer different keys than it would need.
fn sink(effect: &Arc<OneBadKey>) -> Arc<Sink> {
    let circuit = CircuitConfig {
        enabled: true,
        failure_threshold: NonZeroU32::new(3).expect("nonzero"),
        probe_backoff: Duration::from_millis(100),
        max_probe_backoff: Duration::from_millis(400),
    };
    Arc::new(Sink::new("s", true, effect.clone()).with_circuit(&circuit))
}

fn batch(keys: &[&str], first_offset: i64) -> Vec<Item> {
    keys.iter().enumerate().map(|(i, k)| item(k, 1, 1_700_000_000_000, TTL, first_offset + i as i64)).collect()
}

fn outcome(r: &ItemResult) -> Option<Outcome> {
    match r {
        ItemResult::Done(p) => Some(p.result.outcome),
        ItemResult::Abandoned => None,
    }
}

/// Runs `items` through `engine`, failing the test if it is still running after [`STUCK`].
async fn run(engine: &Engine, items: &[Item]) -> Vec<Option<Outcome>> {
    let results = tokio::time::timeout(STUCK, engine.process_batch(items, &CancellationToken::new()))
        .await
        .expect("the batch is stuck behind the failing command")
        .expect("batch");
    results.iter().map(outcome).collect()
}

fn assert_failed_after_its_budget(store: &KeyStore, effect: &OneBadKey) {
    let bad_calls = effect.calls.lock().iter().filter(|(k, _)| k == "bad").count();
    assert!(bad_calls >= MAX_ATTEMPTS as usize, "{bad_calls} calls");
    match store.get("bad").expect("get") {
        Some(Record::Completed(c)) => {
            assert_eq!(c.outcome, Completion::Failed);
            assert_eq!(c.attempts as usize, bad_calls, "stored attempts = calls made");
        }
        other => panic!("bad: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_failing_command_ends_failed_and_the_sinks_other_commands_flow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(Default::default(), dir.path(), Default::default()).expect("store"));
    let effect = Arc::new(OneBadKey { others_up_at: Instant::now(), calls: Mutex::new(Vec::new()) });
    let sink = sink(&effect);
    let engine = engine(&store, Arc::clone(&sink));

    let first = run(&engine, &batch(&["g1", "bad", "g2", "g3"], 0)).await;
    assert_eq!(
        first,
        vec![Some(Outcome::Succeeded), Some(Outcome::Failed), Some(Outcome::Succeeded), Some(Outcome::Succeeded)]
    );
    assert_eq!(
        effect.calls.lock().iter().filter(|(k, _)| k == "bad").count(),
        MAX_ATTEMPTS as usize,
        "its retry budget, no probing"
    );
    assert_failed_after_its_budget(&store, &effect);
    assert!(sink.circuit().expect("breaker").is_closed(), "one key never opened it");

    // The next batch of the same sink goes at once.
    let started = Instant::now();
    let next = run(&engine, &batch(&["g4", "g5"], 4)).await;
    assert_eq!(next, vec![Some(Outcome::Succeeded); 2]);
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_failing_command_caught_in_a_real_outage_does_not_probe_for_ever() {
    // The sink is down for everyone for 1 s (the circuit opens on three different keys),
    // then up for all but `bad`.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(Default::default(), dir.path(), Default::default()).expect("store"));
    let effect =
        Arc::new(OneBadKey { others_up_at: Instant::now() + Duration::from_secs(1), calls: Mutex::new(Vec::new()) });
    let sink = sink(&effect);
    let engine = engine(&store, Arc::clone(&sink));

    let results = run(&engine, &batch(&["bad", "g1", "g2", "g3"], 0)).await;
    assert_eq!(
        results,
        vec![Some(Outcome::Failed), Some(Outcome::Succeeded), Some(Outcome::Succeeded), Some(Outcome::Succeeded)]
    );
    assert_failed_after_its_budget(&store, &effect);
    for key in ["g1", "g2", "g3"] {
        let effects = effect.calls.lock().iter().filter(|(k, ok)| k == key && *ok).count();
        assert_eq!(effects, 1, "{key}: one effect");
    }
    assert!(sink.circuit().expect("breaker").is_closed());
    let next = run(&engine, &batch(&["g4"], 4)).await;
    assert_eq!(next, vec![Some(Outcome::Succeeded)]);
}

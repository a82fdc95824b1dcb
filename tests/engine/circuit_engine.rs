//! The engine with a sink behind a circuit breaker (docs/contract.md §6, docs/sinks.md "Circuit breaker
//! and backpressure"): a sink that is down for much longer than `retry.max_attempts` would
//! last does not make commands `failed`; they wait, one probe at a time tests the sink, and
//! they all succeed, once each, when it is back. A cancel while waiting lets go as before.
//!
//! Time is tokio's paused clock, so the outage lasts seconds of virtual time only.
//!
//! Run with `cargo test --test engine circuit_engine::`.

use crate::common;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use common::engine::{ManualClock, item, router};
use dedupd::engine::RetryConfig;
use dedupd::engine::{Engine, EngineParts, Item, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::sinks::circuit::CircuitConfig;
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{Completion, KeyStore, Record};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(3600);
/// Commands in the batch.
const N: usize = 6;
/// How long the sink is down.
const OUTAGE: Duration = Duration::from_secs(5);

/// A sink that refuses every call (transiently) until `up_at`, then does the effect.
struct Outage {
    up_at: Mutex<Option<Instant>>,
    /// Every call: (key, attempt header, whether it did the effect).
    calls: Mutex<Vec<(String, u32, bool)>>,
}

impl Outage {
    fn new(up_at: Option<Instant>) -> Arc<Outage> {
        Arc::new(Outage { up_at: Mutex::new(up_at), calls: Mutex::new(Vec::new()) })
    }
    fn calls(&self) -> Vec<(String, u32, bool)> {
        self.calls.lock().clone()
    }
}

#[async_trait::async_trait]
impl SinkEffect for Outage {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        // A call takes a little while, so that calls of the batch overlap.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let up = self.up_at.lock().is_some_and(|t| Instant::now() >= t);
        self.calls.lock().push((request.key().to_string(), request.attempt(), up));
        if up {
            Ok(serde_json::json!({"done": request.key()}))
        } else {
            Err(SinkError::Transient { message: "connection refused".into(), retry_after: None })
        }
    }
}

fn retry() -> RetryConfig {
    RetryConfig {
        max_attempts: NonZeroU32::new(3).unwrap(),
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    }
}

fn circuit(enabled: bool) -> CircuitConfig {
    CircuitConfig {
        enabled,
        failure_threshold: NonZeroU32::new(3).unwrap(),
        probe_backoff: Duration::from_millis(100),
        max_probe_backoff: Duration::from_millis(400),
    }
}

/// `outage` as the sink "s", forwarding the key, with the breaker `circuit(enabled)`.
fn sink(outage: &Arc<Outage>, enabled: bool) -> Arc<Sink> {
    Arc::new(Sink::new("s", true, outage.clone()).with_circuit(&circuit(enabled)))
}

fn engine(store: &Arc<KeyStore>, sink: Arc<Sink>) -> Engine {
    let mut sinks: HashMap<String, Arc<Sink>> = HashMap::new();
    sinks.insert("s".into(), sink);
    Engine::new(EngineParts {
        store: store.clone(),
        router: Arc::new(router(TTL)),
        sinks,
        max_in_flight: 8,
        retry: retry(),
        stale_guard: true,
        clock: Arc::new(ManualClock::new(1_700_000_000_000)),
    })
    .unwrap()
}

fn batch() -> Vec<Item> {
    (0..N).map(|i| item(&format!("k{i}"), 1, 1_700_000_000_000, TTL, i as i64)).collect()
}

fn store(dir: &std::path::Path) -> Arc<KeyStore> {
    Arc::new(KeyStore::open(dedupd::store::StoreBackend::default(), dir, dedupd::store::SyncMode::Batch).unwrap())
}

fn outcomes(results: &[ItemResult]) -> Vec<Option<Outcome>> {
    results
        .iter()
        .map(|r| match r {
            ItemResult::Done(p) => Some(p.result.outcome),
            ItemResult::Abandoned => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_long_outage_does_not_fail_commands_and_they_succeed_once_when_the_sink_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let outage = Outage::new(Some(Instant::now() + OUTAGE));
    let sink = sink(&outage, true);
    let engine = engine(&store, Arc::clone(&sink));

    let results = engine.process_batch(&batch(), &CancellationToken::new()).await.unwrap();

    assert_eq!(outcomes(&results), vec![Some(Outcome::Succeeded); N], "no command failed during the outage");
    let calls = outage.calls();
    for i in 0..N {
        let key = format!("k{i}");
        let effects = calls.iter().filter(|(k, _, ok)| *k == key && *ok).count();
        assert_eq!(effects, 1, "{key}: one effect");
        match store.get(&key).unwrap() {
            Some(Record::Completed(c)) => {
                assert_eq!(c.outcome, Completion::Succeeded, "{key}");
                let made = calls.iter().filter(|(k, _, _)| *k == key).count();
                assert_eq!(c.attempts as usize, made, "{key}: stored attempts = calls made");
            }
            other => panic!("{key}: {other:?}"),
        }
        // Attempt numbers of one key go 1, 2, 3, ... whatever the circuit did.
        let attempts: Vec<u32> = calls.iter().filter(|(k, _, _)| *k == key).map(|(_, a, _)| *a).collect();
        assert_eq!(attempts, (1..=attempts.len() as u32).collect::<Vec<_>>(), "{key}");
    }
    // While down: the first wave (each command at most `threshold` calls before the circuit
    // opened) plus one probe per probe interval (100, 200, then 400 ms): nowhere near a
    // retry storm, and no retries spent.
    let failed = calls.iter().filter(|(_, _, ok)| !ok).count();
    let probes_at_most = 3 + (OUTAGE.as_millis() / 400) as usize + 1;
    assert!(failed <= N * 3 + probes_at_most, "{failed} failing calls: {calls:?}");
    assert!(sink.circuit().unwrap().is_closed(), "the success closed the circuit");
}

#[tokio::test(start_paused = true)]
async fn without_the_breaker_the_same_outage_fails_every_command() {
    // The control: the outage above is long enough that plain retries give up.
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let outage = Outage::new(Some(Instant::now() + OUTAGE));
    let sink = sink(&outage, false);
    assert!(sink.circuit().is_none());
    let results = engine(&store, sink).process_batch(&batch(), &CancellationToken::new()).await.unwrap();
    assert_eq!(outcomes(&results), vec![Some(Outcome::Failed); N]);
    assert_eq!(outage.calls().len(), N * 3, "max_attempts calls each");
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_waiting_for_the_circuit_lets_go_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let outage = Outage::new(None);
    let sink = sink(&outage, true);
    let engine = Arc::new(engine(&store, Arc::clone(&sink)));
    let cancel = CancellationToken::new();
    let run = {
        let (engine, cancel) = (Arc::clone(&engine), cancel.clone());
        tokio::spawn(async move { engine.process_batch(&batch(), &cancel).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.circuit().unwrap().is_closed() {
        assert!(Instant::now() < deadline, "the circuit never opened");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Waiting for minutes of probes does not end anything as `failed`.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(!run.is_finished(), "the batch ended while the sink was down");
    cancel.cancel();
    let results = run.await.unwrap().unwrap();
    assert_eq!(outcomes(&results), vec![None; N], "all abandoned, none failed");
    for i in 0..N {
        // Every command was called at least once (the first wave): its claim stays
        // `in_progress` for the crash rules, exactly as an interrupted retry does today.
        assert!(matches!(store.get(&format!("k{i}")).unwrap(), Some(Record::InProgress(_))), "k{i}");
    }
    assert!(outage.calls().iter().all(|(_, _, ok)| !ok));
}

//! Letting go of a batch (a shutdown or revoke cancels it): no sink call starts after the
//! cancel, also not one waiting for the sink's concurrency permit or rate token, and a
//! claim none of whose calls can have reached the sink without an answer (refused at
//! connect, or answered 500) is released (its record put back) so that a redelivery runs it
//! afresh, while one whose request may have arrived unanswered stays `in_progress` for the
//! crash rules (docs/contract.md §4).
//!
//! Run with `cargo test --test engine engine_drain::`.

use crate::common;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::engine::{ManualClock, ScriptedSink, item, router};
use dedupd::engine::{Engine, EngineParts, Item, ItemResult, RetryConfig};
use dedupd::outcome::Outcome;
use dedupd::sinks::limit::SinkLimits;
use dedupd::sinks::{Sink, SinkConfig, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{KeyStore, Record};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(3600);

fn store(dir: &std::path::Path) -> Arc<KeyStore> {
    Arc::new(KeyStore::open(Default::default(), dir, Default::default()).expect("store"))
}

fn engine(store: &Arc<KeyStore>, sink: Arc<Sink>, max_attempts: u32) -> Arc<Engine> {
    let mut sinks: HashMap<String, Arc<Sink>> = HashMap::new();
    sinks.insert("s".into(), sink);
    let engine = Engine::new(EngineParts {
        store: store.clone(),
        router: Arc::new(router(TTL)),
        sinks,
        max_in_flight: 8,
        retry: RetryConfig {
            max_attempts: NonZeroU32::new(max_attempts).expect("nonzero"),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(20),
        },
        stale_guard: true,
        clock: Arc::new(ManualClock::new(1_700_000_000_000)),
    });
    Arc::new(engine.expect("engine"))
}

fn batch(keys: &[&str]) -> Vec<Item> {
    keys.iter().enumerate().map(|(i, k)| item(k, 1, 1_700_000_000_000, TTL, i as i64)).collect()
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

/// Runs `items` on a task of its own; cancel it with the returned token.
fn spawn_batch(
    engine: &Arc<Engine>,
    items: Vec<Item>,
) -> (CancellationToken, tokio::task::JoinHandle<Vec<Option<Outcome>>>) {
    let cancel = CancellationToken::new();
    let (engine, token) = (Arc::clone(engine), cancel.clone());
    let run = tokio::spawn(async move { outcomes(&engine.process_batch(&items, &token).await.expect("batch")) });
    (cancel, run)
}

/// Polls `done` every millisecond until it holds, failing after `within`.
async fn until(within: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A sink whose calls take `busy` and succeed; records the key of every call started.
struct Slow {
    busy: Duration,
    started: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl SinkEffect for Slow {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        self.started.lock().push(request.key().to_string());
        tokio::time::sleep(self.busy).await;
        Ok(serde_json::json!({"done": request.key()}))
    }
}

fn slow_sink(busy: Duration, limits: &SinkLimits) -> (Arc<Slow>, Arc<Sink>) {
    let slow = Arc::new(Slow { busy, started: Mutex::new(Vec::new()) });
    (Arc::clone(&slow), Arc::new(Sink::new("s", false, slow).with_limits(limits)))
}

/// `a` is in its call, `b` waits for the sink's limits; then the batch is cancelled.
async fn cancel_while_b_waits_for_the_limits(limits: SinkLimits, busy: Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path());
    let (slow, sink) = slow_sink(busy, &limits);
    let engine = engine(&store, sink, 3);
    let (cancel, run) = spawn_batch(&engine, batch(&["a", "b"]));
    until(Duration::from_secs(5), "a's call started", || !slow.started.lock().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancelled_at = Instant::now();
    cancel.cancel();
    let results = run.await.expect("join");
    assert!(cancelled_at.elapsed() <= busy, "the batch waited only for a's call: {:?}", cancelled_at.elapsed());
    assert_eq!(results, vec![Some(Outcome::Succeeded), None], "a answered, b let go");
    assert_eq!(*slow.started.lock(), vec!["a".to_string()], "b's call never started");
    assert_eq!(store.get("b").expect("get"), None, "b's claim released: a redelivery runs it afresh");
}

#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_the_sinks_concurrency_permit_never_starts_after_the_cancel() {
    let limits = SinkLimits { max_concurrency: std::num::NonZeroUsize::new(1), ..SinkLimits::default() };
    cancel_while_b_waits_for_the_limits(limits, Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_rate_token_never_starts_after_the_cancel() {
    // One call per 100 s: b would start 100 s after a.
    let limits = SinkLimits { rate_per_second: Some(0.01), burst: NonZeroU32::new(1), max_concurrency: None };
    cancel_while_b_waits_for_the_limits(limits, Duration::from_secs(1)).await;
}

/// An `http` sink at `url`, not forwarding the key, without breaker, every call counted.
fn http_sink(url: &str) -> (Arc<AtomicUsize>, Arc<Sink>) {
    let text = format!(
        "kind = \"http\"\nurl = \"{url}\"\nforward_key = false\nrequest_timeout = \"300ms\"\n[circuit]\nenabled = false"
    );
    let config: SinkConfig = toml::from_str(&text).expect("config");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let sink = config.build("s").expect("build").wrap_effect(|inner| Arc::new(Counted { inner, calls: counted }));
    (calls, Arc::new(sink))
}

struct Counted {
    inner: Arc<dyn SinkEffect>,
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl SinkEffect for Counted {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let result = self.inner.execute(request).await;
        self.calls.fetch_add(1, Ordering::SeqCst);
        result
    }
}

/// Runs `keys` against `sink` until every key was called at least twice, then cancels.
async fn interrupt_after_two_calls_each(store: &Arc<KeyStore>, sink: (Arc<AtomicUsize>, Arc<Sink>), keys: &[&str]) {
    let (calls, sink) = sink;
    let engine = engine(store, sink, 1000);
    let (cancel, run) = spawn_batch(&engine, batch(keys));
    let want = 2 * keys.len();
    until(Duration::from_secs(20), "two calls per key", || calls.load(Ordering::SeqCst) >= want).await;
    cancel.cancel();
    assert_eq!(run.await.expect("join"), vec![None; keys.len()], "all let go, none failed");
}

/// Each of `keys` has no record (its claim was released, not left `in_progress`), and a
/// redelivery to a sink that does not forward the key runs each afresh, not `indeterminate`.
async fn released_and_run_afresh(store: &Arc<KeyStore>, keys: &[&str]) {
    for key in keys {
        assert_eq!(store.get(key).expect("get"), None, "{key}: released, not left in_progress");
    }
    let scripted = Arc::new(ScriptedSink::new("s", false));
    let engine = engine(store, scripted.as_sink(), 3);
    let results = outcomes(&engine.process_batch(&batch(keys), &CancellationToken::new()).await.expect("batch"));
    assert_eq!(results, vec![Some(Outcome::Succeeded); keys.len()]);
    assert_eq!(scripted.effects().len(), keys.len());
}

#[tokio::test]
async fn commands_refused_at_connect_are_released_and_a_redelivery_runs_them_afresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path());
    // A port that was just free: bind, note it, close it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let keys = ["r1", "r2", "r3"];
    interrupt_after_two_calls_each(&store, http_sink(&format!("http://{closed}/hook")), &keys).await;
    released_and_run_afresh(&store, &keys).await;
}

#[tokio::test]
async fn a_request_that_may_have_arrived_keeps_its_claim() {
    // A receiver that reads requests and never answers: each call times out after sending.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let held = Arc::new(Mutex::new(Vec::new()));
    let holder = Arc::clone(&held);
    let server = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            holder.lock().push(socket);
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path());
    let (calls, sink) = http_sink(&format!("http://{addr}/hook"));
    let engine = engine(&store, sink, 1000);
    let (cancel, run) = spawn_batch(&engine, batch(&["t1"]));
    // Cancelled while the call waits for its answer (the receiver took the connection).
    until(Duration::from_secs(20), "the receiver took the connection", || !held.lock().is_empty()).await;
    cancel.cancel();
    assert_eq!(run.await.expect("join"), vec![None], "let go, neither failed nor indeterminate here");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one call, not repeated");
    assert!(
        matches!(store.get("t1").expect("get"), Some(Record::InProgress(_))),
        "a timeout after sending is not certainly unsent: the claim stays for the crash rules"
    );
    server.abort();
}

#[tokio::test]
async fn commands_whose_calls_were_all_answered_with_a_retryable_failure_are_released() {
    // A receiver that answers every request 500: each call fails transiently, with an
    // answer, so none is in doubt when the batch is let go.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let answered = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&answered);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path());
    let keys = ["a1", "a2"];
    interrupt_after_two_calls_each(&store, http_sink(&format!("http://{addr}/hook")), &keys).await;
    assert!(answered.load(Ordering::SeqCst) >= 2 * keys.len(), "the receiver answered every call");
    released_and_run_afresh(&store, &keys).await;
    server.abort();
}

//! Engine-level helpers: a scripted sink, a manual clock, commands built directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use dedupd::engine::RetryConfig;
use dedupd::engine::{Clock, Engine, EngineParts, Item};
use dedupd::envelope::{Command, Shape};
use dedupd::fingerprint::fingerprint;
use dedupd::routes::RouteConfig;
use dedupd::routes::Router;
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{KeyStore, SourcePos};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// A clock moved by hand.
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock(AtomicI64::new(start_ms))
    }
    pub fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now()
    }
}

/// What the scripted sink does on its next call(s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Does the effect and succeeds.
    Succeed,
    /// Refuses permanently (no effect; answered).
    FailPermanently,
    /// Fails transiently on every call (no effect; answered, as a 503 is).
    FailTransiently,
    /// The process dies before the effect (engine cancelled, claim left in place).
    CrashBeforeEffect,
    /// The process dies right after the effect, before completion.
    CrashAfterEffect,
    /// Does the effect and succeeds; the process dies before publishing.
    CrashAfterComplete,
}

/// A sink that records every effect `(key, clock ms)` and follows a script.
pub struct ScriptedSink {
    name: String,
    forwards: bool,
    behaviour: Mutex<Behaviour>,
    cancel: Mutex<Option<CancellationToken>>,
    crashed_after_complete: AtomicBool,
    effects: Mutex<Vec<(String, i64)>>,
    clock: Mutex<Option<Arc<dyn Clock>>>,
    calls: AtomicI64,
}

impl ScriptedSink {
    pub fn new(name: &str, forwards: bool) -> ScriptedSink {
        ScriptedSink {
            name: name.into(),
            forwards,
            behaviour: Mutex::new(Behaviour::Succeed),
            cancel: Mutex::new(None),
            crashed_after_complete: AtomicBool::new(false),
            effects: Mutex::new(Vec::new()),
            clock: Mutex::new(None),
            calls: AtomicI64::new(0),
        }
    }
    /// The script as the engine's sink: named, forwarding the key or not, no breaker.
    pub fn as_sink(self: &Arc<Self>) -> Arc<Sink> {
        Arc::new(Sink::new(&self.name, self.forwards, self.clone()))
    }
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> ScriptedSink {
        *self.clock.lock() = Some(clock);
        self
    }
    pub fn script(&self, b: Behaviour) {
        *self.behaviour.lock() = b;
    }
    pub fn set_cancel(&self, token: CancellationToken) {
        *self.cancel.lock() = Some(token);
    }
    pub fn take_crash_after_complete(&self) -> bool {
        self.crashed_after_complete.swap(false, Ordering::SeqCst)
    }
    pub fn effects(&self) -> Vec<(String, i64)> {
        self.effects.lock().clone()
    }
    pub fn calls(&self) -> i64 {
        self.calls.load(Ordering::SeqCst)
    }
    fn now(&self) -> i64 {
        self.clock.lock().as_ref().map(|c| c.now_ms()).unwrap_or(0)
    }
    fn crash(&self) {
        *self.behaviour.lock() = Behaviour::Succeed;
        if let Some(t) = self.cancel.lock().as_ref() {
            t.cancel();
        }
    }
}

#[async_trait::async_trait]
impl SinkEffect for ScriptedSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let behaviour = *self.behaviour.lock();
        let effect = || self.effects.lock().push((request.key().to_string(), self.now()));
        match behaviour {
            Behaviour::Succeed => {
                effect();
                Ok(serde_json::json!({"done": request.key()}))
            }
            // The receiver answered both failures (a 400, a 503): nothing is in doubt.
            Behaviour::FailPermanently => {
                request.answered();
                Err(SinkError::Permanent { message: "refused".into(), result: serde_json::json!({"status": 400}) })
            }
            Behaviour::FailTransiently => {
                request.answered();
                Err(SinkError::Transient { message: "unavailable".into(), retry_after: None })
            }
            Behaviour::CrashBeforeEffect => {
                self.crash();
                Err(SinkError::Transient { message: "process died".into(), retry_after: None })
            }
            Behaviour::CrashAfterEffect => {
                effect();
                self.crash();
                Err(SinkError::Transient { message: "process died".into(), retry_after: None })
            }
            Behaviour::CrashAfterComplete => {
                effect();
                *self.behaviour.lock() = Behaviour::Succeed;
                self.crashed_after_complete.store(true, Ordering::SeqCst);
                Ok(serde_json::json!({"done": request.key()}))
            }
        }
    }
}

/// One default route `*` to sink `s`.
pub fn router(ttl: Duration) -> Router {
    let route = RouteConfig {
        name: Some("all".into()),
        types: vec!["*".into()],
        sink: "s".into(),
        ttl: None,
        fingerprint_exclude: vec![],
    };
    Router::new(&[route], ttl, ttl * 10).unwrap()
}

/// Two attempts, tiny backoff.
pub fn test_retry() -> RetryConfig {
    RetryConfig {
        max_attempts: std::num::NonZeroU32::new(2).unwrap(),
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    }
}

/// A command of type `t` with payload `{"v": payload}`.
pub fn command(key: &str, payload: u8, produced_at_ms: i64, ttl: Duration) -> Command {
    let payload = serde_json::json!({ "v": payload });
    Command {
        key: key.into(),
        kind: "t".into(),
        fingerprint: fingerprint("t", &payload, &[]).unwrap(),
        payload,
        route: 0,
        ttl,
        created_at_ms: None,
        produced_at_ms: Some(produced_at_ms),
        traceparent: None,
        tracestate: None,
        shape: Shape::Native,
        intake_client: None,
    }
}

/// An item at `offset` of partition 0 of topic `in`.
pub fn item(key: &str, payload: u8, produced_at_ms: i64, ttl: Duration, offset: i64) -> Item {
    Item {
        source: SourcePos { topic: "in".into(), partition: 0, offset },
        parsed: Ok(command(key, payload, produced_at_ms, ttl)),
        traceparent: None,
        tracestate: None,
        span: None,
        checked_absent: None,
    }
}

/// An engine over `store` with one sink `s` (route `*`, a one-hour TTL), the test retry
/// policy and a manual clock at 1,000,000 ms.
pub fn engine_with(store: Arc<KeyStore>, sink: Arc<Sink>, max_in_flight: usize) -> Engine {
    Engine::new(EngineParts {
        store,
        router: Arc::new(router(Duration::from_secs(3600))),
        sinks: std::collections::HashMap::from([("s".to_string(), sink)]),
        max_in_flight,
        retry: test_retry(),
        stale_guard: true,
        clock: Arc::new(ManualClock::new(1_000_000)),
    })
    .expect("engine")
}

/// Polls `done` every millisecond until it holds or `bound` passes; returns whether it held.
pub async fn poll_until(bound: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + bound;
    while !done() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

/// One batch per partition, all at once, as partition workers run them: partition `p`'s
/// batch holds `keys` fresh keys `p{p}-k{i}`. Each task returns its batch's results.
pub fn spawn_partition_batches(
    engine: &Arc<Engine>,
    partitions: usize,
    keys: usize,
) -> Vec<tokio::task::JoinHandle<Vec<dedupd::engine::ItemResult>>> {
    let ttl = Duration::from_secs(3600);
    (0..partitions)
        .map(|p| {
            let items: Vec<Item> =
                (0..keys).map(|i| item(&format!("p{p}-k{i}"), 1, 1_000_000, ttl, i as i64)).collect();
            let engine = Arc::clone(engine);
            tokio::spawn(async move { engine.process_batch(&items, &CancellationToken::new()).await.expect("batch") })
        })
        .collect()
}

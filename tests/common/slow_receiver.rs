//! [`SlowReceiver`]: an HTTP receiver for any path that records every request *when it
//! arrives* (the effect happened), then answers 200 after a random delay (so that a kill can
//! land between the effect and the answer) with a body naming the request's sequence
//! number, so a stored or replayed result can be traced back to the request it answered;
//! and `GET /lookup`, a payments API's search by reference, for sinks with a check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::process::SplitMix;

/// One request a [`SlowReceiver`] saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// 0, 1, 2, ... in arrival order; also in the response body as `seq`.
    pub seq: u64,
    /// The request path, e.g. `/once`.
    pub path: String,
    /// `Idempotency-Key`, if sent.
    pub key: Option<String>,
    /// `Dedupd-Attempt`, if sent.
    pub attempt: Option<String>,
    /// `traceparent`, if sent.
    pub traceparent: Option<String>,
    /// `tracestate`, if sent.
    pub tracestate: Option<String>,
    /// The body.
    pub body: Bytes,
    /// When it arrived, Unix ms (comparable to Kafka record timestamps).
    pub at_unix_ms: i64,
}

#[derive(Clone)]
struct ReceiverState {
    seen: Arc<Mutex<Vec<Seen>>>,
    next: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    last_arrival: Arc<Mutex<Option<Instant>>>,
    delay_ms: (u64, u64),
    rng: Arc<Mutex<SplitMix>>,
    lookups: Arc<AtomicUsize>,
    /// While set, `GET /lookup` answers 503.
    lookups_down: Arc<AtomicBool>,
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn slow_receive(
    State(s): State<ReceiverState>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::Json<serde_json::Value> {
    s.in_flight.fetch_add(1, Ordering::SeqCst);
    // Decremented however the request ends, also when the client went away and the
    // handler is dropped.
    let _guard = InFlight(Arc::clone(&s.in_flight));
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let seq = {
        // Sequence number and record under one lock, so `seen` is in `seq` order.
        let mut seen = s.seen.lock();
        let seq = s.next.fetch_add(1, Ordering::SeqCst);
        seen.push(Seen {
            seq,
            path: uri.path().to_string(),
            key: header("idempotency-key"),
            attempt: header("dedupd-attempt"),
            traceparent: header("traceparent"),
            tracestate: header("tracestate"),
            body,
            at_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        });
        *s.last_arrival.lock() = Some(Instant::now());
        seq
    };
    let delay = s.rng.lock().between(s.delay_ms.0, s.delay_ms.1);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    axum::Json(serde_json::json!({"accepted": true, "seq": seq}))
}

/// `GET /lookup?key=K`: the payments whose POST body carried `"key": K`, as a payments API
/// answers a search by reference: 200 `{"payments": [{"seq": N}, ...]}`, an empty list for
/// none; 503 while lookups are down ([`SlowReceiver::set_lookups_down`]). A lookup is not a
/// request [`SlowReceiver::seen`] lists.
async fn lookup(
    State(s): State<ReceiverState>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<axum::Json<serde_json::Value>, StatusCode> {
    if s.lookups_down.load(Ordering::SeqCst) {
        s.lookups.fetch_add(1, Ordering::SeqCst);
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    let wanted = query.get("key").cloned().unwrap_or_default();
    let payments: Vec<serde_json::Value> = s
        .seen
        .lock()
        .iter()
        .filter(|seen| {
            serde_json::from_slice::<serde_json::Value>(&seen.body).is_ok_and(|b| b["key"].as_str() == Some(&wanted))
        })
        .map(|seen| serde_json::json!({"seq": seen.seq}))
        .collect();
    s.lookups.fetch_add(1, Ordering::SeqCst);
    Ok(axum::Json(serde_json::json!({ "payments": payments })))
}

/// An HTTP receiver on 127.0.0.1 that records every POST (any path) on arrival and answers
/// 200 `{"accepted": true, "seq": N}` after a random delay in `delay_ms`; `GET /lookup`
/// finds the POSTs of a key (see [`lookup`]).
pub struct SlowReceiver {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    state: ReceiverState,
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl SlowReceiver {
    /// Starts it; `seed` seeds the delays.
    pub async fn start(delay_ms: (u64, u64), seed: u64) -> SlowReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let state = ReceiverState {
            seen: Arc::default(),
            next: Arc::default(),
            in_flight: Arc::default(),
            last_arrival: Arc::default(),
            delay_ms,
            rng: Arc::new(Mutex::new(SplitMix(seed))),
            lookups: Arc::default(),
            lookups_down: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/lookup", axum::routing::get(lookup))
            .fallback(axum::routing::post(slow_receive))
            .with_state(state.clone());
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        };
        SlowReceiver { addr, state, stop, task }
    }

    /// The URL of `path` (starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests seen so far.
    pub fn count(&self) -> usize {
        self.state.seen.lock().len()
    }

    /// While `down`, every `GET /lookup` answers 503 (a check then cannot tell).
    pub fn set_lookups_down(&self, down: bool) {
        self.state.lookups_down.store(down, Ordering::SeqCst);
    }

    /// `GET /lookup` requests answered so far.
    pub fn lookups(&self) -> usize {
        self.state.lookups.load(Ordering::SeqCst)
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// When the latest request arrived.
    pub fn last_arrival(&self) -> Option<Instant> {
        *self.state.last_arrival.lock()
    }

    /// A copy of every request seen so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().clone()
    }

    /// Stops it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

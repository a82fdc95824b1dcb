//! Per-sink limits measured where they matter, at the receiver: an HTTP server on
//! 127.0.0.1 records when each request arrives and how many are being answered at once,
//! while many commands are pushed at an `http` sink built from TOML (so through the same
//! `SinkConfig::build` that wraps every kind in its limits) from more concurrent callers
//! than the limits allow.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use dedupd::config::Config;
use dedupd::sinks::{Sink, SinkRequest, build_all};
use parking_lot::Mutex;
use serde_json::json;

/// Upper bound on a whole run.
const BOUND: Duration = Duration::from_secs(60);

#[derive(Clone, Default)]
struct Receiver {
    /// (Idempotency-Key, arrival) per request.
    arrivals: Arc<Mutex<Vec<(String, Instant)>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    hold: Duration,
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap) -> &'static str {
    let now = r.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _guard = InFlight(Arc::clone(&r.in_flight));
    r.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    r.arrivals.lock().push((key, Instant::now()));
    tokio::time::sleep(r.hold).await;
    "ok"
}

async fn start(hold: Duration) -> (String, Receiver) {
    let receiver = Receiver { hold, ..Receiver::default() };
    let app = axum::Router::new().fallback(axum::routing::post(receive)).with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/send"), receiver)
}

/// Builds the sink `limited` from TOML with these `[sinks.limited.limits]` lines.
fn build(url: &str, limits: &str) -> Arc<Sink> {
    let text = format!("[sinks.limited]\nkind = \"http\"\nurl = \"{url}\"\n\n[sinks.limited.limits]\n{limits}\n");
    let config = Config::from_toml_str(&text, Vec::<(String, String)>::new()).unwrap();
    Arc::new(build_all(&config.sinks).unwrap().remove("limited").unwrap())
}

/// Sends `n` commands (keys `cmd-0..n`), each from its own task, all at once.
async fn send_all(sink: Arc<Sink>, n: usize) {
    let keys: Vec<String> = (0..n).map(|i| format!("cmd-{i}")).collect();
    let claims = common::claims::durable_claims(&keys.iter().map(String::as_str).collect::<Vec<_>>());
    let tasks: Vec<_> = claims
        .into_iter()
        .enumerate()
        .map(|(i, claim)| {
            let sink = Arc::clone(&sink);
            tokio::spawn(async move {
                let payload = json!({"n": i});
                let request = SinkRequest::new(&claim, "send", &payload, 1, None);
                sink.execute(request).await
            })
        })
        .collect();
    let all = tokio::time::timeout(BOUND, futures::future::join_all(tasks)).await.expect("every call ends in time");
    for result in all {
        result.expect("task").expect("the receiver accepted it");
    }
}

fn assert_each_arrived_once(receiver: &Receiver, n: usize) {
    let arrivals = receiver.arrivals.lock();
    let keys: HashSet<String> = arrivals.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(arrivals.len(), n, "one request per command");
    assert_eq!(keys, (0..n).map(|i| format!("cmd-{i}")).collect::<HashSet<_>>(), "every command arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_burst_and_concurrency_hold_at_the_receiver() {
    const N: usize = 70;
    const RATE: usize = 20;
    const BURST: usize = 5;
    const MAX_CONCURRENCY: usize = 3;
    let (url, receiver) = start(Duration::from_millis(30)).await;
    let sink = build(&url, &format!("rate_per_second = {RATE}\nburst = {BURST}\nmax_concurrency = {MAX_CONCURRENCY}"));
    send_all(sink, N).await;

    assert_each_arrived_once(&receiver, N);
    let mut instants: Vec<Instant> = receiver.arrivals.lock().iter().map(|(_, t)| *t).collect();
    instants.sort();
    // The busiest one-second window starts at some arrival: count from each.
    let busiest = instants
        .iter()
        .map(|from| instants.iter().filter(|t| **t >= *from && **t < *from + Duration::from_secs(1)).count())
        .max()
        .unwrap_or(0);
    println!("busiest second: {busiest} requests (bound {}), span {:?}", RATE + BURST, instants[N - 1] - instants[0]);
    assert!(busiest <= RATE + BURST, "{busiest} requests within one second");
    let max_in_flight = receiver.max_in_flight.load(Ordering::SeqCst);
    assert!(max_in_flight <= MAX_CONCURRENCY, "{max_in_flight} requests in flight at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_alone_caps_requests_in_flight() {
    const N: usize = 24;
    let (url, receiver) = start(Duration::from_millis(80)).await;
    send_all(build(&url, "max_concurrency = 2"), N).await;
    assert_each_arrived_once(&receiver, N);
    let max_in_flight = receiver.max_in_flight.load(Ordering::SeqCst);
    assert!((1..=2).contains(&max_in_flight), "{max_in_flight} requests in flight at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_limits_nothing_is_held_back() {
    // The control: the same load without limits does overlap at the receiver, so the
    // bound above is the limiter's doing and not the test's.
    const N: usize = 24;
    let (url, receiver) = start(Duration::from_millis(200)).await;
    let text = format!("[sinks.limited]\nkind = \"http\"\nurl = \"{url}\"\n");
    let config = Config::from_toml_str(&text, Vec::<(String, String)>::new()).unwrap();
    send_all(Arc::new(build_all(&config.sinks).unwrap().remove("limited").unwrap()), N).await;
    assert_each_arrived_once(&receiver, N);
    assert!(receiver.max_in_flight.load(Ordering::SeqCst) > 2);
}

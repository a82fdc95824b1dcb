//! The `http` sink against a real axum server on 127.0.0.1 that records every request.
//!
//! Every await on the network is bounded by [`BOUND`]; the only short timeout is the
//! sink's own `request_timeout` in the hanging-server test.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use dedupd::outcome::Outcome;
use dedupd::sinks::http::{HttpSink, HttpSinkConfig, MAX_BODY_BYTES};
use dedupd::sinks::{SinkConfig, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::Record;
use serde_json::{Value, json};

use common::orphan::EngineWithSink;

/// Upper bound on anything a test waits for.
const BOUND: Duration = Duration::from_secs(20);

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII header"))
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
enum Reply {
    /// This status, headers and body.
    Fixed { status: u16, headers: Vec<(&'static str, &'static str)>, body: Vec<u8> },
    /// Never answers (longer than any request_timeout).
    Hang,
    /// 307 back to the same path.
    RedirectToSelf,
}

#[derive(Clone)]
struct Server {
    reply: Reply,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn handle(State(server): State<Server>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    server.seen.lock().unwrap().push(Seen { method, path: uri.path().to_string(), headers, body });
    match server.reply {
        Reply::Fixed { status, headers, body } => {
            let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
            for (name, value) in headers {
                response.headers_mut().insert(HeaderName::from_static(name), HeaderValue::from_static(value));
            }
            response
        }
        Reply::Hang => std::future::pending().await,
        Reply::RedirectToSelf => {
            (StatusCode::TEMPORARY_REDIRECT, [("location", uri.path().to_string())]).into_response()
        }
    }
}

/// Starts a recording server; returns its hook URL and what it saw.
async fn start(reply: Reply) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().fallback(handle).with_state(Server { reply, seen: seen.clone() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/hook"), seen)
}

fn fixed(status: u16, headers: Vec<(&'static str, &'static str)>, body: &[u8]) -> Reply {
    Reply::Fixed { status, headers, body: body.to_vec() }
}

fn config(url: &str) -> HttpSinkConfig {
    HttpSinkConfig {
        url: url.to_string(),
        forward_key: true,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        ..HttpSinkConfig::default()
    }
}

/// Runs one attempt of a fixed command, bounded in time.
async fn run(sink: &HttpSink, attempt: u32, traceparent: Option<&str>) -> Result<SinkOutput, SinkError> {
    let payload = json!({ "to": "a@example.com", "amount": 12.5, "tags": ["x", "y"] });
    let claim = common::claims::durable_claim("order-42");
    let request = SinkRequest::new(&claim, "email.send", &payload, attempt, traceparent);
    tokio::time::timeout(BOUND, sink.execute(request)).await.expect("the sink answers within the bound")
}

fn seen(log: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    log.lock().unwrap().clone()
}

#[tokio::test]
async fn success_posts_the_payload_with_headers_and_stores_the_json_answer() {
    let (url, log) =
        start(fixed(201, vec![("content-type", "application/json")], br#"{"id":"msg-1","queued":true}"#)).await;
    let sink = HttpSink::new("mailer", &config(&url)).unwrap();
    let instance = SinkConfig::Http(config(&url)).build("mailer").unwrap();
    assert_eq!(instance.name(), "mailer");
    assert!(instance.forwards_key());

    let output = run(&sink, 2, Some(TRACEPARENT)).await.unwrap();
    assert_eq!(output, json!({ "status": 201, "body": { "id": "msg-1", "queued": true } }));

    let seen = seen(&log);
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.path, "/hook");
    assert_eq!(request.header("idempotency-key"), Some("order-42"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("dedupd-command-type"), Some("email.send"));
    assert_eq!(request.header("dedupd-attempt"), Some("2"));
    assert_eq!(request.header("traceparent"), Some(TRACEPARENT));
    assert_eq!(request.headers.get_all("idempotency-key").iter().count(), 1);
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body, json!({ "to": "a@example.com", "amount": 12.5, "tags": ["x", "y"] }));
}

#[tokio::test]
async fn key_is_sent_even_when_not_declared_forwarded_and_text_answers_are_strings() {
    let (url, log) = start(fixed(200, vec![("content-type", "text/plain")], b"queued")).await;
    let legacy = HttpSinkConfig { forward_key: false, ..config(&url) };
    let sink = HttpSink::new("legacy", &legacy).unwrap();
    assert!(!SinkConfig::Http(legacy).build("legacy").unwrap().forwards_key());

    let output = run(&sink, 1, None).await.unwrap();
    assert_eq!(output, json!({ "status": 200, "body": "queued" }));

    let seen = seen(&log);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("idempotency-key"), Some("order-42"));
    assert_eq!(seen[0].header("dedupd-attempt"), Some("1"));
    assert_eq!(seen[0].header("traceparent"), None);
}

#[tokio::test]
async fn empty_answer_is_null() {
    let (url, _log) = start(fixed(204, vec![], b"")).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    assert_eq!(run(&sink, 1, None).await.unwrap(), json!({ "status": 204, "body": null }));
}

#[tokio::test]
async fn large_answer_is_bounded() {
    let big = vec![b'a'; MAX_BODY_BYTES * 3];
    let (url, _log) = start(fixed(200, vec![], &big)).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    let output = run(&sink, 1, None).await.unwrap();
    assert_eq!(output["status"], json!(200));
    assert_eq!(output["truncated"], json!(true));
    assert_eq!(output["body"].as_str().unwrap().len(), MAX_BODY_BYTES);
}

#[tokio::test]
async fn server_error_is_transient() {
    let (url, log) = start(fixed(500, vec![], b"database down")).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Transient { message, retry_after }) => {
            assert_eq!(retry_after, None);
            assert!(message.contains("500"), "{message}");
            assert!(message.contains("database down"), "{message}");
        }
        other => panic!("expected transient, got {other:?}"),
    }
    assert_eq!(seen(&log).len(), 1, "the sink itself does not retry");
}

#[tokio::test]
async fn too_many_requests_is_transient_with_retry_after() {
    let (url, _log) = start(fixed(429, vec![("retry-after", "3")], b"")).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Transient { retry_after, .. }) => assert_eq!(retry_after, Some(Duration::from_secs(3))),
        other => panic!("expected transient, got {other:?}"),
    }
}

#[tokio::test]
async fn unavailable_is_transient_with_retry_after() {
    let (url, _log) = start(fixed(503, vec![("retry-after", "7")], b"")).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Transient { retry_after, .. }) => assert_eq!(retry_after, Some(Duration::from_secs(7))),
        other => panic!("expected transient, got {other:?}"),
    }
}

#[tokio::test]
async fn request_timeout_status_is_transient() {
    let (url, _log) = start(fixed(408, vec![], b"")).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    assert!(matches!(run(&sink, 1, None).await, Err(SinkError::Transient { retry_after: None, .. })));
}

#[tokio::test]
async fn bad_request_is_permanent_with_status_and_body_in_result() {
    let (url, _log) =
        start(fixed(400, vec![("content-type", "application/json")], br#"{"error":"no such recipient"}"#)).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Permanent { message, result }) => {
            assert_eq!(result, json!({ "status": 400, "body": { "error": "no such recipient" } }));
            assert!(message.contains("400"), "{message}");
        }
        other => panic!("expected permanent, got {other:?}"),
    }
}

#[tokio::test]
async fn not_found_is_permanent() {
    let (url, _log) = start(fixed(404, vec![], b"nope")).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Permanent { result, .. }) => assert_eq!(result, json!({ "status": 404, "body": "nope" })),
        other => panic!("expected permanent, got {other:?}"),
    }
}

#[tokio::test]
async fn a_redirect_is_permanent_names_its_location_and_is_not_followed() {
    let (url, log) = start(Reply::RedirectToSelf).await;
    let sink = HttpSink::new("s", &config(&url)).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Permanent { result, message }) => {
            assert_eq!(result, json!({ "status": 307, "body": null, "location": "/hook" }));
            assert!(message.contains("307") && message.contains("`/hook`"), "{message}");
            assert!(!message.contains("127.0.0.1"), "no URL in the message: {message}");
        }
        other => panic!("expected permanent, got {other:?}"),
    }
    assert_eq!(seen(&log).len(), 1, "the redirect was not followed");
}

#[tokio::test]
async fn server_slower_than_request_timeout_is_transient() {
    let (url, _log) = start(Reply::Hang).await;
    let sink =
        HttpSink::new("s", &HttpSinkConfig { request_timeout: Duration::from_millis(300), ..config(&url) }).unwrap();
    let started = std::time::Instant::now();
    match run(&sink, 1, None).await {
        Err(SinkError::Transient { message, retry_after }) => {
            assert_eq!(retry_after, None);
            assert!(message.contains("timed out"), "{message}");
        }
        other => panic!("expected transient, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn connection_refused_is_transient() {
    // A port that was just free: bind, note it, close it.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let sink = HttpSink::new("s", &config(&format!("http://{closed}/hook"))).unwrap();
    match run(&sink, 1, None).await {
        Err(SinkError::Transient { message, retry_after }) => {
            assert_eq!(retry_after, None);
            assert!(!message.is_empty());
        }
        other => panic!("expected transient, got {other:?}"),
    }
}

/// The crash window (docs/contract.md §4): the interrupted run's request reached the server, the claim
/// reached the disk, the process died before completing it; the command is redelivered.
#[tokio::test]
async fn an_orphaned_claim_reruns_with_the_same_idempotency_key_only_when_forwarding() {
    let (url, log) = start(fixed(200, vec![("content-type", "application/json")], br#"{"accepted":true}"#)).await;
    let payload = json!({ "n": 1 });

    // forward_key = true (default): the receiver drops repeats of the key, so the re-run is
    // safe; it carries the same key, and the attempt number counts the interrupted run.
    let sink = Arc::new(SinkConfig::Http(config(&url)).build("hook").unwrap());
    assert!(sink.forwards_key());
    let mut h = EngineWithSink::new(sink.clone());
    let item = h.item("orphan-1", payload.clone());
    let earlier_claim = common::claims::durable_claim("orphan-1");
    let interrupted = SinkRequest::new(&earlier_claim, "t", &payload, 1, None);
    tokio::time::timeout(BOUND, sink.execute(interrupted)).await.unwrap().unwrap();
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Succeeded);
    assert!(done[0].sink_called);
    let requests = seen(&log);
    assert_eq!(requests.len(), 2, "the interrupted request and the re-run");
    for (request, attempt) in requests.iter().zip(["1", "2"]) {
        assert_eq!(request.header("idempotency-key"), Some("orphan-1"));
        assert_eq!(request.header("dedupd-attempt"), Some(attempt));
        assert_eq!(serde_json::from_slice::<Value>(&request.body).unwrap(), payload);
    }
    match h.record("orphan-1") {
        Some(Record::Completed(c)) => {
            assert_eq!(c.attempts, 2, "the re-run counts the interrupted run");
            let stored: Value = serde_json::from_slice(&c.result).unwrap();
            assert_eq!(stored, json!({ "status": 200, "body": { "accepted": true } }));
        }
        other => panic!("expected completed, got {other:?}"),
    }

    // forward_key = false: the effect of the interrupted run is unknown; nothing is sent.
    let legacy = HttpSinkConfig { forward_key: false, ..config(&url) };
    let sink = Arc::new(SinkConfig::Http(legacy).build("legacy").unwrap());
    assert!(!sink.forwards_key());
    let mut h = EngineWithSink::new(sink.clone());
    let item = h.item("orphan-2", payload.clone());
    let earlier_claim = common::claims::durable_claim("orphan-2");
    let interrupted = SinkRequest::new(&earlier_claim, "t", &payload, 1, None);
    tokio::time::timeout(BOUND, sink.execute(interrupted)).await.unwrap().unwrap();
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Indeterminate);
    assert!(!done[0].sink_called);
    assert!(matches!(h.record("orphan-2"), Some(Record::Indeterminate(_))));
    let requests = seen(&log);
    assert_eq!(requests.len(), 3, "no second request for the indeterminate key");
    assert_eq!(requests[2].header("idempotency-key"), Some("orphan-2"));
}

//! The `http` sink's check (docs/sinks.md, "`http`: check before writing") against a real
//! axum receiver on 127.0.0.1 that records every request: first the check alone
//! (`SinkEffect::check`), then through the engine, the case it exists for: a POST to an
//! API that cannot take an idempotency key is written, read and never answered, and the
//! check decides whether it is sent again.
//!
//! Every await on the network is bounded ([`BOUND`], or the engine helper's own bound);
//! the short timeouts are the sink's own `request_timeout`s, which the tests rely on.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use dedupd::outcome::Outcome;
use dedupd::sinks::http::{HttpCheckConfig, HttpSink, HttpSinkConfig};
use dedupd::sinks::{CheckAnswer, SinkConfig, SinkEffect, SinkRequest};
use dedupd::store::{Completion, Record};
use serde_json::{Value, json};

use common::orphan::EngineWithSink;

/// Upper bound on anything a test waits for.
const BOUND: Duration = Duration::from_secs(20);

/// The payment a receiver holds once the POST landed.
const PAYMENT: &str = r#"{"id":"pay_1","reference":"r-1","amount":5}"#;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    /// Path and query, as sent.
    target: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII header"))
    }
}

/// How the receiver answers one request.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// This status with this JSON body.
    Status(u16, &'static str),
    /// Reads the whole request and never answers.
    Hang,
    /// A search: 200 with `{"data": [PAYMENT]}` for `reference=r-1`, `{"data": []}` else.
    Search,
}

/// What the receiver answers: each POST to `/payments` (the call) the next of `calls`
/// (the last one again once they run out), any other request (the check) `check`.
#[derive(Clone)]
struct Receiver {
    calls: &'static [Reply],
    check: Reply,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    fn is_call(seen: &Seen) -> bool {
        seen.method == Method::POST && seen.target == "/payments"
    }
}

async fn handle(
    State(receiver): State<Receiver>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // The body is read whole before the handler runs (the `Bytes` extractor).
    let target = uri.path_and_query().map_or_else(|| uri.path().to_string(), ToString::to_string);
    let seen = Seen { method, target, headers, body };
    let reply = {
        let mut log = receiver.seen.lock().unwrap();
        let reply = if Receiver::is_call(&seen) {
            let earlier = log.iter().filter(|s| Receiver::is_call(s)).count();
            receiver.calls[earlier.min(receiver.calls.len() - 1)]
        } else {
            receiver.check
        };
        log.push(seen.clone());
        reply
    };
    match reply {
        Reply::Status(code, body) => json_response(code, body),
        Reply::Hang => std::future::pending().await,
        Reply::Search if seen.target.contains("reference=r-1") => {
            json_response(200, &format!(r#"{{"data":[{PAYMENT}]}}"#))
        }
        Reply::Search => json_response(200, r#"{"data":[]}"#),
    }
}

fn json_response(code: u16, body: &str) -> Response {
    (StatusCode::from_u16(code).unwrap(), [("content-type", "application/json")], body.to_string()).into_response()
}

/// Starts a receiver; returns its base URL (`http://127.0.0.1:PORT`) and what it saw.
async fn start(calls: &'static [Reply], check: Reply) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().fallback(handle).with_state(Receiver { calls, check, seen: seen.clone() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}"), seen)
}

/// A loopback address nothing listens on, and the socket that keeps it so while held.
async fn closed_port() -> (String, tokio::net::TcpSocket) {
    // Bound but never listening: a connection is refused, and while the socket is held no
    // other test's listener can take the port (dropping it at once let one do).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    (format!("http://{addr}"), socket)
}

fn seen(log: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    log.lock().unwrap().clone()
}

fn posts(log: &Arc<Mutex<Vec<Seen>>>) -> usize {
    seen(log).iter().filter(|s| Receiver::is_call(s)).count()
}

/// A payments sink at `base` that cannot forward the key, with `check` (if any), short
/// timeouts, and a check `delay` shorter than its default so the tests stay quick.
fn config(base: &str, check: Option<HttpCheckConfig>) -> HttpSinkConfig {
    HttpSinkConfig {
        url: format!("{base}/payments"),
        forward_key: false,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(1),
        check: check.map(Box::new),
        ..HttpSinkConfig::default()
    }
}

/// A GET check by the payment's reference.
fn lookup(base: &str) -> HttpCheckConfig {
    HttpCheckConfig {
        delay: Some(Duration::from_millis(200)),
        ..HttpCheckConfig::new(&format!("{base}/payments?reference={{/ref}}"))
    }
}

/// One check for `payload`, bounded in time.
async fn check(sink: &HttpSink, payload: &Value) -> CheckAnswer {
    let claim = common::claims::durable_claim("pay-1");
    let request = SinkRequest::new(&claim, "payment.create", payload, 1, None);
    tokio::time::timeout(BOUND, sink.check(request)).await.expect("the check answers within the bound")
}

fn payment(reference: &str) -> Value {
    json!({ "ref": reference, "amount": 5 })
}

// ---- the check alone ----

#[tokio::test]
async fn found_stores_the_answer_and_the_get_carries_the_rendered_url_and_the_headers() {
    let (base, log) = start(&[Reply::Hang], Reply::Status(200, PAYMENT)).await;
    let mut c = config(&base, Some(lookup(&base)));
    c.headers.insert("X-Team".into(), "billing".into());
    c.auth = Some(dedupd::sinks::http::HttpAuthConfig { bearer_env: Some("PAY_TOKEN".into()), ..Default::default() });
    if let Some(check) = c.check.as_mut() {
        check.headers.insert("Accept".into(), "application/json".into());
    }
    let env = |var: &str| (var == "PAY_TOKEN").then(|| "tok".to_string());
    let sink = HttpSink::with_env("payments", &c, &env).unwrap();

    let answer = check(&sink, &payment("r 1/2")).await;
    assert_eq!(
        answer,
        CheckAnswer::Found(json!({ "status": 200, "body": serde_json::from_str::<Value>(PAYMENT).unwrap() }))
    );

    let seen = seen(&log);
    assert_eq!(seen.len(), 1, "one GET, no POST: {seen:?}");
    let get = &seen[0];
    assert_eq!(get.method, Method::GET);
    assert_eq!(get.target, "/payments?reference=r%201%2F2", "the payload's value, percent-encoded");
    assert_eq!(get.header("accept"), Some("application/json"), "the check's headers");
    assert_eq!(get.header("x-team"), Some("billing"), "the sink's headers");
    assert_eq!(get.header("authorization"), Some("Bearer tok"), "the sink's auth");
    assert_eq!(get.header("idempotency-key"), None, "a lookup, not a command");
    assert!(get.body.is_empty());
}

#[tokio::test]
async fn found_pointer_tells_a_hit_from_an_empty_search() {
    let (base, log) = start(&[Reply::Hang], Reply::Search).await;
    let mut check_config = lookup(&base);
    check_config.found_pointer = Some("/data/0/id".into());
    let sink = HttpSink::new("payments", &config(&base, Some(check_config))).unwrap();

    let found = check(&sink, &payment("r-1")).await;
    let body: Value = serde_json::from_str(&format!(r#"{{"data":[{PAYMENT}]}}"#)).unwrap();
    assert_eq!(found, CheckAnswer::Found(json!({ "status": 200, "body": body })));
    assert_eq!(check(&sink, &payment("r-2")).await, CheckAnswer::Absent, "200 with an empty list");
    let targets: Vec<String> = seen(&log).into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["/payments?reference=r-1", "/payments?reference=r-2"]);
}

#[tokio::test]
async fn not_found_is_absent_and_another_status_is_unknown() {
    let (base, _) = start(&[Reply::Hang], Reply::Status(404, r#"{"error":"no such payment"}"#)).await;
    let sink = HttpSink::new("payments", &config(&base, Some(lookup(&base)))).unwrap();
    assert_eq!(check(&sink, &payment("r-1")).await, CheckAnswer::Absent);

    let (base, log) = start(&[Reply::Hang], Reply::Status(500, r#"{"error":"database down"}"#)).await;
    let sink = HttpSink::new("payments", &config(&base, Some(lookup(&base)))).unwrap();
    let CheckAnswer::Unknown(why) = check(&sink, &payment("r-1")).await else { panic!("a 500 tells nothing") };
    assert!(why.starts_with("HTTP 500 Internal Server Error"), "{why}");
    assert!(why.contains("database down"), "quotes the body: {why}");
    assert_eq!(seen(&log).len(), 1, "asked once");
}

#[tokio::test]
async fn no_receiver_is_an_error() {
    let (base, _held) = closed_port().await;
    let sink = HttpSink::new("payments", &config(&base, Some(lookup(&base)))).unwrap();
    let CheckAnswer::Error(why) = check(&sink, &payment("r-1")).await else { panic!("nobody answered") };
    assert!(why.starts_with("GET check: no answer"), "{why}");
}

#[tokio::test]
async fn a_receiver_that_never_answers_is_an_error_within_the_timeout() {
    let (base, log) = start(&[Reply::Hang], Reply::Hang).await;
    let sink = HttpSink::new("payments", &config(&base, Some(lookup(&base)))).unwrap();
    let started = Instant::now();
    let CheckAnswer::Error(why) = check(&sink, &payment("r-1")).await else { panic!("nobody answered") };
    let took = started.elapsed();
    assert!(why.contains("request_timeout 1s"), "{why}");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(5), "bounded by request_timeout: {took:?}");
    assert_eq!(seen(&log).len(), 1, "the GET arrived");
}

#[tokio::test]
async fn a_post_check_sends_its_body_template() {
    let (base, log) = start(&[Reply::Hang], Reply::Status(200, PAYMENT)).await;
    let check_config = HttpCheckConfig {
        method: "POST".into(),
        body_template: Some(json!({ "query": { "reference": "{/ref}" } })),
        ..HttpCheckConfig::new(&format!("{base}/payments/search"))
    };
    let sink = HttpSink::new("payments", &config(&base, Some(check_config))).unwrap();
    assert!(matches!(check(&sink, &payment("r-1")).await, CheckAnswer::Found(_)));
    let seen = seen(&log);
    assert_eq!((seen[0].method.clone(), seen[0].target.as_str()), (Method::POST, "/payments/search"));
    assert_eq!(serde_json::from_slice::<Value>(&seen[0].body).unwrap(), json!({ "query": { "reference": "r-1" } }));
}

#[tokio::test]
async fn a_payload_the_check_url_cannot_take_is_an_error_and_nothing_is_sent() {
    let (base, log) = start(&[Reply::Hang], Reply::Status(200, PAYMENT)).await;
    let sink = HttpSink::new("payments", &config(&base, Some(lookup(&base)))).unwrap();
    let CheckAnswer::Error(why) = check(&sink, &json!({ "amount": 5 })).await else { panic!("cannot render") };
    assert!(why.starts_with("check.url: payload has no field `/ref`"), "{why}");
    assert!(seen(&log).is_empty());
}

// ---- through the engine: a POST written, read and never answered ----

/// An engine over a fresh store whose every command goes to a sink built from `config`
/// as `run` builds one (with its check's timing).
fn engine(config: HttpSinkConfig) -> EngineWithSink {
    assert_eq!(SinkConfig::Http(config.clone()).problems("sinks.payments"), vec![]);
    EngineWithSink::new(Arc::new(SinkConfig::Http(config).build("payments").unwrap()))
}

#[tokio::test]
async fn an_unanswered_post_that_landed_is_found_by_the_check_and_never_sent_again() {
    let (base, log) = start(&[Reply::Hang], Reply::Status(200, PAYMENT)).await;
    let mut h = engine(config(&base, Some(lookup(&base))));
    let item = h.item("pay-1", payment("r-1"));

    let done = h.deliver(std::slice::from_ref(&item)).await.remove(0).result;
    let answer = json!({ "status": 200, "body": serde_json::from_str::<Value>(PAYMENT).unwrap() });
    assert_eq!(done.outcome, Outcome::Succeeded, "{done:?}");
    assert_eq!(done.result, answer, "the check's answer is the result");

    let seen = seen(&log);
    let methods: Vec<&Method> = seen.iter().map(|s| &s.method).collect();
    assert_eq!(methods, [&Method::POST, &Method::GET], "one POST, then the check: {seen:?}");
    assert_eq!(serde_json::from_slice::<Value>(&seen[0].body).unwrap(), payment("r-1"), "the POST arrived whole");
    assert_eq!(seen[1].target, "/payments?reference=r-1");
    let Some(Record::Completed(record)) = h.record("pay-1") else { panic!("completed: {:?}", h.record("pay-1")) };
    assert_eq!(record.outcome, Completion::Succeeded);
    assert_eq!(serde_json::from_slice::<Value>(&record.result).unwrap(), answer);

    // A repeat replays it: the receiver hears nothing more.
    let again = h.item("pay-1", payment("r-1"));
    let repeat = h.deliver(&[again]).await.remove(0).result;
    assert_eq!((repeat.outcome, repeat.result), (Outcome::Duplicate, answer));
    assert_eq!(posts(&log), 1);
}

#[tokio::test]
async fn an_unanswered_post_the_check_finds_absent_is_sent_again() {
    let (base, log) = start(&[Reply::Hang, Reply::Status(201, PAYMENT)], Reply::Status(404, "{}")).await;
    let mut h = engine(config(&base, Some(lookup(&base))));
    let item = h.item("pay-1", payment("r-1"));

    let done = h.deliver(&[item]).await.remove(0).result;
    assert_eq!(done.outcome, Outcome::Succeeded, "{done:?}");
    assert_eq!(done.result, json!({ "status": 201, "body": serde_json::from_str::<Value>(PAYMENT).unwrap() }));
    assert_eq!(done.attempts, 2);

    let seen = seen(&log);
    let methods: Vec<&Method> = seen.iter().map(|s| &s.method).collect();
    assert_eq!(methods, [&Method::POST, &Method::GET, &Method::POST], "{seen:?}");
    assert_eq!(seen[0].body, seen[2].body, "the same command again");
    assert!(matches!(h.record("pay-1"), Some(Record::Completed(c)) if c.outcome == Completion::Succeeded));
}

#[tokio::test]
async fn an_unanswered_post_whose_check_gets_no_answer_is_indeterminate() {
    let (base, log) = start(&[Reply::Hang], Reply::Status(200, PAYMENT)).await;
    let (nowhere, _held) = closed_port().await;
    let mut h = engine(config(&base, Some(lookup(&nowhere))));
    let item = h.item("pay-1", payment("r-1"));

    let done = h.deliver(&[item]).await.remove(0).result;
    assert_eq!(done.outcome, Outcome::Indeterminate, "{done:?}");
    assert_eq!(posts(&log), 1, "never sent again blind");
    assert_eq!(seen(&log).len(), 1, "the check went elsewhere");
    let Some(Record::Indeterminate(record)) = h.record("pay-1") else {
        panic!("indeterminate: {:?}", h.record("pay-1"))
    };
    assert!(
        record.why.contains("its check did not tell") && record.why.contains("GET check: no answer"),
        "{}",
        record.why
    );
}

#[tokio::test]
async fn without_a_check_an_unanswered_post_is_indeterminate_at_once() {
    let (base, log) = start(&[Reply::Hang], Reply::Status(200, PAYMENT)).await;
    let mut h = engine(config(&base, None));
    let item = h.item("pay-1", payment("r-1"));

    let done = h.deliver(&[item]).await.remove(0).result;
    assert_eq!(done.outcome, Outcome::Indeterminate, "{done:?}");
    let seen = seen(&log);
    assert_eq!(seen.len(), 1, "one POST, nothing else: {seen:?}");
    assert_eq!(seen[0].method, Method::POST);
    assert!(matches!(h.record("pay-1"), Some(Record::Indeterminate(r)) if r.why.contains("has no check")));
}

// ---- the docs ----

#[test]
fn the_documented_example_is_a_valid_sink_with_the_documented_timing() {
    let doc = include_str!("../../docs/sinks.md");
    let section = doc.find("## `http`: check before writing").expect("docs/sinks.md has the http check's section");
    let doc = &doc[section..];
    let start = doc.find("```toml\n[sinks.payments]\n").expect("the section has the payments example");
    let text = &doc[start + "```toml\n".len()..];
    let text = &text[..text.find("```").expect("the block ends")];
    let table: toml::Table = toml::from_str(text).unwrap();
    let sink: SinkConfig = table["sinks"]["payments"].clone().try_into().unwrap();
    assert_eq!(sink.problems("sinks.payments"), vec![]);
    let timing = sink.as_kind().check_timing().expect("a check");
    assert_eq!(timing.delay, Duration::from_secs(4));
    let SinkConfig::Http(http) = sink else { panic!("an http sink") };
    let check = *http.check.expect("a check");
    // Written out in the example, the default: twice request_timeout.
    assert_eq!(HttpCheckConfig { delay: None, ..check.clone() }.timing(http.request_timeout), timing);
}

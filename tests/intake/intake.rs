//! The HTTP intake on a real `dedupd run` and a real broker (docs/intake.md): a command
//! posted with an `Idempotency-Key` runs once through its sink and is answered with its
//! result; a repeat gets the stored answer marked replayed, another payload 422, a repeat
//! while the first is in flight 409; two clients never share a key; `GET` reads the key's
//! state; a slow command is answered 202 with the place to poll. Every bad request gets
//! its problem type and produces nothing. Assertions are on what the sink received and
//! what the topics hold, not only on the answers.

use crate::common;

use std::time::Duration;

use common::intake::{Door, problem_type};
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, tail_of_file};
use common::scripted::ScriptedReceiver;
use reqwest::StatusCode;
use serde_json::{Value, json};

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const SPARING: &str = "sparing-key-0123456789abcd";
/// How long a request waits for its result before the intake answers 202.
const WAIT: &str = "3s";
/// The idempotency key whose commands Kafka refuses (failpoint `intake.produce`).
const REFUSED: &str = "kafka-refuses";
/// The slow sink's answer time: past `WAIT`.
const SLOW_MS: u64 = 8_000;

fn config(bootstrap: &str, topics: [&str; 3], store: &std::path::Path, urls: (&str, &str)) -> String {
    let (pay, slow) = urls;
    let rest = format!(
        r#"
[sinks.pay]
kind = "http"
url = "{pay}"

[sinks.slow]
kind = "http"
url = "{slow}"
request_timeout = "20s"

[[routes]]
types = ["payment.*"]
sink = "pay"

[[routes]]
types = ["report.*"]
sink = "slow"

[intake]
listen = "127.0.0.1:0"
wait = "{WAIT}"
max_body_bytes = 4096

[intake.clients.alice]
api_key = "{ALICE}"
rate_per_second = 1000

[intake.clients.bob]
api_key = {{ env = "INTAKE_TEST_BOB_KEY" }}
rate_per_second = 1000

[intake.clients.sparing]
api_key = "{SPARING}"
rate_per_second = 1
burst = 2
"#,
    );
    common::intake::dedupd_toml(bootstrap, "intake-dedupd", topics, store, &rest)
}

/// Requests the pay sink received with `key` as their `Idempotency-Key`.
fn calls(receiver: &ScriptedReceiver, key: &str) -> usize {
    receiver.answered().iter().filter(|a| a.key.as_deref() == Some(key)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_intake_runs_each_key_once_and_answers_every_request() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topics = [kafka::unique("intake-in"), kafka::unique("intake-out"), kafka::unique("intake-dlq")];
    kafka::create_topics(&bootstrap, &[(&topics[0], 3), (&topics[1], 3), (&topics[2], 1)]).await;
    let pay = ScriptedReceiver::start(&[("alice/order-refused", &[400])]).await;
    let slow = SlowReceiver::start((SLOW_MS, SLOW_MS), 1).await;
    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let topic_names = [topics[0].as_str(), topics[1].as_str(), topics[2].as_str()];
    let text = config(&bootstrap, topic_names, &dir.path().join("store"), (&pay.url("/pay"), &slow.url("/report")));
    std::fs::write(&config_path, text).expect("write config");
    // Kafka refuses the commands of one key (failpoint `intake.produce`): the intake's 503.
    let refusing = common::process::has_failpoints("the intake's 503 when Kafka refuses a command");
    let refuse = format!("intake.produce=return(alice/{REFUSED})");
    let mut env = vec![("INTAKE_TEST_BOB_KEY", BOB)];
    if refusing {
        env.push(("FAILPOINTS", refuse.as_str()));
    }
    let mut dedupd =
        DedupdProcess::spawn_with_env(&["run", "--config", config_path.to_str().expect("path")], &env, &log);
    // Ready (its partitions assigned), so that a first answer within WAIT is the pipeline's
    // speed, not the group's join.
    let door = Door::when_ready(&log, &mut dedupd).await;

    first_repeat_and_conflict(&door, &pay).await;
    concurrent_identical_requests(&door, &pay).await;
    bad_requests_produce_nothing(&door, &pay, &bootstrap, &topics[0], refusing).await;
    slow_commands_are_accepted_and_polled(&door, &slow).await;
    every_listed_status_was_answered(&door, refusing).await;
    requests_are_counted(&log, &mut dedupd, refusing).await;

    // One result per command produced, each naming its input on the intake's topic.
    let produced: i64 = kafka::watermarks(&bootstrap, &topics[0]).await.iter().map(|(lo, hi)| hi - lo).sum();
    let results = kafka::read_all(&bootstrap, &topics[1], produced as usize, Duration::from_secs(30)).await;
    assert_eq!(results.len() as i64, produced, "one result per produced command");
    for r in &results {
        let v: Value = serde_json::from_slice(rdkafka::Message::payload(r).unwrap_or_default()).expect("result json");
        assert_eq!(v["source"]["topic"], topics[0].as_str());
        let client = v["source"]["intake"]["client"].as_str();
        assert!(matches!(client, Some("alice" | "bob")), "the source names the client: {v}");
    }
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", tail_of_file(&log, 40));
    pay.stop().await;
}

async fn first_repeat_and_conflict(door: &Door, pay: &ScriptedReceiver) {
    let charge = json!({"amount": 1200, "currency": "EUR"});
    let (status, replayed, body) = door.send(ALICE, "payment.charge", "\"order-1\"", charge.clone()).await;
    assert_eq!((status, replayed.as_deref()), (StatusCode::OK, None), "{body}");
    assert_eq!(body, json!({"accepted": true}), "the receiver's body");
    assert_eq!(calls(pay, "alice/order-1"), 1);
    let sent: Value = serde_json::from_slice(&pay.answered()[0].body).expect("sink body");
    assert_eq!(sent, charge, "the sink got the posted payload");

    // The same key as a bare token: the stored answer, replayed; the sink is not called.
    let (status, replayed, body) = door.send(ALICE, "payment.charge", "order-1", charge.clone()).await;
    assert_eq!((status, replayed.as_deref()), (StatusCode::OK, Some("true")), "{body}");
    assert_eq!(body, json!({"accepted": true}));
    // Another payload under the key: a conflict.
    let (status, _, body) = door.send(ALICE, "payment.charge", "order-1", json!({"amount": 9999})).await;
    assert_eq!((status, problem_type(&body)), (StatusCode::UNPROCESSABLE_ENTITY, "conflict"), "{body}");
    // Bob's order-1 is his own.
    let (status, replayed, _) = door.send(BOB, "payment.charge", "order-1", json!({"amount": 5})).await;
    assert_eq!((status, replayed.as_deref()), (StatusCode::OK, None));
    assert_eq!((calls(pay, "alice/order-1"), calls(pay, "bob/order-1")), (1, 1));

    let (status, state) = door.get(ALICE, "/v1/commands/order-1").await;
    assert_eq!(status, StatusCode::OK, "{state}");
    assert_eq!((state["key"].as_str(), state["state"].as_str()), (Some("order-1"), Some("completed")), "{state}");
    assert_eq!(state["result"]["body"], json!({"accepted": true}));
    let (status, body) = door.get(BOB, "/v1/commands/order-2").await;
    assert_eq!((status, problem_type(&body)), (StatusCode::NOT_FOUND, "not-found"), "{body}");
    let (status, body) = door.get("not-a-key-of-anyone", "/v1/commands/order-1").await;
    assert_eq!((status, problem_type(&body)), (StatusCode::UNAUTHORIZED, "unauthorized"), "{body}");
    let (status, body) = door.get(BOB, &format!("/v1/commands/{}", "k".repeat(300))).await;
    assert_eq!((status, problem_type(&body)), (StatusCode::BAD_REQUEST, "bad-idempotency-key"), "{body}");

    // The receiver refuses (400, scripted for the key): the command failed, and says why.
    let (status, _, body) = door.send(ALICE, "payment.charge", "order-refused", json!({"amount": -1})).await;
    assert_eq!((status, problem_type(&body)), (StatusCode::BAD_GATEWAY, "command-failed"), "{body}");
    assert_eq!(body["result"]["status"], 400, "{body}");
}

async fn concurrent_identical_requests(door: &Door, pay: &ScriptedReceiver) {
    let requests = (0..200).map(|_| door.send(ALICE, "payment.charge", "burst-1", json!({"amount": 7})));
    let answers = futures::future::join_all(requests).await;
    let firsts = answers.iter().filter(|(s, r, _)| *s == StatusCode::OK && r.is_none()).count();
    let replays = answers.iter().filter(|(s, r, _)| *s == StatusCode::OK && r.as_deref() == Some("true")).count();
    let in_flight =
        answers.iter().filter(|(s, _, b)| *s == StatusCode::CONFLICT && problem_type(b) == "in-flight").count();
    assert_eq!(firsts + replays + in_flight, 200, "every answer is the first, a replay or 409: {answers:?}");
    assert!(firsts <= 1, "{firsts} first answers");
    assert_eq!(calls(pay, "alice/burst-1"), 1, "one sink call for 200 requests");
}

async fn bad_requests_produce_nothing(
    door: &Door,
    pay: &ScriptedReceiver,
    bootstrap: &str,
    input: &str,
    refusing: bool,
) {
    let before = kafka::watermarks(bootstrap, input).await;
    let calls_before = pay.answered().len();
    let ok = json!({"amount": 1}).to_string();
    let mut cases: Vec<(&str, reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            "no key",
            door.post(ALICE, "payment.charge", None).body(ok.clone()),
            StatusCode::BAD_REQUEST,
            "missing-idempotency-key",
        ),
        (
            "bad key",
            door.post(ALICE, "payment.charge", Some("\"open")).body(ok.clone()),
            StatusCode::BAD_REQUEST,
            "bad-idempotency-key",
        ),
        (
            "bad json",
            door.post(ALICE, "payment.charge", Some("k-json")).body("{\"amount\":"),
            StatusCode::BAD_REQUEST,
            "invalid-json",
        ),
        (
            "duplicate member",
            door.post(ALICE, "payment.charge", Some("k-dup")).body("{\"a\":1,\"a\":2}"),
            StatusCode::BAD_REQUEST,
            "invalid-json",
        ),
        (
            "too large",
            door.post(ALICE, "payment.charge", Some("k-big")).body(format!("\"{}\"", "x".repeat(5000))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
        ),
        (
            "unknown type",
            door.post(ALICE, "ledger.move", Some("k-type")).body(ok.clone()),
            StatusCode::NOT_FOUND,
            "unknown-type",
        ),
        (
            "bad api key",
            door.post("not-a-key-of-anyone", "payment.charge", Some("k-auth")).body(ok.clone()),
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            "wrong content type",
            door.http
                .post(format!("{}/v1/commands/payment.charge", door.base))
                .bearer_auth(ALICE)
                .header("idempotency-key", "k-ct")
                .header("content-type", "text/plain")
                .body(ok.clone()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
        ),
    ];
    if refusing {
        let refused = door.post(ALICE, "payment.charge", Some(REFUSED)).body(ok.clone());
        cases.push(("kafka refuses", refused, StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
    }
    for (what, request, status, cause) in cases {
        let response = request.send().await.expect("request");
        let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_string());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(response.headers().contains_key("retry-after"), "{what}: 503 without Retry-After");
        }
        let (got, _, body) = door.answer_post(response).await;
        assert_eq!((got, problem_type(&body)), (status, cause), "{what}: {body}");
        assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{what}");
        assert_eq!(body["status"], status.as_u16(), "{what}: {body}");
    }
    // A client past its rate: 429 with Retry-After (its burst is 2, then one a second).
    let mut limited = None;
    for i in 0..5 {
        let response = door.post(SPARING, "payment.charge", None).body(ok.clone()).send().await.expect("request");
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some((i, response.headers().contains_key("retry-after"), door.answer_post(response).await.2));
            break;
        }
    }
    let (_, retry_after, body) = limited.expect("a 429 within 5 requests");
    assert!(retry_after && problem_type(&body) == "rate-limited", "{body}");
    assert_eq!(kafka::watermarks(bootstrap, input).await, before, "a refused request produced a record");
    assert_eq!(pay.answered().len(), calls_before, "a refused request reached the sink");
}

async fn slow_commands_are_accepted_and_polled(door: &Door, slow: &SlowReceiver) {
    let report = json!({"month": "2026-11"});
    let response =
        door.post(ALICE, "report.build", Some("report-11")).body(report.to_string()).send().await.expect("post");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let location = response.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_string);
    assert_eq!(location.as_deref(), Some("/v1/commands/report-11"));
    door.answer_post(response).await;
    // Still in flight: 409 with Retry-After, and the sink is not called again.
    let response =
        door.post(ALICE, "report.build", Some("report-11")).body(report.to_string()).send().await.expect("post");
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(response.headers().contains_key("retry-after"));
    door.answer_post(response).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, state) = door.get(ALICE, "/v1/commands/report-11").await;
        assert!(status == StatusCode::OK || status == StatusCode::NOT_FOUND, "{status} {state}");
        if state["state"] == "completed" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "report-11 never completed: {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Completed in the store; this instance holds the key (409) until the accepted
    // request's result record reaches its results reader, which a loaded machine delays.
    let (status, replayed, body) = loop {
        let (status, replayed, body) = door.send(ALICE, "report.build", "report-11", report.clone()).await;
        if status != StatusCode::CONFLICT || tokio::time::Instant::now() >= deadline {
            break (status, replayed, body);
        }
        assert_eq!(problem_type(&body), "in-flight", "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((status, replayed.as_deref()), (StatusCode::OK, Some("true")), "{body}");
    assert_eq!(slow.count(), 1, "one call of the slow sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intake_serves_tls_with_its_certificate() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topics = [kafka::unique("intake-tls-in"), kafka::unique("intake-tls-out"), kafka::unique("intake-tls-dlq")];
    kafka::create_topics(&bootstrap, &[(&topics[0], 1), (&topics[1], 1), (&topics[2], 1)]).await;
    let pay = ScriptedReceiver::start(&[]).await;
    let dir = KeptOnFailure::new();
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("certificate");
    let (cert, key) = (dir.path().join("intake.crt"), dir.path().join("intake.key"));
    std::fs::write(&cert, certified.cert.pem()).expect("write cert");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write key");
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let names = [topics[0].as_str(), topics[1].as_str(), topics[2].as_str()];
    let mut text = config(&bootstrap, names, &dir.path().join("store"), (&pay.url("/pay"), &pay.url("/slow")));
    text.push_str(&format!("\n[intake.tls]\ncert_file = {cert:?}\nkey_file = {key:?}\n"));
    std::fs::write(&config_path, text).expect("write config");
    // Kafka refuses the commands of one key (failpoint `intake.produce`): the intake's 503.
    let refusing = common::process::has_failpoints("the intake's 503 when Kafka refuses a command");
    let refuse = format!("intake.produce=return(alice/{REFUSED})");
    let mut env = vec![("INTAKE_TEST_BOB_KEY", BOB)];
    if refusing {
        env.push(("FAILPOINTS", refuse.as_str()));
    }
    let mut dedupd =
        DedupdProcess::spawn_with_env(&["run", "--config", config_path.to_str().expect("path")], &env, &log);
    let plain = Door::when_ready(&log, &mut dedupd).await;
    let trusting = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).expect("pem")])
        .build()
        .expect("client");
    let door = Door::new(plain.base.replace("http://", "https://"), trusting);
    let (status, replayed, body) = door.send(ALICE, "payment.charge", "tls-1", json!({"amount": 3})).await;
    assert_eq!((status, replayed.as_deref()), (StatusCode::OK, None), "{body}");
    assert_eq!(calls(&pay, "alice/tls-1"), 1);
    // Plain HTTP on the TLS listener gets no answer.
    let refused = plain.post(ALICE, "payment.charge", Some("tls-2")).body("{}").send().await;
    assert!(refused.is_err() || refused.is_ok_and(|r| !r.status().is_success()));
    assert_eq!(calls(&pay, "alice/tls-2"), 0);
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", tail_of_file(&log, 40));
}

/// `/metrics` counts the requests above by door, client and status, and times them.
async fn requests_are_counted(log: &std::path::Path, dedupd: &mut DedupdProcess, refusing: bool) {
    let ops = common::process::wait_for_http_addr(log, dedupd, Duration::from_secs(10)).await;
    let scrape = reqwest::get(format!("http://{ops}/metrics")).await.expect("scrape").text().await.expect("text");
    let count = |labels: &[&str]| -> f64 {
        scrape
            .lines()
            .filter(|l| l.starts_with("dedupd_intake_requests_total{") && labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(count(&[r#"door="http""#, r#"client="alice""#, r#"status="200""#]) >= 3.0, "{scrape}");
    assert!(count(&[r#"client="bob""#]) >= 1.0, "{scrape}");
    assert!(count(&[r#"client="-""#, r#"status="401""#]) >= 1.0, "an unknown API key: {scrape}");
    assert!(count(&[r#"client="alice""#, r#"status="422""#]) >= 1.0, "{scrape}");
    if refusing {
        assert!(count(&[r#"client="alice""#, r#"status="503""#]) >= 1.0, "{scrape}");
    }
    let timed = scrape.lines().find(|l| l.starts_with(r#"dedupd_intake_request_duration_seconds_count{door="http"}"#));
    let timed: f64 = timed.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0);
    assert!(timed >= count(&[r#"door="http""#]), "every request timed: {timed}\n{scrape}");
}

/// Every status `/v1/openapi.json` lists was answered above, but 421 `not-owner` (a key of
/// another instance, with `store.changelog`: tests/intake/intake_instances.rs answers it), and 503
/// `unavailable` in a build without failpoints.
async fn every_listed_status_was_answered(door: &Door, refusing: bool) {
    let response = door.http.get(format!("{}/v1/openapi.json", door.base)).send().await.expect("openapi");
    assert_eq!(response.status(), StatusCode::OK);
    let doc: Value = response.json().await.expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    let paths: Vec<&String> = doc["paths"].as_object().expect("paths").keys().collect();
    assert_eq!(paths, ["/v1/commands/{name}", "/v1/openapi.json"]);
    let mut not_brought_about = vec![("GET", "421")];
    if !refusing {
        not_brought_about.push(("POST", "503"));
    }
    for (method, op) in doc["paths"]["/v1/commands/{name}"].as_object().expect("operations") {
        let method = method.to_uppercase();
        let seen = door.seen(&method);
        for status in op["responses"].as_object().expect("responses").keys() {
            if not_brought_about.contains(&(method.as_str(), status.as_str())) {
                continue;
            }
            let answered = match status.as_str() {
                // The sink's own 2xx: any success but the intake's 202.
                "2XX" => seen.iter().any(|s| (200..300).contains(s) && *s != 202),
                code => seen.contains(&code.parse::<u16>().expect("a status")),
            };
            assert!(answered, "{method} {status} is listed and was never answered (answered: {seen:?})");
        }
    }
}

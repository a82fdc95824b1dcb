//! The `http` sink never follows a redirect and never lets a payload choose the host: a 3xx is
//! a permanent failure naming `Location`, the redirect target gets nothing (so neither the
//! payload nor a configured secret header leaves for it), and URL template values stay inside
//! their path segment or query value. The opt-in `follow_redirects = "same_origin"` follows
//! 307/308 to the configured origin only. Real axum servers on 127.0.0.1; every wait is bounded.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use dedupd::outcome::Outcome;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::http::{FollowRedirects, HttpSinkConfig};
use dedupd::store::{Completion, Record};
use serde_json::{Value, json};

use common::orphan::EngineWithSink;

/// The requests a server saw: method, path with query, headers and body.
type Seen = Arc<Mutex<Vec<(Method, String, HeaderMap, Bytes)>>>;

/// Starts a server that records every request and answers each with `answer(path)`;
/// returns its `http://127.0.0.1:PORT` origin.
async fn serve(answer: impl Fn(&str) -> Response + Clone + Send + Sync + 'static) -> (String, Seen) {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let (log, answer) = (log.clone(), answer.clone());
        async move {
            let path = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
            log.lock().unwrap().push((method, path.clone(), headers, body));
            answer(&path)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}"), seen)
}

fn ok(_path: &str) -> Response {
    (StatusCode::OK, [("content-type", "application/json")], r#"{"ran":true}"#).into_response()
}

fn paths(seen: &Seen) -> Vec<String> {
    seen.lock().unwrap().iter().map(|(_, p, _, _)| p.clone()).collect()
}

fn config(url: String) -> HttpSinkConfig {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert("X-Api-Key".to_string(), "secret-api-key".to_string());
    HttpSinkConfig {
        url,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        headers,
        ..HttpSinkConfig::default()
    }
}

/// Runs one command through the engine and returns its outcome, error and stored record.
async fn deliver(config: HttpSinkConfig, key: &str, payload: Value) -> (Outcome, Option<String>, Option<Record>) {
    let sink = Arc::new(SinkConfig::Http(config).build("hook").unwrap());
    let mut h = EngineWithSink::new(sink);
    let item = h.item(key, payload);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert!(done[0].sink_called);
    (done[0].result.outcome, done[0].result.error.clone(), h.record(key))
}

/// Every redirect status, to a path of the same server that would answer 200 and to
/// another server: the command ends `failed` on its first attempt, the message names the
/// status and the `Location`, and nothing reaches the target.
#[tokio::test]
async fn a_redirect_is_a_permanent_failure_naming_location_and_is_never_followed() {
    let (other, other_seen) = serve(ok).await;
    for (code, reason) in [
        (301, "Moved Permanently"),
        (302, "Found"),
        (303, "See Other"),
        (307, "Temporary Redirect"),
        (308, "Permanent Redirect"),
    ] {
        for target in ["/landing".to_string(), format!("{other}/landing")] {
            let location = target.clone();
            let (origin, seen) = serve(move |path: &str| {
                if path == "/hook" {
                    (StatusCode::from_u16(code).unwrap(), [("location", location.clone())]).into_response()
                } else {
                    ok(path)
                }
            })
            .await;
            let key = format!("redirect-{code}-{}", target.len());
            let (outcome, error, record) = deliver(config(format!("{origin}/hook")), &key, json!({"n": 1})).await;
            assert_eq!(outcome, Outcome::Failed, "{code} to {target}: {error:?}");
            let error = error.expect("a failure names its cause");
            assert!(error.contains(&code.to_string()) && error.contains(reason), "{code}: {error}");
            assert!(error.contains(&target), "the message names Location `{target}`: {error}");
            match record {
                Some(Record::Completed(c)) => {
                    assert_eq!(c.outcome, Completion::Failed, "{code}");
                    assert_eq!(c.attempts, 1, "{code}: permanent, not retried");
                }
                other => panic!("{code}: expected a completed record, got {other:?}"),
            }
            assert_eq!(paths(&seen), ["/hook"], "{code} to {target}: the redirect was not followed");
            assert!(paths(&other_seen).is_empty(), "{code} to {target}: the other host got nothing");
        }
    }
}

/// Answers `/hook` with `code` to `location`, every other path 200.
fn redirecting(code: u16, location: String) -> impl Fn(&str) -> Response + Clone + Send + Sync + 'static {
    move |path: &str| {
        if path == "/hook" {
            (StatusCode::from_u16(code).unwrap(), [("location", location.clone())]).into_response()
        } else {
            ok(path)
        }
    }
}

/// With `same_origin`, 307 and 308 to the same server are followed with the same method,
/// body and headers; 301/302/303, and 307 to another host, still fail naming `Location`.
#[tokio::test]
async fn same_origin_follows_307_and_308_to_the_configured_origin_only() {
    let same_origin = |url: String| HttpSinkConfig { follow_redirects: FollowRedirects::SameOrigin, ..config(url) };
    for code in [307, 308] {
        let (origin, seen) = serve(redirecting(code, "/moved?x=1".into())).await;
        let payload = json!({"n": code});
        let (outcome, error, _) =
            deliver(same_origin(format!("{origin}/hook")), &format!("k{code}"), payload.clone()).await;
        assert_eq!(outcome, Outcome::Succeeded, "{code}: {error:?}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{code}");
        let (method, path, headers, body) = &seen[1];
        assert_eq!((method, path.as_str()), (&Method::POST, "/moved?x=1"), "{code}");
        assert_eq!(headers.get("x-api-key").unwrap(), "secret-api-key", "{code}");
        assert_eq!(headers.get("idempotency-key").unwrap(), format!("k{code}").as_str());
        assert_eq!(serde_json::from_slice::<Value>(body).unwrap(), payload);
    }
    let (other, other_seen) = serve(ok).await;
    for (code, target) in [(301, "/moved".to_string()), (303, "/moved".into()), (307, format!("{other}/moved"))] {
        let (origin, seen) = serve(redirecting(code, target.clone())).await;
        let (outcome, error, _) = deliver(same_origin(format!("{origin}/hook")), &format!("n{code}"), json!({})).await;
        assert_eq!(outcome, Outcome::Failed, "{code} to {target}");
        assert!(error.unwrap_or_default().contains(&target), "{code}: names the Location");
        assert_eq!(paths(&seen), ["/hook"], "{code} to {target}");
    }
    assert!(paths(&other_seen).is_empty(), "the other host got nothing");
    // A redirect loop on the same origin ends permanently after a bounded number of hops.
    let (origin, seen) = serve(redirecting(307, "/hook".into())).await;
    let (outcome, error, _) = deliver(same_origin(format!("{origin}/hook")), "loop", json!({})).await;
    assert_eq!(outcome, Outcome::Failed, "{error:?}");
    assert!((2..=12).contains(&paths(&seen).len()), "{}", paths(&seen).len());
}

/// Values that would change the host, user or port if inserted raw stay in their path
/// segment or query value, percent-encoded: the request reaches the configured server.
#[tokio::test]
async fn template_values_cannot_leave_their_path_segment_or_query_value() {
    let (origin, seen) = serve(ok).await;
    let url = format!("{origin}/{{/tenant}}/orders?ref={{/ref}}");
    let cases = [
        ("evil.com/x", "/evil.com%2Fx/orders"),
        ("@evil.com", "/%40evil.com/orders"),
        ("x:1", "/x%3A1/orders"),
        ("evil.com:80#", "/evil.com%3A80%23/orders"),
        ("a?b=c&d", "/a%3Fb%3Dc%26d/orders"),
    ];
    for (i, (tenant, path)) in cases.into_iter().enumerate() {
        let payload = json!({"tenant": tenant, "ref": "//evil.com:1@x"});
        let (outcome, error, _) = deliver(config(url.clone()), &format!("tenant-{i}"), payload).await;
        assert_eq!(outcome, Outcome::Succeeded, "{tenant}: {error:?}");
        let last = paths(&seen).pop().expect("the configured server got the request");
        assert_eq!(last, format!("{path}?ref=%2F%2Fevil.com%3A1%40x"), "{tenant}");
    }
    assert_eq!(paths(&seen).len(), cases.len());
}

/// A placeholder anywhere in the scheme or authority (user, host, port) is refused when the
/// config is read, naming `sinks.NAME.url`; placeholders after the authority are accepted.
#[test]
fn a_placeholder_in_the_authority_is_refused_at_validation() {
    let load = |url: &str| {
        let text = format!("[sinks.h]\nkind = \"http\"\nurl = \"{url}\"\n");
        dedupd::config::Config::from_toml_str(&text, Vec::<(String, String)>::new())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    for url in [
        "https://{/host}/x",
        "https://{/host}",
        "https://api.test{/suffix}/x",
        "https://api.test{/suffix}",
        "https://api.{/region}.test/x",
        "https://api.test:{/port}/x",
        "https://{/user}@api.test/x",
        "http{/s}://api.test/x",
        "{/base}/x",
    ] {
        let err = load(url).expect_err(url);
        assert!(err.contains("sinks.h.url"), "{url}: {err}");
    }
    for url in [
        "https://api.test/{/t}/orders",
        "https://api.test?x={/v}",
        "https://api.test:8443/{/t}",
        "http://127.0.0.1/a#{/f}",
    ] {
        assert_eq!(load(url), Ok(()), "{url}");
    }
}

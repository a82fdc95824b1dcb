//! The admin API (docs/contract.md §9, docs/admin.md) on a real loopback listener over a real store:
//! bearer token (missing and wrong: 401 with a challenge, nothing changed), off without a
//! token (404), unknown key 404, conflicts 409, bad input 400; resolve, forget, compact,
//! export and import change the store, asserted by reading it back.

use crate::common;

use common::admin::Server;

use std::sync::Arc;

use common::records::{completed, in_progress, indeterminate};
use dedupd::fingerprint::Fingerprint;
use dedupd::ops::AdminApi;
use dedupd::store::{Completion, KeyStore, Record};
use dedupd::store::{StoreBackend, SyncMode};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const TOKEN: &str = "s3cret-token-0123456789";

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn start(admin: Option<AdminApi>) -> Server {
    Server::start(admin).await
}

/// Sends a request; returns status, `WWW-Authenticate` and the body as JSON (or a string).
async fn call(
    method: Method,
    url: &str,
    token: Option<&str>,
    body: Option<String>,
) -> (StatusCode, Option<String>, Value) {
    let client = reqwest::Client::new();
    let mut r = client.request(method, url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.body(b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status();
    let challenge = resp.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, challenge, value)
}

fn store_with_records(dir: &std::path::Path) -> Arc<KeyStore> {
    let store = Arc::new(KeyStore::open(StoreBackend::Sled, &dir.join("store"), SyncMode::Batch).unwrap());
    let later = now_ms() + 3_600_000;
    for (k, r) in [
        ("done", completed(1, later)),
        ("a/b c", completed(2, later)),
        ("unknown-effect", indeterminate(3)),
        ("busy", in_progress(4)),
        ("old", completed(5, now_ms() - 1)),
    ] {
        store.compare_and_swap(k, None, Some(&r)).unwrap().unwrap();
    }
    store.raise_watermarks(&[("commands".into(), 0, 41)]).unwrap();
    store
}

fn api(store: &Arc<KeyStore>) -> AdminApi {
    common::admin::api(store, TOKEN)
}

#[tokio::test]
async fn off_without_a_token() {
    let server = start(None).await;
    for (method, path) in [(Method::GET, "/v1/keys/done"), (Method::POST, "/v1/compact"), (Method::GET, "/v1/stats")] {
        let (status, _, body) = call(method, &format!("{}{path}", server.base), Some(TOKEN), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(body["error"].as_str().unwrap().contains("admin API is off"), "{body}");
    }
    // The CLI says so and exits 2 (an error), not 4 (no such key).
    let base = server.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
            .args(["inspect", "done", "--admin", &base])
            .env("DEDUPD_ADMIN_TOKEN", TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin API is off"), "{out:?}");
    // The rest of the listener is unaffected.
    let (status, _, _) = call(Method::GET, &format!("{}/healthz", server.base), None, None).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn every_route_needs_the_right_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_records(dir.path());
    let server = start(Some(api(&store))).await;
    let routes = [
        (Method::GET, "/v1/keys/done", None),
        (Method::DELETE, "/v1/keys/done", None),
        (Method::POST, "/v1/keys/unknown-effect/resolve", Some(r#"{"as":"succeeded"}"#.to_string())),
        (Method::GET, "/v1/stats", None),
        (Method::GET, "/v1/status", None),
        (Method::POST, "/v1/compact", None),
        (Method::GET, "/v1/export", None),
        (Method::POST, "/v1/import", Some(String::new())),
        (Method::GET, "/v1/keys?key=done", None),
        (Method::DELETE, "/v1/keys?key=done", None),
        (Method::POST, "/v1/resolve?key=unknown-effect", Some(r#"{"as":"succeeded"}"#.to_string())),
    ];
    let done_before = store.get("done").unwrap();
    assert!(done_before.is_some());
    for (method, path, body) in &routes {
        let url = format!("{}{path}", server.base);
        let (status, challenge, answer) = call(method.clone(), &url, None, body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} without a token");
        assert_eq!(challenge.as_deref(), Some("Bearer realm=\"dedupd\""), "{path}");
        assert!(answer["error"].as_str().unwrap().contains("missing"), "{answer}");
        for wrong in ["wrong-token-0123456789", &TOKEN[..TOKEN.len() - 1], &format!("{TOKEN}x")] {
            let (status, challenge, answer) = call(method.clone(), &url, Some(wrong), body.clone()).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} with {wrong:?}");
            assert!(challenge.unwrap().contains("error=\"invalid_token\""));
            assert!(answer["error"].as_str().unwrap().contains("wrong"), "{answer}");
        }
    }
    // Nothing changed: the forget, resolve, compaction and import above were all refused.
    assert_eq!(store.get("done").unwrap(), done_before);
    assert_eq!(store.get("unknown-effect").unwrap(), Some(indeterminate(3)));
    assert!(store.get("old").unwrap().is_some(), "the expired record was not compacted");
    // With the token: the status needs a pipeline, which this listener has not.
    let (status, _, answer) = call(Method::GET, &format!("{}/v1/status", server.base), Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("dedupd run"), "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn key_routes_change_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_records(dir.path());
    let server = start(Some(api(&store))).await;
    let url = |path: &str| format!("{}{path}", server.base);
    let t = Some(TOKEN);

    // inspect: found (a key with a slash and a space, percent-encoded), and unknown.
    let (status, _, body) = call(Method::GET, &url("/v1/keys/a%2Fb%20c"), t, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["key"].as_str(), body["state"].as_str()), (Some("a/b c"), Some("completed")));
    assert_eq!(body["result"], json!({"accepted": true}));
    let (status, _, body) = call(Method::GET, &url("/v1/keys/nope"), t, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("no record"), "{body}");

    // resolve: only an indeterminate key; bad bodies are 400.
    let (status, _, body) =
        call(Method::POST, &url("/v1/keys/done/resolve"), t, Some(r#"{"as":"failed"}"#.into())).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _, _) = call(Method::POST, &url("/v1/keys/nope/resolve"), t, Some(r#"{"as":"failed"}"#.into())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for bad in ["", "{}", r#"{"as":"maybe"}"#, "[1]"] {
        let (status, _, body) = call(Method::POST, &url("/v1/keys/unknown-effect/resolve"), t, Some(bad.into())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    assert_eq!(store.get("unknown-effect").unwrap(), Some(indeterminate(3)));
    let (status, _, body) =
        call(Method::POST, &url("/v1/keys/unknown-effect/resolve"), t, Some(r#"{"as":"failed"}"#.into())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    match store.get("unknown-effect").unwrap() {
        Some(Record::Completed(c)) => {
            assert_eq!(c.outcome, Completion::Failed);
            assert_eq!(c.fingerprint, Fingerprint([3; 32]));
            assert!(c.expires_at_ms > now_ms() + 3_000_000, "resolve_ttl applied");
        }
        other => panic!("not resolved: {other:?}"),
    }

    // forget: an in_progress key needs force; unknown is 404; a bad query 400.
    let (status, _, body) = call(Method::DELETE, &url("/v1/keys/busy"), t, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(store.get("busy").unwrap(), Some(in_progress(4)));
    let (status, _, _) = call(Method::DELETE, &url("/v1/keys/busy?force=maybe"), t, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, body) = call(Method::DELETE, &url("/v1/keys/busy?force=true"), t, None).await;
    assert_eq!((status, body["was"].as_str()), (StatusCode::OK, Some("in_progress")), "{body}");
    assert_eq!(store.get("busy").unwrap(), None);
    let (status, _, body) = call(Method::DELETE, &url("/v1/keys/done"), t, None).await;
    assert_eq!((status, body["was"].as_str()), (StatusCode::OK, Some("completed")));
    assert_eq!(store.get("done").unwrap(), None);
    let (status, _, _) = call(Method::DELETE, &url("/v1/keys/done"), t, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // stats agree with the store; compact removes the expired record.
    let (status, _, stats) = call(Method::GET, &url("/v1/stats"), t, None).await;
    assert_eq!(status, StatusCode::OK);
    let counts = store.counts();
    assert_eq!(
        stats["records"],
        json!({"in_progress": counts.in_progress, "completed": counts.completed, "indeterminate": counts.indeterminate})
    );
    assert_eq!(stats["records"]["completed"], 3, "{stats}");
    assert_eq!(stats["watermarks"], 1);
    let (status, _, body) = call(Method::POST, &url("/v1/compact"), t, None).await;
    assert_eq!((status, &body), (StatusCode::OK, &json!({"removed": 1})));
    assert_eq!(store.get("old").unwrap(), None);
    assert_eq!(store.counts().completed, 2);
    // Counted as the background's compactions are.
    let scraped = reqwest::get(url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(scraped.lines().any(|l| l == "dedupd_compaction_removed_total 1"), "{scraped}");
    server.stop().await;
}

/// The query form reaches every key, `.` and `..` included (no client can send those as a
/// path segment: URL parsing removes them, `%2E` too).
#[tokio::test]
async fn key_routes_take_the_key_in_the_query_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_records(dir.path());
    for (k, r) in [(".", indeterminate(6)), ("..", in_progress(7)), ("a+b", completed(8, now_ms() + 3_600_000))] {
        store.compare_and_swap(k, None, Some(&r)).unwrap().unwrap();
    }
    let server = start(Some(api(&store))).await;
    let url = |path: &str| format!("{}{path}", server.base);
    let t = Some(TOKEN);

    for (query, key) in [("key=.", "."), ("key=..", ".."), ("key=a%2Bb", "a+b"), ("key=a%2Fb+c", "a/b c")] {
        let (status, _, body) = call(Method::GET, &url(&format!("/v1/keys?{query}")), t, None).await;
        assert_eq!((status, body["key"].as_str()), (StatusCode::OK, Some(key)), "{query}: {body}");
    }
    let (status, _, body) = call(Method::GET, &url("/v1/keys?key=nope"), t, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Without a key, GET /v1/keys lists (tests/cli/cli_admin.rs); the others need one.
    for (method, path) in [(Method::DELETE, "/v1/keys?force=true"), (Method::POST, "/v1/resolve")] {
        let (status, _, body) = call(method, &url(path), t, Some(r#"{"as":"failed"}"#.into())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("key=KEY"), "{body}");
    }

    let (status, _, body) = call(Method::POST, &url("/v1/resolve?key=."), t, Some(r#"{"as":"failed"}"#.into())).await;
    assert_eq!((status, body["state"].as_str()), (StatusCode::OK, Some("completed")), "{body}");
    let (status, _, _) = call(Method::POST, &url("/v1/resolve?key=."), t, Some(r#"{"as":"failed"}"#.into())).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _, _) = call(Method::DELETE, &url("/v1/keys?key=.."), t, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "in_progress needs force");
    let (status, _, body) = call(Method::DELETE, &url("/v1/keys?key=..&force=true"), t, None).await;
    assert_eq!((status, body["was"].as_str()), (StatusCode::OK, Some("in_progress")), "{body}");
    assert_eq!(store.get("..").unwrap(), None);
    let (status, _, _) = call(Method::DELETE, &url("/v1/keys?key=.&force=maybe"), t, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

#[tokio::test]
async fn export_then_import_into_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_records(dir.path());
    let server = start(Some(api(&store))).await;
    let (status, _, body) = call(Method::GET, &format!("{}/v1/export", server.base), Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK);
    let text = body.as_str().unwrap().to_string();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.first().unwrap()["type"], "header");
    assert_eq!(lines.last().unwrap(), &json!({"v": 1, "type": "end", "records": 5, "watermarks": 1}));
    assert!(lines.iter().all(|l| l["v"] == 1));
    server.stop().await;

    // A second, empty instance.
    let other_dir = tempfile::tempdir().unwrap();
    let other = Arc::new(KeyStore::open(StoreBackend::Fjall, &other_dir.path().join("s"), SyncMode::Batch).unwrap());
    let server = start(Some(api(&other))).await;
    let import = |body: String, query: &'static str| {
        let url = format!("{}/v1/import{query}", server.base);
        async move { call(Method::POST, &url, Some(TOKEN), Some(body)).await }
    };
    // A bad line is 400 naming it.
    let cut: String =
        text.lines().take(3).map(|l| format!("{l}\n")).collect::<String>() + "{\"v\":1,\"type\":\"record\"}\n";
    let (status, _, body) = import(cut, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("line 4:"), "{body}");
    // The lines before it were applied (documented; the CLI checks a file before sending).
    assert_eq!(other.watermark("commands", 0).unwrap(), Some(41));
    assert_eq!(other.counts().completed + other.counts().in_progress + other.counts().indeterminate, 1);
    let (status, _, report) = import(text.clone(), "").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        report,
        json!({"imported": 3, "unchanged": 1, "kept_newer": 0, "kept_in_progress": 0, "expired": 1, "watermarks_raised": 0})
    );
    for key in ["done", "a/b c", "unknown-effect", "busy"] {
        assert_eq!(other.get(key).unwrap(), store.get(key).unwrap(), "{key}");
    }
    assert_eq!(other.get("old").unwrap(), None, "expired records are skipped");
    assert_eq!(other.watermark("commands", 0).unwrap(), Some(41));
    let (status, _, report) = import(text, "?overwrite=false").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(report["unchanged"], 4);
    server.stop().await;
}

/// An import body far past axum's default 2 MiB body limit streams through.
#[tokio::test]
async fn a_large_export_streams_both_ways() {
    const N: usize = 12_000;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Sled, &dir.path().join("a"), SyncMode::Batch).unwrap());
    let later = now_ms() + 3_600_000;
    for i in 0..N {
        let key = format!("key-{i:06}-{}", "x".repeat(200));
        store.compare_and_swap(&key, None, Some(&completed((i % 250) as u8, later))).unwrap().unwrap();
    }
    let server = start(Some(api(&store))).await;
    let (status, _, body) = call(Method::GET, &format!("{}/v1/export", server.base), Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK);
    let text = body.as_str().unwrap().to_string();
    assert!(text.len() > 4 * 1024 * 1024, "{} bytes", text.len());
    server.stop().await;

    let other = Arc::new(KeyStore::open(StoreBackend::Sled, &dir.path().join("b"), SyncMode::Batch).unwrap());
    let server = start(Some(api(&other))).await;
    let (status, _, report) = call(Method::POST, &format!("{}/v1/import", server.base), Some(TOKEN), Some(text)).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["imported"], N);
    assert_eq!(other.counts().completed, N as i64);
    let key = format!("key-{:06}-{}", N - 1, "x".repeat(200));
    assert_eq!(other.get(&key).unwrap(), store.get(&key).unwrap());
    server.stop().await;
}

/// Holds only the keys it lists (as an instance holds only its state partitions).
struct Holds(&'static [&'static str]);

impl dedupd::ops::KeyOwner for Holds {
    fn check(&self, key: &str) -> Result<(), String> {
        match self.0.contains(&key) {
            true => Ok(()),
            false => Err(format!("key {key:?} belongs to a state partition this instance does not hold")),
        }
    }
}

#[tokio::test]
async fn writes_to_a_key_another_instance_owns_are_misdirected_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_records(dir.path());
    let server = start(Some(AdminApi { owner: Some(Arc::new(Holds(&["done"]))), ..api(&store) })).await;
    let url = |path: &str| format!("{}{path}", server.base);
    let t = Some(TOKEN);
    let before = store.get("unknown-effect").unwrap();
    let resolve = Some(r#"{"as":"succeeded"}"#.to_string());
    for (method, path, body) in [
        (Method::DELETE, "/v1/keys/unknown-effect", None),
        (Method::DELETE, "/v1/keys?key=unknown-effect", None),
        (Method::POST, "/v1/keys/unknown-effect/resolve", resolve.clone()),
        (Method::POST, "/v1/resolve?key=unknown-effect", resolve),
    ] {
        let (status, _, answer) = call(method.clone(), &url(path), t, body).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{method} {path}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains("does not hold"), "{answer}");
    }
    assert_eq!(store.get("unknown-effect").unwrap(), before, "nothing changed");
    // Reads go anywhere; a key it owns is changed as ever.
    let (status, _, _) = call(Method::GET, &url("/v1/keys/unknown-effect"), t, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, answer) = call(Method::DELETE, &url("/v1/keys/done"), t, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(store.get("done").unwrap().is_none());
    server.stop().await;
}

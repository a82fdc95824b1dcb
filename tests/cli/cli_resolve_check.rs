//! `dedupd resolve KEY --check` (docs/sinks.md, "Checks"): an `indeterminate` key settled by
//! asking its receiver, with the real `dedupd` binary and a real HTTP receiver on 127.0.0.1
//! that answers lookups by a payment's reference; on a stopped instance's store (`-c`,
//! the sinks built from its config) and through a running admin API (the engine's sinks).
//! The same by filter (`resolve --where ... --check`, `forget --where ...`): the count
//! first, nothing changed without `--yes`. What the store holds afterwards and what the
//! receiver was asked are checked, not only what the command printed.

use crate::common;

use common::admin::Server;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use common::records::{completed_for_an_hour, indeterminate};
use dedupd::fingerprint::Fingerprint;
use dedupd::ops::AdminApi;
use dedupd::sinks::{Sink, SinkConfig};
use dedupd::store::{Completion, Held, Indeterminate, KeyStore, Record, SourcePos, StoreBackend, SyncMode};
use parking_lot::Mutex;
use serde_json::{Value, json};

const TOKEN: &str = "resolve-check-token-0123456789";

/// The lookups the receiver was asked, by reference.
type Asked = Arc<Mutex<Vec<String>>>;

/// A payments API's lookup: `found-*` references exist (200 with the payment), `absent-*`
/// do not (404), anything else is an error (500).
async fn start_receiver() -> (String, Asked) {
    async fn lookup(State(asked): State<Asked>, Query(q): Query<HashMap<String, String>>) -> (StatusCode, String) {
        let reference = q.get("ref").cloned().unwrap_or_default();
        asked.lock().push(reference.clone());
        if reference.starts_with("found-") {
            (StatusCode::OK, json!({"id": format!("ch_{reference}")}).to_string())
        } else if reference.starts_with("absent-") {
            (StatusCode::NOT_FOUND, String::new())
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "lookup down".into())
        }
    }
    let asked = Asked::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/lookup", axum::routing::get(lookup)).with_state(Arc::clone(&asked));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, asked)
}

/// The `pay` sink's table: POSTs that cannot take the key, looked up by `ref`.
fn pay_sink(base: &str) -> String {
    format!(
        r#"kind = "http"
url = "{base}/charges"
forward_key = false
request_timeout = "2s"

[check]
url = "{base}/lookup?ref={{/ref}}"
"#
    )
}

/// An `indeterminate` record whose command (`{"ref": reference}`) went to sink `pay`.
fn in_doubt(fp: u8, reference: &str) -> Record {
    Record::Indeterminate(Indeterminate {
        fingerprint: Fingerprint([fp; 32]),
        claimed_at_ms: 1_000,
        attempts: 1,
        why: "the call may have reached sink `pay` without an answer".into(),
        held: Some(Box::new(Held {
            sink: "pay".into(),
            route: "payments".into(),
            kind: "payment.charge".into(),
            payload: json!({"ref": reference}).to_string().into_bytes(),
            source: SourcePos { topic: "commands".into(), partition: 0, offset: i64::from(fp) },
            intake_client: None,
        })),
    })
}

/// A store holding one key per case.
fn fill(store: &KeyStore) {
    for (key, record) in [
        ("k-found", in_doubt(1, "found-1")),
        ("k-absent", in_doubt(2, "absent-2")),
        ("k-down", in_doubt(3, "down-3")),
        ("k-old", indeterminate(4)),
        ("k-done", completed_for_an_hour(5)),
    ] {
        store.compare_and_swap(key, None, Some(&record)).unwrap().unwrap();
    }
    store.flush_always().unwrap();
}

/// `dedupd ARGS` with the admin token and no other `DEDUPD_*` variable: exit code, stdout,
/// stderr.
async fn dedupd(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_dedupd"));
    cmd.args(args).stdin(std::process::Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") {
            cmd.env_remove(&k);
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.env("DEDUPD_ADMIN_TOKEN", TOKEN).output())
        .await
        .expect("dedupd ends within 30 s")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dedupd ARGS TARGET...`.
async fn dedupd_at(args: &[&str], target: &[&str]) -> (Option<i32>, String, String) {
    dedupd(&[args, target].concat()).await
}

/// Runs `resolve --check` for each case with `target` and checks what it printed; then
/// `store` (opened after the runs, for a stopped store) holds what each answer means.
async fn resolve_each(target: &[&str]) -> Vec<(Option<i32>, String, String)> {
    let mut ran = Vec::new();
    for key in ["k-found", "k-absent", "k-down", "k-old", "k-done", "k-none"] {
        ran.push(dedupd(&[&["resolve", key, "--check"], target].concat()).await);
    }
    ran
}

/// What every run printed and what the store and the receiver hold afterwards.
fn assert_settled(ran: &[(Option<i32>, String, String)], store: &KeyStore, asked: &Asked) {
    let printed: Value = serde_json::from_str(&ran[0].1).unwrap_or_else(|e| panic!("{e}: {:?}", ran[0]));
    assert_eq!((ran[0].0, printed["check"].as_str()), (Some(0), Some("found")), "{:?}", ran[0]);
    let record = &printed["record"];
    assert_eq!((record["settled_by"].as_str(), record["check_answer"].as_str()), (Some("check"), Some("found")));
    assert_eq!(record["settled_at"], record["completed_at"], "settled when completed: {record}");
    let Some(Record::Completed(found)) = store.get("k-found").unwrap() else { panic!("k-found not completed") };
    assert_eq!(found.outcome, Completion::Succeeded);
    let result: Value = serde_json::from_slice(&found.result).unwrap();
    assert_eq!(result, json!({"status": 200, "body": {"id": "ch_found-1"}}), "the check's answer is the result");

    assert_eq!(ran[1].0, Some(0), "{:?}", ran[1]);
    let Some(Record::Completed(absent)) = store.get("k-absent").unwrap() else { panic!("k-absent not completed") };
    assert_eq!(absent.outcome, Completion::Failed);
    assert!(absent.error.as_deref().unwrap_or("").contains("found no effect"), "{:?}", absent.error);

    assert_eq!(ran[2].0, Some(2), "{:?}", ran[2]);
    assert!(ran[2].2.contains("did not tell") && ran[2].2.contains("HTTP 500"), "{:?}", ran[2]);
    assert!(matches!(store.get("k-down").unwrap(), Some(Record::Indeterminate(_))), "left as it was");

    assert_eq!(ran[3].0, Some(2), "{:?}", ran[3]);
    assert!(ran[3].2.contains("does not keep the command in doubt"), "{:?}", ran[3]);
    assert_eq!((ran[4].0, ran[5].0), (Some(3), Some(4)), "not indeterminate; no such key: {ran:?}");
    assert_eq!(*asked.lock(), ["found-1", "absent-2", "down-3"], "one lookup per key that keeps its command");
}

#[tokio::test]
async fn resolve_check_settles_a_stopped_stores_keys_by_the_receivers_answer() {
    let (base, asked) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store");
    fill(&KeyStore::open(StoreBackend::Fjall, &store_path, SyncMode::Batch).unwrap());
    let config = config_file(dir.path(), &store_path, &base);

    let ran = resolve_each(&["-c", &config]).await;
    // `inspect` says how the key in doubt was settled: by its check, which found no effect.
    let (code, out, err) = dedupd(&["inspect", "k-absent", "-c", &config]).await;
    assert_eq!(code, Some(0), "{err}");
    let inspected: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (inspected["outcome"].as_str(), inspected["settled_by"].as_str(), inspected["check_answer"].as_str()),
        (Some("failed"), Some("check"), Some("absent")),
        "{inspected}"
    );
    let store = KeyStore::open(StoreBackend::Fjall, &store_path, SyncMode::Batch).unwrap();
    assert_settled(&ran, &store, &asked);
}

/// The `key`s of JSON lines and whether each has no `error`.
fn lines(stdout: &str) -> Vec<(String, bool)> {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .map(|v| (v["key"].as_str().unwrap().to_string(), v.get("error").is_none()))
        .collect()
}

/// `resolve --where` and `forget --where` with `target`; `store` is read after each run.
async fn act_by_filter(target: &[&str], store: &dyn Fn() -> Arc<KeyStore>, asked: &Asked) {
    let (code, out, err) = dedupd_at(&["resolve", "--where", "sink=pay", "--check"], target).await;
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");
    assert!(err.contains("3 key(s) match; nothing changed: add --yes"), "{err}");
    assert!(asked.lock().is_empty(), "no check without --yes");
    assert!(matches!(store().get("k-found").unwrap(), Some(Record::Indeterminate(_))));

    let (code, out, err) = dedupd_at(&["resolve", "--where", "sink=pay", "--check", "--yes"], target).await;
    assert_eq!(code, Some(2), "one key was not settled: {err}");
    let want = [("k-absent".to_string(), true), ("k-down".to_string(), false), ("k-found".to_string(), true)];
    assert_eq!(lines(&out), want, "{out}");
    assert!(err.contains("done for 2 of 3 key(s)"), "{err}");
    assert_eq!(*asked.lock(), ["absent-2", "down-3", "found-1"]);
    let s = store();
    assert!(matches!(s.get("k-found").unwrap(), Some(Record::Completed(c)) if c.outcome == Completion::Succeeded));
    assert!(matches!(s.get("k-absent").unwrap(), Some(Record::Completed(c)) if c.outcome == Completion::Failed));
    drop(s);

    let (code, _, err) = dedupd_at(&["resolve", "--where", "state=completed", "--as", "failed", "--yes"], target).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("indeterminate keys only"), "{err}");
    let (code, _, err) = dedupd_at(&["forget", "--where", "colour=red"], target).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--where colour=red: FIELD is one of"), "{err}");

    let (code, out, err) = dedupd_at(&["forget", "--where", "state=indeterminate", "--yes"], target).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines(&out), [("k-down".to_string(), true), ("k-old".to_string(), true)]);
    let s = store();
    assert_eq!((s.get("k-down").unwrap(), s.get("k-old").unwrap()), (None, None));
    assert!(s.get("k-done").unwrap().is_some(), "a key the filter does not match is kept");
}

#[tokio::test]
async fn resolve_and_forget_by_filter_on_a_stopped_store() {
    let (base, asked) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store");
    fill(&KeyStore::open(StoreBackend::Fjall, &store_path, SyncMode::Batch).unwrap());
    let config = config_file(dir.path(), &store_path, &base);
    let open = || Arc::new(KeyStore::open(StoreBackend::Fjall, &store_path, SyncMode::Batch).unwrap());
    act_by_filter(&["-c", &config], &open, &asked).await;
}

#[tokio::test]
async fn resolve_and_forget_by_filter_through_the_admin_api() {
    let (base, asked) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &dir.path().join("store"), SyncMode::Batch).unwrap());
    fill(&store);
    let (server, _sink) = start_admin(&store, &base).await;
    act_by_filter(&["--admin", &server.base], &|| Arc::clone(&store), &asked).await;
    server.stop().await;
}

/// An admin API on 127.0.0.1 over `store`, with the `pay` sink at `base` as an engine's
/// (held weakly by the API: the returned sink keeps it).
async fn start_admin(store: &Arc<KeyStore>, base: &str) -> (Server, Arc<Sink>) {
    let config: SinkConfig = toml::from_str(&pay_sink(base)).unwrap();
    let sink: Arc<Sink> = Arc::new(config.build("pay").unwrap());
    let admin = AdminApi {
        sinks: HashMap::from([("pay".to_string(), Arc::downgrade(&sink))]),
        ..common::admin::api(store, TOKEN)
    };
    (Server::start(Some(admin)).await, sink)
}

#[tokio::test]
async fn resolve_check_through_the_admin_api_asks_with_the_engines_sinks() {
    let (base, asked) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &dir.path().join("store"), SyncMode::Batch).unwrap());
    fill(&store);
    let (server, _sink) = start_admin(&store, &base).await;
    let ran = resolve_each(&["--admin", &server.base]).await;
    assert_settled(&ran, &store, &asked);
    server.stop().await;
}

/// A stopped instance's config: its store at `store`, the `pay` sink at `base`.
fn config_file(dir: &Path, store: &Path, base: &str) -> String {
    let table = pay_sink(base).replace("[check]", "[sinks.pay.check]");
    let path = common::records::config_file_with_sink(&dir.join("dedupd.toml"), store, None, "pay", &table);
    path.to_str().unwrap().to_string()
}

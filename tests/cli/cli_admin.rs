//! The operator CLI through the admin API (`--admin URL`), with the real `dedupd` binary
//! against the real admin server on a loopback listener: every valid key is reachable,
//! `.` and `..` included (URL parsing removes them from a path, so the CLI sends them in
//! the query), and keys with `/`, `%`, `?`, `#`, `+`, spaces and non-ASCII round-trip;
//! `--admin` goes before or after the subcommand; a closed stdout ends the output quietly;
//! a 404 from a server that is not dedupd's admin API is an error (exit 2), not "no such
//! key" (exit 4).

use crate::common;

use common::admin::Server;

use std::sync::Arc;

use common::records::{completed_for_an_hour, in_progress, indeterminate, indeterminate_at};
use dedupd::store::{Completion, KeyStore, Record};
use dedupd::store::{StoreBackend, SyncMode};
use serde_json::Value;

const TOKEN: &str = "cli-admin-token-0123456789";

/// Keys a URL path mangles unless each is sent with care.
const AWKWARD_KEYS: &[&str] = &[
    ".",
    "..",
    "...",
    "%2E",
    ".%2e",
    "%2e%2e",
    "a/b c",
    "a/../b",
    "./x",
    "100%",
    "%",
    "?x=1&y=2#frag",
    "+plus+",
    " spaced ",
    "back\\slash",
    "ключ/键",
    "keys",
    "resolve",
    "\"quoted\"",
];

async fn start(store: &Arc<KeyStore>) -> Server {
    Server::start(Some(common::admin::api(store, TOKEN))).await
}

/// What a CLI run left behind.
#[derive(Debug)]
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// `dedupd ARGS` with the admin token and no other `DEDUPD_*` variable.
fn dedupd(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_dedupd"));
    cmd.args(args).stdin(std::process::Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("DEDUPD_ADMIN_TOKEN", TOKEN);
    cmd
}

async fn cli(args: &[&str]) -> Ran {
    let out = dedupd(args).output().await.unwrap();
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn every_key_is_reachable_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &dir.path().join("store"), SyncMode::Batch).unwrap());
    for (i, key) in AWKWARD_KEYS.iter().enumerate() {
        store.compare_and_swap(key, None, Some(&completed_for_an_hour(i as u8))).unwrap().unwrap();
    }
    let server = start(&store).await;
    let url = server.base.as_str();

    for key in AWKWARD_KEYS {
        for args in [["inspect", key, "--admin", url], ["--admin", url, "inspect", key]] {
            let ran = cli(&args).await;
            assert_eq!(ran.code, Some(0), "{key:?}: {ran:?}");
            assert_eq!(ran.json()["key"].as_str(), Some(*key), "{ran:?}");
        }
    }
    // Forget each; the store no longer has it, and inspecting it again is "no such key".
    for key in AWKWARD_KEYS {
        let ran = cli(&["forget", key, "--admin", url]).await;
        let expected = format!("forgot {} (was completed)", serde_json::Value::from(*key));
        assert_eq!((ran.code, ran.stdout.trim()), (Some(0), expected.as_str()), "{ran:?}");
        assert_eq!(store.get(key).unwrap(), None, "{key:?}");
        let ran = cli(&["--admin", url, "inspect", key]).await;
        assert_eq!(ran.code, Some(4), "{ran:?}");
        assert!(ran.stderr.contains("has no record"), "{ran:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn dot_keys_resolve_and_force_forget_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Sled, &dir.path().join("store"), SyncMode::Batch).unwrap());
    for (i, key) in [".", "..", "a/b"].iter().enumerate() {
        store.compare_and_swap(key, None, Some(&indeterminate(i as u8))).unwrap().unwrap();
    }
    let server = start(&store).await;
    let url = server.base.as_str();

    for key in [".", "..", "a/b"] {
        let ran = cli(&["resolve", key, "--as", "failed", "--admin", url]).await;
        assert_eq!(ran.code, Some(0), "{ran:?}");
        assert_eq!((ran.json()["key"].as_str(), ran.json()["state"].as_str()), (Some(key), Some("completed")));
        match store.get(key).unwrap() {
            Some(Record::Completed(c)) => assert_eq!(c.outcome, Completion::Failed, "{key:?}"),
            other => panic!("{key:?} not resolved: {other:?}"),
        }
        // A second resolve is refused (exit 3): the key is no longer indeterminate.
        let ran = cli(&["--admin", url, "resolve", key, "--as", "succeeded"]).await;
        assert_eq!(ran.code, Some(3), "{ran:?}");
        let ran = cli(&["--admin", url, "forget", key, "--force"]).await;
        assert_eq!(ran.code, Some(0), "{ran:?}");
        assert_eq!(store.get(key).unwrap(), None);
    }
    // An in_progress key needs --force, and the refusal says so in the command's terms.
    store.compare_and_swap("busy", None, Some(&in_progress(7))).unwrap().unwrap();
    let ran = cli(&["--admin", url, "forget", "busy"]).await;
    assert_eq!(ran.code, Some(3), "{ran:?}");
    assert!(ran.stderr.contains("(--force)") && !ran.stderr.contains("?force"), "{ran:?}");
    assert_eq!(store.get("busy").unwrap(), Some(in_progress(7)), "kept");
    server.stop().await;
}

#[tokio::test]
async fn a_closed_stdout_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &dir.path().join("store"), SyncMode::Batch).unwrap());
    store.compare_and_swap("k1", None, Some(&completed_for_an_hour(1))).unwrap().unwrap();
    let server = start(&store).await;
    let url = server.base.as_str();

    for args in [["inspect", "k1", "--admin", url].as_slice(), &["--admin", url, "stats"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = dedupd(args).stdout(writer).stderr(std::process::Stdio::piped()).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!((out.status.code(), stderr.as_ref()), (Some(0), ""), "{args:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_404_from_something_else_is_an_error_not_no_such_key() {
    // A plain HTTP server on the address (a wrong port, a proxy without the path): 404s in
    // text, as most servers answer.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "404 page not found") });
    let other = tokio::spawn(async move { axum::serve(listener, app).await });
    for args in
        [["inspect", "k1", "--admin", &url].as_slice(), &["--admin", &url, "stats"], &["forget", "k1", "--admin", &url]]
    {
        let ran = cli(args).await;
        assert_eq!(ran.code, Some(2), "{args:?}: {ran:?}");
        assert!(ran.stderr.contains("without dedupd's error body"), "{ran:?}");
    }
    other.abort();

    // dedupd itself still says "no such key" with exit 4.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &dir.path().join("store"), SyncMode::Batch).unwrap());
    let server = start(&store).await;
    let ran = cli(&["inspect", "absent", "--admin", &server.base]).await;
    assert_eq!(ran.code, Some(4), "{ran:?}");
    server.stop().await;
}

/// A store of records of each state, indeterminate ones of two routes and sinks.
fn store_to_list(store: &KeyStore) {
    for (key, record) in [
        ("pay-2", indeterminate_at(2, 5_000, "payments", "pay-api")),
        ("pay-1", indeterminate_at(1, 1_000, "payments", "pay-api")),
        ("mail-1", indeterminate_at(3, 1_000, "emails", "mail")),
        ("done-1", completed_for_an_hour(4)),
        ("busy-1", in_progress(5)),
    ] {
        store.compare_and_swap(key, None, Some(&record)).unwrap().unwrap();
    }
    store.flush_always().unwrap();
}

/// The `key`s of JSON lines, in order.
fn listed_keys(ran: &Ran) -> Vec<String> {
    assert_eq!(ran.code, Some(0), "{ran:?}");
    ran.stdout
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
            v["key"].as_str().unwrap().to_string()
        })
        .collect()
}

#[tokio::test]
async fn keys_lists_the_records_a_filter_matches_through_the_api_and_on_a_stopped_store() {
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store");
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &store_path, SyncMode::Batch).unwrap());
    store_to_list(&store);
    let server = start(&store).await;
    let url = server.base.clone();
    let cases: &[(&[&str], &[&str])] = &[
        (&[], &["busy-1", "done-1", "mail-1", "pay-1", "pay-2"]),
        (&["--state", "indeterminate"], &["mail-1", "pay-1", "pay-2"]),
        (&["--state", "indeterminate", "--sink", "pay-api"], &["pay-1", "pay-2"]),
        (&["--route", "emails"], &["mail-1"]),
        (&["--sink", "pay-api", "--since", "1970-01-01T00:00:02Z"], &["pay-2"]),
        (&["--state", "indeterminate", "--until", "1970-01-01T00:00:02Z"], &["mail-1", "pay-1"]),
        (&["--state", "completed", "--route", "payments"], &[]),
    ];
    let mut through_api = Vec::new();
    for (filters, want) in cases {
        let ran = cli(&[&["keys", "--admin", url.as_str()], *filters].concat()).await;
        assert_eq!(listed_keys(&ran), *want, "{filters:?}");
        through_api.push(ran.stdout);
    }
    // Each line is the record as `inspect` shows it, the command in doubt included.
    let ran = cli(&["keys", "--admin", &url, "--route", "emails"]).await;
    let line: Value = serde_json::from_str(ran.stdout.trim()).unwrap();
    assert_eq!((line["state"].as_str(), line["sink"].as_str()), (Some("indeterminate"), Some("mail")));
    assert_eq!(line["payload"], serde_json::json!({"amount": 5}));

    // A bad filter is refused naming it, before anything is listed; the API says why too.
    let ran = cli(&["keys", "--admin", &url, "--since", "yesterday"]).await;
    assert_eq!((ran.code, ran.stdout.as_str()), (Some(2), ""), "{ran:?}");
    assert!(ran.stderr.contains("--since: \"yesterday\" is not an RFC 3339 instant"), "{ran:?}");
    let ran = cli(&["keys", "--admin", &url, "--state", "done"]).await;
    assert_eq!(ran.code, Some(2), "{ran:?}");
    let answer =
        reqwest::Client::new().get(format!("{url}/v1/keys?state=done")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("no state \"done\""), "{body}");
    server.stop().await;
    drop(store);

    // The same filters on the stopped store print the same lines (but `expired`, as of now).
    let config = common::records::config_file(&dir.path().join("dedupd.toml"), &store_path, None);
    let config = config.to_str().unwrap();
    for ((filters, want), api) in cases.iter().zip(&through_api) {
        let ran = cli(&[&["keys", "-c", config], *filters].concat()).await;
        assert_eq!(listed_keys(&ran), *want, "{filters:?}");
        assert_eq!(ran.stdout.lines().count(), api.lines().count());
    }
}

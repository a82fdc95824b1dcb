//! The operator CLI end to end on a real broker (docs/contract.md §8, docs/admin.md), with the real
//! `dedupd` binary as child processes:
//! - `inspect`, `forget`, `resolve`, `stats`, `compact` once against the running instance
//!   (`--admin URL`, token from `DEDUPD_ADMIN_TOKEN`) and once against its stopped store
//!   (`-c FILE`), asserting what they print and what the store then holds; the direct path
//!   refuses a store locked by the running instance and points at `--admin`;
//! - `export FILE --admin URL` while running → stop → wipe the store directory →
//!   `import FILE -c CONFIG` → restart → the same commands again: the HTTP receiver gets
//!   nothing new and the results topic shows every one as a `duplicate` replaying the
//!   stored result (which also needs the imported partition watermarks: without them the
//!   restarted instance would refuse its partitions).
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test cli cli_transfer::`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::kafka::{self, Receiver};
use common::process::{DedupdProcess, KeptOnFailure, TopicTail, file_len, tail_of_file, wait_for_line};
use dedupd::fingerprint::Fingerprint;
use dedupd::store::Record;
use dedupd::store::record::Indeterminate;
use dedupd::store::transfer::{end_line, header_line, record_line};
use rdkafka::message::Message;
use serde_json::{Value, json};

const TOKEN: &str = "cli-transfer-token-0123456789";
const PARTITIONS: i32 = 2;
const KEYS: usize = 20;

/// What a CLI run left behind.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// Runs `dedupd ARGS...` to completion with only the given `DEDUPD_ADMIN_*` variables.
async fn cli(args: Vec<String>, admin: Option<&str>) -> Ran {
    let admin = admin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupd"));
        cmd.args(&args).stdin(std::process::Stdio::null());
        for (k, _) in std::env::vars() {
            if k.starts_with("DEDUPD_") {
                cmd.env_remove(&k);
            }
        }
        if let Some(url) = admin {
            cmd.env("DEDUPD_ADMIN_URL", url).env("DEDUPD_ADMIN_TOKEN", TOKEN);
        }
        let out = cmd.output().expect("run dedupd");
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .expect("cli task")
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn config_toml(
    bootstrap: &str,
    group: &str,
    input: &str,
    results: &str,
    dlq: &str,
    store: &Path,
    sink: &str,
) -> String {
    format!(
        r#"{kafka_table}
[kafka.consumer]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "1000"

[store]
path = {store:?}

[sinks.effects]
kind = "http"
url = "{sink}"
forward_key = false

[[routes]]
name = "effects"
types = ["*"]
sink = "effects"

[http]
listen = "127.0.0.1:0"
admin_token = "{TOKEN}"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, group, input, results, dlq)
    )
}

/// Starts `dedupd run` and returns it with its admin URL (read from its "running" log line).
async fn start(config: &Path, log: &Path) -> (DedupdProcess, String) {
    let from = file_len(log);
    let mut p = DedupdProcess::run(config, log);
    let seen = wait_for_line(log, from, "dedupd running", Duration::from_secs(60), || p.exited().is_some()).await;
    assert!(seen.is_some(), "dedupd did not start; log:\n{}", tail_of_file(log, 30));
    let text = std::fs::read_to_string(log).expect("read log");
    let line = text[from as usize..].lines().find(|l| l.contains("dedupd running")).expect("running line");
    let addr =
        line.split("\"http_addr\":\"").nth(1).and_then(|s| s.split('"').next()).expect("http_addr in the log line");
    (p, format!("http://{addr}"))
}

fn command(i: usize) -> kafka::Outgoing {
    let v = json!({"id": format!("cli-k{i}"), "type": "effect.apply", "payload": {"i": i}});
    (format!("k{i}"), serde_json::to_vec(&v).expect("json"), vec![])
}

async fn wait_until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn results_of(tail: &TopicTail, from: usize) -> Vec<Value> {
    tail.since(from)
        .iter()
        .map(|m| serde_json::from_slice(m.payload().expect("result payload")).expect("result JSON"))
        .collect()
}

/// An export file holding one indeterminate record `key`.
fn indeterminate_file(dir: &Path, key: &str) -> PathBuf {
    let record = Record::Indeterminate(Indeterminate {
        fingerprint: Fingerprint([7; 32]),
        claimed_at_ms: chrono::Utc::now().timestamp_millis(),
        attempts: 1,
        why: "made by the test".into(),
        held: None,
    });
    let path = dir.join(format!("{key}.jsonl"));
    let text = format!("{}\n{}\n{}\n", header_line(0, "test", 1), record_line(key, &record), end_line(1, 0));
    std::fs::write(&path, text).expect("write indeterminate file");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_and_export_wipe_import_keep_duplicates_recognised() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("cli-in"), kafka::unique("cli-results"), kafka::unique("cli-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let receiver = Receiver::start().await;
    let dir = KeptOnFailure::new();
    let store = dir.path().join("store");
    let config = dir.path().join("dedupd.toml");
    let log = dir.path().join("dedupd.log");
    let toml = config_toml(&bootstrap, &kafka::unique("cli-group"), &input, &results, &dlq, &store, &receiver.url());
    std::fs::write(&config, toml).expect("write config");
    let c = config.to_str().expect("utf-8").to_string();
    let tail = TopicTail::start(&bootstrap, &results, 1);

    // First run: KEYS commands plus one to forget, each executed once.
    let (mut p, admin) = start(&config, &log).await;
    let mut first: Vec<kafka::Outgoing> = (0..KEYS).map(command).collect();
    first.push((
        "f".into(),
        serde_json::to_vec(&json!({"id": "cli-forget-me", "type": "effect.apply", "payload": {}})).expect("json"),
        vec![],
    ));
    kafka::produce_all(&bootstrap, &input, first).await;
    wait_until("the first results", Duration::from_secs(60), || tail.len() > KEYS).await;
    assert_eq!(receiver.counts().len(), KEYS + 1);
    assert!(receiver.counts().values().all(|n| *n == 1));

    // --- against the running instance ---
    let a = Some(admin.as_str());
    let ran = cli(args(&["inspect", "cli-k3"]), a).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let record = ran.json();
    assert_eq!((record["state"].as_str(), record["outcome"].as_str()), (Some("completed"), Some("succeeded")));
    assert_eq!(record["result"], json!({"status": 200, "body": {"accepted": true}}));
    let ran = cli(args(&["inspect", "cli-nope"]), a).await;
    assert_eq!(ran.code, 4, "unknown key: {ran:?}");

    let ran = cli(args(&["stats"]), a).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.json()["records"], json!({"in_progress": 0, "completed": KEYS + 1, "indeterminate": 0}));
    let ran = cli(args(&["compact"]), a).await;
    assert_eq!((ran.code, ran.stdout.trim()), (0, "removed 0 expired record(s)"), "{ran:?}");

    let ran = cli(args(&["forget", "cli-forget-me"]), a).await;
    assert_eq!((ran.code, ran.stdout.trim()), (0, "forgot \"cli-forget-me\" (was completed)"), "{ran:?}");
    assert_eq!(cli(args(&["inspect", "cli-forget-me"]), a).await.code, 4, "forgotten in the running store");

    // An indeterminate key, put in through the API's import, resolved through the API.
    let file = indeterminate_file(dir.path(), "cli-ind-admin");
    let ran = cli(args(&["import", file.to_str().expect("utf-8")]), a).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.json()["imported"], 1);
    let ran = cli(args(&["resolve", "cli-k3", "--as", "failed"]), a).await;
    assert_eq!(ran.code, 3, "a completed key cannot be resolved: {ran:?}");
    let ran = cli(args(&["resolve", "cli-ind-admin", "--as", "succeeded"]), a).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!((ran.json()["state"].as_str(), ran.json()["outcome"].as_str()), (Some("completed"), Some("succeeded")));
    let back = cli(args(&["inspect", "cli-ind-admin"]), a).await.json();
    assert_eq!(
        (back["state"].as_str(), back["result"].clone(), back["settled_by"].as_str()),
        (Some("completed"), json!({"resolved_by": "operator"}), Some("operator"))
    );
    assert!(back["settled_at"].is_string() && back.get("check_answer").is_none(), "{back}");

    // The direct path refuses the store the running instance holds, and says what to do.
    let ran = cli(args(&["stats", "-c", &c]), None).await;
    assert_eq!(ran.code, 2, "{ran:?}");
    assert!(ran.stderr.contains("locked") && ran.stderr.contains("--admin"), "{ran:?}");

    // A wrong token is refused.
    let wrong = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_dedupd"))
                .args(["stats", "--admin", &admin])
                .env("DEDUPD_ADMIN_TOKEN", "not-the-token-at-all")
                .output()
                .expect("run")
        }
    })
    .await
    .expect("task");
    assert_eq!(wrong.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("401"), "{wrong:?}");

    // Export while running.
    let export = dir.path().join("export.jsonl");
    let ran = cli(args(&["export", export.to_str().expect("utf-8")]), a).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stderr, "", "no progress bar when stderr is not a terminal");
    let expected_records = KEYS + 1; // the keys and the resolved one; the forgotten one is gone
    assert_eq!(
        ran.stdout.trim(),
        format!("exported {expected_records} record(s) and {PARTITIONS} watermark(s) to {}", export.display())
    );
    assert!(!dir.path().join("export.jsonl.part").exists());
    let lines: Vec<Value> = std::fs::read_to_string(&export)
        .expect("export")
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines.iter().filter(|l| l["type"] == "watermark").count(), PARTITIONS as usize);
    assert!(lines.iter().all(|l| l["key"] != "cli-forget-me"));

    assert!(p.terminate(Duration::from_secs(60)).is_some_and(|s| s.success()), "{}", tail_of_file(&log, 30));

    // --- against the stopped store ---
    let ran = cli(args(&["inspect", "cli-k5", "-c", &c]), None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.json()["state"], "completed");
    let ran = cli(args(&["stats", "-c", &c]), None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.json()["records"], json!({"in_progress": 0, "completed": expected_records, "indeterminate": 0}));
    assert_eq!(ran.json()["watermarks"], PARTITIONS);
    let ran = cli(args(&["compact", "-c", &c]), None).await;
    assert_eq!((ran.code, ran.stdout.trim()), (0, "removed 0 expired record(s)"), "{ran:?}");
    let ran = cli(args(&["forget", "cli-k19", "-c", &c]), None).await;
    assert_eq!((ran.code, ran.stdout.trim()), (0, "forgot \"cli-k19\" (was completed)"), "{ran:?}");
    assert_eq!(cli(args(&["inspect", "cli-k19", "-c", &c]), None).await.code, 4);
    let file = indeterminate_file(dir.path(), "cli-ind-direct");
    let ran = cli(args(&["import", file.to_str().expect("utf-8"), "-c", &c]), None).await;
    assert_eq!((ran.code, ran.json()["imported"].as_u64()), (0, Some(1)), "{ran:?}");
    let ran = cli(args(&["resolve", "cli-ind-direct", "--as", "failed", "-c", &c]), None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let back = cli(args(&["inspect", "cli-ind-direct", "-c", &c]), None).await.json();
    assert_eq!((back["state"].as_str(), back["outcome"].as_str()), (Some("completed"), Some("failed")));
    assert_eq!(cli(args(&["resolve", "cli-k5", "--as", "failed", "-c", &c]), None).await.code, 3);

    // --- wipe, import the export, restart, send the same commands again ---
    std::fs::remove_dir_all(&store).expect("wipe the store");
    let ran = cli(args(&["import", export.to_str().expect("utf-8"), "-c", &c]), None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stderr, "", "no progress bar when stderr is not a terminal");
    assert_eq!(
        ran.json(),
        json!({"imported": expected_records, "unchanged": 0, "kept_newer": 0, "kept_in_progress": 0, "expired": 0, "watermarks_raised": PARTITIONS})
    );
    assert_eq!(cli(args(&["inspect", "cli-forget-me", "-c", &c]), None).await.code, 4);

    let requests_before = receiver.seen.lock().len();
    let results_before = tail.len();
    let (mut p, _admin) = start(&config, &log).await;
    kafka::produce_all(&bootstrap, &input, (0..KEYS).map(command).collect()).await;
    wait_until("the replayed results", Duration::from_secs(60), || tail.len() >= results_before + KEYS).await;
    let again = results_of(&tail, results_before);
    assert_eq!(again.len(), KEYS, "{again:?}");
    for r in &again {
        assert_eq!((r["outcome"].as_str(), r["replay"].as_bool()), (Some("duplicate"), Some(true)), "{r}");
        assert_eq!(r["result"], json!({"status": 200, "body": {"accepted": true}}), "{r}");
    }
    let mut keys: Vec<&str> = again.iter().filter_map(|r| r["key"].as_str()).collect();
    keys.sort_unstable();
    let mut want: Vec<String> = (0..KEYS).map(|i| format!("cli-k{i}")).collect();
    want.sort_unstable();
    assert_eq!(keys, want);
    assert!(p.terminate(Duration::from_secs(60)).is_some_and(|s| s.success()), "{}", tail_of_file(&log, 30));
    assert_eq!(receiver.seen.lock().len(), requests_before, "the receiver got nothing new");
    assert_eq!(kafka::count_records(&bootstrap, &dlq).await, 0);
    tail.stop();
    receiver.stop().await;
}

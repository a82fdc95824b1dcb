//! SIGTERM while a sink call outlasts the drain (docs/sinks.md, "Shutdown and revoke"), on a
//! real broker: `dedupd run` as a child with an `exec` sink whose program
//! records its start and then sleeps far longer than the drain bound (shortened to 2 s by
//! the failpoint `consumer.drain_timeout`; 30 s otherwise).
//!
//! The process must exit soon after the bound, saying so, not "stopped cleanly", and never
//! panic or hang (it once did both: the worker that had not drained held the consumer, whose
//! close then ran the revoke inside the runtime). Its program is killed, the store's lock
//! is let go (a direct `inspect` opens the store) and the key is left `in_progress`; the
//! next run finds it orphaned and, as the sink does not forward the key, publishes
//! `indeterminate` for the repeat, never a second call.
//!
//! Needs the `failpoints` feature (scripts/test passes it). Run with
//! `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test engine shutdown_overdue::`.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{
    DedupdProcess, KeptOnFailure, TopicTail, has_failpoints, tail_of_file, until, wait_for_http_addr,
};
use dedupd::outcome::ResultRecord;
use rdkafka::message::Message;
use serde_json::json;

/// The drain bound the failpoint sets.
const DRAIN_MS: u64 = 2_000;

fn config(bootstrap: &str, topics: [&str; 3], store: &Path, program: &Path) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[store]
path = "{store}"

[sinks.slow]
kind = "exec"
program = "{program}"
timeout = "300s"
forward_key = false

[[routes]]
types = ["slow.*"]
sink = "slow"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"
"#,
        kafka_table = kafka::kafka_table(bootstrap, &kafka::unique("overdue-group"), input, results, dlq),
        store = store.display(),
        program = program.display(),
    )
}

/// A program that appends `started PID` to `runs`, then sleeps 300 s.
fn slow_program(dir: &Path, runs: &Path) -> std::path::PathBuf {
    let path = dir.join("slow.sh");
    let script = format!("#!/bin/sh\necho \"started $$\" >> '{}'\nexec sleep 300\n", runs.display());
    std::fs::write(&path, script).expect("write the program");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
    path
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_outlasting_the_drain_ends_the_process_without_a_hang_and_leaves_its_claim() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !has_failpoints("the drain bound is shortened by a failpoint") {
        return;
    }
    let (input, results, dlq) =
        (kafka::unique("overdue-in"), kafka::unique("overdue-results"), kafka::unique("overdue-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;
    let dir = KeptOnFailure::new();
    let (config_path, log, store, runs) = (
        dir.path().join("dedupd.toml"),
        dir.path().join("dedupd.log"),
        dir.path().join("store"),
        dir.path().join("runs"),
    );
    let program = slow_program(dir.path(), &runs);
    std::fs::write(&config_path, config(&bootstrap, [&input, &results, &dlq], &store, &program)).expect("config");
    let args = ["run", "-c", config_path.to_str().expect("utf-8")];
    let failpoint = format!("consumer.drain_timeout=return({DRAIN_MS})");
    let mut dedupd = DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", &failpoint)], &log);
    wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    let command = || {
        let value = json!({"id": "long-1", "type": "slow.op", "payload": {"n": 1}});
        vec![("long-1".to_string(), serde_json::to_vec(&value).expect("json"), vec![])]
    };
    kafka::produce_all(&bootstrap, &input, command()).await;
    let started = || std::fs::read_to_string(&runs).unwrap_or_default();
    until("the sink's program to start", Duration::from_secs(60), &mut dedupd, &log, || !started().is_empty()).await;
    let program_pid: i32 = started().trim().trim_start_matches("started ").parse().expect("the program's pid");

    let signalled = Instant::now();
    let status = dedupd.terminate(Duration::from_secs(60));
    let took = signalled.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.is_some(), "dedupd did not exit within 60 s of SIGTERM:\n{}", tail_of_file(&log, 40));
    assert!(!text.contains("panicked"), "dedupd panicked:\n{}", tail_of_file(&log, 40));
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}:\n{}", tail_of_file(&log, 40));
    assert!(took < Duration::from_secs(30), "stopping took {took:?}; the drain bound is {DRAIN_MS} ms");
    assert!(text.contains("did not drain in time"), "{}", tail_of_file(&log, 20));
    assert!(text.contains("stopped with commands still at their sinks"), "{}", tail_of_file(&log, 20));
    assert!(!text.contains("dedupd stopped cleanly"), "{}", tail_of_file(&log, 20));
    assert!(!pid_alive(program_pid), "the sink's program (pid {program_pid}) outlived dedupd");

    // The lock is let go and the claim stays: a direct inspect opens the store.
    let inspected = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["inspect", "long-1", "-c", config_path.to_str().expect("utf-8")])
        .output()
        .expect("run inspect");
    let shown = String::from_utf8_lossy(&inspected.stdout);
    assert!(inspected.status.success(), "inspect: {}", String::from_utf8_lossy(&inspected.stderr));
    assert!(shown.contains("in_progress"), "{shown}");

    // After a restart: the input redelivered (its offset was never committed) and a repeat.
    // The orphaned claim of a sink that does not forward the
    // key is `indeterminate`, and the program is not run again.
    let tail = TopicTail::start(&bootstrap, &results, 1);
    let mut dedupd = DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", &failpoint)], &log);
    wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    kafka::produce_all(&bootstrap, &input, command()).await;
    until("both results", Duration::from_secs(60), &mut dedupd, &log, || tail.len() >= 2).await;
    let outcomes: Vec<String> = tail
        .since(0)
        .iter()
        .map(|m| serde_json::from_slice::<ResultRecord>(m.payload().expect("payload")).expect("result record"))
        .map(|r| r.outcome.as_str().to_string())
        .collect();
    assert!(outcomes.iter().all(|o| o == "indeterminate"), "{outcomes:?}");
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "second stop");
    assert_eq!(started().lines().count(), 1, "the program ran again: {}", started());
}

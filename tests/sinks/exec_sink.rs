//! The `exec` sink running real shell scripts written to a temporary directory.
//!
//! The scripts record what they received (stdin, environment) in files the tests read
//! back. Every await is bounded by [`BOUND`]; the only short timeout is the sink's own
//! `timeout` in the test that checks a hung program is killed.

use crate::common;

use std::num::NonZeroUsize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dedupd::outcome::Outcome;
use dedupd::sinks::exec::{ExecSink, ExecSinkConfig};
use dedupd::sinks::{CallAnswer, CallWatch, SinkConfig, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::Record;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use common::orphan::EngineWithSink;

/// Upper bound on anything a test waits for.
const BOUND: Duration = Duration::from_secs(20);

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Writes an executable `/bin/sh` script `name` into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A sink config as the TOML `[sinks.NAME]` table would give it (so keys added later with
/// defaults need no change here), with a 10 s timeout; tests adjust fields.
fn config(program: &Path) -> ExecSinkConfig {
    let mut config: ExecSinkConfig =
        toml::from_str(&format!("program = {:?}\ntimeout = \"10s\"", program.display().to_string())).unwrap();
    assert_eq!(
        (config.transient_exit_codes.as_slice(), config.forward_key),
        (&[75][..], false),
        "the documented defaults"
    );
    assert_eq!(config.max_output_bytes, NonZeroUsize::new(64 * 1024).unwrap());
    config.args.clear();
    config
}

/// Runs one attempt of a fixed command, bounded in time.
async fn run(sink: &ExecSink, attempt: u32, traceparent: Option<&str>) -> Result<SinkOutput, SinkError> {
    let payload = json!({ "to": "a@example.com", "amount": 12.5, "note": "line1\nline2 'quoted' ü" });
    let claim = common::claims::durable_claim("order-42");
    let request = SinkRequest::new(&claim, "email.send", &payload, attempt, traceparent);
    tokio::time::timeout(BOUND, sink.execute(request)).await.expect("the sink answers within the bound")
}

/// `NAME=value` lines of an `env` dump, as pairs.
fn env_dump(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn lookup<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn payload_arrives_on_stdin_and_key_type_attempt_in_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let program = script(
        out,
        "record.sh",
        &format!(
            "cat > '{0}/stdin.json'\nenv > '{0}/env.txt'\necho \"$1|$2\" > '{0}/args.txt'\necho '{{\"id\": \"job-7\"}}'",
            out.display()
        ),
    );
    // dedupd's own environment (here: what cargo gives the test binary) is withheld
    // unless listed in env_passthrough.
    let passed = std::env::var("CARGO_PKG_NAME").ok();
    let withheld = std::env::var("CARGO_MANIFEST_DIR").ok();
    let mut cfg = config(&program);
    cfg.args = vec!["first arg".into(), "--second".into()];
    cfg.env_passthrough = vec!["CARGO_PKG_NAME".into()];
    let sink = ExecSink::new(&cfg);
    let instance = SinkConfig::Exec(cfg.clone()).build("jobs").unwrap();
    assert_eq!(instance.name(), "jobs");
    assert!(!instance.forwards_key(), "exec does not declare the key forwarded unless configured");

    let output = run(&sink, 3, Some(TRACEPARENT)).await.unwrap();
    assert_eq!(output, json!({ "exit_code": 0, "stdout": { "id": "job-7" } }));

    let stdin: Value = serde_json::from_slice(&std::fs::read(out.join("stdin.json")).unwrap()).unwrap();
    assert_eq!(stdin, json!({ "to": "a@example.com", "amount": 12.5, "note": "line1\nline2 'quoted' ü" }));
    let env = env_dump(&out.join("env.txt"));
    assert_eq!(lookup(&env, "DEDUPD_KEY"), Some("order-42"));
    assert_eq!(lookup(&env, "DEDUPD_TYPE"), Some("email.send"));
    assert_eq!(lookup(&env, "DEDUPD_ATTEMPT"), Some("3"));
    assert_eq!(lookup(&env, "TRACEPARENT"), Some(TRACEPARENT));
    assert_eq!(lookup(&env, "CARGO_PKG_NAME"), passed.as_deref());
    assert!(withheld.is_none() || lookup(&env, "CARGO_MANIFEST_DIR").is_none(), "not passed through");
    assert_eq!(lookup(&env, "PATH").is_some(), std::env::var_os("PATH").is_some());
    assert_eq!(std::fs::read_to_string(out.join("args.txt")).unwrap(), "first arg|--second\n");
}

#[tokio::test]
async fn no_traceparent_no_variable_and_text_output_is_a_string() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let program = script(out, "plain.sh", &format!("env > '{0}/env.txt'\necho queued", out.display()));
    let sink = ExecSink::new(&config(&program));
    let output = run(&sink, 1, None).await.unwrap();
    assert_eq!(output, json!({ "exit_code": 0, "stdout": "queued\n" }));
    assert_eq!(lookup(&env_dump(&out.join("env.txt")), "TRACEPARENT"), None);
}

#[tokio::test]
async fn a_bare_program_name_is_looked_up_in_path() {
    let mut cfg = config(Path::new("sh"));
    cfg.args = vec!["-c".into(), "printf '%s' \"$DEDUPD_KEY\"".into()];
    let output = run(&ExecSink::new(&cfg), 1, None).await.unwrap();
    assert_eq!(output, json!({ "exit_code": 0, "stdout": "order-42" }));
}

#[tokio::test]
async fn exit_codes_map_to_success_transient_and_permanent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    // Exits with the code written in the file `code`, after a marker that proves it ran.
    let program = script(
        out,
        "exit.sh",
        &format!(
            "echo ran >> '{0}/runs'\necho \"partial\"\necho \"oops: $(cat '{0}/code')\" >&2\nexit $(cat '{0}/code')",
            out.display()
        ),
    );
    let mut cfg = config(&program);
    cfg.transient_exit_codes = vec![75, 111];
    let sink = ExecSink::new(&cfg);

    for (code, expect) in [(75, "transient"), (111, "transient"), (1, "permanent"), (64, "permanent")] {
        std::fs::write(out.join("code"), code.to_string()).unwrap();
        match (run(&sink, 1, None).await, expect) {
            (Err(SinkError::Transient { message, retry_after }), "transient") => {
                assert!(
                    message.contains(&format!("code {code}")) && message.contains(&format!("oops: {code}")),
                    "{message}"
                );
                assert_eq!(retry_after, None);
            }
            (Err(SinkError::Permanent { message, result }), "permanent") => {
                assert!(
                    message.contains(&format!("code {code}")) && message.contains(&format!("oops: {code}")),
                    "{message}"
                );
                assert_eq!(result, json!({ "exit_code": code, "stdout": "partial\n" }));
            }
            (other, _) => panic!("exit {code}: expected {expect}, got {other:?}"),
        }
    }
    assert_eq!(std::fs::read_to_string(out.join("runs")).unwrap().lines().count(), 4, "one run per attempt");
}

#[tokio::test]
async fn a_missing_program_is_permanent() {
    let dir = tempfile::tempdir().unwrap();
    let sink = ExecSink::new(&config(&dir.path().join("does-not-exist")));
    match run(&sink, 1, None).await {
        Err(SinkError::Permanent { message, .. }) => assert!(message.contains("cannot start"), "{message}"),
        other => panic!("expected permanent, got {other:?}"),
    }
}

/// Whether process `pid` has ended (no such process, or a zombie waiting for its reaper).
fn ended(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Waits (bounded) until every pid listed in `files` has ended.
async fn wait_ended(files: &[PathBuf]) {
    let pids: Vec<String> = files.iter().map(|f| std::fs::read_to_string(f).unwrap().trim().to_string()).collect();
    let deadline = Instant::now() + BOUND;
    while !pids.iter().all(|p| ended(p)) {
        assert!(Instant::now() < deadline, "still running: {pids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A script that starts a background child and then waits forever, recording both pids.
fn hanging_script(out: &Path) -> PathBuf {
    script(
        out,
        "hang.sh",
        &format!(
            "sleep 600 &\necho $! > '{0}/child.pid.tmp'\nmv '{0}/child.pid.tmp' '{0}/child.pid'\necho $$ > '{0}/pid'\nwait",
            out.display()
        ),
    )
}

#[tokio::test]
async fn a_hung_program_and_its_children_are_killed_at_the_timeout_and_the_attempt_is_transient() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let mut cfg = config(&hanging_script(out));
    cfg.timeout = Duration::from_millis(500);
    let sink = ExecSink::new(&cfg);

    match run(&sink, 1, None).await {
        Err(SinkError::Transient { message, .. }) => assert!(message.contains("timed out"), "{message}"),
        other => panic!("expected a transient timeout, got {other:?}"),
    }
    // The script and the child it started are both gone: nothing can finish an effect late.
    wait_ended(&[out.join("pid"), out.join("child.pid")]).await;
}

#[tokio::test]
async fn an_abandoned_run_kills_the_program_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let mut cfg = config(&hanging_script(out));
    cfg.timeout = Duration::from_secs(600);
    let sink = ExecSink::new(&cfg);
    let payload = json!({});
    let claim = common::claims::durable_claim("k");
    let mut attempt = Box::pin(sink.execute(SinkRequest::new(&claim, "t", &payload, 1, None)));
    // Run it until the script has started its child, then drop it, as a shutdown would.
    let deadline = Instant::now() + BOUND;
    while !(out.join("pid").exists() && out.join("child.pid").exists()) {
        assert!(Instant::now() < deadline, "the script did not start");
        tokio::select! {
            result = &mut attempt => panic!("the hanging script finished: {result:?}"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    // `pid` is written last; wait until it has content.
    while std::fs::read_to_string(out.join("pid")).unwrap().trim().is_empty() {
        assert!(Instant::now() < deadline, "the script did not record its pid");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(attempt);
    wait_ended(&[out.join("pid"), out.join("child.pid")]).await;
}

#[tokio::test]
async fn output_is_bounded_and_truncation_is_noted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    // 1 MiB of stdout (far past the pipe buffer) and of stderr, then a failing exit: the
    // sink must keep draining both pipes or the program would block forever.
    let program = script(
        out,
        "loud.sh",
        "head -c 1048576 /dev/zero | tr '\\0' 'a'\nhead -c 1048576 /dev/zero | tr '\\0' 'e' >&2\nexit ${EXIT:-0}",
    );
    let mut cfg = config(&program);
    cfg.max_output_bytes = NonZeroUsize::new(1000).unwrap();
    let sink = ExecSink::new(&cfg);

    let output = run(&sink, 1, None).await.unwrap();
    assert_eq!(output["truncated"], json!(true));
    assert_eq!(output["stdout"], json!("a".repeat(1000)));

    cfg.program =
        script(out, "loud_fail.sh", &format!("EXIT=3 exec '{}'", program.display())).to_string_lossy().into_owned();
    let sink = ExecSink::new(&cfg);
    match run(&sink, 1, None).await {
        Err(SinkError::Permanent { message, result }) => {
            assert!(message.contains("stderr (truncated)"), "{}", &message[..200.min(message.len())]);
            assert!(message.len() < 1200, "stderr quoted within the bound: {} bytes", message.len());
            assert_eq!(result["exit_code"], json!(3));
            assert_eq!(result["stdout"].as_str().map(str::len), Some(1000));
        }
        other => panic!("expected permanent, got {other:?}"),
    }
}

/// The crash window: the claim reached the disk, the process died before completing it.
#[tokio::test]
async fn an_orphaned_claim_reruns_with_the_same_key_only_when_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let program = script(
        out,
        "effect.sh",
        &format!("echo \"$DEDUPD_KEY attempt=$DEDUPD_ATTEMPT\" >> '{0}/effects'", out.display()),
    );
    let effects = || std::fs::read_to_string(out.join("effects")).unwrap_or_default();

    // forward_key = true: the program honours DEDUPD_KEY, so the re-run is safe.
    let mut forwarding = config(&program);
    forwarding.forward_key = true;
    let mut h = EngineWithSink::new(std::sync::Arc::new(SinkConfig::Exec(forwarding).build("jobs").unwrap()));
    let item = h.item("orphan-1", json!({ "n": 1 }));
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Succeeded);
    assert!(done[0].sink_called);
    // Same key; the attempt number counts the run the crash interrupted.
    assert_eq!(effects(), "orphan-1 attempt=2\n");
    assert!(matches!(h.record("orphan-1"), Some(Record::Completed(_))));

    // forward_key = false (default): the effect is unknown; the program is not run.
    let mut h = EngineWithSink::new(std::sync::Arc::new(SinkConfig::Exec(config(&program)).build("jobs").unwrap()));
    let item = h.item("orphan-2", json!({ "n": 2 }));
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Indeterminate);
    assert!(!done[0].sink_called);
    assert!(matches!(h.record("orphan-2"), Some(Record::Indeterminate(_))));
    assert_eq!(effects(), "orphan-1 attempt=2\n", "the program did not run for the indeterminate key");
}

/// Runs one attempt watched, as the engine makes it: its result and what the sink said of
/// whether the program answered.
async fn run_watched(sink: &ExecSink) -> (Result<SinkOutput, SinkError>, CallAnswer) {
    let payload = json!({ "n": 1 });
    let claim = common::claims::durable_claim("watched-1");
    let watch = CallWatch::new(&CancellationToken::new());
    let request = SinkRequest::new(&claim, "job.run", &payload, 1, None).watched_by(&watch);
    let result = tokio::time::timeout(BOUND, sink.execute(request)).await.expect("the sink answers within the bound");
    (result, request.call_answer().expect("a watched request"))
}

#[tokio::test]
async fn an_exit_code_is_an_answer_a_program_that_cannot_start_was_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let program = script(out, "exit.sh", &format!("exit $(cat '{0}/code')", out.display()));
    let sink = ExecSink::new(&config(&program));
    for (code, ok) in [(0, true), (75, false), (3, false)] {
        std::fs::write(out.join("code"), code.to_string()).unwrap();
        let (result, answer) = run_watched(&sink).await;
        assert_eq!(result.is_ok(), ok, "exit {code}: {result:?}");
        assert_eq!(answer, CallAnswer::Answered, "exit {code} (transient codes included) answers the call");
    }

    // Validation refuses a program that is not executable; one that stops being executable
    // after the config was checked cannot be started: nothing ran.
    let cfg = config(&program);
    assert_eq!(SinkConfig::Exec(cfg.clone()).problems("sinks.jobs"), vec![]);
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (result, answer) = run_watched(&ExecSink::new(&cfg)).await;
    assert!(
        matches!(&result, Err(SinkError::Permanent { message, .. }) if message.contains("cannot start")),
        "{result:?}"
    );
    assert_eq!(answer, CallAnswer::NeverSent);
}

#[tokio::test]
async fn a_program_killed_at_its_timeout_or_by_a_signal_may_have_done_its_effect() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let mut cfg = config(&hanging_script(out));
    cfg.timeout = Duration::from_millis(300);
    let (result, answer) = run_watched(&ExecSink::new(&cfg)).await;
    assert!(
        matches!(&result, Err(SinkError::Transient { message, .. }) if message.contains("timed out")),
        "{result:?}"
    );
    assert_eq!(answer, CallAnswer::Maybe);

    let killed = script(out, "killed.sh", "kill -9 $$");
    let (result, answer) = run_watched(&ExecSink::new(&config(&killed))).await;
    assert!(matches!(&result, Err(SinkError::Transient { message, .. }) if message.contains("signal")), "{result:?}");
    assert_eq!(answer, CallAnswer::Maybe);
}

/// A program that appends a line to `runs` each time it starts, then does `then`.
fn counting_script(out: &Path, then: &str) -> PathBuf {
    script(out, "effect.sh", &format!("echo \"$DEDUPD_KEY\" >> '{0}/runs'\n{then}", out.display()))
}

fn runs(out: &Path) -> usize {
    std::fs::read_to_string(out.join("runs")).unwrap_or_default().lines().count()
}

/// A non-forwarding sink (the default) running `program` with a 2 s timeout (the first run
/// of a hanging program lasts that long; a run that must finish has that long even on a
/// loaded machine) and `check_table` (TOML lines of `[check]`, none when empty), through
/// the engine.
fn engine_with(program: &Path, check_table: &str) -> EngineWithSink {
    let mut text = format!("program = {:?}\ntimeout = \"2s\"\n", program.display().to_string());
    if !check_table.is_empty() {
        text.push_str(&format!("[check]\n{check_table}\n"));
    }
    let cfg: ExecSinkConfig = toml::from_str(&text).unwrap();
    assert!(!cfg.forward_key);
    EngineWithSink::new(std::sync::Arc::new(SinkConfig::Exec(cfg).build("jobs").unwrap()))
}

#[tokio::test]
async fn a_hung_program_without_a_check_runs_once_and_its_key_is_indeterminate() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let mut h = engine_with(&counting_script(out, "exec sleep 600"), "");
    let item = h.item("hung-1", json!({ "n": 1 }));
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Indeterminate, "{:?}", done[0].result);
    assert!(done[0].result.error.as_deref().unwrap_or("").contains("has no check"), "{:?}", done[0].result.error);
    assert_eq!(runs(out), 1, "never run again blind (retry.max_attempts is 2 here)");
    match h.record("hung-1") {
        Some(Record::Indeterminate(r)) => assert_eq!(r.attempts, 1),
        other => panic!("expected an indeterminate record, got {other:?}"),
    }
}

#[tokio::test]
async fn a_check_that_finds_the_effect_completes_the_command_with_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let check = script(out, "check.sh", "echo '{\"payment\": \"pay_7\", \"status\": \"settled\"}'");
    let mut h =
        engine_with(&counting_script(out, "exec sleep 600"), &format!("program = {:?}", check.display().to_string()));
    let item = h.item("found-1", json!({ "reference": "r-7" }));
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Succeeded, "{:?}", done[0].result);
    assert_eq!(done[0].result.result, json!({ "exit_code": 0, "stdout": { "payment": "pay_7", "status": "settled" } }));
    assert_eq!(runs(out), 1, "the check answered for the call: no second run");
    assert!(matches!(h.record("found-1"), Some(Record::Completed(_))));
}

#[tokio::test]
async fn a_check_that_finds_nothing_lets_the_program_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    // The first run hangs past the timeout; the second succeeds.
    let program = counting_script(
        out,
        &format!("[ \"$(wc -l < '{0}/runs')\" -gt 1 ] || exec sleep 600\necho '{{\"done\": true}}'", out.display()),
    );
    let check = script(out, "check.sh", &format!("echo checked >> '{0}/checks'\nexit 1", out.display()));
    let mut h = engine_with(&program, &format!("program = {:?}\ndelay = \"10ms\"", check.display().to_string()));
    let item = h.item("absent-1", json!({ "n": 1 }));
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Succeeded, "{:?}", done[0].result);
    assert_eq!(done[0].result.result, json!({ "exit_code": 0, "stdout": { "done": true } }));
    assert_eq!((runs(out), done[0].result.attempts), (2, 2));
    assert_eq!(std::fs::read_to_string(out.join("checks")).unwrap(), "checked\n", "one check, between the runs");
}

//! The `exec` sink: runs a configured program once per attempt (docs/contract.md §6).
//!
//! What the program gets, per attempt:
//! - the payload as JSON on stdin (then stdin is closed; a program that does not read it
//!   is fine);
//! - an environment cleared of everything but `PATH`, the names listed in
//!   `env_passthrough`, and `DEDUPD_KEY` (the idempotency key, always set), `DEDUPD_TYPE`,
//!   `DEDUPD_ATTEMPT`, and `TRACEPARENT` and `TRACESTATE` when there is a trace context;
//! - `timeout` for the whole run: when it expires the process is killed and the attempt is
//!   a transient failure.
//!
//! How it ends: exit code 0 is success; a code listed in `transient_exit_codes` (default
//! 75, `EX_TEMPFAIL`) or death by a signal is transient; any other code is permanent.
//! `forward_key` (default false) only *declares* whether the program honours
//! `DEDUPD_KEY` as an idempotency key: it decides whether a claim orphaned by a crash is
//! re-run (true) or becomes `indeterminate` (false), docs/contract.md §4.
//!
//! The result stored and replayed to repeats is `{"exit_code": 0, "stdout": <stdout>}`,
//! stdout parsed as JSON when it is valid JSON, else its text (lossy UTF-8), `null` when
//! empty. At most `max_output_bytes` of stdout are kept (more is read and dropped so the
//! program never blocks on a full pipe) and the result then gets `"truncated": true`;
//! stderr is bounded the same way and quoted in failure messages.
//!
//! Each run gets a process group of its own. When a run is abandoned (timeout, or dedupd
//! dropping it at shutdown) the whole group is killed, so a script's children (a `curl` it
//! started, a background job) cannot finish an effect after dedupd gave up on the attempt.
//! After a normal exit nothing is killed; but a child that keeps stdout open makes the run
//! last until it closes, or until the timeout.

use std::num::NonZeroUsize;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput, SinkRequest};

/// Config of an `exec` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSinkConfig {
    /// Rate and concurrency limits (`[sinks.NAME.limits]`, see docs/sinks.md).
    #[serde(default)]
    pub limits: crate::sinks::limit::SinkLimits,
    /// The circuit breaker (`[sinks.NAME.circuit]`, see docs/sinks.md).
    #[serde(default)]
    pub circuit: crate::sinks::circuit::CircuitConfig,
    /// The program: a path, or a name looked up in `PATH`.
    pub program: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Longest a run may take; then the process is killed and the attempt is transient.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Exit codes that mean "try again later" (transient); other non-zero codes are permanent.
    #[serde(default = "default_transient_exit_codes")]
    pub transient_exit_codes: Vec<i32>,
    /// Most bytes of stdout kept as the result, and of stderr quoted in an error.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: NonZeroUsize,
    /// Whether the program honours `DEDUPD_KEY` as an idempotency key (then crash re-runs
    /// are safe; otherwise an orphaned claim becomes `indeterminate`).
    #[serde(default)]
    pub forward_key: bool,
    /// Names of dedupd's own environment variables passed to the program (besides `PATH`,
    /// which always is); everything else is withheld.
    #[serde(default)]
    pub env_passthrough: Vec<String>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_transient_exit_codes() -> Vec<i32> {
    // sysexits.h EX_TEMPFAIL: "temporary failure, user is invited to retry".
    vec![75]
}
fn default_max_output_bytes() -> NonZeroUsize {
    NonZeroUsize::new(64 * 1024).unwrap_or(NonZeroUsize::MIN)
}

impl SinkKind for ExecSinkConfig {
    fn limits(&self) -> &crate::sinks::limit::SinkLimits {
        &self.limits
    }

    fn circuit(&self) -> &crate::sinks::circuit::CircuitConfig {
        &self.circuit
    }

    fn validate(&self, problems: &mut Problems<'_>) {
        problems.check(self.limits.validate(problems.at()));
        if self.program.trim().is_empty() {
            problems.add("program", self.program.clone(), "must name a program");
        } else if let Some(why) = program_problem(&self.program) {
            // Found at the first call, it would fail every command of the route for good.
            problems.add("program", self.program.clone(), why);
        }
        if self.timeout.is_zero() {
            problems.add("timeout", "0s", "must be positive");
        }
        if let Some(zero) = self.transient_exit_codes.iter().find(|c| **c == 0) {
            problems.add("transient_exit_codes", zero.to_string(), "0 means success");
        }
        if let Some(bad) = self.env_passthrough.iter().find(|n| n.is_empty() || n.contains('=') || n.contains('\0')) {
            problems.add("env_passthrough", bad.clone(), "not an environment variable name");
        }
    }

    fn forwards_key(&self) -> bool {
        self.forward_key
    }

    fn call_holds_a_resource(&self) -> bool {
        // A process, with its pipes, per call.
        true
    }

    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        if let Some((key, value, reason)) = self.problems(&format!("sinks.{name}")).into_iter().next() {
            return Err(SinkBuildError { name: name.to_string(), reason: format!("{key} = {value:?}: {reason}") });
        }
        Ok(Arc::new(ExecSink::new(self)))
    }
}

/// An `exec` sink at run time.
#[derive(Debug)]
pub struct ExecSink {
    config: ExecSinkConfig,
}

/// What a finished run produced.
struct Finished {
    status: ExitStatus,
    stdout: Bounded,
    stderr: Bounded,
}

/// The first bytes of a stream and whether there were more.
#[derive(Default)]
struct Bounded {
    bytes: Vec<u8>,
    truncated: bool,
}

impl ExecSink {
    /// Builds the sink from a validated config.
    pub fn new(config: &ExecSinkConfig) -> ExecSink {
        ExecSink { config: config.clone() }
    }

    fn command(&self, request: &SinkRequest<'_>) -> Command {
        let mut command = Command::new(&self.config.program);
        command.args(&self.config.args).env_clear();
        for name in std::iter::once("PATH").chain(self.config.env_passthrough.iter().map(String::as_str)) {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
            .env("DEDUPD_KEY", request.key())
            .env("DEDUPD_TYPE", request.kind())
            .env("DEDUPD_ATTEMPT", request.attempt().to_string());
        if let Some(traceparent) = request.traceparent() {
            command.env("TRACEPARENT", traceparent);
        }
        if let Some(tracestate) = request.tracestate() {
            command.env("TRACESTATE", tracestate);
        }
        // A group of its own, so that abandoning the run can kill the program's children too.
        command.process_group(0);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        command
    }

    /// Runs the program to its end; `Err` is a transient failure (spawn or I/O trouble, or
    /// the timeout, after which the process has been killed and reaped).
    async fn run(&self, request: &SinkRequest<'_>) -> Result<Finished, SinkError> {
        let transient = |message: String| SinkError::Transient { message, retry_after: None };
        let stdin_bytes =
            serde_json::to_vec(request.payload()).map_err(|e| transient(format!("cannot encode the payload: {e}")))?;
        let mut child = self.command(request).spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => SinkError::Permanent {
                message: format!("cannot start `{}`: {e}", self.config.program),
                result: json!({ "exit_code": Value::Null, "error": e.to_string() }),
            },
            _ => transient(format!("cannot start `{}`: {e}", self.config.program)),
        })?;
        // Declared after `child`, so dropped before it: the group is killed while its leader
        // is not yet reaped, and the group id cannot have been reused.
        let mut group = GroupKill(child.id().and_then(|pid| rustix::process::Pid::from_raw(pid.try_into().ok()?)));
        let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let max = self.config.max_output_bytes.get();
        let run = async {
            // All at once: a program may write before it reads, and pipes are finite.
            let (_, stdout, stderr, status) = tokio::join!(
                write_all_and_close(stdin, stdin_bytes),
                read_bounded(stdout, max),
                read_bounded(stderr, max),
                child.wait()
            );
            (stdout, stderr, status)
        };
        match tokio::time::timeout(self.config.timeout, run).await {
            Ok((stdout, stderr, Ok(status))) => {
                group.disarm();
                Ok(Finished { status, stdout: stdout?, stderr: stderr? })
            }
            Ok((_, _, Err(e))) => Err(transient(format!("waiting for `{}` failed: {e}", self.config.program))),
            Err(_) => {
                group.kill();
                // kill() also reaps the program, so no zombie outlives the attempt.
                let killed = child.kill().await;
                let mut message = format!(
                    "`{}` timed out after {}; killed",
                    self.config.program,
                    humantime::format_duration(self.config.timeout)
                );
                if let Err(e) = killed {
                    message.push_str(&format!(" (kill failed: {e})"));
                }
                Err(transient(message))
            }
        }
    }
}

/// Kills a run's process group when dropped, unless disarmed after a normal exit.
struct GroupKill(Option<rustix::process::Pid>);

impl GroupKill {
    fn kill(&mut self) {
        if let Some(group) = self.0.take() {
            // ESRCH (the group is already gone) is the expected race; nothing else can help.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }

    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Feeds the payload to stdin and closes it. A program that exits without reading stdin
/// (broken pipe) is not an error: whether it needed the payload is for its exit code to say.
async fn write_all_and_close(stdin: Option<tokio::process::ChildStdin>, bytes: Vec<u8>) {
    if let Some(mut stdin) = stdin {
        let _ = stdin.write_all(&bytes).await;
        let _ = stdin.shutdown().await;
    }
}

/// Reads a stream to its end, keeping at most `max` bytes.
async fn read_bounded(stream: Option<impl AsyncRead + Unpin>, max: usize) -> Result<Bounded, SinkError> {
    let mut out = Bounded::default();
    let Some(mut stream) = stream else { return Ok(out) };
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| SinkError::Transient {
            message: format!("reading the program's output failed: {e}"),
            retry_after: None,
        })?;
        if n == 0 {
            return Ok(out);
        }
        let room = max.saturating_sub(out.bytes.len());
        out.bytes.extend_from_slice(&chunk[..n.min(room)]);
        out.truncated |= n > room;
    }
}

/// stdout as a result value: JSON when it parses (and was not cut), else text, `null` if empty.
fn stdout_value(stdout: &Bounded) -> Value {
    let text = String::from_utf8_lossy(&stdout.bytes);
    if text.trim().is_empty() {
        return Value::Null;
    }
    if !stdout.truncated
        && let Ok(value) = serde_json::from_slice::<Value>(&stdout.bytes)
    {
        return value;
    }
    Value::String(text.into_owned())
}

/// The result object: exit code, stdout, and `truncated` when stdout was cut.
fn result(exit_code: Option<i32>, stdout: &Bounded) -> Value {
    let mut result = json!({ "exit_code": exit_code, "stdout": stdout_value(stdout) });
    if stdout.truncated {
        result["truncated"] = Value::Bool(true);
    }
    result
}

/// A failure message: what happened, and the (bounded) stderr when there was any.
fn failure_message(what: String, stderr: &Bounded) -> String {
    let text = String::from_utf8_lossy(&stderr.bytes);
    let text = text.trim();
    match (text.is_empty(), stderr.truncated) {
        (true, _) => what,
        (false, false) => format!("{what}; stderr: {text}"),
        (false, true) => format!("{what}; stderr (truncated): {text}"),
    }
}

#[async_trait::async_trait]
impl SinkEffect for ExecSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let Finished { status, stdout, stderr } = self.run(&request).await?;
        let program = &self.config.program;
        match status.code() {
            Some(0) => Ok(result(Some(0), &stdout)),
            Some(code) if self.config.transient_exit_codes.contains(&code) => Err(SinkError::Transient {
                message: failure_message(format!("`{program}` exited with transient code {code}"), &stderr),
                retry_after: None,
            }),
            Some(code) => Err(SinkError::Permanent {
                message: failure_message(format!("`{program}` exited with code {code}"), &stderr),
                result: result(Some(code), &stdout),
            }),
            // Killed by a signal from outside (OOM killer, an operator): worth another try.
            None => Err(SinkError::Transient {
                message: failure_message(format!("`{program}` was killed by a signal ({status})"), &stderr),
                retry_after: None,
            }),
        }
    }
}

/// Why `program` cannot be started on this machine now, as `Command::new` would look for
/// it: a path (with a `/`) that is no executable file, or a name no directory of `PATH`
/// holds as one.
fn program_problem(program: &str) -> Option<&'static str> {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        return match std::fs::metadata(program) {
            Err(_) => Some("no such file"),
            Ok(m) if !m.is_file() => Some("not a file"),
            Ok(_) if !executable(std::path::Path::new(program)) => Some("not executable (no x permission)"),
            Ok(_) => None,
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    match std::env::split_paths(&path).any(|dir| executable(&dir.join(program))) {
        true => None,
        false => Some("not found in PATH"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_cannot_be_started_is_a_problem_of_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let at = |p: &std::path::Path| program_problem(p.to_str().unwrap());
        assert_eq!(at(&dir.path().join("typo.sh")), Some("no such file"));
        assert_eq!(at(dir.path()), Some("not a file"));
        assert_eq!(at(&script), Some("not executable (no x permission)"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(at(&script), None);
        // A name is looked up in PATH.
        assert_eq!(program_problem("sh"), None);
        assert_eq!(program_problem("surely-no-such-program-5e1c"), Some("not found in PATH"));
    }

    fn bounded(bytes: &[u8], truncated: bool) -> Bounded {
        Bounded { bytes: bytes.to_vec(), truncated }
    }

    #[test]
    fn stdout_is_json_when_it_parses_else_text() {
        assert_eq!(stdout_value(&bounded(b"{\"id\": 7}\n", false)), json!({"id": 7}));
        assert_eq!(stdout_value(&bounded(b"queued\n", false)), json!("queued\n"));
        assert_eq!(stdout_value(&bounded(b"  \n", false)), Value::Null);
        // A cut JSON document is kept as the text it is, not half-parsed.
        assert_eq!(stdout_value(&bounded(b"[1, 2", true)), json!("[1, 2"));
    }

    #[test]
    fn validation_names_the_key() {
        let config: ExecSinkConfig = toml::from_str("program = \"/bin/true\"\ntransient_exit_codes = [75, 0]").unwrap();
        let (key, value, _) = config.problems("sinks.x")[0].clone();
        assert_eq!((key.as_str(), value.as_str()), ("sinks.x.transient_exit_codes", "0"));
        let config: ExecSinkConfig = toml::from_str("program = \"/bin/true\"\ntimeout = \"0s\"").unwrap();
        assert_eq!(config.problems("sinks.x")[0].0, "sinks.x.timeout");
        assert!(toml::from_str::<ExecSinkConfig>("program = \"/bin/true\"\nmax_output_bytes = 0").is_err());
    }

    #[test]
    fn defaults_do_not_forward_the_key() {
        let config: ExecSinkConfig = toml::from_str("program = \"/bin/true\"").unwrap();
        assert!(!config.forwards_key());
        assert_eq!(config.transient_exit_codes, vec![75]);
        assert_eq!(config.timeout, Duration::from_secs(30));
    }
}

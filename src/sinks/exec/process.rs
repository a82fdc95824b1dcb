//! Running one program to its end, for the `exec` sink's call and for its check alike: the
//! same environment, the payload on stdin, bounded output, and a process group of its own
//! that is killed when the run is abandoned (timeout, or the run dropped at shutdown).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::sinks::SinkRequest;

/// One program as configured: the sink's own, or its check's.
#[derive(Debug, Clone, Copy)]
pub(super) struct Program<'a> {
    /// A path, or a name looked up in `PATH`.
    pub(super) program: &'a str,
    pub(super) args: &'a [String],
    /// Longest a run may take; then its process group is killed.
    pub(super) timeout: Duration,
    /// dedupd's own variables passed on besides `PATH`.
    pub(super) env_passthrough: &'a [String],
    /// Most bytes of stdout and of stderr kept.
    pub(super) max_output_bytes: usize,
}

/// What a run that ended by itself (an exit code, or a signal) produced.
pub(super) struct Finished {
    pub(super) status: ExitStatus,
    pub(super) stdout: Bounded,
    pub(super) stderr: Bounded,
}

/// Why a run has no exit status to tell.
#[derive(Debug)]
pub(super) enum RunFailure {
    /// The program could not be started: it never ran, so it cannot have done anything.
    NotStarted(std::io::Error),
    /// It started, and its end is unknown: killed at its timeout, or waiting for it or
    /// reading its output failed. Whatever it did may have happened. The sentence says what.
    Unfinished(String),
}

/// The first bytes of a stream and whether there were more.
#[derive(Default)]
pub(super) struct Bounded {
    pub(super) bytes: Vec<u8>,
    pub(super) truncated: bool,
}

impl Program<'_> {
    fn command(&self, request: &SinkRequest<'_>) -> Command {
        let mut command = Command::new(self.program);
        command.args(self.args).env_clear();
        for name in std::iter::once("PATH").chain(self.env_passthrough.iter().map(String::as_str)) {
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

    /// Runs the program for `request` to its end, or kills it (and reaps it) at the timeout.
    pub(super) async fn run(&self, request: &SinkRequest<'_>) -> Result<Finished, RunFailure> {
        let stdin_bytes = serde_json::to_vec(request.payload())
            .map_err(|e| RunFailure::NotStarted(std::io::Error::other(format!("cannot encode the payload: {e}"))))?;
        let mut child = self.command(request).spawn().map_err(RunFailure::NotStarted)?;
        // Declared after `child`, so dropped before it: the group is killed while its leader
        // is not yet reaped, and the group id cannot have been reused.
        let mut group = GroupKill(child.id().and_then(|pid| rustix::process::Pid::from_raw(pid.try_into().ok()?)));
        let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let max = self.max_output_bytes;
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
        let program = self.program;
        match tokio::time::timeout(self.timeout, run).await {
            Ok((stdout, stderr, Ok(status))) => {
                group.disarm();
                let unread =
                    |e: std::io::Error| RunFailure::Unfinished(format!("reading `{program}`'s output failed: {e}"));
                Ok(Finished { status, stdout: stdout.map_err(unread)?, stderr: stderr.map_err(unread)? })
            }
            Ok((_, _, Err(e))) => Err(RunFailure::Unfinished(format!("waiting for `{program}` failed: {e}"))),
            Err(_) => {
                group.kill();
                // kill() also reaps the program, so no zombie outlives the run.
                let killed = child.kill().await;
                let mut message =
                    format!("`{program}` timed out after {}; killed", humantime::format_duration(self.timeout));
                if let Err(e) = killed {
                    message.push_str(&format!(" (kill failed: {e})"));
                }
                Err(RunFailure::Unfinished(message))
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
async fn read_bounded(stream: Option<impl AsyncRead + Unpin>, max: usize) -> std::io::Result<Bounded> {
    let mut out = Bounded::default();
    let Some(mut stream) = stream else { return Ok(out) };
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(out);
        }
        let room = max.saturating_sub(out.bytes.len());
        out.bytes.extend_from_slice(&chunk[..n.min(room)]);
        out.truncated |= n > room;
    }
}

/// stdout as a result value: JSON when it parses (and was not cut), else text, `null` if empty.
pub(super) fn stdout_value(stdout: &Bounded) -> Value {
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
pub(super) fn result(exit_code: Option<i32>, stdout: &Bounded) -> Value {
    let mut result = json!({ "exit_code": exit_code, "stdout": stdout_value(stdout) });
    if stdout.truncated {
        result["truncated"] = Value::Bool(true);
    }
    result
}

/// A failure message: what happened, and the (bounded) stderr when there was any.
pub(super) fn failure_message(what: String, stderr: &Bounded) -> String {
    let text = String::from_utf8_lossy(&stderr.bytes);
    let text = text.trim();
    match (text.is_empty(), stderr.truncated) {
        (true, _) => what,
        (false, false) => format!("{what}; stderr: {text}"),
        (false, true) => format!("{what}; stderr (truncated): {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

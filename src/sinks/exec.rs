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
//! What the engine learns of each call ([`crate::sinks::CallAnswer`]): a program that exited
//! by itself, with any code, *answered*; one that could not be started was *never sent*;
//! one killed at its timeout, killed by a signal, or whose output or end could not be read
//! *may* have done its effect. After such a call, a sink that does not forward the key runs
//! its check (`[sinks.NAME.check]`, [`check`]) before running the program again, or leaves
//! the key `indeterminate` when it has none.
//!
//! The result stored and replayed to repeats is `{"exit_code": 0, "stdout": <stdout>}`,
//! stdout parsed as JSON when it is valid JSON, else its text (lossy UTF-8), `null` when
//! empty. At most `max_output_bytes` of stdout are kept (more is read and dropped so the
//! program never blocks on a full pipe) and the result then gets `"truncated": true`;
//! stderr is bounded the same way and quoted in failure messages.
//!
//! Each run gets a process group of its own ([`process`]). When a run is abandoned (timeout,
//! or dedupd dropping it at shutdown) the whole group is killed, so a script's children (a
//! `curl` it started, a background job) cannot finish an effect after dedupd gave up on the
//! attempt. After a normal exit nothing is killed; but a child that keeps stdout open makes
//! the run last until it closes, or until the timeout.

mod check;
mod process;

pub use self::check::ExecCheckConfig;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use self::process::{Finished, Program, RunFailure, failure_message, result};
use super::{
    CheckAnswer, CheckTiming, Problem, Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput,
    SinkRequest,
};

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
    /// `[sinks.NAME.check]`: a program that asks the receiver whether a command's effect
    /// exists, run after a call that may have done it without an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<ExecCheckConfig>,
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

    fn validate(&self, problems: &mut Problems) {
        if self.program.trim().is_empty() {
            problems.add("program", self.program.clone(), "must name a program");
        } else if let Some(why) = program_problem(&self.program) {
            // Found at the first call, it would fail every command of the route for good.
            problems.add("program", self.program.clone(), why);
        }
        if self.timeout.is_zero() {
            problems.add("timeout", "0s", "must be positive");
        }
        if self.max_output_bytes.get() > super::MAX_RESULT_BYTES {
            let why =
                format!("must be at most {} (8 MiB): a result is kept in the key's record", super::MAX_RESULT_BYTES);
            problems.add("max_output_bytes", self.max_output_bytes.to_string(), why);
        }
        if let Some(zero) = self.transient_exit_codes.iter().find(|c| **c == 0) {
            problems.add("transient_exit_codes", zero.to_string(), "0 means success");
        }
        if let Some(bad) = self.env_passthrough.iter().find(|n| n.is_empty() || n.contains('=') || n.contains('\0')) {
            problems.add("env_passthrough", bad.clone(), "not an environment variable name");
        }
        if let Some(check) = &self.check {
            if self.forward_key {
                // The engine retries such a sink with the key: the check would never run.
                let at = problems.at();
                problems.add(
                    "forward_key",
                    "true",
                    format!(
                        "a sink that forwards the key is run again with the key; a check is only used when \
                         forward_key = false (set it to false, or remove [{at}.check])"
                    ),
                );
            }
            check.validate(self.timeout, problems);
        }
    }

    fn check_timing(&self) -> Option<CheckTiming> {
        self.check.as_ref().map(|check| check.timing(self.timeout))
    }

    fn forwards_key(&self) -> bool {
        self.forward_key
    }

    fn call_holds_a_resource(&self) -> bool {
        // A process, with its pipes, per call.
        true
    }

    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        if let Some(Problem { key, value, reason }) = self.problems(&format!("sinks.{name}")).into_iter().next() {
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

impl ExecSink {
    /// Builds the sink from a validated config.
    pub fn new(config: &ExecSinkConfig) -> ExecSink {
        ExecSink { config: config.clone() }
    }

    /// The sink's own program, as configured.
    fn program(&self) -> Program<'_> {
        Program {
            program: &self.config.program,
            args: &self.config.args,
            timeout: self.config.timeout,
            env_passthrough: &self.config.env_passthrough,
            max_output_bytes: self.config.max_output_bytes.get(),
        }
    }

    /// What a run that ended by itself means: its exit code answered the call.
    fn ended(&self, request: &SinkRequest<'_>, finished: Finished) -> Result<SinkOutput, SinkError> {
        let Finished { status, stdout, stderr } = finished;
        let program = &self.config.program;
        let Some(code) = status.code() else {
            // Killed by a signal from outside (OOM killer, an operator): worth another try,
            // but not an answer: it may have died after doing its effect.
            return Err(SinkError::Transient {
                message: failure_message(format!("`{program}` was killed by a signal ({status})"), &stderr),
                retry_after: None,
            });
        };
        request.answered();
        match code {
            0 => Ok(result(Some(0), &stdout)),
            code if self.config.transient_exit_codes.contains(&code) => Err(SinkError::Transient {
                message: failure_message(format!("`{program}` exited with transient code {code}"), &stderr),
                retry_after: None,
            }),
            code => Err(SinkError::Permanent {
                message: failure_message(format!("`{program}` exited with code {code}"), &stderr),
                result: result(Some(code), &stdout),
            }),
        }
    }
}

#[async_trait::async_trait]
impl SinkEffect for ExecSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        match self.program().run(&request).await {
            Ok(finished) => self.ended(&request, finished),
            Err(RunFailure::NotStarted(e)) => {
                request.never_sent();
                let message = format!("cannot start `{}`: {e}", self.config.program);
                Err(match e.kind() {
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => SinkError::Permanent {
                        message,
                        result: json!({ "exit_code": Value::Null, "error": e.to_string() }),
                    },
                    _ => SinkError::Transient { message, retry_after: None },
                })
            }
            // Neither answered nor never sent: the program may have done its effect.
            Err(RunFailure::Unfinished(message)) => Err(SinkError::Transient { message, retry_after: None }),
        }
    }

    async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        match &self.config.check {
            Some(check) => check::run(&check.program(&self.program()), &request).await,
            None => CheckAnswer::Error(format!("the exec sink running `{}` has no check", self.config.program)),
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

    #[test]
    fn validation_names_the_key() {
        let config: ExecSinkConfig = toml::from_str("program = \"/bin/true\"\ntransient_exit_codes = [75, 0]").unwrap();
        let crate::problems::Problem { key, value, .. } = config.problems("sinks.x").remove(0);
        assert_eq!((key.as_str(), value.as_str()), ("sinks.x.transient_exit_codes", "0"));
        let config: ExecSinkConfig = toml::from_str("program = \"/bin/true\"\ntimeout = \"0s\"").unwrap();
        assert_eq!(config.problems("sinks.x")[0].key, "sinks.x.timeout");
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

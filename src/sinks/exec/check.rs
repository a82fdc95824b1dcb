//! The `exec` sink's check (`[sinks.NAME.check]`, module [`crate::sinks::check`]): a second
//! program that asks the receiver whether a command's effect exists, run exactly like the
//! call (same environment, the payload on stdin, its own process group killed at its
//! timeout). Exit 0: found, its stdout the result; exit 1: absent; any other code: the
//! receiver did not tell; a program that cannot start, times out or is killed: no answer.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::process::{Finished, Program, RunFailure, failure_message, result};
use crate::sinks::check::{CheckAnswer, CheckTimes, CheckTiming};
use crate::sinks::{Problems, SinkRequest};

/// `[sinks.NAME.check]` of an `exec` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecCheckConfig {
    /// The check program: a path, or a name looked up in `PATH`.
    pub program: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Longest a check may take (default: the sink's `timeout`); then it is killed and the
    /// check has no answer.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// After a call without an answer, how long to wait before checking (default: twice the
    /// sink's `timeout`).
    #[serde(default, with = "humantime_serde")]
    pub delay: Option<Duration>,
    /// How often the reconciler asks again about an `indeterminate` key (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// How long after its claim a key is still asked about (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub deadline: Option<Duration>,
}

impl ExecCheckConfig {
    /// The check's timing, for a sink whose calls take at most `call_timeout`.
    pub fn timing(&self, call_timeout: Duration) -> CheckTiming {
        CheckTiming::new(
            CheckTimes { delay: self.delay, interval: self.interval, deadline: self.deadline },
            call_timeout,
        )
    }

    /// Adds the problems of the table (keys `check.program`, ...), for a sink whose calls
    /// take at most `call_timeout`.
    pub(super) fn validate(&self, call_timeout: Duration, problems: &mut Problems) {
        if self.program.trim().is_empty() {
            problems.add("check.program", self.program.clone(), "must name a program");
        } else if let Some(why) = super::program_problem(&self.program) {
            // Found at the first check, it would leave every unanswered call indeterminate.
            problems.add("check.program", self.program.clone(), why);
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            problems.add("check.timeout", "0s", "must be positive");
        }
        self.timing(call_timeout).validate(problems);
    }

    /// The check program, run like the sink's own `program` (`env_passthrough`,
    /// `max_output_bytes`), with the sink's `timeout` unless it sets its own.
    pub(super) fn program<'a>(&'a self, call: &Program<'a>) -> Program<'a> {
        Program { program: &self.program, args: &self.args, timeout: self.timeout.unwrap_or(call.timeout), ..*call }
    }
}

/// Runs the check `program` for `request`; it is killed when the caller gives up on it (a
/// check only reads, so stopping it early loses nothing).
pub(super) async fn run(program: &Program<'_>, request: &SinkRequest<'_>) -> CheckAnswer {
    let ran = tokio::select! {
        ran = program.run(request) => ran,
        () = request.given_up() => return CheckAnswer::Error(format!("the check `{}` was given up", program.program)),
    };
    answer(program.program, ran)
}

/// What a run of the check program `name` answers.
fn answer(name: &str, ran: Result<Finished, RunFailure>) -> CheckAnswer {
    match ran {
        Err(RunFailure::NotStarted(e)) => CheckAnswer::Error(format!("cannot start the check `{name}`: {e}")),
        Err(RunFailure::Unfinished(why)) => CheckAnswer::Error(format!("the check did not finish: {why}")),
        Ok(Finished { status, stdout, stderr }) => match status.code() {
            Some(0) => CheckAnswer::Found(result(Some(0), &stdout)),
            Some(1) => CheckAnswer::Absent,
            Some(code) => CheckAnswer::Unknown(failure_message(
                format!("the check `{name}` exited with code {code} (0: found, 1: absent)"),
                &stderr,
            )),
            None => CheckAnswer::Error(failure_message(
                format!("the check `{name}` was killed by a signal ({status})"),
                &stderr,
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use serde_json::json;

    use super::super::{ExecSink, ExecSinkConfig};
    use super::*;
    use crate::sinks::{SinkEffect, SinkKind};

    /// An exec sink (its own program `/bin/true`, 10 s timeout) whose check runs the `/bin/sh`
    /// script `body`, with `extra` lines added to the `[check]` table.
    fn sink_checking(dir: &Path, body: &str, extra: &str) -> ExecSink {
        let script = dir.join("check.sh");
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let text = format!("program = \"/bin/true\"\ntimeout = \"10s\"\n[check]\nprogram = {:?}\n{extra}", script);
        let config: ExecSinkConfig = toml::from_str(&text).unwrap();
        assert_eq!(config.problems("sinks.pay"), vec![]);
        ExecSink::new(&config)
    }

    async fn ask(sink: &ExecSink) -> CheckAnswer {
        let payload = json!({ "reference": "ref-7" });
        let request = SinkRequest::unclaimed("pay-1", "payment.create", &payload, 2, None);
        tokio::time::timeout(Duration::from_secs(20), sink.check(request)).await.expect("the check ends in time")
    }

    #[tokio::test]
    async fn exit_0_is_found_with_stdout_as_the_result_1_absent_other_codes_unknown() {
        let dir = tempfile::tempdir().unwrap();
        // The check gets what the call gets: the key and type in the environment, the payload
        // on stdin.
        let found = sink_checking(
            dir.path(),
            "grep -q '\"reference\":\"ref-7\"' || exit 3\necho \"{\\\"id\\\": \\\"$DEDUPD_KEY/$DEDUPD_TYPE\\\"}\"",
            "",
        );
        assert_eq!(
            ask(&found).await,
            CheckAnswer::Found(json!({ "exit_code": 0, "stdout": { "id": "pay-1/payment.create" } }))
        );
        assert_eq!(ask(&sink_checking(dir.path(), "exit 1", "")).await, CheckAnswer::Absent);
        match ask(&sink_checking(dir.path(), "echo 'api down' >&2\nexit 2", "")).await {
            CheckAnswer::Unknown(why) => assert!(why.contains("code 2") && why.contains("api down"), "{why}"),
            other => panic!("expected unknown, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_check_past_its_timeout_is_killed_and_has_no_answer() {
        let dir = tempfile::tempdir().unwrap();
        let sink = sink_checking(dir.path(), "exec sleep 600", "timeout = \"300ms\"");
        match ask(&sink).await {
            CheckAnswer::Error(why) => assert!(why.contains("timed out after 300ms"), "{why}"),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_check_that_cannot_start_has_no_answer() {
        let dir = tempfile::tempdir().unwrap();
        let sink = sink_checking(dir.path(), "exit 0", "");
        // Validated, then removed: as if it vanished after the config was checked.
        std::fs::remove_file(dir.path().join("check.sh")).unwrap();
        match ask(&sink).await {
            CheckAnswer::Error(why) => assert!(why.contains("cannot start the check"), "{why}"),
            other => panic!("expected an error, got {other:?}"),
        }
        let none = ExecSink::new(&toml::from_str("program = \"/bin/true\"").unwrap());
        assert!(matches!(ask(&none).await, CheckAnswer::Error(_)));
    }

    #[test]
    fn defaults_follow_the_sink() {
        let config: ExecSinkConfig =
            toml::from_str("program = \"/bin/true\"\ntimeout = \"5s\"\n[check]\nprogram = \"/bin/true\"").unwrap();
        let timing = config.check_timing().unwrap();
        assert_eq!(timing, CheckTiming::new(CheckTimes::default(), Duration::from_secs(5)));
        assert_eq!(timing.delay, Duration::from_secs(10), "twice the sink's timeout");
        let sink = ExecSink::new(&config);
        let check = config.check.as_ref().unwrap();
        assert_eq!(check.program(&sink.program()).timeout, Duration::from_secs(5), "the sink's timeout");
        assert_eq!(check.args, Vec::<String>::new());
        let without: ExecSinkConfig = toml::from_str("program = \"/bin/true\"").unwrap();
        assert_eq!(without.check_timing(), None, "no check, no timing");
    }

    #[test]
    fn validation_names_the_check_keys() {
        let keys = |table: &str| -> Vec<String> {
            let config: ExecSinkConfig =
                toml::from_str(&format!("program = \"/bin/true\"\ntimeout = \"1m\"\n[check]\n{table}")).unwrap();
            config.problems("sinks.pay").into_iter().map(|p| p.key).collect()
        };
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-executable.sh");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert_eq!(keys(&format!("program = {plain:?}")), ["sinks.pay.check.program"]);
        assert_eq!(keys("program = \"surely-no-such-check-5e1c\""), ["sinks.pay.check.program"]);
        assert_eq!(keys("program = \" \""), ["sinks.pay.check.program"]);
        assert_eq!(keys("program = \"/bin/true\"\ntimeout = \"0s\""), ["sinks.pay.check.timeout"]);
        assert_eq!(keys("program = \"/bin/true\"\ndelay = \"25h\""), ["sinks.pay.check.delay"]);
        let forwarding: ExecSinkConfig =
            toml::from_str("program = \"/bin/true\"\nforward_key = true\n[check]\nprogram = \"/bin/true\"").unwrap();
        let problems = forwarding.problems("sinks.pay");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "sinks.pay.forward_key", "a check that would never run");
        let unknown =
            toml::from_str::<ExecSinkConfig>("program = \"/bin/true\"\n[check]\nprogram = \"/bin/true\"\nurl = \"x\"");
        assert!(unknown.unwrap_err().to_string().contains("url"));
        let missing = toml::from_str::<ExecSinkConfig>("program = \"/bin/true\"\n[check]\nargs = []");
        assert!(missing.unwrap_err().to_string().contains("program"));
    }
}

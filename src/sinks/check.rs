//! Checks, "check before writing" (docs/contract.md §4, "Calls without an answer"): asking a
//! sink's receiver whether a command's effect exists, for a sink that does not forward the
//! key and whose call may have landed without an answer.
//!
//! A kind that can ask its receiver has a `[sinks.NAME.check]` table; its config states the
//! check's timing ([`SinkKind::check_timing`](super::SinkKind::check_timing)) and its effect
//! performs the check ([`SinkEffect::check`](super::SinkEffect::check)). The timing keys are
//! the same for every kind: `delay`, `interval` and `deadline`.

use std::time::Duration;

use super::{Problems, SinkOutput};

/// What a check learnt of a command's effect at the receiver.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckAnswer {
    /// The effect exists; this is what the receiver holds for it, stored as the command's
    /// result.
    Found(SinkOutput),
    /// The receiver said the effect does not exist: the command may run.
    Absent,
    /// The receiver answered without telling (an answer the check's rules do not map): the
    /// key stays as it is and is checked again later. The sentence says what it answered.
    Unknown(String),
    /// The check could not be made (the receiver was not reached, did not answer in time,
    /// the check program could not run): as `Unknown`. The sentence says why.
    Error(String),
}

impl CheckAnswer {
    /// The `answer` label of `dedupd_checks_total`.
    pub fn label(&self) -> &'static str {
        match self {
            CheckAnswer::Found(_) => "found",
            CheckAnswer::Absent => "absent",
            CheckAnswer::Unknown(_) => "unknown",
            CheckAnswer::Error(_) => "error",
        }
    }
}

/// When an instance's check runs: the timing keys of `[sinks.NAME.check]`, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckTiming {
    /// After a call without an answer, how long to wait before checking, so that a request
    /// still being processed at the receiver has landed (`check.delay`; by default twice
    /// the call's timeout).
    pub delay: Duration,
    /// How often a key left `indeterminate` is checked again (`check.interval`).
    pub interval: Duration,
    /// How long after its claim a key left `indeterminate` is checked again
    /// (`check.deadline`); past it the key waits for an operator.
    pub deadline: Duration,
}

/// `check.interval` when unset.
pub fn default_interval() -> Duration {
    Duration::from_secs(60)
}

/// `check.deadline` when unset.
pub fn default_deadline() -> Duration {
    Duration::from_secs(24 * 60 * 60)
}

impl CheckTiming {
    /// The timing a kind's `[sinks.NAME.check]` states: `delay` when set, else twice
    /// `call_timeout` (the longest a call of the instance can take).
    pub fn new(delay: Option<Duration>, interval: Duration, deadline: Duration, call_timeout: Duration) -> CheckTiming {
        CheckTiming { delay: delay.unwrap_or_else(|| call_timeout.saturating_mul(2)), interval, deadline }
    }

    /// Adds a problem for each timing key that cannot work (keys `check.interval`, ...).
    pub fn validate(&self, problems: &mut Problems<'_>) {
        let shown = |d: Duration| humantime::format_duration(d).to_string();
        if self.interval.is_zero() {
            problems.add("check.interval", shown(self.interval), "must be positive");
        }
        if self.deadline.is_zero() {
            problems.add("check.deadline", shown(self.deadline), "must be positive");
        }
        if self.delay > self.deadline {
            problems.add(
                "check.delay",
                shown(self.delay),
                format!("must not be longer than check.deadline ({})", shown(self.deadline)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_defaults_to_twice_the_call_timeout() {
        let t = CheckTiming::new(None, default_interval(), default_deadline(), Duration::from_secs(2));
        assert_eq!(t.delay, Duration::from_secs(4));
        let set = CheckTiming::new(Some(Duration::from_secs(1)), default_interval(), default_deadline(), Duration::MAX);
        assert_eq!(set.delay, Duration::from_secs(1));
    }

    #[test]
    fn timing_problems_name_their_keys() {
        let t =
            CheckTiming { delay: Duration::from_secs(10), interval: Duration::ZERO, deadline: Duration::from_secs(5) };
        let mut problems = Problems::new("sinks.pay");
        t.validate(&mut problems);
        let keys: Vec<String> = problems.into_vec().into_iter().map(|p| p.0).collect();
        assert_eq!(keys, ["sinks.pay.check.interval", "sinks.pay.check.delay"]);
    }
}

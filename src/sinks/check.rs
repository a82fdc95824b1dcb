//! Checks, "check before writing" (docs/contract.md §4, "Calls without an answer"): asking a
//! sink's receiver whether a command's effect exists, when a call may have landed without
//! an answer, and for an operator's `resolve --check` ([`super::Sink::check_held`]).
//!
//! A kind that can ask its receiver has a `[sinks.NAME.check]` table; its config states the
//! check's timing ([`SinkKind::check_timing`](super::SinkKind::check_timing)) and its effect
//! performs the check ([`SinkEffect::check`](super::SinkEffect::check)). Every kind's table
//! has `delay`; the rest says how to ask.

use std::time::Duration;

use serde_json::Value;

use super::{Problems, SinkOutput, SinkRequest};
use crate::store::Held;

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

/// When an instance's checks run: `delay`, `interval` and `deadline` of
/// `[sinks.NAME.check]`, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckTiming {
    /// After a call without an answer, or before checking a claim a crash left, how long
    /// to wait so that a request still being processed at the receiver has landed
    /// (`check.delay`; by default twice the call's timeout).
    pub delay: Duration,
    /// How often the reconciler asks again about an `indeterminate` key of the sink
    /// (`check.interval`, default a minute).
    pub interval: Duration,
    /// How long after its claim a key is still asked about; past it the key waits for an
    /// operator, and the alert `DedupdIndeterminateRecords` says so (`check.deadline`,
    /// default a day).
    pub deadline: Duration,
}

/// The three keys every kind's `[sinks.NAME.check]` shares, as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckTimes {
    /// `check.delay`.
    pub delay: Option<Duration>,
    /// `check.interval`.
    pub interval: Option<Duration>,
    /// `check.deadline`.
    pub deadline: Option<Duration>,
}

impl CheckTiming {
    /// The timing a kind's `[sinks.NAME.check]` states: each key when set, else its
    /// default (`delay`: twice `call_timeout`, the longest a call of the instance can take).
    pub fn new(times: CheckTimes, call_timeout: Duration) -> CheckTiming {
        CheckTiming {
            delay: times.delay.unwrap_or_else(|| call_timeout.saturating_mul(2)),
            interval: times.interval.unwrap_or(DEFAULT_INTERVAL),
            deadline: times.deadline.unwrap_or(DEFAULT_DEADLINE),
        }
    }

    /// Adds a problem for each time that cannot work (keys `check.delay`, ...).
    pub fn validate(&self, problems: &mut Problems) {
        let text = |d: Duration| humantime::format_duration(d).to_string();
        // Longer than a day, a delay would hold the key's partition that long after every
        // call without an answer.
        if self.delay > MAX_DELAY {
            problems.add("check.delay", text(self.delay), format!("must be at most {}", text(MAX_DELAY)));
        }
        // Each pass asks about every key in doubt: more often than a second would load the
        // receiver, rarer than the deadline would never ask.
        if self.interval < MIN_INTERVAL {
            problems.add("check.interval", text(self.interval), format!("must be at least {}", text(MIN_INTERVAL)));
        } else if self.interval > self.deadline {
            problems.add(
                "check.interval",
                text(self.interval),
                format!("must be at most check.deadline ({})", text(self.deadline)),
            );
        }
        if self.deadline > MAX_DEADLINE {
            problems.add("check.deadline", text(self.deadline), format!("must be at most {}", text(MAX_DEADLINE)));
        }
    }
}

/// The longest `check.delay` accepted.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);
/// `check.interval` unless set.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest `check.interval` accepted.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// `check.deadline` unless set.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest `check.deadline` accepted: a command in doubt for a month needs a person.
const MAX_DEADLINE: Duration = Duration::from_secs(30 * 24 * 60 * 60);

impl super::Sink {
    /// Asks the receiver whether the effect of the command kept with an `indeterminate` key
    /// exists (`resolve --check`). No claim is taken: the engine never calls a sink for an
    /// `indeterminate` key, so nothing runs beside the check, and a request built here never
    /// reaches [`SinkEffect::execute`].
    pub async fn check_held(&self, key: &str, held: &Held, claimed_at_ms: i64) -> CheckAnswer {
        let payload: Value = match serde_json::from_slice(&held.payload) {
            Ok(payload) => payload,
            Err(e) => return CheckAnswer::Error(format!("the kept payload is not JSON: {e}")),
        };
        self.effect.check(SinkRequest::of(key, &held.kind, &payload, 1, Some(claimed_at_ms))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_defaults_to_twice_the_call_timeout() {
        let unset = CheckTiming::new(CheckTimes::default(), Duration::from_secs(2));
        assert_eq!(unset.delay, Duration::from_secs(4));
        assert_eq!((unset.interval, unset.deadline), (DEFAULT_INTERVAL, DEFAULT_DEADLINE));
        let times = CheckTimes { delay: Some(Duration::from_secs(1)), ..CheckTimes::default() };
        assert_eq!(CheckTiming::new(times, Duration::MAX).delay, Duration::from_secs(1));
        assert_eq!(CheckTiming::new(CheckTimes::default(), Duration::MAX).delay, Duration::MAX, "saturates");
    }

    #[test]
    fn a_delay_past_a_day_is_refused_naming_its_key() {
        let timing = CheckTiming::new(CheckTimes::default(), Duration::from_secs(1));
        assert_eq!(problems(CheckTiming { delay: MAX_DELAY, ..timing }), Vec::<String>::new());
        assert_eq!(
            problems(CheckTiming { delay: MAX_DELAY + Duration::from_secs(1), ..timing }),
            ["sinks.pay.check.delay"]
        );
    }

    fn problems(timing: CheckTiming) -> Vec<String> {
        let mut problems = Problems::new("sinks.pay");
        timing.validate(&mut problems);
        problems.into_vec().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn an_interval_under_a_second_or_past_the_deadline_is_refused_naming_its_key() {
        let timing = CheckTiming::new(CheckTimes::default(), Duration::from_secs(1));
        let interval = |ms| CheckTiming { interval: Duration::from_millis(ms), ..timing };
        assert_eq!(problems(interval(999)), ["sinks.pay.check.interval"]);
        assert_eq!(problems(interval(1000)), Vec::<String>::new());
        let past = CheckTiming { interval: Duration::from_secs(120), deadline: Duration::from_secs(60), ..timing };
        assert_eq!(problems(past), ["sinks.pay.check.interval"]);
        let long = CheckTiming { deadline: MAX_DEADLINE + Duration::from_secs(1), ..timing };
        assert_eq!(problems(long), ["sinks.pay.check.deadline"]);
    }
}

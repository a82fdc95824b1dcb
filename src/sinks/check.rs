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

/// When an instance's check runs: `check.delay` of `[sinks.NAME.check]`, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckTiming {
    /// After a call without an answer, or before checking a claim a crash left, how long
    /// to wait so that a request still being processed at the receiver has landed
    /// (`check.delay`; by default twice the call's timeout).
    pub delay: Duration,
}

impl CheckTiming {
    /// The timing a kind's `[sinks.NAME.check]` states: `delay` when set, else twice
    /// `call_timeout` (the longest a call of the instance can take).
    pub fn new(delay: Option<Duration>, call_timeout: Duration) -> CheckTiming {
        CheckTiming { delay: delay.unwrap_or_else(|| call_timeout.saturating_mul(2)) }
    }

    /// Adds a problem for a delay that cannot work (key `check.delay`): longer than a day,
    /// it would hold the key's partition that long after every call without an answer.
    pub fn validate(&self, problems: &mut Problems<'_>) {
        if self.delay > MAX_DELAY {
            problems.add(
                "check.delay",
                humantime::format_duration(self.delay).to_string(),
                format!("must be at most {}", humantime::format_duration(MAX_DELAY)),
            );
        }
    }
}

/// The longest `check.delay` accepted.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

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
        assert_eq!(CheckTiming::new(None, Duration::from_secs(2)).delay, Duration::from_secs(4));
        let set = CheckTiming::new(Some(Duration::from_secs(1)), Duration::MAX);
        assert_eq!(set.delay, Duration::from_secs(1));
        assert_eq!(CheckTiming::new(None, Duration::MAX).delay, Duration::MAX, "saturates");
    }

    #[test]
    fn a_delay_past_a_day_is_refused_naming_its_key() {
        let mut problems = Problems::new("sinks.pay");
        CheckTiming { delay: MAX_DELAY }.validate(&mut problems);
        CheckTiming { delay: MAX_DELAY + Duration::from_secs(1) }.validate(&mut problems);
        let keys: Vec<String> = problems.into_vec().into_iter().map(|p| p.0).collect();
        assert_eq!(keys, ["sinks.pay.check.delay"]);
    }
}

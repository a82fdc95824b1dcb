//! The result record of every outcome: executed by a sink, replayed or reported from a
//! stored record, conflicting, stale, rejected.

use serde_json::Value;

use super::{Engine, Item};
use crate::envelope::{Command, Rejection};
use crate::outcome::{DeadLetter, IntakeRef, Outcome, Processed, ResultRecord, SourceRef, rfc3339_ms};
use crate::store::{Completed, Completion, Record};
use crate::telemetry::TraceHeaders;
use crate::time::Rfc3339Memo;

/// A stored sink result as JSON (as text, if it somehow is not JSON).
fn stored_result(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// A sink's definite answer for one claim: what is stored as its completion and published
/// as its result.
pub(super) struct Answer {
    /// Succeeded or failed.
    pub(super) completion: Completion,
    /// What the sink answered.
    pub(super) result: Value,
    /// Why it failed, for a failure.
    pub(super) error: Option<String>,
    /// Sink calls for the command over all its claims (crash re-runs included).
    pub(super) attempts: u32,
    /// When the command was first claimed, Unix ms.
    pub(super) first_seen_ms: i64,
    /// When the answer came, Unix ms.
    pub(super) completed_at_ms: i64,
}

impl Engine {
    /// The parts of a result every outcome shares.
    fn base(&self, item: &Item, cmd: Option<&Command>, outcome: Outcome) -> Processed {
        let route = cmd.and_then(|c| self.router.routes().get(c.route));
        let TraceHeaders { traceparent, tracestate } = result_trace(item, cmd);
        Processed {
            result: ResultRecord {
                key: cmd.map(|c| c.key.clone()),
                kind: cmd.map(|c| c.kind.clone()),
                outcome,
                replay: false,
                route: route.map(|r| r.name.clone()),
                sink: route.map(|r| r.sink.clone()),
                result: Value::Object(Default::default()),
                error: None,
                attempts: 0,
                fingerprint: cmd.map(|c| c.fingerprint.to_string()),
                first_seen_at: None,
                completed_at: None,
                source: SourceRef {
                    intake: cmd.and_then(|c| c.intake_client.clone()).map(|client| IntakeRef { client }),
                    ..SourceRef::from(&item.source)
                },
                settled_by: None,
            },
            dead_letter: None,
            duplicate_age_ms: None,
            traceparent,
            tracestate,
            span: item.span.clone(),
            sink_called: false,
        }
    }

    /// The result of a command its sink answered (its instants written through `times`).
    pub(super) fn executed(&self, item: &Item, cmd: &Command, answer: Answer, times: &mut Rfc3339Memo) -> Processed {
        let outcome = match answer.completion {
            Completion::Succeeded => Outcome::Succeeded,
            Completion::Failed => Outcome::Failed,
        };
        let mut p = self.base(item, Some(cmd), outcome);
        p.result.result = answer.result;
        p.result.error = answer.error;
        p.result.attempts = answer.attempts;
        p.result.first_seen_at = Some(times.format(answer.first_seen_ms));
        p.result.completed_at = Some(times.format(answer.completed_at_ms));
        p.sink_called = true;
        p
    }

    /// The record that claimed the key, read again before its offset was committed (after a
    /// crash): its own result again, as its sink's answer made it, not a replay.
    pub(super) fn republished(&self, item: &Item, cmd: &Command, c: &Completed) -> Processed {
        let outcome = match c.outcome {
            Completion::Succeeded => Outcome::Succeeded,
            Completion::Failed => Outcome::Failed,
        };
        let mut p = self.base(item, Some(cmd), outcome);
        p.result.result = stored_result(&c.result);
        p.result.error = c.error.clone();
        p.result.attempts = c.attempts;
        p.result.first_seen_at = Some(rfc3339_ms(c.first_seen_at_ms));
        p.result.completed_at = Some(rfc3339_ms(c.completed_at_ms));
        p
    }

    /// A result read from a stored record: a replay (`duplicate`) or `indeterminate`.
    pub(super) fn processed_from_record(&self, item: &Item, cmd: &Command, record: &Record, now: i64) -> Processed {
        match record {
            Record::Completed(c) => {
                let mut p = self.base(item, Some(cmd), Outcome::Duplicate);
                p.result.replay = true;
                p.result.result = stored_result(&c.result);
                p.result.error = c.error.clone();
                p.result.attempts = c.attempts;
                p.result.first_seen_at = Some(rfc3339_ms(c.first_seen_at_ms));
                p.result.completed_at = Some(rfc3339_ms(c.completed_at_ms));
                p.duplicate_age_ms = Some(now.saturating_sub(c.first_seen_at_ms).max(0));
                p
            }
            Record::Indeterminate(r) => {
                let mut p = self.base(item, Some(cmd), Outcome::Indeterminate);
                p.result.error = Some(r.why.clone());
                p.result.attempts = r.attempts;
                p.result.first_seen_at = Some(rfc3339_ms(r.claimed_at_ms));
                p
            }
            Record::InProgress(r) => {
                let mut p = self.base(item, Some(cmd), Outcome::Indeterminate);
                p.result.error = Some("in progress".into());
                p.result.attempts = r.attempts;
                p.result.first_seen_at = Some(rfc3339_ms(r.claimed_at_ms));
                p
            }
        }
    }
    /// A conflict: the key holds `record`, made by a command with another fingerprint.
    pub(super) fn conflict(&self, item: &Item, cmd: &Command, record: &Record, now: i64) -> Processed {
        let mut p = self.processed_from_record(item, cmd, record, now);
        p.result.outcome = Outcome::Conflict;
        p.result.replay = false;
        p.result.result = Value::Object(Default::default());
        p.result.error = Some(format!(
            "key already holds a record in state {} with fingerprint {}; this command's fingerprint is {}",
            record.state().as_str(),
            record.fingerprint(),
            cmd.fingerprint
        ));
        p.result.fingerprint = Some(cmd.fingerprint.to_string());
        p.duplicate_age_ms = None;
        p
    }

    /// A command produced longer ago than its TTL: not executed, dead-lettered.
    pub(super) fn stale(&self, item: &Item, cmd: &Command) -> Processed {
        let produced = cmd.produced_at_ms.map(rfc3339_ms).unwrap_or_default();
        let error = format!(
            "produced at {produced}, longer ago than its TTL of {}; not executed",
            humantime::format_duration(cmd.ttl)
        );
        let mut p = self.base(item, Some(cmd), Outcome::Stale);
        p.result.error = Some(error.clone());
        p.dead_letter = Some(DeadLetter { reason: "stale", error });
        p
    }
}

/// The trace context a result carries: with traces on, the one naming the command's span;
/// else the input's as it came: the envelope's (CloudEvents attributes included) when
/// there is a command, the raw headers otherwise.
fn result_trace(item: &Item, cmd: Option<&Command>) -> TraceHeaders {
    match (&item.span, cmd) {
        (Some(span), _) => span.headers(),
        (None, Some(c)) => TraceHeaders { traceparent: c.traceparent.clone(), tracestate: c.tracestate.clone() },
        (None, None) => TraceHeaders { traceparent: item.traceparent.clone(), tracestate: item.tracestate.clone() },
    }
}

/// The result of a record that is not a command (or a command refused by `decide`); also
/// made by the pipeline for a record the by-key hop rejects before forwarding it.
pub fn rejected(item: &Item, rejection: &Rejection) -> Processed {
    let error = rejection.message.clone();
    let TraceHeaders { traceparent, tracestate } = result_trace(item, None);
    Processed {
        result: ResultRecord {
            key: rejection.key.clone(),
            kind: rejection.kind.clone(),
            outcome: Outcome::Rejected,
            replay: false,
            route: None,
            sink: None,
            result: Value::Object(Default::default()),
            error: Some(format!("{}: {error}", rejection.reason.as_str())),
            attempts: 0,
            fingerprint: None,
            first_seen_at: None,
            completed_at: None,
            source: SourceRef::from(&item.source),
            settled_by: None,
        },
        dead_letter: Some(DeadLetter { reason: rejection.reason.as_str(), error }),
        duplicate_age_ms: None,
        traceparent,
        tracestate,
        span: item.span.clone(),
        sink_called: false,
    }
}

//! What became of one input record, and the result record (docs/contract.md §5) it is published as.
//! Pure data and formatting: the pipeline publishes it, tests read it back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::SourcePos;
use crate::telemetry::CommandSpan;
pub use crate::time::rfc3339_ms;

/// The `outcome` of a result record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The sink did it (this time).
    Succeeded,
    /// The sink refused it, or retries ran out.
    Failed,
    /// A repeat: the stored result is replayed.
    Duplicate,
    /// Same key, other payload: not executed.
    Conflict,
    /// The effect of an earlier run is unknown; an operator must resolve the key.
    Indeterminate,
    /// Produced longer ago than its TTL: never executed.
    Stale,
    /// Invalid input.
    Rejected,
}

impl Outcome {
    /// Every outcome, for metrics initialisation.
    pub const ALL: [Outcome; 7] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Duplicate,
        Outcome::Conflict,
        Outcome::Indeterminate,
        Outcome::Stale,
        Outcome::Rejected,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Duplicate => "duplicate",
            Outcome::Conflict => "conflict",
            Outcome::Indeterminate => "indeterminate",
            Outcome::Stale => "stale",
            Outcome::Rejected => "rejected",
        }
    }
}

/// The source position as it appears in a result record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    /// Input topic.
    pub topic: String,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
    /// For a command the HTTP intake produced: the client that posted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intake: Option<IntakeRef>,
}

/// The intake's part of a source: who posted the command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntakeRef {
    /// The client's name (`intake.clients.NAME`).
    pub client: String,
}

impl SourceRef {
    /// The position `topic`/`partition`/`offset`, of no intake.
    pub fn at(topic: &str, partition: i32, offset: i64) -> SourceRef {
        SourceRef { topic: topic.to_string(), partition, offset, intake: None }
    }

    /// Whether both name the same input record.
    pub fn same_record(&self, other: &SourceRef) -> bool {
        self.topic == other.topic && self.partition == other.partition && self.offset == other.offset
    }
}

impl From<&SourcePos> for SourceRef {
    fn from(s: &SourcePos) -> Self {
        SourceRef::at(&s.topic, s.partition, s.offset)
    }
}

/// The value of a result record, as docs/contract.md §5 describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// The command key (`null` when the record had none readable).
    pub key: Option<String>,
    /// The command type.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// What happened.
    pub outcome: Outcome,
    /// True when the result is a replay of a stored one.
    pub replay: bool,
    /// The route's name.
    pub route: Option<String>,
    /// The sink's name.
    pub sink: Option<String>,
    /// The sink's result (`{}` when none).
    pub result: Value,
    /// An error sentence, for failed, conflict, indeterminate, stale and rejected.
    pub error: Option<String>,
    /// Sink runs it took.
    pub attempts: u32,
    /// The command's fingerprint.
    pub fingerprint: Option<String>,
    /// When the key was first claimed (RFC 3339).
    pub first_seen_at: Option<String>,
    /// When the sink returned (RFC 3339).
    pub completed_at: Option<String>,
    /// Where the input record was.
    pub source: SourceRef,
    /// `"check"` on the result of a key in doubt that the reconciler settled by asking the
    /// receiver (published after the input's own `indeterminate`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<String>,
}

/// Where a record that is dead-lettered goes, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// `dedupd-reason`.
    pub reason: &'static str,
    /// `dedupd-error`.
    pub error: String,
}

/// Everything the publisher needs for one input record.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    /// The result record's value.
    pub result: ResultRecord,
    /// Set when the input must also go to the dead-letter topic.
    pub dead_letter: Option<DeadLetter>,
    /// For a duplicate: ms since the key's first sighting (`duplicate_age_seconds`).
    pub duplicate_age_ms: Option<i64>,
    /// The `traceparent` to carry to the result: the input's, or with traces on the one
    /// naming the command's span.
    pub traceparent: Option<String>,
    /// The `tracestate` to carry with it.
    pub tracestate: Option<String>,
    /// With traces on: the command's span, ended once the result is acknowledged.
    pub span: Option<CommandSpan>,
    /// True when this record's processing called the sink (for metrics and tests).
    pub sink_called: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_record_has_the_spec_field_names() {
        let r = ResultRecord {
            key: Some("k".into()),
            kind: Some("email.send".into()),
            outcome: Outcome::Succeeded,
            replay: false,
            route: Some("mail".into()),
            sink: Some("smtp-main".into()),
            result: serde_json::json!({}),
            error: None,
            attempts: 1,
            fingerprint: Some("sha256:00".into()),
            first_seen_at: Some(rfc3339_ms(0)),
            completed_at: Some(rfc3339_ms(1)),
            source: SourceRef::at("commands", 3, 1042),
            settled_by: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "attempts",
                "completed_at",
                "error",
                "fingerprint",
                "first_seen_at",
                "key",
                "outcome",
                "replay",
                "result",
                "route",
                "sink",
                "source",
                "type"
            ]
        );
        assert_eq!(v["outcome"], "succeeded");
        assert_eq!(v["source"]["offset"], 1042);
        assert_eq!(v["first_seen_at"], "1970-01-01T00:00:00.000Z");
    }
}

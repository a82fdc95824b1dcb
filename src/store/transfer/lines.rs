//! The lines of export format v1, one struct per line shape, each `deny_unknown_fields`
//! so that a misspelt field is an error naming the line rather than a silent default.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::FORMAT_VERSION;
use crate::fingerprint::Fingerprint;
use crate::store::record::{Completed, Completion, Held, InProgress, Indeterminate, Record, Settled, SourcePos};

/// The first line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    exported_at_ms: i64,
    backend: String,
    records_estimate: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatermarkLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    topic: String,
    partition: i32,
    offset: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    records: u64,
    watermarks: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InProgressLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    state: String,
    fingerprint: String,
    claimed_at_ms: i64,
    attempts: u32,
    source: SourcePos,
    /// The command, when the claim keeps it (the reconciler's run of a key in doubt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    held: Option<HeldLine>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletedLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    state: String,
    fingerprint: String,
    outcome: Completion,
    /// The stored result verbatim when it is one-line JSON (`null` when absent) ...
    result: Option<Box<RawValue>>,
    /// ... else its text, so that the bytes come back exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result_text: Option<String>,
    error: Option<String>,
    first_seen_at_ms: i64,
    completed_at_ms: i64,
    expires_at_ms: i64,
    attempts: u32,
    /// The input record that claimed the key, when the store knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<SourcePos>,
    /// How the key was settled when its effect was in doubt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled: Option<Settled>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndeterminateLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    state: String,
    fingerprint: String,
    claimed_at_ms: i64,
    attempts: u32,
    why: String,
    /// The command in doubt, when the record keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    held: Option<HeldLine>,
}

/// An indeterminate record's held command, as a line carries it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeldLine {
    sink: String,
    route: String,
    #[serde(rename = "type")]
    kind: String,
    payload: serde_json::Value,
    source: SourcePos,
    /// The intake client that posted the command, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    intake_client: Option<String>,
}

impl HeldLine {
    fn of(held: &Held) -> HeldLine {
        HeldLine {
            sink: held.sink.clone(),
            route: held.route.clone(),
            kind: held.kind.clone(),
            payload: serde_json::from_slice(&held.payload).unwrap_or(serde_json::Value::Null),
            source: held.source.clone(),
            intake_client: held.intake_client.clone(),
        }
    }

    fn into_held(self) -> Box<Held> {
        Box::new(Held {
            sink: self.sink,
            route: self.route,
            kind: self.kind,
            payload: serde_json::to_vec(&self.payload).unwrap_or_else(|_| b"null".to_vec()),
            source: self.source,
            intake_client: self.intake_client,
        })
    }
}

/// Just enough of a line to pick its full shape.
#[derive(Deserialize)]
struct Probe {
    v: Option<u32>,
    #[serde(rename = "type")]
    kind: Option<String>,
    state: Option<String>,
}

/// One parsed export line.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// The first line.
    Header { exported_at_ms: i64, records_estimate: i64 },
    /// A partition watermark.
    Watermark { topic: String, partition: i32, offset: i64 },
    /// A record.
    Record { key: String, record: Record },
    /// The last line.
    End { records: u64, watermarks: u64 },
}

fn s(kind: &str) -> String {
    kind.to_string()
}

/// The header line (no newline).
pub fn header_line(exported_at_ms: i64, backend: &str, records_estimate: i64) -> String {
    let h =
        HeaderLine { v: FORMAT_VERSION, kind: s("header"), exported_at_ms, backend: backend.into(), records_estimate };
    serde_json::to_string(&h).unwrap_or_default()
}

/// A watermark line (no newline).
pub fn watermark_line(topic: &str, partition: i32, offset: i64) -> String {
    let w = WatermarkLine { v: FORMAT_VERSION, kind: s("watermark"), topic: topic.into(), partition, offset };
    serde_json::to_string(&w).unwrap_or_default()
}

/// The end line (no newline).
pub fn end_line(records: u64, watermarks: u64) -> String {
    serde_json::to_string(&EndLine { v: FORMAT_VERSION, kind: s("end"), records, watermarks }).unwrap_or_default()
}

/// A record line (no newline).
pub fn record_line(key: &str, record: &Record) -> String {
    let (v, kind, key) = (FORMAT_VERSION, s("record"), key.to_string());
    let out = match record {
        Record::InProgress(r) => serde_json::to_string(&InProgressLine {
            v,
            kind,
            key,
            state: s("in_progress"),
            fingerprint: r.fingerprint.to_string(),
            claimed_at_ms: r.claimed_at_ms,
            attempts: r.attempts,
            source: r.source.clone(),
            held: r.held.as_deref().map(HeldLine::of),
        }),
        Record::Completed(r) => {
            let text = String::from_utf8(r.result.clone());
            let raw = match &text {
                Ok(t) if !t.contains(['\n', '\r']) => RawValue::from_string(t.clone()).ok(),
                _ => None,
            };
            let result_text = match (&raw, text) {
                (Some(_), _) => None,
                (None, Ok(t)) => Some(t),
                // Not UTF-8: cannot come from a sink (results are JSON); keep what survives.
                (None, Err(e)) => Some(String::from_utf8_lossy(e.as_bytes()).into_owned()),
            };
            serde_json::to_string(&CompletedLine {
                v,
                kind,
                key,
                state: s("completed"),
                fingerprint: r.fingerprint.to_string(),
                outcome: r.outcome,
                result: raw,
                result_text,
                error: r.error.clone(),
                first_seen_at_ms: r.first_seen_at_ms,
                completed_at_ms: r.completed_at_ms,
                expires_at_ms: r.expires_at_ms,
                attempts: r.attempts,
                source: r.source.clone(),
                settled: r.settled,
            })
        }
        Record::Indeterminate(r) => serde_json::to_string(&IndeterminateLine {
            v,
            kind,
            key,
            state: s("indeterminate"),
            fingerprint: r.fingerprint.to_string(),
            claimed_at_ms: r.claimed_at_ms,
            attempts: r.attempts,
            why: r.why.clone(),
            held: r.held.as_deref().map(HeldLine::of),
        }),
    };
    out.unwrap_or_default()
}

/// Parses one line (without its newline).
pub fn parse_line(line: &str) -> Result<Entry, String> {
    let probe: Probe = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    match probe.v {
        Some(FORMAT_VERSION) => {}
        Some(other) => {
            return Err(format!("format version {other} is not supported (this dedupd reads {FORMAT_VERSION})"));
        }
        None => return Err("no \"v\" (format version)".into()),
    }
    let fp = |f: &str| f.parse::<Fingerprint>();
    let err = |e: serde_json::Error| e.to_string();
    match (probe.kind.as_deref(), probe.state.as_deref()) {
        (Some("header"), _) => {
            let h: HeaderLine = serde_json::from_str(line).map_err(err)?;
            Ok(Entry::Header { exported_at_ms: h.exported_at_ms, records_estimate: h.records_estimate })
        }
        (Some("watermark"), _) => {
            let w: WatermarkLine = serde_json::from_str(line).map_err(err)?;
            if w.topic.is_empty() || w.partition < 0 || w.offset < 0 {
                return Err("watermark needs a topic, a partition >= 0 and an offset >= 0".into());
            }
            Ok(Entry::Watermark { topic: w.topic, partition: w.partition, offset: w.offset })
        }
        (Some("end"), _) => {
            let e: EndLine = serde_json::from_str(line).map_err(err)?;
            Ok(Entry::End { records: e.records, watermarks: e.watermarks })
        }
        (Some("record"), Some("in_progress")) => {
            let r: InProgressLine = serde_json::from_str(line).map_err(err)?;
            let record = Record::InProgress(InProgress {
                fingerprint: fp(&r.fingerprint)?,
                claimed_at_ms: r.claimed_at_ms,
                attempts: r.attempts,
                source: r.source,
                held: r.held.map(HeldLine::into_held),
            });
            Ok(Entry::Record { key: checked_key(r.key)?, record })
        }
        (Some("record"), Some("completed")) => {
            let r: CompletedLine = serde_json::from_str(line).map_err(err)?;
            let result = match (r.result_text, r.result) {
                (Some(t), None) => t.into_bytes(),
                (None, Some(raw)) => raw.get().as_bytes().to_vec(),
                (None, None) => b"null".to_vec(),
                (Some(_), Some(_)) => return Err("has both result and result_text".into()),
            };
            let record = Record::Completed(Completed {
                fingerprint: fp(&r.fingerprint)?,
                outcome: r.outcome,
                result,
                error: r.error,
                first_seen_at_ms: r.first_seen_at_ms,
                completed_at_ms: r.completed_at_ms,
                expires_at_ms: r.expires_at_ms,
                attempts: r.attempts,
                source: r.source,
                settled: r.settled,
            });
            Ok(Entry::Record { key: checked_key(r.key)?, record })
        }
        (Some("record"), Some("indeterminate")) => {
            let r: IndeterminateLine = serde_json::from_str(line).map_err(err)?;
            let record = Record::Indeterminate(Indeterminate {
                fingerprint: fp(&r.fingerprint)?,
                claimed_at_ms: r.claimed_at_ms,
                attempts: r.attempts,
                why: r.why,
                held: r.held.map(HeldLine::into_held),
            });
            Ok(Entry::Record { key: checked_key(r.key)?, record })
        }
        (Some("record"), Some(other)) => {
            Err(format!("unknown record state {other:?} (in_progress, completed or indeterminate)"))
        }
        (Some("record"), None) => Err("a record line without a state".into()),
        (Some(other), _) => Err(format!("unknown line type {other:?} (header, watermark, record or end)")),
        (None, _) => Err("a line without a type".into()),
    }
}

fn checked_key(key: String) -> Result<String, String> {
    if key.is_empty() { Err("empty key".into()) } else { Ok(key) }
}

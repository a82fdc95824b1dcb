//! Envelopes (docs/contract.md §1): a Kafka record becomes a [`Command`] (key, type, payload,
//! fingerprint, route, TTL) or a [`Rejection`] with a typed reason (docs/contract.md §1). Never panics
//! (proptest below, and the `envelope` cargo-fuzz target: docs/fuzzing.md).
//!
//! Details docs/contract.md §1 leaves open:
//! - Checks run in a fixed order and the first failure wins: value present, size (before
//!   any parsing; headers do not count), UTF-8/JSON/object, shape, key, type, `ttl`/
//!   `created_at`, payload, route. `Rejection::key` is set once the key is valid.
//! - No value (a tombstone) is `invalid_json`, binary CloudEvents included; so is an empty
//!   value. Numbers beyond f64 (`1e999`) are not JSON we can hold: `invalid_json`. So is an
//!   object with a member name twice, at any depth (RFC 8785 fingerprints I-JSON only:
//!   `json`).
//! - Headers are matched ASCII case-insensitively (all of them, `header:NAME` included);
//!   the last occurrence wins, and if that one has a null value the header is absent.
//! - `envelope.format` pinned: the record is read as that shape whenever it has that
//!   shape's marker (`id`/`type`/`payload`; `tool`; `specversion` or a `ce_specversion`
//!   header), even if auto-detection would pick another; otherwise `bad_envelope`, naming
//!   what it looks like. A `ce_specversion` header under `native`/`tool_call` is
//!   `bad_envelope`.
//! - Native `payload` is required (`bad_envelope`), `null` allowed. Tool-call `arguments`
//!   must be an object (absent, or a JSON-encoded string: `bad_envelope`). Structured
//!   CloudEvents without `data` have a `null` payload; `data_base64` is `bad_envelope`
//!   (only JSON data). Only CloudEvents `specversion` "1.0" is accepted.
//! - A key member that is `null` counts as missing (`missing_key`); any other non-string is
//!   `bad_key`. An empty CloudEvents `source` or `id` is `bad_key`. With the
//!   `idempotency-key` header present (auto), the shape's own key is not needed; a bad
//!   header is `bad_key`, it never falls back to the shape's key.
//! - `ttl` and `created_at` are read from native envelopes only; CloudEvents `time`
//!   (`ce_time`) serves as `created_at`; tool calls have neither (top-level members with
//!   those names are ignored). `null` means absent. `ttl` must be a humantime string
//!   ("72h", "1h 30m"): a number, zero or garbage is `bad_field`.
//! - A negative Kafka timestamp (Kafka's -1 = none) is unknown, so it cannot make every
//!   command look stale.
//! - `traceparent`: the header; for CloudEvents also the distributed-tracing extension
//!   (`ce_traceparent` header, `traceparent` attribute); `tracestate` from the same place.
//!   Not UTF-8: dropped, not rejected.
//! - `stale` is never produced here: it needs the clock, see [`crate::decide`].

mod config;
mod headers;
mod json;
mod key;
mod shapes;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use config::{EnvelopeConfig, EnvelopeFormat, LimitsConfig, StaleBy};
pub use headers::{HeaderList, ReadHeaders, header_bytes, read_headers};
use key::*;
use shapes::*;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::fingerprint::Fingerprint;
use crate::routes::{Route, Router};

/// A Kafka record as the envelope parser sees it: borrowed, client-independent.
#[derive(Debug, Clone, Copy)]
pub struct InputRecord<'a> {
    /// Source topic.
    pub topic: &'a str,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
    /// Kafka timestamp in Unix milliseconds, if the record has one.
    pub timestamp_ms: Option<i64>,
    /// Kafka record key.
    pub key: Option<&'a [u8]>,
    /// Kafka record value.
    pub value: Option<&'a [u8]>,
    /// Kafka headers in record order (a name may repeat; the last one wins).
    pub headers: &'a [(String, Option<Vec<u8>>)],
}

/// Where the idempotency key comes from (`envelope.key`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeySource {
    /// The `idempotency-key` header if present, else the shape's own key.
    #[default]
    Auto,
    /// Only this header.
    Header(String),
    /// Only this JSON pointer into the record value.
    JsonPointer(String),
    /// Only the Kafka record key.
    RecordKey,
}

impl std::str::FromStr for KeySource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            Ok(KeySource::Auto)
        } else if s == "record-key" {
            Ok(KeySource::RecordKey)
        } else if let Some(name) = s.strip_prefix("header:") {
            if name.is_empty() {
                return Err("`header:` needs a header name".into());
            }
            Ok(KeySource::Header(name.to_string()))
        } else if let Some(ptr) = s.strip_prefix("json:") {
            if !ptr.starts_with('/') {
                return Err(format!("`{s}`: the pointer must start with '/'"));
            }
            Ok(KeySource::JsonPointer(ptr.to_string()))
        } else {
            Err(format!("`{s}` is not one of auto, header:NAME, json:/pointer, record-key"))
        }
    }
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Auto => f.write_str("auto"),
            KeySource::RecordKey => f.write_str("record-key"),
            KeySource::Header(h) => write!(f, "header:{h}"),
            KeySource::JsonPointer(p) => write!(f, "json:{p}"),
        }
    }
}

impl Serialize for KeySource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which of the three shapes a command came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// `{"id", "type", "payload"}`.
    Native,
    /// `{"tool", "arguments"}`.
    ToolCall,
    /// CloudEvents with the event in the value.
    CloudEventsStructured,
    /// CloudEvents with attributes in `ce_*` headers.
    CloudEventsBinary,
}

/// A valid command, ready for the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// The idempotency key: 1..=255 bytes of UTF-8, no control characters.
    pub key: String,
    /// The command type (selects the route).
    pub kind: String,
    /// The payload handed to the sink.
    pub payload: Value,
    /// Fingerprint of `{type, payload}` minus the route's exclusions.
    pub fingerprint: Fingerprint,
    /// Index of the route in the [`Router`].
    pub route: usize,
    /// Effective TTL (command, else route, else default; capped).
    pub ttl: Duration,
    /// `created_at` of the envelope, Unix ms, if it had one.
    pub created_at_ms: Option<i64>,
    /// When the command was produced for the stale guard (Kafka timestamp or `created_at`
    /// per `envelope.stale_by`), Unix ms, if known.
    pub produced_at_ms: Option<i64>,
    /// W3C `traceparent` header, carried to the result.
    pub traceparent: Option<String>,
    /// W3C `tracestate` that came with `traceparent`, passed on with it.
    pub tracestate: Option<String>,
    /// The shape it came in.
    pub shape: Shape,
    /// The intake client that posted it (the [`INTAKE_CLIENT_HEADER`] header), named in its
    /// result's `source`.
    pub intake_client: Option<String>,
}

/// The header the HTTP intake names its client in, on the records it produces.
pub const INTAKE_CLIENT_HEADER: &str = "dedupd-intake-client";

/// Why a record is not a valid command. `as_str` is the `dedupd-reason` header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// No value, not UTF-8, not JSON, or not a JSON object.
    InvalidJson,
    /// Value larger than `limits.max_command_bytes`.
    TooLarge,
    /// No key where the shape or `envelope.key` says one must be.
    MissingKey,
    /// A key that is empty, over 255 bytes, not a string, or has control characters.
    BadKey,
    /// No type, or a type that is not a non-empty string.
    MissingType,
    /// The JSON is an object but not one of the accepted shapes (or a field has a wrong type).
    BadEnvelope,
    /// `ttl` or `created_at` that does not parse.
    BadField,
    /// No route matches the type and there is no default route.
    NoRoute,
    /// Produced longer ago than its TTL (stale guard).
    Stale,
    /// With `kafka.copartitioned`: on an input partition that is not its key's (the
    /// pipeline checks it; `parse` never returns it).
    NotCopartitioned,
}

impl RejectReason {
    /// Every reason, for metrics initialisation and docs.
    pub const ALL: [RejectReason; 10] = [
        RejectReason::InvalidJson,
        RejectReason::TooLarge,
        RejectReason::MissingKey,
        RejectReason::BadKey,
        RejectReason::MissingType,
        RejectReason::BadEnvelope,
        RejectReason::BadField,
        RejectReason::NoRoute,
        RejectReason::Stale,
        RejectReason::NotCopartitioned,
    ];

    /// The wire name (`dedupd-reason` header, metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::InvalidJson => "invalid_json",
            RejectReason::TooLarge => "too_large",
            RejectReason::MissingKey => "missing_key",
            RejectReason::BadKey => "bad_key",
            RejectReason::MissingType => "missing_type",
            RejectReason::BadEnvelope => "bad_envelope",
            RejectReason::BadField => "bad_field",
            RejectReason::NoRoute => "no_route",
            RejectReason::Stale => "stale",
            RejectReason::NotCopartitioned => "not_copartitioned",
        }
    }
}

/// A record that is not a valid command: the reason and a sentence for `dedupd-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct Rejection {
    /// The typed reason.
    pub reason: RejectReason,
    /// A sentence saying what was wrong.
    pub message: String,
    /// The key, when it could be read before the record was found invalid.
    pub key: Option<String>,
    /// The type, when it could be read before the record was found invalid.
    pub kind: Option<String>,
}

impl Rejection {
    /// The same rejection of a record whose type was read (`kind`).
    fn of_type(self, kind: &str) -> Rejection {
        Rejection { kind: Some(kind.to_string()), ..self }
    }
}

/// Longest accepted key, in bytes of UTF-8 (docs/contract.md §1).
pub const MAX_KEY_BYTES: usize = 255;

/// The only CloudEvents `specversion` accepted.
const CE_SPECVERSION: &str = "1.0";

/// Parses one record into a command or a rejection. Pure: no I/O, no clock.
///
/// Checks run in this order, and the first failure is the rejection: value present, size,
/// shape (UTF-8, JSON, object, envelope format), key, type, payload, `ttl`/`created_at`,
/// route. [`RejectReason::Stale`] is never returned here: staleness needs the clock and is
/// decided by [`crate::decide`] from [`Command::produced_at_ms`] and [`Command::ttl`].
pub fn parse(
    record: &InputRecord<'_>,
    envelope: &EnvelopeConfig,
    limits: &LimitsConfig,
    router: &Router,
) -> Result<Command, Rejection> {
    let Some(bytes) = record.value else {
        return Err(reject(
            RejectReason::InvalidJson,
            "the record has no value (a tombstone); a command is a JSON object".to_string(),
            None,
        ));
    };
    let max = limits.max_command_bytes.get();
    if bytes.len() > max {
        return Err(reject(
            RejectReason::TooLarge,
            format!("value is {} bytes, over limits.max_command_bytes = {max}", bytes.len()),
            None,
        ));
    }

    let (shape, mut doc) = detect(record, envelope.format, bytes)?;

    let key = read_key(record, &envelope.key, shape, &doc)?;
    let known = Some(key.as_str());

    let kind = read_type(shape, record, &doc).map_err(|(reason, m)| reject(reason, m, known))?;

    let (ttl, created_at_ms) =
        read_fields(shape, record, &doc).map_err(|m| reject(RejectReason::BadField, m, known).of_type(&kind))?;

    let (traceparent, tracestate) = read_trace_context(shape, record, &doc);

    let payload =
        take_payload(shape, &mut doc).map_err(|m| reject(RejectReason::BadEnvelope, m, known).of_type(&kind))?;

    let Some((route_index, route)) = find_route(router, &kind) else {
        return Err(reject(
            RejectReason::NoRoute,
            format!("no route matches type {} and there is no default route (`*`)", quote(&kind)),
            known,
        )
        .of_type(&kind));
    };
    let ttl = router.effective_ttl(ttl, route);

    let fingerprint = crate::fingerprint::fingerprint(&kind, &payload, &route.fingerprint_exclude).map_err(|e| {
        reject(
            RejectReason::InvalidJson,
            format!("the payload cannot be canonicalised for the fingerprint: {e}"),
            known,
        )
        .of_type(&kind)
    })?;

    // Kafka uses -1 for "no timestamp"; a negative timestamp is treated as unknown so that
    // it cannot make every command look stale.
    let kafka_ms = record.timestamp_ms.filter(|t| *t >= 0);
    let produced_at_ms = match envelope.stale_by {
        StaleBy::KafkaTimestamp => kafka_ms,
        StaleBy::CreatedAt => created_at_ms.or(kafka_ms),
    };

    Ok(Command {
        key,
        kind,
        payload,
        fingerprint,
        route: route_index,
        ttl,
        created_at_ms,
        produced_at_ms,
        traceparent,
        tracestate,
        shape,
        intake_client: header(record.headers, INTAKE_CLIENT_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string),
    })
}

fn reject(reason: RejectReason, message: String, key: Option<&str>) -> Rejection {
    Rejection { reason, message, key: key.map(str::to_string), kind: None }
}

/// The value of the last header named `name` (ASCII case-insensitively); a header whose
/// last occurrence has a null value counts as absent.
fn header<'h>(headers: &'h [(String, Option<Vec<u8>>)], name: &str) -> Option<&'h [u8]> {
    headers.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.as_deref())
}

/// `s` quoted and escaped for a message, cut after 64 characters.
fn quote(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    match s.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", s.get(..cut).unwrap_or_default(), s.len()),
        None => format!("{s:?}"),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn format_name(format: EnvelopeFormat) -> &'static str {
    match format {
        EnvelopeFormat::Auto => "auto",
        EnvelopeFormat::Native => "native",
        EnvelopeFormat::ToolCall => "tool_call",
        EnvelopeFormat::Cloudevents => "cloudevents",
    }
}

fn shape_name(shape: Shape) -> &'static str {
    match shape {
        Shape::Native => "a native command",
        Shape::ToolCall => "a tool call",
        Shape::CloudEventsStructured => "a structured CloudEvent",
        Shape::CloudEventsBinary => "a binary CloudEvent",
    }
}

fn parse_json(bytes: &[u8], what: &str) -> Result<Value, Rejection> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        reject(
            RejectReason::InvalidJson,
            format!("{what} is not UTF-8 (invalid byte at offset {})", e.valid_up_to()),
            None,
        )
    })?;
    serde_json::from_str(text)
        .map(|json::UniqueNames(value)| value)
        .map_err(|e| reject(RejectReason::InvalidJson, format!("{what} is not valid JSON: {e}"), None))
}

fn bad_envelope(message: String) -> Rejection {
    reject(RejectReason::BadEnvelope, message, None)
}

/// The first route matching `kind`, with its index.
fn find_route<'r>(router: &'r Router, kind: &str) -> Option<(usize, &'r Route)> {
    let route = router.route(kind)?;
    let index = router.routes().iter().position(|r| std::ptr::eq(r, route))?;
    Some((index, route))
}

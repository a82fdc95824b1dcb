//! A request as the input record the intake produces: a native envelope (`id`, `type`,
//! `payload`, the body unchanged as the payload) with the client's scoped key where
//! `envelope.key` looks for it, checked by the same parser the pipeline runs, so that what
//! the intake accepts is a command the pipeline will take (docs/contract.md §1).

use axum::http::HeaderMap;
use serde_json::value::RawValue;

use super::problem::{Cause, Problem};
use crate::envelope::{EnvelopeConfig, InputRecord, KeySource, LimitsConfig, RejectReason};
use crate::routes::Router;

use crate::envelope::INTAKE_CLIENT_HEADER;

/// Request headers passed on to the record (and so to the result): the W3C trace context.
const PASSED_ON: [&str; 2] = ["traceparent", "tracestate"];

/// The record to produce: its Kafka key, value and headers.
#[derive(Debug)]
pub struct Produced {
    pub key: String,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// What the record is checked with: the pipeline's own envelope settings and routes.
pub struct Checks {
    pub envelope: EnvelopeConfig,
    pub limits: LimitsConfig,
    pub router: std::sync::Arc<Router>,
}

/// The record for `client`'s command of type `kind` under `scoped_key`, `body` its
/// payload; refused with the problem the pipeline's rejection names.
pub fn build(
    checks: &Checks,
    (client, scoped_key): (&str, &str),
    kind: &str,
    body: &[u8],
    request: &HeaderMap,
) -> Result<Produced, Problem> {
    let payload: &RawValue = serde_json::from_slice(body)
        .map_err(|e| Problem::new(Cause::InvalidJson, format!("the body is not JSON: {e}")))?;
    let value = format!(
        r#"{{"id":{},"type":{},"payload":{}}}"#,
        serde_json::Value::from(scoped_key),
        serde_json::Value::from(kind),
        payload.get()
    )
    .into_bytes();
    let mut headers = vec![(INTAKE_CLIENT_HEADER.to_string(), Some(client.as_bytes().to_vec()))];
    match &checks.envelope.key {
        KeySource::Auto => headers.push(("idempotency-key".into(), Some(scoped_key.as_bytes().to_vec()))),
        KeySource::Header(name) => headers.push((name.clone(), Some(scoped_key.as_bytes().to_vec()))),
        // The record key is always the scoped key; a pointer is `/id` (validation).
        KeySource::RecordKey | KeySource::JsonPointer(_) => {}
    }
    for name in PASSED_ON {
        if let Some(v) = request.get(name) {
            headers.push((name.to_string(), Some(v.as_bytes().to_vec())));
        }
    }
    let record = InputRecord {
        topic: "",
        partition: -1,
        offset: -1,
        timestamp_ms: None,
        key: Some(scoped_key.as_bytes()),
        value: Some(&value),
        headers: &headers,
    };
    match crate::envelope::parse(&record, &checks.envelope, &checks.limits, &checks.router) {
        Ok(_) => Ok(Produced { key: scoped_key.to_string(), value, headers }),
        Err(rejection) => Err(refused(rejection.reason, &rejection.message)),
    }
}

/// The problem of a rejection the pipeline would have dead-lettered.
fn refused(reason: RejectReason, message: &str) -> Problem {
    let cause = match reason {
        RejectReason::TooLarge => Cause::TooLarge,
        RejectReason::NoRoute | RejectReason::MissingType => Cause::UnknownType,
        RejectReason::MissingKey | RejectReason::BadKey => Cause::BadIdempotencyKey,
        _ => Cause::InvalidJson,
    };
    Problem::new(cause, message.to_string()).with("reason", serde_json::Value::from(reason.as_str()))
}

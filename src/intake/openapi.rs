//! `GET /v1/openapi.json`: the intake described in OpenAPI 3.1 (`openapi.json` beside this
//! file), its version the binary's. tests/intake/intake.rs exercises every path and status it
//! lists; the test below holds its problem types to [`Cause`].

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::LazyLock;

#[cfg(test)]
use super::problem::Cause;

const DOCUMENT: &str = include_str!("openapi.json");

/// The document as served, made once: parsed, its version set, written back out.
static SERVED: LazyLock<String> = LazyLock::new(|| document().to_string());

/// The document as served.
pub fn document() -> Value {
    let mut doc: Value = serde_json::from_str(DOCUMENT).unwrap_or(Value::Null);
    if let Some(info) = doc.get_mut("info").and_then(Value::as_object_mut) {
        info.insert("version".into(), Value::from(env!("CARGO_PKG_VERSION")));
    }
    doc
}

/// `GET /v1/openapi.json`.
pub async fn describe() -> Response {
    let mut response = SERVED.as_str().into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY_CAUSE: [Cause; 17] = [
        Cause::Unauthorized,
        Cause::RateLimited,
        Cause::UnsupportedMediaType,
        Cause::TooLarge,
        Cause::MissingIdempotencyKey,
        Cause::BadIdempotencyKey,
        Cause::InvalidJson,
        Cause::UnknownType,
        Cause::InFlight,
        Cause::Conflict,
        Cause::CommandFailed,
        Cause::Indeterminate,
        Cause::NotExecuted,
        Cause::NotFound,
        Cause::NotOwner,
        Cause::Unavailable,
        Cause::Internal,
    ];

    #[test]
    fn the_document_parses_and_carries_the_version() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn its_problem_types_are_the_causes() {
        let listed: Vec<String> = document()["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]
            .as_array()
            .expect("enum")
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect();
        let causes: Vec<String> = EVERY_CAUSE.iter().map(|c| format!("urn:dedupd:problem:{}", c.name())).collect();
        assert_eq!(listed, causes);
    }

    #[test]
    fn every_status_a_cause_answers_is_listed_by_an_operation() {
        let doc = document();
        let listed: Vec<&str> = doc["paths"]["/v1/commands/{name}"]
            .as_object()
            .expect("path")
            .values()
            .flat_map(|op| op["responses"].as_object().expect("responses").keys().map(String::as_str))
            .collect();
        for cause in EVERY_CAUSE {
            let status = cause.status().as_u16().to_string();
            // Anything else (a store failure) is the HTTP's own 500.
            if cause != Cause::Internal {
                assert!(listed.contains(&status.as_str()), "{} answers {status}, not listed", cause.name());
            }
        }
    }
}

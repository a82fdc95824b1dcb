//! A command's result record as the HTTP answer (docs/intake.md, "Answers"):
//!
//! | outcome | answer |
//! | --- | --- |
//! | `succeeded` | the sink's result: an `http` sink's `{status, body}` as that 2xx status and body, any other result as 200 and the result |
//! | `duplicate` of a success | the same, with `Idempotent-Replayed: true` |
//! | `failed`, or a `duplicate` of a failure | 502 `command-failed`, the error and the result |
//! | `conflict` | 422 `conflict` |
//! | `indeterminate` | 502 `indeterminate`, with `Location` to poll until dedupd settles it |
//! | `stale`, `rejected` | 422 `not-executed` |

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::problem::{Cause, Problem};

/// `Idempotent-Replayed`, set to `true` on an answer replayed from the store.
pub const REPLAYED: &str = "idempotent-replayed";

/// The answer to the request whose command ended in `result` (a result record, §5).
/// `location` is where its key's state can be read.
pub fn of_result(result: &Value, location: &str) -> Response {
    let outcome = result.get("outcome").and_then(Value::as_str).unwrap_or("");
    let replay = result.get("replay").and_then(Value::as_bool).unwrap_or(false);
    let error = result.get("error").and_then(Value::as_str);
    let stored = result.get("result").cloned().unwrap_or(Value::Null);
    let mut response = match (outcome, error) {
        ("succeeded", _) | ("duplicate", None) => success(&stored),
        ("failed" | "duplicate", Some(error)) => {
            Problem::new(Cause::CommandFailed, error).with("result", stored).into_response()
        }
        ("conflict", _) => {
            Problem::new(Cause::Conflict, error.unwrap_or("the key was used with another payload")).into_response()
        }
        ("indeterminate", _) => {
            Problem::new(Cause::Indeterminate, error.unwrap_or("the sink's call may have landed without an answer"))
                .header(header::LOCATION, location)
                .into_response()
        }
        (other, _) => Problem::new(Cause::NotExecuted, error.unwrap_or("the command was not executed"))
            .with("outcome", Value::from(other))
            .into_response(),
    };
    let headers = response.headers_mut();
    if replay {
        headers.insert(REPLAYED, HeaderValue::from_static("true"));
    }
    if let Ok(value) = HeaderValue::from_str(outcome) {
        headers.insert("dedupd-outcome", value);
    }
    response
}

/// A stored success: an `http` sink's 2xx status and body, else 200 and the result.
fn success(stored: &Value) -> Response {
    let status = stored
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .filter(StatusCode::is_success);
    let (status, body) = match (status, stored.get("body")) {
        (Some(status), Some(body)) => (status, body.clone()),
        _ => (StatusCode::OK, stored.clone()),
    };
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    async fn body(r: Response) -> Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
        serde_json::from_slice(&bytes).expect("json")
    }

    #[tokio::test]
    async fn an_http_sinks_success_is_its_status_and_body() {
        let r = of_result(&json!({"outcome": "succeeded", "result": {"status": 201, "body": {"id": "ch_1"}}}), "/x");
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get(REPLAYED).is_none());
        assert_eq!(body(r).await, json!({"id": "ch_1"}));
    }

    #[tokio::test]
    async fn another_sinks_success_is_200_and_its_result_and_a_replay_says_so() {
        let r =
            of_result(&json!({"outcome": "duplicate", "replay": true, "error": null, "result": {"sent": true}}), "/x");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[REPLAYED], "true");
        assert_eq!(r.headers()["dedupd-outcome"], "duplicate");
        assert_eq!(body(r).await, json!({"sent": true}));
    }

    #[tokio::test]
    async fn failures_conflicts_and_doubts_are_problems() {
        let failed = of_result(&json!({"outcome": "failed", "error": "HTTP 400", "result": {"status": 400}}), "/x");
        assert_eq!(failed.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(failed.headers()[header::CONTENT_TYPE], "application/problem+json");
        let doc = body(failed).await;
        assert_eq!(doc["type"], "urn:dedupd:problem:command-failed");
        assert_eq!(doc["detail"], "HTTP 400");

        let replayed = of_result(&json!({"outcome": "duplicate", "replay": true, "error": "HTTP 400"}), "/x");
        assert_eq!(replayed.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(replayed.headers()[REPLAYED], "true");

        let conflict = of_result(&json!({"outcome": "conflict", "error": "another payload"}), "/x");
        assert_eq!(conflict.status(), StatusCode::UNPROCESSABLE_ENTITY);

        let doubt = of_result(&json!({"outcome": "indeterminate", "error": "no answer"}), "/v1/commands/k");
        assert_eq!(doubt.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(doubt.headers()[header::LOCATION], "/v1/commands/k");
    }
}

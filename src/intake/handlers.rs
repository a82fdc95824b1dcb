//! The intake's two routes: `POST /v1/commands/{type}` (a command, answered with its
//! result) and `GET /v1/commands/{key}` (a key's state and stored result).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::clients::Refused;
use super::key;
use super::problem::{Cause, Problem};
use super::run::{Posted, RETRY_AFTER_SECS, Ran, bad_key, quoted};
use super::{Door, answer};
use crate::time::{Clock, SystemClock};

/// `POST /v1/commands/{type}`.
pub async fn submit(
    State(door): State<Arc<Door>>,
    Path(kind): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    door.submit(&kind, &headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/commands/{key}`.
pub async fn state(State(door): State<Arc<Door>>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    door.state(&key, &headers).await.unwrap_or_else(IntoResponse::into_response)
}

impl Door {
    async fn submit(self: &Arc<Self>, kind: &str, headers: &HeaderMap, body: Body) -> Result<Response, Problem> {
        let client = self.admit(headers)?;
        json_content(headers)?;
        let key = idempotency_key(headers)?;
        let body = axum::body::to_bytes(body, self.max_body_bytes).await.map_err(|_| {
            Problem::new(Cause::TooLarge, format!("the body is over intake.max_body_bytes = {}", self.max_body_bytes))
        })?;
        let posted = Posted { client, key: &key, kind, body: &body, request: headers };
        Ok(match self.run(posted).await? {
            Ran::Done { result, location } => answer::of_result(&result, &location),
            Ran::Accepted { body, location } => {
                let mut response = (StatusCode::ACCEPTED, body.to_string()).into_response();
                let h = response.headers_mut();
                h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
                if let Ok(value) = header::HeaderValue::from_str(&location) {
                    h.insert(header::LOCATION, value);
                }
                response
            }
        })
    }

    /// The request's client, or why it may not call.
    pub(super) fn admit(&self, headers: &HeaderMap) -> Result<&str, Problem> {
        self.clients.admit(headers).map_err(|refused| match refused {
            Refused::Unknown => {
                Problem::new(Cause::Unauthorized, "send a client's API key as Authorization: Bearer KEY")
                    .header(header::WWW_AUTHENTICATE, "Bearer")
            }
            Refused::RateLimited(wait) => {
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                Problem::new(Cause::RateLimited, "this client's intake.clients rate is used up")
                    .header(header::RETRY_AFTER, &secs.max(1).to_string())
            }
        })
    }

    async fn state(self: &Arc<Self>, key: &str, headers: &HeaderMap) -> Result<Response, Problem> {
        let client = self.admit(headers)?.to_string();
        let scoped = key::scoped(&client, key).map_err(bad_key)?;
        if let Some(owner) = &self.owner {
            owner.check(&scoped).map_err(|why| Problem::new(Cause::NotOwner, why))?;
        }
        let store = Arc::clone(&self.store);
        let lookup = scoped.clone();
        let record = tokio::task::spawn_blocking(move || store.get(&lookup))
            .await
            .map_err(|e| Problem::new(Cause::Internal, e.to_string()))?
            .map_err(|e| Problem::new(Cause::Internal, e.to_string()))?;
        let Some(record) = record else {
            return Err(Problem::new(Cause::NotFound, format!("the key {} has no record", quoted(key))));
        };
        let mut doc = crate::store::record_json(&scoped, &record, SystemClock.now_ms());
        if let Value::Object(fields) = &mut doc {
            fields.insert("key".into(), Value::from(key));
            fields.insert("client".into(), Value::from(client));
        }
        let mut response = axum::Json(doc).into_response();
        if self.waiters.holds(&scoped) {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static(RETRY_AFTER_SECS));
        }
        Ok(response)
    }
}

/// Refuses a body that is not JSON by its `Content-Type` (`application/json` or `+json`).
fn json_content(headers: &HeaderMap) -> Result<(), Problem> {
    let given = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = given.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json")) {
        Ok(())
    } else {
        Err(Problem::new(
            Cause::UnsupportedMediaType,
            format!("Content-Type is {}; send application/json", quoted(given)),
        ))
    }
}

/// The request's `Idempotency-Key`.
fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let given = headers.get("idempotency-key").ok_or_else(|| {
        Problem::new(Cause::MissingIdempotencyKey, "send the command's key as Idempotency-Key: \"KEY\"")
    })?;
    key::parse(given.as_bytes()).map_err(bad_key)
}

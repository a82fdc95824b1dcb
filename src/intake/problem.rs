//! The intake's error answers: RFC 9457 problem documents (`application/problem+json`),
//! each cause with a stable `type` (docs/intake.md lists them).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// Every cause the intake answers with a problem. `type` is `urn:dedupd:problem:` and
/// [`Cause::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No or an unknown API key.
    Unauthorized,
    /// The client's rate is used up.
    RateLimited,
    /// The body is not `application/json`.
    UnsupportedMediaType,
    /// The body is over `intake.max_body_bytes`, or the command over `limits.max_command_bytes`.
    TooLarge,
    /// No `Idempotency-Key` header.
    MissingIdempotencyKey,
    /// An `Idempotency-Key` that is not a Structured Field string or token, or not a usable key.
    BadIdempotencyKey,
    /// The body is not JSON (or has a member name twice).
    InvalidJson,
    /// No route takes the command's type.
    UnknownType,
    /// The key's first request is still being executed.
    InFlight,
    /// The key was used with another payload.
    Conflict,
    /// The command ran and failed.
    CommandFailed,
    /// The command's call may have landed without an answer: dedupd settles it.
    Indeterminate,
    /// The command could not be executed (stale or refused by the pipeline).
    NotExecuted,
    /// The key has no record.
    NotFound,
    /// Another instance holds the key's state.
    NotOwner,
    /// The command could not be handed to Kafka, or the intake is stopping.
    Unavailable,
    /// Anything else; the log says more.
    Internal,
}

impl Cause {
    /// The stable name in the problem's `type`.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Unauthorized => "unauthorized",
            Cause::RateLimited => "rate-limited",
            Cause::UnsupportedMediaType => "unsupported-media-type",
            Cause::TooLarge => "too-large",
            Cause::MissingIdempotencyKey => "missing-idempotency-key",
            Cause::BadIdempotencyKey => "bad-idempotency-key",
            Cause::InvalidJson => "invalid-json",
            Cause::UnknownType => "unknown-type",
            Cause::InFlight => "in-flight",
            Cause::Conflict => "conflict",
            Cause::CommandFailed => "command-failed",
            Cause::Indeterminate => "indeterminate",
            Cause::NotExecuted => "not-executed",
            Cause::NotFound => "not-found",
            Cause::NotOwner => "not-owner",
            Cause::Unavailable => "unavailable",
            Cause::Internal => "internal",
        }
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Cause::Unauthorized => StatusCode::UNAUTHORIZED,
            Cause::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Cause::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Cause::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Cause::MissingIdempotencyKey | Cause::BadIdempotencyKey | Cause::InvalidJson => StatusCode::BAD_REQUEST,
            Cause::UnknownType | Cause::NotFound => StatusCode::NOT_FOUND,
            Cause::InFlight => StatusCode::CONFLICT,
            Cause::Conflict => StatusCode::UNPROCESSABLE_ENTITY,
            Cause::CommandFailed | Cause::Indeterminate => StatusCode::BAD_GATEWAY,
            Cause::NotExecuted => StatusCode::UNPROCESSABLE_ENTITY,
            Cause::NotOwner => StatusCode::MISDIRECTED_REQUEST,
            Cause::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Cause::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short summary that does not change from occurrence to occurrence (RFC 9457 `title`).
    pub fn title(self) -> &'static str {
        match self {
            Cause::Unauthorized => "No valid API key",
            Cause::RateLimited => "Too many requests from this client",
            Cause::UnsupportedMediaType => "The body must be application/json",
            Cause::TooLarge => "The request is too large",
            Cause::MissingIdempotencyKey => "The Idempotency-Key header is missing",
            Cause::BadIdempotencyKey => "The Idempotency-Key header is not a usable key",
            Cause::InvalidJson => "The body is not valid JSON",
            Cause::UnknownType => "No route takes this command type",
            Cause::InFlight => "A request with this key is still being processed",
            Cause::Conflict => "This key was used with another payload",
            Cause::CommandFailed => "The command failed",
            Cause::Indeterminate => "The command's effect is in doubt",
            Cause::NotExecuted => "The command was not executed",
            Cause::NotFound => "This key has no record",
            Cause::NotOwner => "Another instance holds this key",
            Cause::Unavailable => "The command could not be accepted now",
            Cause::Internal => "Internal error",
        }
    }
}

/// One problem answer: a cause, what happened this time, and extra members.
#[derive(Debug)]
pub struct Problem {
    cause: Cause,
    detail: String,
    members: Map<String, Value>,
    headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl Problem {
    /// A problem of `cause`, `detail` saying what happened this time.
    pub fn new(cause: Cause, detail: impl Into<String>) -> Problem {
        Problem { cause, detail: detail.into(), members: Map::new(), headers: Vec::new() }
    }

    /// With an extension member (RFC 9457 §3.2).
    pub fn with(mut self, name: &str, value: Value) -> Problem {
        self.members.insert(name.to_string(), value);
        self
    }

    /// With a response header (`Retry-After`, `Location`, `WWW-Authenticate`).
    pub fn header(mut self, name: header::HeaderName, value: &str) -> Problem {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.headers.push((name, value));
        }
        self
    }
}

impl Problem {
    /// The problem document (RFC 9457 §3).
    pub fn document(&self) -> Value {
        let mut body = json!({
            "type": format!("urn:dedupd:problem:{}", self.cause.name()),
            "title": self.cause.title(),
            "status": self.cause.status().as_u16(),
            "detail": self.detail,
        });
        if let Value::Object(object) = &mut body {
            object.extend(self.members.clone());
        }
        body
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = self.document();
        let mut response = (self.cause.status(), body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

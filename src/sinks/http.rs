//! The `http` sink: JSON POST with `Idempotency-Key` (SPEC §6), failures classified as
//! SPEC §4 says (see [`classify`], the one place that names what is transient).
//!
//! What goes out, per attempt:
//! - `POST <url>` with the payload as the JSON body;
//! - `Idempotency-Key: <key>`, always: `forward_key` only *declares* whether the receiver
//!   honours it (which decides what happens to a claim orphaned by a crash), it never
//!   suppresses the header;
//! - `Content-Type: application/json`, `Dedupd-Command-Type: <type>`,
//!   `Dedupd-Attempt: <n>`, and `traceparent` when the input carried one.
//!
//! What comes back is stored as the result and replayed to repeats:
//! `{"status": <code>, "body": <body>}` where the body is the response parsed as JSON when it
//! is valid JSON (whatever its `Content-Type`), else the text (lossy UTF-8), `null` when
//! empty, and never more than [`MAX_BODY_BYTES`] (a longer body is kept as its first
//! 64 KiB of text and the result gets `"truncated": true`).

use std::error::Error as _;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Sink, SinkError, SinkOutput, SinkRequest};

/// Config of an `http` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// Where to POST.
    pub url: String,
    /// Whether the receiver honours `Idempotency-Key` (then crash re-runs are safe).
    #[serde(default = "default_true")]
    pub forward_key: bool,
    /// TCP connect timeout.
    #[serde(default = "default_connect_timeout", with = "crate::config::duration_str")]
    pub connect_timeout: Duration,
    /// Whole-request timeout.
    #[serde(default = "default_request_timeout", with = "crate::config::duration_str")]
    pub request_timeout: Duration,
}

fn default_true() -> bool {
    true
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}

impl HttpSinkConfig {
    /// Checks the URL.
    pub fn validate(&self, at: &str) -> Result<(), (String, String, String)> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err((format!("{at}.url"), self.url.clone(), "must start with http:// or https://".into()));
        }
        if self.request_timeout.is_zero() {
            return Err((format!("{at}.request_timeout"), "0s".into(), "must be positive".into()));
        }
        Ok(())
    }
}

/// Most bytes of a response body kept in a result (64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Most characters of a response body quoted in an error message.
const MESSAGE_SNIPPET_CHARS: usize = 256;

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const COMMAND_TYPE: HeaderName = HeaderName::from_static("dedupd-command-type");
const ATTEMPT: HeaderName = HeaderName::from_static("dedupd-attempt");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Why an `http` sink could not be built from its config.
#[derive(Debug, thiserror::Error)]
pub enum HttpSinkError {
    /// The URL does not parse, or is not `http://` / `https://`.
    #[error("sink `{sink}`: url `{url}` is not usable: {reason}")]
    InvalidUrl {
        /// The sink instance.
        sink: String,
        /// The configured URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `request_timeout` is zero.
    #[error("sink `{sink}`: request_timeout must be positive")]
    ZeroTimeout {
        /// The sink instance.
        sink: String,
    },
    /// reqwest refused to build the client (e.g. the TLS backend failed to initialise).
    #[error("sink `{sink}`: cannot build the HTTP client: {source}")]
    Client {
        /// The sink instance.
        sink: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
}

/// An `http` sink at run time: one pooled client per instance.
#[derive(Debug)]
pub struct HttpSink {
    name: String,
    url: reqwest::Url,
    forward_key: bool,
    connect_timeout: Duration,
    request_timeout: Duration,
    client: reqwest::Client,
}

impl HttpSink {
    /// Builds the sink: parses the URL and builds a rustls client with the configured
    /// connect and whole-request timeouts (the latter also bounds reading the response).
    pub fn new(name: &str, config: &HttpSinkConfig) -> Result<HttpSink, HttpSinkError> {
        let invalid_url = |reason: String| HttpSinkError::InvalidUrl {
            sink: name.to_string(),
            url: config.url.clone(),
            reason,
        };
        let url = reqwest::Url::parse(&config.url).map_err(|e| invalid_url(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid_url("must start with http:// or https://".into()));
        }
        if config.request_timeout.is_zero() {
            return Err(HttpSinkError::ZeroTimeout { sink: name.to_string() });
        }
        let client = reqwest::Client::builder()
            .tls_backend_rustls()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(concat!("dedupd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| HttpSinkError::Client { sink: name.to_string(), source })?;
        Ok(HttpSink {
            name: name.to_string(),
            url,
            forward_key: config.forward_key,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            client,
        })
    }

    /// The headers of one attempt; `Err` names a value that cannot be an HTTP header
    /// (retrying cannot fix it).
    fn headers(&self, request: &SinkRequest<'_>) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::with_capacity(5);
        // from_bytes: non-ASCII keys and types go out as their UTF-8 bytes (obs-text);
        // only control characters are refused.
        let key = HeaderValue::from_bytes(request.key.as_bytes())
            .map_err(|_| "the idempotency key cannot be sent as an HTTP header (control characters)".to_string())?;
        let kind = HeaderValue::from_bytes(request.kind.as_bytes())
            .map_err(|_| "the command type cannot be sent as an HTTP header (control characters)".to_string())?;
        headers.insert(IDEMPOTENCY_KEY, key);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(COMMAND_TYPE, kind);
        headers.insert(ATTEMPT, HeaderValue::from(request.attempt));
        if let Some(traceparent) = request.traceparent {
            // Trace context is best effort: a malformed one is dropped, not fatal.
            match HeaderValue::from_str(traceparent) {
                Ok(value) => {
                    headers.insert(TRACEPARENT, value);
                }
                Err(_) => tracing::warn!(sink = %self.name, key = request.key, "traceparent is not a valid header value; not forwarded"),
            }
        }
        Ok(headers)
    }

    /// Classifies a reqwest error from `send()` (no usable response).
    fn send_failure(&self, err: reqwest::Error) -> SinkError {
        let ending = Ending::of_error(&err);
        let timed_out = err.is_timeout();
        let mut message = describe(err.without_url());
        if timed_out {
            message = format!(
                "timed out (connect_timeout {}, request_timeout {}): {message}",
                humantime::format_duration(self.connect_timeout),
                humantime::format_duration(self.request_timeout)
            );
        }
        match classify(ending) {
            Class::Transient => SinkError::Transient { message, retry_after: None },
            // Success cannot come out of an error; treat it like any other refusal.
            Class::Permanent | Class::Success => SinkError::Permanent {
                result: json!({ "status": Value::Null, "body": Value::Null, "error": message }),
                message,
            },
        }
    }
}

#[async_trait::async_trait]
impl Sink for HttpSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn forwards_key(&self) -> bool {
        self.forward_key
    }

    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let headers = match self.headers(&request) {
            Ok(headers) => headers,
            Err(message) => {
                return Err(SinkError::Permanent {
                    result: json!({ "status": Value::Null, "body": Value::Null, "error": message }),
                    message,
                });
            }
        };
        let sent = self.client.post(self.url.clone()).headers(headers).json(request.payload).send().await;
        let mut response = match sent {
            Ok(response) => response,
            Err(err) => {
                let failure = self.send_failure(err);
                tracing::debug!(sink = %self.name, key = request.key, attempt = request.attempt, error = %failure, "http sink: no response");
                return Err(failure);
            }
        };
        let status = response.status();
        let code = status.as_u16();
        let retry_after = retry_after(code, response.headers());
        let body = read_body(&mut response).await;
        tracing::debug!(sink = %self.name, key = request.key, attempt = request.attempt, status = code, "http sink: response");
        let describe_status = || {
            let reason = status.canonical_reason().map(|r| format!(" {r}")).unwrap_or_default();
            match body.snippet() {
                Some(snippet) => format!("HTTP {code}{reason}: {snippet}"),
                None => format!("HTTP {code}{reason}"),
            }
        };
        match classify(Ending::Status(code)) {
            Class::Success => Ok(body.into_result(code)),
            Class::Transient => Err(SinkError::Transient { message: describe_status(), retry_after }),
            Class::Permanent => Err(SinkError::Permanent { message: describe_status(), result: body.into_result(code) }),
        }
    }
}

/// How one POST ended, as far as classification cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A response head arrived with this status code (redirects already followed).
    Status(u16),
    /// No response: connect error (refused, DNS, TLS), connect or request timeout, or an
    /// I/O error while sending the request or before the response head arrived.
    NoResponse,
    /// The redirect policy gave up: a redirect loop or more than 10 hops.
    RedirectLoop,
    /// The request could not be built (e.g. an unusable URL or header value).
    Unbuildable,
}

impl Ending {
    /// The ending a reqwest error stands for.
    fn of_error(err: &reqwest::Error) -> Ending {
        if err.is_redirect() {
            Ending::RedirectLoop
        } else if err.is_builder() {
            Ending::Unbuildable
        } else if let Some(status) = err.status() {
            Ending::Status(status.as_u16())
        } else {
            // is_connect, is_timeout, is_request, is_body and anything unforeseen: nothing
            // was answered, so the same key may safely be tried again.
            Ending::NoResponse
        }
    }
}

/// What a POST's ending means for the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The receiver accepted it: store the result.
    Success,
    /// Retry with the same key, with backoff (SPEC §4).
    Transient,
    /// Retrying cannot help: complete as `failed` and replay that.
    Permanent,
}

/// The single place that says which endings are transient (SPEC §4).
///
/// Transient (retried with the same key):
/// - no response at all: connect errors (refused, unreachable, DNS, TLS handshake), the
///   connect or request timeout, and request errors before a response head arrived —
///   the receiver may or may not have acted, and the key lets it tell;
/// - HTTP 5xx (the receiver failed, not the command);
/// - HTTP 429 Too Many Requests and 408 Request Timeout (come back later).
///
/// Permanent: every other non-2xx status (other 4xx, a 3xx that was not followed, codes
/// outside 100..=599), a redirect loop, and a request that could not be built.
///
/// Success: 2xx.
pub(crate) fn classify(ending: Ending) -> Class {
    match ending {
        Ending::NoResponse => Class::Transient,
        Ending::Status(200..=299) => Class::Success,
        Ending::Status(408 | 429 | 500..=599) => Class::Transient,
        Ending::Status(_) => Class::Permanent,
        Ending::RedirectLoop | Ending::Unbuildable => Class::Permanent,
    }
}

/// The server-suggested wait: `Retry-After` in delta-seconds on a 429 or 503 only. An
/// HTTP-date or garbage value yields `None` (the engine's own backoff applies).
pub(crate) fn retry_after(code: u16, headers: &HeaderMap) -> Option<Duration> {
    if code != 429 && code != 503 {
        return None;
    }
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>().ok().map(Duration::from_secs)
}

/// A response body, read up to [`MAX_BODY_BYTES`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Body {
    /// The body as stored: JSON, text or null.
    value: Value,
    /// Whether the body was longer than the bound.
    truncated: bool,
    /// Why reading the body failed part way, if it did (the status still counts).
    error: Option<String>,
}

impl Body {
    /// Renders raw bytes (at most [`MAX_BODY_BYTES`] of them): JSON when the whole body is
    /// valid JSON, else lossy UTF-8 text cut to the bound at a character boundary, null
    /// when empty.
    pub(crate) fn from_bytes(bytes: &[u8], truncated: bool) -> Body {
        if bytes.is_empty() {
            return Body { value: Value::Null, truncated, error: None };
        }
        if !truncated
            && let Ok(value) = serde_json::from_slice::<Value>(bytes)
        {
            return Body { value, truncated, error: None };
        }
        // A cut may split the last character: drop the incomplete tail.
        let whole = match std::str::from_utf8(bytes) {
            Err(e) if truncated && e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        };
        let mut text = String::from_utf8_lossy(whole).into_owned();
        let mut truncated = truncated;
        if text.len() > MAX_BODY_BYTES {
            // Replacement characters grew invalid bytes; keep the bound on the stored text.
            let mut cut = MAX_BODY_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            truncated = true;
        }
        Body { value: Value::String(text), truncated, error: None }
    }

    /// The result stored for a response: `{"status", "body"}`, plus `"truncated": true`
    /// or `"body_error"` when those happened.
    fn into_result(self, code: u16) -> Value {
        let mut result = json!({ "status": code, "body": self.value });
        if self.truncated {
            result["truncated"] = Value::Bool(true);
        }
        if let Some(error) = self.error {
            result["body_error"] = Value::String(error);
        }
        result
    }

    /// A short quote of the body for an error message.
    fn snippet(&self) -> Option<String> {
        let text = match &self.value {
            Value::Null => return None,
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let mut snippet: String = text.chars().take(MESSAGE_SNIPPET_CHARS).collect();
        if snippet.len() < text.len() {
            snippet.push('…');
        }
        Some(snippet)
    }
}

/// Reads the body up to the bound (bounded in time by the client's request timeout) and
/// stops there; a read error keeps the status and records the error with a null body.
async fn read_body(response: &mut reqwest::Response) -> Body {
    let mut bytes: Vec<u8> = Vec::new();
    let mut truncated = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_BODY_BYTES - bytes.len();
                if chunk.len() > room {
                    bytes.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(err) => {
                return Body { value: Value::Null, truncated: false, error: Some(describe(err.without_url())) };
            }
        }
    }
    Body::from_bytes(&bytes, truncated)
}

/// An error with its causes ("error sending request: client error (Connect): tcp connect
/// error: Connection refused"), without the URL (it may carry credentials).
fn describe(err: reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_hundreds_succeed() {
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(classify(Ending::Status(code)), Class::Success, "{code}");
        }
    }

    #[test]
    fn no_response_is_transient() {
        assert_eq!(classify(Ending::NoResponse), Class::Transient);
    }

    #[test]
    fn server_errors_throttling_and_request_timeout_are_transient() {
        for code in [500, 501, 502, 503, 504, 599, 429, 408] {
            assert_eq!(classify(Ending::Status(code)), Class::Transient, "{code}");
        }
    }

    #[test]
    fn other_client_errors_are_permanent() {
        for code in [400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 451, 499] {
            assert_eq!(classify(Ending::Status(code)), Class::Permanent, "{code}");
        }
    }

    #[test]
    fn unfollowed_redirects_odd_codes_loops_and_unbuildable_are_permanent() {
        for code in [100, 300, 304, 399, 600, 999] {
            assert_eq!(classify(Ending::Status(code)), Class::Permanent, "{code}");
        }
        assert_eq!(classify(Ending::RedirectLoop), Class::Permanent);
        assert_eq!(classify(Ending::Unbuildable), Class::Permanent);
    }

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn retry_after_seconds_on_429_and_503_only() {
        assert_eq!(retry_after(429, &with_retry_after("3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(503, &with_retry_after(" 120 ")), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(503, &with_retry_after("0")), Some(Duration::ZERO));
        assert_eq!(retry_after(500, &with_retry_after("3")), None);
        assert_eq!(retry_after(408, &with_retry_after("3")), None);
        assert_eq!(retry_after(429, &HeaderMap::new()), None);
    }

    #[test]
    fn retry_after_dates_and_garbage_are_ignored() {
        assert_eq!(retry_after(429, &with_retry_after("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(429, &with_retry_after("-3")), None);
        assert_eq!(retry_after(429, &with_retry_after("+3")), None);
        assert_eq!(retry_after(429, &with_retry_after("1.5")), None);
        assert_eq!(retry_after(429, &with_retry_after("")), None);
        assert_eq!(retry_after(429, &with_retry_after("99999999999999999999999")), None);
    }

    #[test]
    fn body_json_text_and_empty() {
        assert_eq!(Body::from_bytes(br#"{"id":7}"#, false).value, json!({"id": 7}));
        assert_eq!(Body::from_bytes(b"accepted", false).value, json!("accepted"));
        assert_eq!(Body::from_bytes(b"", false).value, Value::Null);
        assert_eq!(Body::from_bytes(b"\xff ok", false).value, json!("\u{fffd} ok"));
    }

    #[test]
    fn truncated_body_is_text_cut_at_a_char_boundary() {
        // 'é' is two bytes; the cut lands in the middle of the last one.
        let mut bytes = br#"{"x":""#.to_vec();
        while bytes.len() < MAX_BODY_BYTES - 1 {
            bytes.extend_from_slice("é".as_bytes());
        }
        bytes.truncate(MAX_BODY_BYTES);
        let body = Body::from_bytes(&bytes, true);
        assert!(body.truncated);
        let text = body.value.as_str().expect("a truncated body is text");
        assert!(text.len() <= MAX_BODY_BYTES);
        assert!(!text.ends_with('\u{fffd}'));
        assert!(text.starts_with(r#"{"x":"é"#));
    }

    #[test]
    fn invalid_bytes_do_not_break_the_bound() {
        let bytes = vec![0xffu8; MAX_BODY_BYTES];
        let body = Body::from_bytes(&bytes, false);
        assert!(body.truncated);
        assert!(body.value.as_str().unwrap().len() <= MAX_BODY_BYTES);
    }

    #[test]
    fn result_shape() {
        assert_eq!(Body::from_bytes(b"", false).into_result(204), json!({"status": 204, "body": null}));
        assert_eq!(
            Body::from_bytes(b"abc", true).into_result(200),
            json!({"status": 200, "body": "abc", "truncated": true})
        );
    }

    #[test]
    fn snippet_is_short() {
        let long = "x".repeat(1000);
        let snippet = Body::from_bytes(long.as_bytes(), false).snippet().unwrap();
        assert_eq!(snippet.chars().count(), MESSAGE_SNIPPET_CHARS + 1);
        assert_eq!(Body::from_bytes(b"", false).snippet(), None);
    }

    fn config(url: &str) -> HttpSinkConfig {
        HttpSinkConfig {
            url: url.into(),
            forward_key: false,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn new_checks_url_and_timeout() {
        assert!(matches!(HttpSink::new("s", &config("ftp://x/")), Err(HttpSinkError::InvalidUrl { .. })));
        assert!(matches!(HttpSink::new("s", &config("not a url")), Err(HttpSinkError::InvalidUrl { .. })));
        let mut zero = config("http://127.0.0.1:1/");
        zero.request_timeout = Duration::ZERO;
        assert!(matches!(HttpSink::new("s", &zero), Err(HttpSinkError::ZeroTimeout { .. })));
        let sink = HttpSink::new("s", &config("https://example.invalid/hook")).unwrap();
        assert!(!sink.forwards_key());
        assert_eq!(sink.name(), "s");
    }

    #[test]
    fn control_characters_in_key_are_refused_but_utf8_is_sent() {
        let sink = HttpSink::new("s", &config("http://127.0.0.1:1/")).unwrap();
        let payload = json!({});
        let request = |key| SinkRequest { key, kind: "t", payload: &payload, attempt: 1, traceparent: Some("bad\nvalue") };
        assert!(sink.headers(&request("a\nb")).is_err());
        let headers = sink.headers(&request("clé")).unwrap();
        assert_eq!(headers.get(IDEMPOTENCY_KEY).unwrap().as_bytes(), "clé".as_bytes());
        assert!(headers.get(TRACEPARENT).is_none(), "a malformed traceparent is dropped");
        assert_eq!(headers.get(ATTEMPT).unwrap(), "1");
    }
}

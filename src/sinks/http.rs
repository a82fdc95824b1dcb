//! The `http` sink: JSON POST with `Idempotency-Key` (docs/contract.md §6), failures classified as
//! docs/contract.md §4 says (see [`classify::classify`], the one place that names what is transient).
//!
//! What goes out, per attempt:
//! - `POST <url>` with the payload as the JSON body; `url` may be a template over payload
//!   fields (percent-encoded), and `body_template` replaces the body by a JSON template
//!   rendered from the payload (see [`super::template`]);
//! - `Idempotency-Key: <key>`, always: `forward_key` only *declares* whether the receiver
//!   honours it (which decides what happens to a claim orphaned by a crash), it never
//!   suppresses the header;
//! - `Content-Type: application/json`, `Dedupd-Command-Type: <type>`,
//!   `Dedupd-Attempt: <n>`, and `traceparent` (with `tracestate`) when there is one;
//! - the configured `headers`, `headers_from_env` and `auth` (`Authorization`), the
//!   environment read once when the sink is built.
//!
//! Redirects are not followed (unless `follow_redirects = "same_origin"`, which follows
//! 307/308 to the configured origin only): any other 3xx answer is a permanent failure whose message and
//! result name its `Location` (see [`classify::redirect_location`] for why).
//!
//! What comes back is stored as the result and replayed to repeats:
//! `{"status": <code>, "body": <body>}` where the body is the response parsed as JSON when it
//! is valid JSON (whatever its `Content-Type`), else the text (lossy UTF-8), `null` when
//! empty, and never more than `max_response_bytes` (a longer body is kept as its first
//! bytes of text and the result gets `"truncated": true`).
//!
//! With `forward_key = false`, `[sinks.NAME.check]` says how to ask the receiver whether a
//! call that may have landed without an answer did (a timeout after the request was
//! written, a reset while waiting): see [`check`]. Which calls those are is [`never_sent`]'s
//! and `execute`'s to say (docs/contract.md §4).
//!
//! TLS is rustls with the platform verifier (reqwest's `rustls` feature): certificates
//! are checked against the system's roots, as a browser on the same host would.

mod check;
mod classify;
mod error;
mod outgoing;
mod response;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use self::check::Check;
pub use self::check::HttpCheckConfig;
use self::classify::{Class, Ending, classify, redirect_location, redirect_policy, retry_after};
pub use self::error::HttpSinkError;
pub use self::outgoing::HttpAuthConfig;
use self::outgoing::Outgoing;
pub use self::response::MAX_BODY_BYTES;
use self::response::{describe, read_body};
use super::limit::SinkLimits;
use super::{
    CheckAnswer, CheckTiming, Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput, SinkRequest,
};

/// Config of an `http` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// Where to POST; may name payload fields (`https://api/x/{/customer/id}`), which are
    /// percent-encoded. The scheme and the authority (user, host, port) must be written out:
    /// payload values only fill path segments, query values or the fragment.
    pub url: String,
    /// Whether the receiver honours `Idempotency-Key` (then crash re-runs are safe).
    #[serde(default = "default_true")]
    pub forward_key: bool,
    /// TCP connect timeout.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Whole-request timeout.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Extra headers sent with every request, as written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Headers whose values come from environment variables (header name → variable
    /// name), read when the sink is built; an unset variable stops the start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers_from_env: BTreeMap<String, String>,
    /// `Authorization`: `{ bearer_env = "VAR" }` or `{ basic_user = "u", basic_password_env = "VAR" }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<HttpAuthConfig>,
    /// The request body as a JSON template over the payload; the payload itself when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_template: Option<Value>,
    /// Which redirects are followed: `"never"` (default: every 3xx is a permanent failure)
    /// or `"same_origin"` (307/308 to the configured scheme, host and port only).
    #[serde(default, skip_serializing_if = "FollowRedirects::is_never")]
    pub follow_redirects: FollowRedirects,
    /// Most bytes of a response body kept in the result (default 64 KiB).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: NonZeroUsize,
    /// Rate and concurrency limits.
    #[serde(default)]
    pub limits: SinkLimits,
    /// The circuit breaker (`[sinks.NAME.circuit]`, see docs/sinks.md).
    #[serde(default)]
    pub circuit: crate::sinks::circuit::CircuitConfig,
    /// How to ask the receiver whether a call that may have landed unanswered did
    /// (`[sinks.NAME.check]`, only with `forward_key = false`; see [`check`]). Boxed: most
    /// sinks have none, and every sink's config is as large as the largest kind's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Box<HttpCheckConfig>>,
}

/// Which redirects an `http` sink follows (`follow_redirects`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowRedirects {
    /// None: every 3xx is a permanent failure naming its `Location`.
    #[default]
    Never,
    /// 307 and 308 only (they re-send the same method, body and headers), only to the
    /// configured URL's scheme, host and port, at most [`classify::MAX_REDIRECT_HOPS`]
    /// hops; any other 3xx is a permanent failure as with `Never`.
    SameOrigin,
}

impl FollowRedirects {
    fn is_never(&self) -> bool {
        *self == FollowRedirects::Never
    }
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
fn default_max_response_bytes() -> NonZeroUsize {
    NonZeroUsize::new(MAX_BODY_BYTES).unwrap_or(NonZeroUsize::MIN)
}

impl Default for HttpSinkConfig {
    /// Every default, and an empty `url` that must be set before use.
    fn default() -> Self {
        HttpSinkConfig {
            url: String::new(),
            forward_key: default_true(),
            connect_timeout: default_connect_timeout(),
            request_timeout: default_request_timeout(),
            headers: BTreeMap::new(),
            headers_from_env: BTreeMap::new(),
            auth: None,
            body_template: None,
            follow_redirects: FollowRedirects::Never,
            max_response_bytes: default_max_response_bytes(),
            limits: SinkLimits::default(),
            circuit: crate::sinks::circuit::CircuitConfig::default(),
            check: None,
        }
    }
}

impl SinkKind for HttpSinkConfig {
    /// Checks what can be checked without the environment.
    fn validate(&self, problems: &mut Problems) {
        outgoing::validate(self, problems);
        if self.request_timeout.is_zero() {
            problems.add("request_timeout", "0s", "must be positive");
        }
        if self.max_response_bytes.get() > super::MAX_RESULT_BYTES {
            let why =
                format!("must be at most {} (8 MiB): a result is kept in the key's record", super::MAX_RESULT_BYTES);
            problems.add("max_response_bytes", self.max_response_bytes.to_string(), why);
        }
        if let Some(check) = &self.check {
            check.validate(self, problems);
        }
    }

    fn forwards_key(&self) -> bool {
        self.forward_key
    }

    fn call_holds_a_resource(&self) -> bool {
        // A connection per call in flight (the pool reuses only idle ones).
        true
    }

    fn limits(&self) -> &SinkLimits {
        &self.limits
    }

    fn circuit(&self) -> &crate::sinks::circuit::CircuitConfig {
        &self.circuit
    }

    fn check_timing(&self) -> Option<CheckTiming> {
        // A call's longest is its request_timeout (reqwest's timeout covers connecting too).
        self.check.as_ref().map(|check| check.timing(self.request_timeout))
    }

    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        let sink =
            HttpSink::new(name, self).map_err(|e| SinkBuildError { name: name.to_string(), reason: e.to_string() })?;
        Ok(Arc::new(sink))
    }
}

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const COMMAND_TYPE: HeaderName = HeaderName::from_static("dedupd-command-type");
const ATTEMPT: HeaderName = HeaderName::from_static("dedupd-attempt");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// An `http` sink at run time: one pooled client per instance.
#[derive(Debug)]
pub struct HttpSink {
    name: String,
    outgoing: Outgoing,
    connect_timeout: Duration,
    request_timeout: Duration,
    max_response_bytes: usize,
    client: reqwest::Client,
    /// The check, when `[sinks.NAME.check]` is set.
    check: Option<Check>,
}

impl HttpSink {
    /// Builds the sink, reading `headers_from_env` and `auth` from the process environment.
    pub fn new(name: &str, config: &HttpSinkConfig) -> Result<HttpSink, HttpSinkError> {
        HttpSink::with_env(name, config, &|var| std::env::var(var).ok())
    }

    /// Builds the sink with `env` as the environment: resolves URL, templates, headers and
    /// credentials, and builds a rustls client (system roots) with the configured connect
    /// and whole-request timeouts (the latter also bounds reading the response).
    pub fn with_env(
        name: &str,
        config: &HttpSinkConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HttpSink, HttpSinkError> {
        let outgoing = Outgoing::build(name, config, env)?;
        if config.request_timeout.is_zero() {
            return Err(HttpSinkError::ZeroTimeout { sink: name.to_string() });
        }
        let client = reqwest::Client::builder()
            .tls_backend_rustls()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .redirect(redirect_policy(config.follow_redirects))
            .user_agent(concat!("dedupd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| HttpSinkError::Client { sink: name.to_string(), source })?;
        Ok(HttpSink {
            name: name.to_string(),
            outgoing,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            max_response_bytes: config.max_response_bytes.get(),
            client,
            check: config.check.as_ref().map(|c| Check::build(name, c, config.auth.is_some())).transpose()?,
        })
    }

    /// The headers of one attempt; `Err` names a value that cannot be an HTTP header
    /// (retrying cannot fix it).
    fn headers(&self, request: &SinkRequest<'_>) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::with_capacity(5);
        // from_bytes: non-ASCII keys and types go out as their UTF-8 bytes (obs-text);
        // only control characters are refused.
        let key = HeaderValue::from_bytes(request.key().as_bytes())
            .map_err(|_| "the idempotency key cannot be sent as an HTTP header (control characters)".to_string())?;
        let kind = HeaderValue::from_bytes(request.kind().as_bytes())
            .map_err(|_| "the command type cannot be sent as an HTTP header (control characters)".to_string())?;
        headers.insert(IDEMPOTENCY_KEY, key);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(COMMAND_TYPE, kind);
        headers.insert(ATTEMPT, HeaderValue::from(request.attempt()));
        // Trace context is best effort: a malformed one is dropped, not fatal.
        for (name, value) in [(TRACEPARENT, request.traceparent()), (TRACESTATE, request.tracestate())] {
            let Some(value) = value else { continue };
            match HeaderValue::from_str(value) {
                Ok(value) => {
                    headers.insert(name, value);
                }
                Err(_) => {
                    tracing::warn!(sink = %self.name, key = request.key(), header = %name, "not a valid header value; not forwarded")
                }
            }
        }
        // Configured headers first, so the loop above cannot be undone by config
        // (validation refuses reserved names too).
        let mut all = self.outgoing.headers().clone();
        all.extend(headers);
        Ok(all)
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
            Class::Permanent | Class::Success => unsendable(message),
        }
    }
}

#[async_trait::async_trait]
impl SinkEffect for HttpSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let headers = self.headers(&request).map_err(unsendable)?;
        let url = self.outgoing.url(request.payload()).map_err(unsendable)?;
        let body = self.outgoing.body(request.payload()).map_err(|e| unsendable(format!("body_template: {e}")))?;
        let sent = self.client.post(url).headers(headers).json(body.as_ref()).send().await;
        let mut response = match sent {
            Ok(response) => response,
            Err(err) => {
                if never_sent(&err) {
                    request.never_sent();
                }
                let failure = self.send_failure(err);
                tracing::debug!(sink = %self.name, key = request.key(), attempt = request.attempt(), error = %failure, "http sink: no response");
                return Err(failure);
            }
        };
        // A status came back: the receiver answered (a 5xx it answered is retried like any
        // transient failure, so a cancel may let the command run again too).
        request.answered();
        let status = response.status();
        let code = status.as_u16();
        let retry_after = retry_after(code, response.headers());
        let location = redirect_location(code, response.headers());
        let body = read_body(&mut response, self.max_response_bytes).await;
        tracing::debug!(sink = %self.name, key = request.key(), attempt = request.attempt(), status = code, "http sink: response");
        let describe_status = || {
            let reason = status.canonical_reason().map(|r| format!(" {r}")).unwrap_or_default();
            match (&location, body.snippet()) {
                (Some(location), _) => format!(
                    "HTTP {code}{reason}: redirect to `{location}` not followed (the http sink never follows redirects; set `url` to the final address)"
                ),
                (None, Some(snippet)) => format!("HTTP {code}{reason}: {snippet}"),
                (None, None) => format!("HTTP {code}{reason}"),
            }
        };
        match classify(Ending::Status(code)) {
            Class::Success => Ok(body.into_result(code)),
            Class::Transient => Err(SinkError::Transient { message: describe_status(), retry_after }),
            Class::Permanent => {
                let message = describe_status();
                let mut result = body.into_result(code);
                if let Some(location) = location {
                    result["location"] = Value::String(location);
                }
                Err(SinkError::Permanent { message, result })
            }
        }
    }

    async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        match &self.check {
            Some(check) => check.ask(self, &request).await,
            None => CheckAnswer::Error(format!("sink `{}` has no [check]", self.name)),
        }
    }
}

/// Whether a failed send certainly never reached the receiver: the connection was never
/// made (refused, unreachable, the name did not resolve, the TLS handshake or the connect
/// timeout failed). The request is only written once a connection is made, so nothing of it
/// left. Any later failure (a timeout after connecting, a reset while sending or waiting)
/// may follow bytes that arrived, and is not claimed to be unsent.
fn never_sent(err: &reqwest::Error) -> bool {
    err.is_connect()
}

/// A failure that retrying cannot fix, before anything was sent.
fn unsendable(message: String) -> SinkError {
    SinkError::Permanent { result: json!({ "status": Value::Null, "body": Value::Null, "error": message }), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> HttpSinkConfig {
        HttpSinkConfig {
            url: url.into(),
            forward_key: false,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            ..HttpSinkConfig::default()
        }
    }

    #[test]
    fn a_missing_env_var_is_a_build_error_naming_it() {
        let mut c = config("http://127.0.0.1:1/");
        c.headers_from_env.insert("X-Api-Key".into(), "DEDUPD_TEST_UNSET_KEY".into());
        let err = HttpSink::with_env("s", &c, &|_| None).unwrap_err();
        assert!(matches!(&err, HttpSinkError::MissingEnv { var, .. } if var == "DEDUPD_TEST_UNSET_KEY"), "{err}");
        assert!(err.to_string().contains("DEDUPD_TEST_UNSET_KEY"));
        c.headers_from_env.clear();
        c.auth = Some(HttpAuthConfig { bearer_env: Some("TOKEN_VAR".into()), ..HttpAuthConfig::default() });
        let err = HttpSink::with_env("s", &c, &|_| Some(String::new())).unwrap_err();
        assert!(err.to_string().contains("TOKEN_VAR"), "{err}");
    }

    #[test]
    fn validate_names_header_auth_and_template_keys() {
        let key = |c: &HttpSinkConfig| c.problems("sinks.h")[0].key.clone();
        let mut c = config("https://api.test/x/{/id}");
        assert!(c.problems("sinks.h").is_empty());
        c.headers.insert("Idempotency-Key".into(), "x".into());
        assert_eq!(key(&c), "sinks.h.headers");
        let mut c = config("https://api.test/");
        c.auth = Some(HttpAuthConfig { basic_user: Some("u".into()), ..HttpAuthConfig::default() });
        assert_eq!(key(&c), "sinks.h.auth.basic_user");
        let mut c = config("https://api.test/");
        c.body_template = Some(json!({"a": "{oops}"}));
        assert_eq!(key(&c), "sinks.h.body_template");
        assert_eq!(key(&config("{/base}/x")), "sinks.h.url");
    }

    #[test]
    fn https_urls_get_a_client_with_system_roots() {
        // rustls-platform-verifier loads the system's roots when the client is built; a
        // loopback test cannot reach a public site, so this checks the build path only.
        let sink = HttpSink::new("tls", &config("https://api.example.com/hook/{/id}")).unwrap();
        assert_eq!(sink.outgoing.url(&json!({"id": "a b"})).unwrap().as_str(), "https://api.example.com/hook/a%20b");
    }

    #[test]
    fn new_checks_url_and_timeout() {
        assert!(matches!(HttpSink::new("s", &config("ftp://x/")), Err(HttpSinkError::InvalidUrl { .. })));
        assert!(matches!(HttpSink::new("s", &config("not a url")), Err(HttpSinkError::InvalidUrl { .. })));
        let mut zero = config("http://127.0.0.1:1/");
        zero.request_timeout = Duration::ZERO;
        assert!(matches!(HttpSink::new("s", &zero), Err(HttpSinkError::ZeroTimeout { .. })));
        let sink = crate::sinks::SinkConfig::Http(config("https://example.invalid/hook")).build("s").unwrap();
        assert!(!sink.forwards_key());
        assert_eq!(sink.name(), "s");
    }

    #[test]
    fn control_characters_in_key_are_refused_but_utf8_is_sent() {
        let sink = HttpSink::new("s", &config("http://127.0.0.1:1/")).unwrap();
        let payload = json!({});
        let request = |key| SinkRequest::unclaimed(key, "t", &payload, 1, Some("bad\nvalue"));
        assert!(sink.headers(&request("a\nb")).is_err());
        let headers = sink.headers(&request("clé")).unwrap();
        assert_eq!(headers.get(IDEMPOTENCY_KEY).unwrap().as_bytes(), "clé".as_bytes());
        assert!(headers.get(TRACEPARENT).is_none(), "a malformed traceparent is dropped");
        assert_eq!(headers.get(ATTEMPT).unwrap(), "1");
    }

    #[test]
    fn trace_context_is_passed_on_with_its_tracestate() {
        let sink = HttpSink::new("s", &config("http://127.0.0.1:1/")).unwrap();
        let payload = json!({});
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let request = SinkRequest::unclaimed("k", "t", &payload, 1, Some(tp)).with_tracestate(Some("rojo=1"));
        let headers = sink.headers(&request).unwrap();
        assert_eq!(headers.get(TRACEPARENT).unwrap(), tp);
        assert_eq!(headers.get(TRACESTATE).unwrap(), "rojo=1");
        let bad = SinkRequest::unclaimed("k", "t", &payload, 1, Some(tp)).with_tracestate(Some("a\nb"));
        let headers = sink.headers(&bad).unwrap();
        assert!(headers.get(TRACESTATE).is_none(), "a malformed tracestate is dropped, the traceparent kept");
        assert_eq!(headers.get(TRACEPARENT).unwrap(), tp);
    }
}

//! The `http` sink's check, `[sinks.NAME.check]` (docs/sinks.md, "`http`: check before
//! writing"): for a receiver that cannot take an idempotency key (`forward_key = false`),
//! after a call that may have landed without an answer, one lookup at the same API of the
//! command's effect. Its URL (and a POST's body) is rendered from the payload with the
//! call's templates; its status, and optionally a JSON pointer into its body, says whether
//! the effect is found, absent, or neither.
//!
//! It goes through the sink's own client with the sink's configured headers and `auth`:
//! it asks the same API, so it needs the same credentials, TLS and timeouts. It sends
//! neither `Idempotency-Key` nor the `Dedupd-*` headers: it is a lookup, not a command.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::outgoing::{UrlSource, check_header_name, url_source};
use super::response::{Body, describe, read_body};
use super::{HttpSink, HttpSinkConfig, HttpSinkError};
use crate::sinks::check::{CheckAnswer, CheckTimes, CheckTiming};
use crate::sinks::template::JsonTemplate;
use crate::sinks::{Problems, SinkRequest};

/// `[sinks.NAME.check]` of an `http` sink.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpCheckConfig {
    /// Where to look the effect up: a URL template like the call's `url` (payload fields
    /// percent-encoded, the scheme and authority written out).
    pub url: String,
    /// `GET` (default), `HEAD` or `POST`.
    #[serde(default = "default_method")]
    pub method: String,
    /// Statuses that mean the effect exists (default `[200]`).
    #[serde(default = "default_found_status")]
    pub found_status: Vec<u16>,
    /// Statuses that mean it does not (default `[404]`).
    #[serde(default = "default_absent_status")]
    pub absent_status: Vec<u16>,
    /// A JSON pointer into a found answer's body that must hold something (not null, "",
    /// [] or {}) for the effect to exist; else it is absent. For search endpoints that
    /// answer 200 with an empty list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_pointer: Option<String>,
    /// Headers sent with the check besides the sink's own `headers`, `headers_from_env`
    /// and `auth` (static text, as the sink's `headers`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A POST check's JSON body, a JSON template over the payload (none when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_template: Option<Value>,
    /// How long after a call without an answer to check (default: twice `request_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub delay: Option<Duration>,
    /// How often the reconciler asks again about an `indeterminate` key (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// How long after its claim a key is still asked about (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub deadline: Option<Duration>,
}

fn default_method() -> String {
    "GET".into()
}
fn default_found_status() -> Vec<u16> {
    vec![200]
}
fn default_absent_status() -> Vec<u16> {
    vec![404]
}

/// The methods a check may use: a lookup, or a search that takes a body.
fn method(name: &str) -> Option<reqwest::Method> {
    match name.to_ascii_uppercase().as_str() {
        "GET" => Some(reqwest::Method::GET),
        "HEAD" => Some(reqwest::Method::HEAD),
        "POST" => Some(reqwest::Method::POST),
        _ => None,
    }
}

impl HttpCheckConfig {
    /// A check with `url` and every default.
    pub fn new(url: &str) -> HttpCheckConfig {
        HttpCheckConfig {
            url: url.into(),
            method: default_method(),
            found_status: default_found_status(),
            absent_status: default_absent_status(),
            found_pointer: None,
            headers: BTreeMap::new(),
            body_template: None,
            delay: None,
            interval: None,
            deadline: None,
        }
    }

    /// The check's timing; `request_timeout` is the longest a call of the sink takes.
    pub fn timing(&self, request_timeout: Duration) -> CheckTiming {
        CheckTiming::new(
            CheckTimes { delay: self.delay, interval: self.interval, deadline: self.deadline },
            request_timeout,
        )
    }

    /// Adds every problem of the table (keys `check.url`, ...) of the sink `sink`.
    pub(super) fn validate(&self, sink: &HttpSinkConfig, problems: &mut Problems) {
        if sink.forward_key {
            problems.add(
                "forward_key",
                "true",
                format!(
                    "a sink that forwards the key is retried with the key; a check is only used when forward_key = false \
                     (set it to false, or remove [{}.check])",
                    problems.at()
                ),
            );
        }
        if let Err(HttpSinkError::InvalidUrl { reason, .. }) = url_source("", &self.url) {
            problems.add("check.url", self.url.clone(), reason);
        }
        let method = method(&self.method);
        if method.is_none() {
            problems.add("check.method", self.method.clone(), "must be GET, HEAD or POST");
        }
        self.validate_statuses(problems);
        self.validate_pointer(method.as_ref(), problems);
        for (name, value) in &self.headers {
            if let Err(reason) = check_header_name(name, sink.auth.is_some()) {
                problems.add("check.headers", name.clone(), reason);
            }
            if HeaderValue::from_str(value).is_err() {
                problems.add(&format!("check.headers.{name}"), value.clone(), "is not a valid header value");
            }
        }
        if let Some(body) = &self.body_template {
            if method.is_some() && method != Some(reqwest::Method::POST) {
                problems.add("check.body_template", body.to_string(), "only a POST check sends a body");
            }
            if let Err(e) = JsonTemplate::parse(body) {
                problems.add("check.body_template", body.to_string(), e.to_string());
            }
        }
        self.timing(sink.request_timeout).validate(problems);
    }

    /// `found_status` and `absent_status`: HTTP codes, at least one found, none in both
    /// (a status must mean one answer).
    fn validate_statuses(&self, problems: &mut Problems) {
        if self.found_status.is_empty() {
            problems.add(
                "check.found_status",
                "[]",
                "must name at least one status: a check that can never find only delays `indeterminate`",
            );
        }
        for (key, codes) in [("check.found_status", &self.found_status), ("check.absent_status", &self.absent_status)] {
            for code in codes.iter().filter(|c| !(100..=599).contains(*c)) {
                problems.add(key, code.to_string(), "is not an HTTP status (100 to 599)");
            }
        }
        for code in self.absent_status.iter().filter(|c| self.found_status.contains(c)) {
            problems.add(
                "check.absent_status",
                code.to_string(),
                "is in check.found_status too: a status must mean one answer",
            );
        }
    }

    /// `found_pointer`: a JSON pointer (RFC 6901), and a body to look into.
    fn validate_pointer(&self, method: Option<&reqwest::Method>, problems: &mut Problems) {
        let Some(pointer) = &self.found_pointer else { return };
        if let Err(reason) = check_pointer(pointer) {
            problems.add("check.found_pointer", pointer.clone(), reason);
        }
        if method == Some(&reqwest::Method::HEAD) {
            problems.add("check.found_pointer", pointer.clone(), "a HEAD answer has no body to look into");
        }
    }
}

/// Whether `pointer` is a JSON pointer (RFC 6901): empty (the whole body), or `/`-separated
/// tokens in which `~` is only ever `~0` or `~1`.
fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err("a JSON pointer is empty or starts with `/` (`/data/0/id`)".into());
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err("`~` must be written `~0`, and `/` inside a key `~1`".into());
        }
    }
    Ok(())
}

/// A check, resolved when the sink is built.
#[derive(Debug)]
pub(super) struct Check {
    url: UrlSource,
    method: reqwest::Method,
    found: Vec<u16>,
    absent: Vec<u16>,
    found_pointer: Option<String>,
    /// The check's own headers, sent after the sink's (so they may replace one, `Accept`).
    headers: HeaderMap,
    body: Option<JsonTemplate>,
}

impl Check {
    /// Resolves `config` for the sink `sink`; `auth_set` whether the sink sets
    /// `Authorization` itself. Refuses what validation refuses, naming the key.
    pub(super) fn build(sink: &str, config: &HttpCheckConfig, auth_set: bool) -> Result<Check, HttpSinkError> {
        let refused = |key: &str, reason: String| HttpSinkError::Config { sink: sink.into(), key: key.into(), reason };
        let url = url_source(sink, &config.url).map_err(|e| match e {
            HttpSinkError::InvalidUrl { reason, .. } => refused("check.url", reason),
            other => other,
        })?;
        let method =
            method(&config.method).ok_or_else(|| refused("check.method", "must be GET, HEAD or POST".into()))?;
        if let Some(pointer) = &config.found_pointer {
            check_pointer(pointer).map_err(|reason| refused("check.found_pointer", reason))?;
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header: HeaderName =
                check_header_name(name, auth_set).map_err(|r| refused(&format!("check.headers.{name}"), r))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| refused(&format!("check.headers.{name}"), "is not a valid header value".into()))?;
            headers.insert(header, value);
        }
        let body = config
            .body_template
            .as_ref()
            .map(JsonTemplate::parse)
            .transpose()
            .map_err(|e| refused("check.body_template", e.to_string()))?;
        Ok(Check {
            url,
            method,
            found: config.found_status.clone(),
            absent: config.absent_status.clone(),
            found_pointer: config.found_pointer.clone(),
            headers,
            body,
        })
    }

    /// Asks `sink`'s receiver whether `request`'s effect exists: one request with the
    /// sink's client, bounded by its `request_timeout`.
    pub(super) async fn ask(&self, sink: &HttpSink, request: &SinkRequest<'_>) -> CheckAnswer {
        let payload = request.payload();
        // A payload the templates cannot fill cannot be looked up: nothing tells, so the
        // key is left to an operator rather than called again.
        let url = match self.url.render(payload) {
            Ok(url) => url,
            Err(e) => return CheckAnswer::Error(format!("check.url: {e}")),
        };
        let mut headers = sink.outgoing.headers().clone();
        headers.extend(self.headers.clone());
        let mut call = sink.client.request(self.method.clone(), url).headers(headers);
        if let Some(template) = &self.body {
            match template.render(payload) {
                Ok(body) => call = call.json(&body),
                Err(e) => return CheckAnswer::Error(format!("check.body_template: {e}")),
            }
        }
        if let Some(traceparent) = request.traceparent() {
            call = call.header("traceparent", traceparent);
            if let Some(tracestate) = request.tracestate() {
                call = call.header("tracestate", tracestate);
            }
        }
        let mut response = match call.send().await {
            Ok(response) => response,
            Err(err) => return CheckAnswer::Error(self.no_answer(sink, err)),
        };
        let code = response.status().as_u16();
        let body = read_body(&mut response, sink.max_response_bytes).await;
        let answer = self.judge(code, body);
        tracing::debug!(sink = %sink.name, key = request.key(), status = code, answer = answer.label(), "http check");
        answer
    }

    /// What an answer with status `code` and `body` says.
    fn judge(&self, code: u16, body: Body) -> CheckAnswer {
        let status = describe_status(code);
        if self.found.contains(&code) {
            let Some(pointer) = &self.found_pointer else { return CheckAnswer::Found(body.into_result(code)) };
            // A body that cannot be read whole is not "absent": absent lets the command be
            // called again, which must never follow an answer that may hold the effect.
            return match body.json() {
                Err(why) => CheckAnswer::Unknown(format!("{status}: check.found_pointer `{pointer}`: {why}")),
                Ok(json) if holds_something(json.pointer(pointer)) => CheckAnswer::Found(body.into_result(code)),
                Ok(_) => CheckAnswer::Absent,
            };
        }
        if self.absent.contains(&code) {
            return CheckAnswer::Absent;
        }
        let snippet = body.snippet().map(|s| format!(": {s}")).unwrap_or_default();
        CheckAnswer::Unknown(format!("{status}, in neither check.found_status nor check.absent_status{snippet}"))
    }

    /// The sentence for a check that got no answer.
    fn no_answer(&self, sink: &HttpSink, err: reqwest::Error) -> String {
        let timed_out = err.is_timeout();
        let message = describe(err.without_url());
        let method = &self.method;
        if timed_out {
            format!(
                "{method} check: no answer within request_timeout {} (connect_timeout {}): {message}",
                humantime::format_duration(sink.request_timeout),
                humantime::format_duration(sink.connect_timeout)
            )
        } else {
            format!("{method} check: no answer: {message}")
        }
    }
}

/// `HTTP 404 Not Found`.
fn describe_status(code: u16) -> String {
    let reason = reqwest::StatusCode::from_u16(code).ok().and_then(|s| s.canonical_reason());
    match reason {
        Some(reason) => format!("HTTP {code} {reason}"),
        None => format!("HTTP {code}"),
    }
}

/// Whether a pointer found something: present, and not null, "", [] or {}.
fn holds_something(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

#[cfg(test)]
mod tests;

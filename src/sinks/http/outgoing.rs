//! What an `http` sink's config adds to every request: static headers, headers and
//! credentials read from the environment (once, when the sink is built), and the URL and
//! body templates rendered from each payload.

use std::borrow::Cow;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::HttpSinkError;
use crate::problems::Problems;
use crate::sinks::template::{Encoding, JsonTemplate, StringTemplate, TemplateError};

/// `auth = { bearer_env = "VAR" }` or `auth = { basic_user = "u", basic_password_env = "VAR" }`.
/// Secrets come from the environment only, never from the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpAuthConfig {
    /// Environment variable holding a bearer token (`Authorization: Bearer <token>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_env: Option<String>,
    /// User name for HTTP basic auth (with `basic_password_env`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_user: Option<String>,
    /// Environment variable holding the basic-auth password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_password_env: Option<String>,
}

impl HttpAuthConfig {
    /// Checks that exactly one scheme is configured, completely, into `problems` (whose
    /// keys start with the sink's, `sinks.NAME`).
    pub fn validate(&self, problems: &mut Problems) {
        match (&self.bearer_env, &self.basic_user, &self.basic_password_env) {
            (Some(var), None, None) if !var.trim().is_empty() => {}
            (None, Some(_), Some(var)) if !var.trim().is_empty() => {}
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => problems.add(
                "auth",
                "bearer_env and basic_*",
                "choose one: bearer_env, or basic_user with basic_password_env",
            ),
            (None, Some(user), None) => problems.add("auth.basic_user", user, "needs basic_password_env"),
            (None, None, Some(var)) => problems.add("auth.basic_password_env", var, "needs basic_user"),
            _ => problems.add(
                "auth",
                "{}",
                "set bearer_env, or basic_user with basic_password_env (non-empty variable names)",
            ),
        }
    }
}

/// Headers dedupd sets itself (or that `auth` sets), which config cannot override.
const RESERVED_HEADERS: [&str; 8] = [
    "idempotency-key",
    "dedupd-command-type",
    "dedupd-attempt",
    "traceparent",
    "tracestate",
    "content-type",
    "content-length",
    "host",
];

/// Checks a configured header name: valid, and not one dedupd sets. `authorization` is
/// only refused when `auth` is set.
pub(super) fn check_header_name(name: &str, auth_set: bool) -> Result<HeaderName, String> {
    let parsed = HeaderName::from_bytes(name.as_bytes()).map_err(|_| "is not a valid HTTP header name".to_string())?;
    if RESERVED_HEADERS.contains(&parsed.as_str()) {
        return Err("is set by dedupd itself".into());
    }
    if auth_set && parsed == AUTHORIZATION {
        return Err("is set by `auth`; remove one of the two".into());
    }
    Ok(parsed)
}

/// The config's additions, resolved when the sink is built.
#[derive(Debug)]
pub(super) struct Outgoing {
    url: UrlSource,
    body: Option<JsonTemplate>,
    /// Static and environment headers, auth included (marked sensitive).
    headers: HeaderMap,
}

/// Where a request goes: the call's `url`, or a check's `check.url`.
#[derive(Debug)]
pub(super) enum UrlSource {
    Fixed(reqwest::Url),
    /// A template whose scheme and authority are literal text; `sample` (rendered with a
    /// filler) has them, and every rendered URL must keep them; `sample_dots` is how many
    /// `.`/`..` path segments the template's own text has (the filler adds none).
    Template {
        template: StringTemplate,
        sample: reqwest::Url,
        sample_dots: usize,
    },
}

impl UrlSource {
    /// The URL for `payload`; `Err` when a field is missing or the rendered URL does not
    /// parse or leaves the configured origin (the caller prefixes the key it came from).
    pub(super) fn render(&self, payload: &Value) -> Result<reqwest::Url, String> {
        match self {
            UrlSource::Fixed(url) => Ok(url.clone()),
            UrlSource::Template { template, sample, sample_dots } => {
                let text = template.render(payload, Encoding::Url).map_err(|e| e.to_string())?;
                let url = reqwest::Url::parse(&text).map_err(|e| format!("rendered `{text}` does not parse: {e}"))?;
                // Percent-encoding already keeps values out of the authority; this holds even
                // if the encoding ever changes.
                if !same_authority(&url, sample) {
                    return Err(format!("rendered `{text}` leaves the configured scheme, host or port"));
                }
                // `.` and `..` are unreserved, so they go in unescaped, and URL parsing then
                // removes them with the segment before: a value would climb out of its own
                // segment. Counted in the text, before parsing normalises them away (a value
                // never holds `/`, and an encoded dot from it stays text: `%` is escaped).
                if dot_segments(&text) != *sample_dots {
                    return Err(format!("rendered `{text}`: a payload value `.` or `..` cannot be a path segment"));
                }
                Ok(url)
            }
        }
    }
}

impl Outgoing {
    /// Resolves the config; `env` reads an environment variable (the process environment
    /// in production). A variable that is unset or empty is an error naming it.
    pub(super) fn build(
        sink: &str,
        config: &super::HttpSinkConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Outgoing, HttpSinkError> {
        let url = url_source(sink, &config.url)?;
        let body = config.body_template.as_ref().map(JsonTemplate::parse).transpose().map_err(|e| {
            HttpSinkError::Config { sink: sink.into(), key: "body_template".into(), reason: e.to_string() }
        })?;
        let bad_header = |name: &str, reason: String| HttpSinkError::Config {
            sink: sink.into(),
            key: format!("headers.{name}"),
            reason,
        };
        let read_env = |var: &str, purpose: String| -> Result<String, HttpSinkError> {
            env(var).filter(|v| !v.is_empty()).ok_or_else(|| HttpSinkError::MissingEnv {
                sink: sink.into(),
                var: var.into(),
                purpose,
            })
        };
        let auth_set = config.auth.is_some();
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header = check_header_name(name, auth_set).map_err(|r| bad_header(name, r))?;
            let value =
                HeaderValue::from_str(value).map_err(|_| bad_header(name, "is not a valid header value".into()))?;
            headers.insert(header, value);
        }
        for (name, var) in &config.headers_from_env {
            let header = check_header_name(name, auth_set).map_err(|r| bad_header(name, r))?;
            let mut value = HeaderValue::from_str(&read_env(var, format!("header `{name}`"))?)
                .map_err(|_| bad_header(name, format!("the value of ${var} is not a valid header value")))?;
            // Environment headers are usually secrets (API keys): keep them out of debug output.
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        if let Some(auth) = &config.auth {
            let credentials = match (&auth.bearer_env, &auth.basic_user, &auth.basic_password_env) {
                (Some(var), None, None) => {
                    format!("Bearer {}", read_env(var, "auth.bearer_env".into())?)
                }
                (None, Some(user), Some(var)) => {
                    let password = read_env(var, "auth.basic_password_env".into())?;
                    format!("Basic {}", base64(format!("{user}:{password}").as_bytes()))
                }
                _ => {
                    return Err(HttpSinkError::Config {
                        sink: sink.into(),
                        key: "auth".into(),
                        reason: "set bearer_env, or basic_user with basic_password_env".into(),
                    });
                }
            };
            let mut value = HeaderValue::from_str(&credentials).map_err(|_| HttpSinkError::Config {
                sink: sink.into(),
                key: "auth".into(),
                reason: "the credentials are not a valid header value".into(),
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        Ok(Outgoing { url, body, headers })
    }

    /// The URL of one request; `Err` (permanent) when a field is missing or the rendered
    /// URL does not parse.
    pub(super) fn url(&self, payload: &Value) -> Result<reqwest::Url, String> {
        self.url.render(payload).map_err(|e| format!("url: {e}"))
    }

    /// The JSON body of one request: the payload, or the body template rendered from it.
    pub(super) fn body<'p>(&self, payload: &'p Value) -> Result<Cow<'p, Value>, TemplateError> {
        match &self.body {
            Some(template) => template.render(payload).map(Cow::Owned),
            None => Ok(Cow::Borrowed(payload)),
        }
    }

    /// The configured headers (static, from the environment, auth).
    pub(super) fn headers(&self) -> &HeaderMap {
        &self.headers
    }
}

/// A fixed URL, or a template whose literal start fixes the scheme and the whole authority
/// (user, host, port), so that a payload value can only fill path segments, query values or
/// the fragment, and whose shape parses when fields are filled in.
pub(super) fn url_source(sink: &str, url: &str) -> Result<UrlSource, HttpSinkError> {
    let invalid = |reason: String| HttpSinkError::InvalidUrl { sink: sink.into(), url: url.into(), reason };
    let template = StringTemplate::parse(url).map_err(|e| invalid(e.to_string()))?;
    let prefix = template.literal_prefix();
    let Some(after_scheme) = prefix.strip_prefix("http://").or_else(|| prefix.strip_prefix("https://")) else {
        return Err(invalid("must start with http:// or https:// (written out, not from a field)".into()));
    };
    if template.has_fields() && !after_scheme.contains(['/', '?', '#']) {
        return Err(invalid(
            "a placeholder cannot stand in the host, port or user name: write the address out up to the first `/`, \
             `?` or `#` (`https://api.example/{/tenant}/orders`)"
                .into(),
        ));
    }
    let sample_text = template.render_with("x");
    let sample = reqwest::Url::parse(&sample_text).map_err(|e| invalid(e.to_string()))?;
    if template.has_fields() {
        Ok(UrlSource::Template { template, sample, sample_dots: dot_segments(&sample_text) })
    } else {
        Ok(UrlSource::Fixed(sample))
    }
}

/// How many path segments of URL text (`scheme://authority/path?query#fragment`) are
/// exactly `.` or `..`, the segments URL parsing removes.
fn dot_segments(text: &str) -> usize {
    let after_scheme = text.split_once("://").map_or(text, |(_, rest)| rest);
    let path = after_scheme.find('/').map_or("", |at| &after_scheme[at..]);
    let path = path.split(['?', '#']).next().unwrap_or("");
    path.split('/').filter(|segment| matches!(*segment, "." | "..")).count()
}

/// Whether two URLs have the same scheme, user, host and port.
fn same_authority(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.username() == b.username()
        && a.password() == b.password()
        && a.host() == b.host()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Standard base64 with padding (RFC 4648 §4), for basic-auth credentials.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Checks what can be checked without the environment (for config validation).
pub(super) fn validate(config: &super::HttpSinkConfig, problems: &mut Problems) {
    match url_source("", &config.url) {
        Ok(_) => {}
        Err(HttpSinkError::InvalidUrl { reason, .. }) => problems.add("url", config.url.clone(), reason),
        Err(other) => problems.add("url", config.url.clone(), other.to_string()),
    }
    let auth_set = config.auth.is_some();
    for (name, value) in &config.headers {
        if let Err(reason) = check_header_name(name, auth_set) {
            problems.add("headers", name.clone(), reason);
        }
        if HeaderValue::from_str(value).is_err() {
            problems.add(&format!("headers.{name}"), value.clone(), "is not a valid header value");
        }
    }
    for (name, var) in &config.headers_from_env {
        if let Err(reason) = check_header_name(name, auth_set) {
            problems.add("headers_from_env", name.clone(), reason);
        }
        if var.trim().is_empty() {
            problems.add(&format!("headers_from_env.{name}"), "\"\"", "must name an environment variable");
        }
    }
    if let Some(auth) = &config.auth {
        auth.validate(problems);
    }
    if let Some(body) = &config.body_template
        && let Err(e) = JsonTemplate::parse(body)
    {
        problems.add("body_template", body.to_string(), e.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn auth_shapes() {
        let ok = |a: HttpAuthConfig| Problems::found_by("sinks.h", |p| a.validate(p)).is_empty();
        assert!(ok(HttpAuthConfig { bearer_env: Some("T".into()), ..Default::default() }));
        assert!(ok(HttpAuthConfig {
            basic_user: Some("u".into()),
            basic_password_env: Some("P".into()),
            ..Default::default()
        }));
        assert!(!ok(HttpAuthConfig::default()));
        assert!(!ok(HttpAuthConfig { basic_user: Some("u".into()), ..Default::default() }));
        assert!(!ok(HttpAuthConfig {
            bearer_env: Some("T".into()),
            basic_user: Some("u".into()),
            ..Default::default()
        }));
    }

    #[test]
    fn reserved_and_invalid_header_names_are_refused() {
        assert!(check_header_name("X-Api-Key", true).is_ok());
        assert!(check_header_name("Idempotency-Key", false).is_err());
        assert!(check_header_name("bad header", false).is_err());
        assert!(check_header_name("Authorization", false).is_ok());
        assert!(check_header_name("Authorization", true).is_err());
    }

    #[test]
    fn url_templates_must_fix_the_scheme() {
        assert!(url_source("s", "https://api.test/x/{/id}").is_ok());
        assert!(matches!(url_source("s", "{/base}/x"), Err(HttpSinkError::InvalidUrl { .. })));
        assert!(matches!(url_source("s", "https://api.test/{/id"), Err(HttpSinkError::InvalidUrl { .. })));
        assert!(matches!(url_source("s", "ftp://x/"), Err(HttpSinkError::InvalidUrl { .. })));
    }

    #[test]
    fn url_templates_must_write_the_authority_out() {
        for url in ["https://{/host}/x", "https://api.test{/s}/x", "https://api.test:{/port}/", "https://{/u}@a.test/"]
        {
            assert!(matches!(url_source("s", url), Err(HttpSinkError::InvalidUrl { .. })), "{url}");
        }
        assert!(url_source("s", "https://api.test?x={/v}").is_ok());
        // A fixed URL has no placeholder, whatever it contains.
        assert!(matches!(url_source("s", "https://api.test"), Ok(UrlSource::Fixed(_))));
    }

    #[test]
    fn a_dot_segment_value_cannot_climb_out_of_its_path_segment() {
        let Ok(source) = url_source("s", "https://api.test/tenants/{/t}/orders?q={/t}") else { panic!("valid") };
        let outgoing = Outgoing { url: source, body: None, headers: HeaderMap::new() };
        for value in ["..", "."] {
            let err = outgoing.url(&serde_json::json!({ "t": value })).unwrap_err();
            assert!(err.contains("path segment"), "{value}: {err}");
        }
        // A whole segment at the root: parsing leaves one (empty) segment, as many as before.
        let Ok(root) = url_source("s", "https://api.test/{/t}") else { panic!("valid") };
        let at_root = Outgoing { url: root, body: None, headers: HeaderMap::new() };
        for value in ["..", "."] {
            let err = at_root.url(&serde_json::json!({ "t": value })).unwrap_err();
            assert!(err.contains("path segment"), "{value}: {err}");
        }
        assert_eq!(at_root.url(&serde_json::json!({ "t": "a.b" })).unwrap().path(), "/a.b");
        let url = outgoing.url(&serde_json::json!({ "t": "..." })).unwrap();
        assert_eq!(url.path(), "/tenants/.../orders");
        assert_eq!(url.query(), Some("q=..."));
        // `%` is escaped, so an encoded dot stays text.
        let url = outgoing.url(&serde_json::json!({ "t": "%2e%2E" })).unwrap();
        assert_eq!(url.path(), "/tenants/%252e%252E/orders");
    }

    #[test]
    fn rendered_urls_keep_the_configured_origin() {
        let Ok(source) = url_source("s", "https://api.test:8443/{/tenant}/orders") else { panic!("a valid template") };
        let outgoing = Outgoing { url: source, body: None, headers: HeaderMap::new() };
        for (tenant, path) in
            [("evil.com/x", "/evil.com%2Fx/orders"), ("@evil.com", "/%40evil.com/orders"), ("x:1", "/x%3A1/orders")]
        {
            let url = outgoing.url(&serde_json::json!({ "tenant": tenant })).unwrap();
            assert_eq!((url.host_str(), url.port(), url.path()), (Some("api.test"), Some(8443), path), "{tenant}");
        }
    }
}

//! The `smtp` sink: sends one email per command through an SMTP relay (lettre, tokio,
//! rustls).
//!
//! The payload is a JSON object with these fields and no others:
//! - `from`: one address (`"a@example.com"` or `"Name <a@example.com>"`); optional when the
//!   sink has a `from` default;
//! - `to`: one address or a list of them (at least one); `cc`: the same, optional;
//! - `subject`: optional text;
//! - `text` and/or `html`: the body (at least one; both make a `multipart/alternative`).
//!
//! Anything else, or an address that does not parse, is a permanent failure naming the
//! field: retrying the same payload cannot help.
//!
//! The key becomes the `Message-ID`, `<ENCODED@message_id_domain>` (see [`message_id`]),
//! on every attempt, so a relay or mailbox that drops repeated Message-IDs sees one message
//! per key. `forward_key` (default false) only *declares* that it does: it decides whether
//! a claim orphaned by a crash is re-run with the same Message-ID (true) or becomes
//! `indeterminate` (false), docs/contract.md §4.
//!
//! Failures: an SMTP 4xx reply, a connection, TLS or timeout error, or a malformed reply is
//! transient; a 5xx reply (e.g. a rejected recipient or bad credentials) is permanent.
//!
//! What the engine learns of each call ([`crate::sinks::CallAnswer`], [`session`]): any reply
//! with a code, at any step, *answered* it; a failure while setting up the session (connect,
//! TLS, greeting, EHLO, STARTTLS, AUTH) means it was *never sent*; any other failure from
//! MAIL FROM on (a timeout or a reset waiting for the reply to the message's end) *may*
//! have delivered it. The sink has no check: SMTP gives no way to ask a relay whether it
//! delivered a message, so a call that may have landed leaves a key that does not forward
//! the key `indeterminate`.
//!
//! The result stored and replayed to repeats is
//! `{"message_id": "<...>", "code": 250, "reply": "<the relay's reply text>"}`.

mod session;

use std::fmt;
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lettre::Message;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use self::session::{Cause, Failed, Relay, Secure};
use super::{CallAnswer, Problem, Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput, SinkRequest};

/// How the connection to the relay is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SmtpTls {
    /// Plain text; only allowed to a loopback host (a local relay or a test server).
    None,
    /// Plain connect, then STARTTLS, which the relay must offer (default port 587).
    #[default]
    Starttls,
    /// TLS from the first byte (implicit TLS, default port 465).
    Tls,
}

/// Config of an `smtp` sink.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpSinkConfig {
    /// Rate and concurrency limits (`[sinks.NAME.limits]`, see docs/sinks.md).
    #[serde(default)]
    pub limits: crate::sinks::limit::SinkLimits,
    /// The circuit breaker (`[sinks.NAME.circuit]`, see docs/sinks.md).
    #[serde(default)]
    pub circuit: crate::sinks::circuit::CircuitConfig,
    /// The relay's host name or IP address.
    pub host: String,
    /// The relay's port; default 25 with `tls = "none"`, 587 with `starttls`, 465 with `tls`.
    #[serde(default)]
    pub port: Option<NonZeroU16>,
    /// `"none"` (loopback only), `"starttls"` (default) or `"tls"`.
    #[serde(default)]
    pub tls: SmtpTls,
    /// User name for SMTP AUTH; needs `password` or `password_env`.
    #[serde(default)]
    pub username: Option<String>,
    /// Password for SMTP AUTH (prefer `password_env`).
    #[serde(default)]
    pub password: Option<String>,
    /// Name of the environment variable holding the password, read when the sink is built.
    #[serde(default)]
    pub password_env: Option<String>,
    /// PEM file of extra root certificates to trust besides the system's (a relay with a
    /// private CA); read when the sink is built.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Bound on each step of a call: connecting (TCP, TLS, greeting, EHLO), STARTTLS, AUTH,
    /// and each command's reply, the message's end included.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Right-hand side of every Message-ID, e.g. `mail.example.com`.
    pub message_id_domain: String,
    /// Whether the relay or recipients drop repeated Message-IDs (then crash re-runs are
    /// safe; otherwise an orphaned claim becomes `indeterminate`).
    #[serde(default)]
    pub forward_key: bool,
    /// Sender used when the payload has no `from`.
    #[serde(default)]
    pub from: Option<String>,
    /// Name sent in EHLO; default `localhost`.
    #[serde(default)]
    pub helo_name: Option<String>,
}

impl fmt::Debug for SmtpSinkConfig {
    /// Like the derived one, without the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpSinkConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_env", &self.password_env)
            .field("ca_file", &self.ca_file)
            .field("timeout", &self.timeout)
            .field("message_id_domain", &self.message_id_domain)
            .field("forward_key", &self.forward_key)
            .field("from", &self.from)
            .field("helo_name", &self.helo_name)
            .finish()
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Whether `host` names this machine: the only place a plain-text connection may go.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A domain usable after the `@` of a Message-ID: dot-separated labels of letters, digits
/// and hyphens.
fn is_domain(domain: &str) -> bool {
    !domain.is_empty()
        && domain.len() <= 253
        && domain
            .split('.')
            .all(|label| !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

impl SinkKind for SmtpSinkConfig {
    fn limits(&self) -> &crate::sinks::limit::SinkLimits {
        &self.limits
    }

    fn circuit(&self) -> &crate::sinks::circuit::CircuitConfig {
        &self.circuit
    }

    fn validate(&self, problems: &mut Problems) {
        if self.host.trim().is_empty() {
            problems.add("host", self.host.clone(), "must name the relay");
        } else if self.tls == SmtpTls::None && !is_loopback(&self.host) {
            problems.add("tls", "none", "plain text is only allowed to a loopback host; use starttls or tls");
        }
        if self.timeout.is_zero() {
            problems.add("timeout", "0s", "must be positive");
        }
        if let Some(path) = &self.ca_file
            && self.tls == SmtpTls::None
        {
            problems.add("ca_file", path.display().to_string(), "needs tls = \"starttls\" or \"tls\"");
        }
        if !is_domain(&self.message_id_domain) {
            problems.add(
                "message_id_domain",
                self.message_id_domain.clone(),
                "must be a domain (letters, digits, '-', dots)",
            );
        }
        match (&self.username, &self.password, &self.password_env) {
            (_, Some(_), Some(_)) => problems.add("password_env", "", "set password or password_env, not both"),
            (Some(_), None, None) => problems.add("username", "", "needs password or password_env"),
            (None, Some(_), _) | (None, _, Some(_)) => problems.add("username", "", "a password needs a username"),
            _ => {}
        }
        if let Some(from) = &self.from
            && let Err(e) = from.parse::<Mailbox>()
        {
            problems.add("from", from.clone(), format!("not an email address: {e}"));
        }
        if let Some(name) = &self.helo_name
            && !is_domain(name)
        {
            problems.add("helo_name", name.clone(), "must be a domain");
        }
    }

    fn forwards_key(&self) -> bool {
        self.forward_key
    }

    fn call_holds_a_resource(&self) -> bool {
        // A connection per call in flight.
        true
    }

    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        Ok(Arc::new(SmtpSink::new(name, self)?))
    }
}

/// What [`message_id`] escapes: every byte but ASCII letters, digits and `- _ + =`.
const MESSAGE_ID_ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'+').remove(b'=');

/// The `Message-ID` for `key`: `<ENCODED@domain>`. ASCII letters, digits and `- _ + =`
/// stay as they are; every other byte of the key's UTF-8 becomes `%XX` (upper-case hex),
/// so the encoding is injective and the same key always gives the same Message-ID. An
/// encoding longer than 200 characters is replaced by `sha256.<hex of SHA-256(key)>`
/// (unambiguous: encoded keys never contain a dot), keeping the header line short.
pub fn message_id(key: &str, domain: &str) -> String {
    let mut encoded = utf8_percent_encode(key, MESSAGE_ID_ESCAPED).to_string();
    if encoded.len() > 200 {
        encoded = format!("sha256.{}", hex::encode(Sha256::digest(key.as_bytes())));
    }
    format!("<{encoded}@{domain}>")
}

/// An `smtp` sink at run time.
pub struct SmtpSink {
    config: SmtpSinkConfig,
    default_from: Option<Mailbox>,
    relay: Relay,
}

impl SmtpSink {
    /// Builds the sink: checks the config, reads `password_env`, prepares TLS.
    pub fn new(name: &str, config: &SmtpSinkConfig) -> Result<SmtpSink, SinkBuildError> {
        let fail = |reason: String| SinkBuildError { name: name.to_string(), reason };
        if let Some(Problem { key, value, reason }) = config.problems(&format!("sinks.{name}")).into_iter().next() {
            return Err(fail(format!("{key} = {value:?}: {reason}")));
        }
        let password = match (&config.password, &config.password_env) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|e| fail(format!("password_env {var}: {e}")))?),
            (None, None) => None,
        };
        let credentials =
            config.username.clone().zip(password).map(|(user, password)| Credentials::new(user, password));
        let default_from =
            config.from.as_deref().map(str::parse::<Mailbox>).transpose().map_err(|e| fail(format!("from: {e}")))?;
        let secure = match config.tls {
            SmtpTls::None => Secure::None,
            SmtpTls::Starttls | SmtpTls::Tls => {
                let mut params = TlsParameters::builder(config.host.clone());
                if let Some(path) = &config.ca_file {
                    let pem = std::fs::read(path).map_err(|e| fail(format!("ca_file {}: {e}", path.display())))?;
                    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                        return Err(fail(format!("ca_file {}: no PEM certificate in it", path.display())));
                    }
                    let roots =
                        Certificate::from_pem(&pem).map_err(|e| fail(format!("ca_file {}: {e}", path.display())))?;
                    params = params.add_root_certificate(roots);
                }
                let params = params.build().map_err(|e| fail(format!("TLS setup: {e}")))?;
                if config.tls == SmtpTls::Tls { Secure::Implicit(params) } else { Secure::Starttls(params) }
            }
        };
        let port = config.port.map(NonZeroU16::get).unwrap_or(match config.tls {
            SmtpTls::None => 25,
            SmtpTls::Starttls => 587,
            SmtpTls::Tls => 465,
        });
        let hello = ClientId::Domain(config.helo_name.clone().unwrap_or_else(|| "localhost".into()));
        let relay = Relay::new(config.host.clone(), port, secure, hello, credentials, config.timeout);
        Ok(SmtpSink { config: config.clone(), default_from, relay })
    }

    /// The message for one request; `Err` says which payload field is wrong.
    fn message(&self, request: &SinkRequest<'_>, message_id: &str) -> Result<Message, String> {
        let fields = request.payload().as_object().ok_or("the payload must be a JSON object")?;
        if let Some(unknown) =
            fields.keys().find(|k| !matches!(k.as_str(), "from" | "to" | "cc" | "subject" | "text" | "html"))
        {
            return Err(format!("unknown payload field `{unknown}` (expected from, to, cc, subject, text, html)"));
        }
        let from = match fields.get("from") {
            Some(value) => mailbox("from", value)?,
            None => self.default_from.clone().ok_or("`from` is missing and the sink has no default `from`")?,
        };
        let to = mailboxes("to", fields.get("to").ok_or("`to` is missing")?)?;
        if to.is_empty() {
            return Err("`to` names no recipient".into());
        }
        let cc = fields.get("cc").map(|v| mailboxes("cc", v)).transpose()?.unwrap_or_default();
        let mut builder = Message::builder().message_id(Some(message_id.to_string())).from(from);
        for mailbox in to {
            builder = builder.to(mailbox);
        }
        for mailbox in cc {
            builder = builder.cc(mailbox);
        }
        if let Some(subject) = text_field(fields, "subject")? {
            builder = builder.subject(subject);
        }
        let built = match (text_field(fields, "text")?, text_field(fields, "html")?) {
            (Some(text), Some(html)) => builder.multipart(MultiPart::alternative_plain_html(text, html)),
            (Some(text), None) => builder.singlepart(SinglePart::plain(text)),
            (None, Some(html)) => builder.singlepart(SinglePart::html(html)),
            (None, None) => return Err("the payload needs `text` or `html` (or both)".into()),
        };
        built.map_err(|e| format!("cannot build the message: {e}"))
    }
}

/// An optional string field.
fn text_field(fields: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("`{name}` must be a string, not {other}")),
    }
}

fn mailbox(field: &str, value: &Value) -> Result<Mailbox, String> {
    let text = value.as_str().ok_or_else(|| format!("`{field}` must be an address string, not {value}"))?;
    text.parse::<Mailbox>().map_err(|e| format!("`{field}`: {text:?} is not an email address ({e})"))
}

/// One address or a list of them.
fn mailboxes(field: &str, value: &Value) -> Result<Vec<Mailbox>, String> {
    match value {
        Value::Array(items) => items.iter().map(|item| mailbox(field, item)).collect(),
        single => Ok(vec![mailbox(field, single)?]),
    }
}

/// Sorts a failed call into transient (4xx, connection, TLS, timeout, bad reply) and
/// permanent (5xx, or a relay that cannot take the message as configured).
fn classify(failed: &Failed, message_id: &str) -> SinkError {
    let message = format!("SMTP send failed: {failed}");
    let (permanent, code) = match &failed.cause {
        Cause::Smtp(err) => (err.is_permanent() || err.is_client(), err.status().map(u16::from)),
        Cause::Unsupported(_) => (true, None),
        Cause::TimedOut { .. } => (false, None),
    };
    if permanent {
        SinkError::Permanent {
            result: json!({ "message_id": message_id, "code": code, "error": failed.to_string() }),
            message,
        }
    } else {
        SinkError::Transient { message, retry_after: None }
    }
}

#[async_trait::async_trait]
impl SinkEffect for SmtpSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let message_id = message_id(request.key(), &self.config.message_id_domain);
        let message = self.message(&request, &message_id).map_err(|message| {
            request.never_sent();
            SinkError::Permanent {
                result: json!({ "message_id": Value::Null, "error": message }),
                message: format!("bad email payload: {message}"),
            }
        })?;
        match self.relay.send(&message).await {
            Ok(response) => {
                request.answered();
                let reply: Vec<&str> = response.message().collect();
                Ok(json!({ "message_id": message_id, "code": u16::from(response.code()), "reply": reply.join("\n") }))
            }
            Err(failed) => {
                match failed.answer() {
                    CallAnswer::Answered => request.answered(),
                    CallAnswer::NeverSent => request.never_sent(),
                    // Said by saying nothing.
                    CallAnswer::Maybe => {}
                }
                Err(classify(&failed, &message_id))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_safe_injective_and_stable() {
        assert_eq!(message_id("order-42", "mail.example"), "<order-42@mail.example>");
        assert_eq!(message_id("a b<c>@d.ü%", "x.y"), "<a%20b%3Cc%3E%40d%2E%C3%BC%25@x.y>");
        // '%' itself is encoded, so a key that looks encoded cannot collide.
        assert_ne!(message_id("a%20b", "x"), message_id("a b", "x"));
        assert_eq!(message_id("k", "x"), message_id("k", "x"));
        let long = "é".repeat(100);
        let id = message_id(&long, "x");
        assert!(id.starts_with("<sha256.") && id.len() < 100, "{id}");
    }

    #[test]
    fn validation_names_the_key() {
        let base = "host = \"127.0.0.1\"\ntls = \"none\"\nmessage_id_domain = \"mail.example\"\n";
        let ok: SmtpSinkConfig = toml::from_str(base).unwrap();
        assert_eq!(ok.problems("sinks.m"), vec![]);
        assert!(!ok.forwards_key(), "does not forward the key unless configured");
        let cases = [
            ("host = \"smtp.example.com\"\ntls = \"none\"\nmessage_id_domain = \"x\"", "sinks.m.tls"),
            (&format!("{base}username = \"u\""), "sinks.m.username"),
            (&format!("{base}password = \"p\""), "sinks.m.username"),
            (&format!("{base}username = \"u\"\npassword = \"p\"\npassword_env = \"P\""), "sinks.m.password_env"),
            ("host = \"::1\"\ntls = \"none\"\nmessage_id_domain = \"a..b\"", "sinks.m.message_id_domain"),
            (&format!("{base}from = \"not an address\""), "sinks.m.from"),
            (&format!("{base}ca_file = \"/etc/ca.pem\""), "sinks.m.ca_file"),
        ];
        for (text, key) in cases {
            let config: SmtpSinkConfig = toml::from_str(text).unwrap();
            assert_eq!(config.problems("sinks.m")[0].key, key, "{text}");
        }
    }

    #[test]
    fn debug_output_hides_the_password() {
        let config: SmtpSinkConfig =
            toml::from_str("host = \"localhost\"\nmessage_id_domain = \"x\"\nusername = \"u\"\npassword = \"hunter2\"")
                .unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}

//! The `[intake]` section: the HTTP door in front of the pipeline (docs/intake.md). Off
//! unless the section is present.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::connection::PropertyValue;
use crate::problems::Problems;

/// The intake's listener, limits and clients.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeConfig {
    /// Address of the intake's own listener (never the metrics and admin one).
    pub listen: SocketAddr,
    /// The input topic requests are produced to: one of `kafka.input_topics`; the first of
    /// them when unset.
    #[serde(default)]
    pub topic: Option<String>,
    /// How long a request waits for its command's result before it is answered 202 with
    /// the place to poll.
    #[serde(default = "default_wait", with = "humantime_serde")]
    pub wait: Duration,
    /// Largest request body, in bytes; a larger one is refused with 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// TLS on the intake's listener; plain HTTP when unset.
    #[serde(default)]
    pub tls: Option<IntakeTls>,
    /// The commands offered as MCP tools at `/mcp`, by tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, IntakeTool>,
    /// The `Host` names `/mcp` answers (its guard against DNS rebinding); add the names
    /// clients reach it by.
    #[serde(default = "default_mcp_hosts")]
    pub mcp_allowed_hosts: Vec<String>,
    /// Who may call, by name: each client's API key and rate. A client's idempotency keys
    /// are its own.
    #[serde(default)]
    pub clients: BTreeMap<String, IntakeClient>,
}

/// The intake's certificate and key (PEM files, read at start).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeTls {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// A command offered as an MCP tool.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeTool {
    /// The command type a call runs (a route must take it).
    #[serde(rename = "type")]
    pub kind: String,
    /// What the tool does, for the agent choosing it.
    pub description: String,
    /// A JSON Schema of the call's arguments, the command's payload (an object);
    /// `idempotency_key` is added to it. Any object when unset.
    #[serde(default = "any_object")]
    pub input_schema: serde_json::Map<String, serde_json::Value>,
}

fn any_object() -> serde_json::Map<String, serde_json::Value> {
    let mut schema = serde_json::Map::new();
    schema.insert("type".into(), "object".into());
    schema
}

fn default_mcp_hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

/// One client of the intake.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeClient {
    /// The API key it sends as `Authorization: Bearer KEY`: written, `{ env = "NAME" }` or
    /// `{ file = "PATH" }`.
    pub api_key: PropertyValue,
    /// Requests per second it may make on average; past it, 429 with `Retry-After`.
    #[serde(default = "default_rate")]
    pub rate_per_second: u32,
    /// Requests it may make at once after a quiet period; `rate_per_second` when unset.
    #[serde(default)]
    pub burst: Option<u32>,
}

fn default_wait() -> Duration {
    Duration::from_secs(10)
}

fn default_max_body_bytes() -> usize {
    1024 * 1024
}

fn default_rate() -> u32 {
    100
}

/// Shortest API key accepted: a key guessable in a few tries is no key.
pub const MIN_API_KEY_CHARS: usize = 16;

impl IntakeClient {
    /// The bucket size: `burst`, else the rate (never 0: validation refuses a 0 rate).
    pub fn burst(&self) -> NonZeroU32 {
        NonZeroU32::new(self.burst.unwrap_or(self.rate_per_second)).unwrap_or(NonZeroU32::MIN)
    }
}

impl IntakeConfig {
    /// `[intake]` on its own, keys under `problems`' `intake`. Keys read from the
    /// environment or files are read now, so that a missing secret stops the start.
    pub fn validate(&self, problems: &mut Problems) {
        if self.wait.is_zero() {
            problems.add("wait", "0s", "must be positive");
        }
        if self.max_body_bytes == 0 {
            problems.add("max_body_bytes", 0, "must be positive");
        }
        if let Some(tls) = &self.tls
            && let Err(why) = super::tls::server_config(&tls.cert_file, &tls.key_file)
        {
            problems.add("tls", format!("{:?}", tls.cert_file.display().to_string()), why);
        }
        for (name, tool) in &self.tools {
            let valid = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
            if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
                problems.add(
                    &format!("tools.{name:?}"),
                    format!("{name:?}"),
                    "a tool's name is 1 to 64 letters, digits, '_', '-' or '.'",
                );
            }
            problems.within(&format!("tools.{name}"), |p| tool.validate(p));
        }
        if self.clients.is_empty() {
            problems.add("clients", "{}", "must name at least one client: the intake answers only clients it knows");
        }
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        for (name, client) in &self.clients {
            if name.is_empty() || name.contains('/') || name.chars().any(char::is_control) {
                problems.add(
                    &format!("clients.{name:?}"),
                    format!("{name:?}"),
                    "a client's name must be non-empty, without '/' or control characters",
                );
            }
            problems.within(&format!("clients.{name}"), |p| client.validate(name, &mut seen, p));
        }
    }
}

impl IntakeTool {
    fn validate(&self, problems: &mut Problems) {
        if self.kind.trim().is_empty() {
            problems.add("type", "\"\"", "must name a command type");
        }
        if self.input_schema.get("type").is_some_and(|t| t != "object") {
            problems.add(
                "input_schema.type",
                self.input_schema["type"].to_string(),
                "must be \"object\": the arguments are the payload",
            );
        }
        if self.input_schema.get("properties").and_then(|p| p.get(super::mcp::KEY_ARGUMENT)).is_some() {
            problems.add(
                "input_schema.properties",
                super::mcp::KEY_ARGUMENT,
                "is the intake's own argument, added to every tool",
            );
        }
    }
}

impl IntakeClient {
    fn validate<'a>(&self, name: &'a str, seen: &mut BTreeMap<String, &'a str>, problems: &mut Problems) {
        if self.rate_per_second == 0 {
            problems.add("rate_per_second", 0, "must be positive");
        }
        if self.burst == Some(0) {
            problems.add("burst", 0, "must be positive");
        }
        match self.api_key.resolve() {
            Err(e) => problems.add("api_key", self.api_key.shown(true), e.to_string()),
            Ok(key) if key.chars().count() < MIN_API_KEY_CHARS => problems.add(
                "api_key",
                self.api_key.shown(true),
                format!("must be at least {MIN_API_KEY_CHARS} characters"),
            ),
            Ok(key) => {
                if let Some(other) = seen.insert(key, name) {
                    problems.add("api_key", self.api_key.shown(true), format!("is also intake.clients.{other}'s"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intake(extra: &str) -> IntakeConfig {
        let text = format!("listen = \"127.0.0.1:8443\"\n{extra}\n[clients.alice]\napi_key = \"0123456789abcdef\"\n");
        toml::from_str(&text).expect("intake")
    }

    fn problems(c: &IntakeConfig) -> Vec<(String, String)> {
        Problems::found_by("intake", |p| c.validate(p)).into_iter().map(|p| (p.key, p.reason)).collect()
    }

    #[test]
    fn the_smallest_intake_is_valid_with_its_defaults() {
        let c = intake("");
        assert!(problems(&c).is_empty(), "{:?}", problems(&c));
        assert_eq!(
            (c.wait, c.max_body_bytes, c.clients["alice"].rate_per_second),
            (Duration::from_secs(10), 1 << 20, 100)
        );
    }

    #[test]
    fn bad_values_name_their_keys() {
        let c: IntakeConfig = toml::from_str(
            "listen = \"127.0.0.1:8443\"\nwait = \"0s\"\n[tls]\ncert_file = \"/nonexistent/c.pem\"\nkey_file = \"/nonexistent/k.pem\"\n\
             [clients.alice]\napi_key = \"short\"\nrate_per_second = 0\n[clients.bob]\napi_key = { env = \"DEDUPD_TEST_UNSET_INTAKE_KEY\" }\n",
        )
        .expect("parses");
        let found = problems(&c);
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "intake.wait",
                "intake.tls",
                "intake.clients.alice.rate_per_second",
                "intake.clients.alice.api_key",
                "intake.clients.bob.api_key"
            ],
            "{found:?}"
        );
        assert!(found[1].1.contains("/nonexistent/c.pem"), "{found:?}");
        assert!(found[4].1.contains("DEDUPD_TEST_UNSET_INTAKE_KEY"), "{found:?}");
    }

    #[test]
    fn two_clients_may_not_share_a_key_and_none_is_no_intake() {
        let c: IntakeConfig = toml::from_str(
            "listen = \"127.0.0.1:8443\"\n[clients.alice]\napi_key = \"0123456789abcdef\"\n[clients.bob]\napi_key = \"0123456789abcdef\"\n",
        )
        .expect("parses");
        assert_eq!(
            problems(&c),
            [("intake.clients.bob.api_key".to_string(), "is also intake.clients.alice's".to_string())]
        );
        let none: IntakeConfig = toml::from_str("listen = \"127.0.0.1:8443\"\n").expect("parses");
        assert_eq!(problems(&none)[0].0, "intake.clients");
    }
}

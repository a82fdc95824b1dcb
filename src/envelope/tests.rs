//! Envelope tests: every shape, key source and rejection reason; never a panic. The topics
//! are the child modules below; the router, record builder and sample values they share
//! are here.

use super::*;
use crate::routes::RouteConfig;
use std::num::NonZeroUsize;

mod fields;
mod keys;
mod rejections;
mod robustness;
mod shapes;

const HOUR: u64 = 3600;
const TS: i64 = 1_700_000_000_000;

fn route(name: &str, types: &[&str], ttl: Option<u64>, exclude: &[&str]) -> RouteConfig {
    RouteConfig {
        name: Some(name.into()),
        types: types.iter().map(|s| s.to_string()).collect(),
        sink: format!("{name}-sink"),
        ttl: ttl.map(Duration::from_secs),
        fingerprint_exclude: exclude.iter().map(|s| s.to_string()).collect(),
    }
}

/// Routes: `email.*` (1h, excludes /payload/request_id), `charge_card`, `com.example.*`,
/// `plain` (no ttl). No default route. default_ttl 24h, max_ttl 7d.
fn router() -> &'static Router {
    static ROUTER: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
    ROUTER.get_or_init(make_router)
}

fn make_router() -> Router {
    Router::new(
        &[
            route("mail", &["email.*"], Some(HOUR), &["/payload/request_id"]),
            route("billing", &["charge_card"], Some(2 * HOUR), &[]),
            route("events", &["com.example.*"], None, &[]),
            route("plain", &["plain"], None, &[]),
        ],
        Duration::from_secs(24 * HOUR),
        Duration::from_secs(7 * 24 * HOUR),
    )
    .unwrap()
}

fn env() -> EnvelopeConfig {
    EnvelopeConfig::default()
}

fn env_format(format: EnvelopeFormat) -> EnvelopeConfig {
    EnvelopeConfig { format, ..EnvelopeConfig::default() }
}

fn env_key(key: &str) -> EnvelopeConfig {
    EnvelopeConfig { key: key.parse().unwrap(), ..EnvelopeConfig::default() }
}

fn limits(max: usize) -> LimitsConfig {
    LimitsConfig { max_command_bytes: NonZeroUsize::new(max).unwrap() }
}

/// A record builder: value, record key, headers, timestamp.
#[derive(Clone)]
struct Rec {
    value: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    ts: Option<i64>,
}

fn rec(value: &str) -> Rec {
    Rec { value: Some(value.as_bytes().to_vec()), key: None, headers: vec![], ts: Some(TS) }
}

impl Rec {
    fn raw(value: &[u8]) -> Rec {
        Rec { value: Some(value.to_vec()), key: None, headers: vec![], ts: Some(TS) }
    }
    fn h(mut self, name: &str, value: &str) -> Rec {
        self.headers.push((name.into(), Some(value.as_bytes().to_vec())));
        self
    }
    fn hb(mut self, name: &str, value: Option<&[u8]>) -> Rec {
        self.headers.push((name.into(), value.map(<[u8]>::to_vec)));
        self
    }
    fn key(mut self, key: &[u8]) -> Rec {
        self.key = Some(key.to_vec());
        self
    }
    fn ts(mut self, ts: Option<i64>) -> Rec {
        self.ts = ts;
        self
    }
    fn parse_with(&self, envelope: &EnvelopeConfig, limits: &LimitsConfig) -> Result<Command, Rejection> {
        let record = InputRecord {
            topic: "commands",
            partition: 0,
            offset: 7,
            timestamp_ms: self.ts,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            headers: &self.headers,
        };
        parse(&record, envelope, limits, router())
    }
    fn env(&self, envelope: &EnvelopeConfig) -> Result<Command, Rejection> {
        self.parse_with(envelope, &LimitsConfig::default())
    }
    fn ok(&self) -> Command {
        self.env(&env()).unwrap()
    }
    fn err(&self) -> Rejection {
        self.env(&env()).unwrap_err()
    }
}

/// A binary CloudEvent with the given data.
fn binary(data: &str) -> Rec {
    rec(data)
        .h("ce_specversion", "1.0")
        .h("ce_id", "evt-1")
        .h("ce_source", "/billing")
        .h("ce_type", "com.example.charged")
}

const NATIVE: &str = r#"{"id":"k1","type":"email.send","payload":{"to":"a@b","n":1}}"#;
const TOOL: &str = r#"{"tool":"charge_card","arguments":{"amount":5,"idempotency_key":"tk-1"}}"#;
const STRUCTURED: &str =
    r#"{"specversion":"1.0","id":"e1","source":"/orders","type":"com.example.placed","data":{"order":7}}"#;

fn reason(r: Result<Command, Rejection>) -> RejectReason {
    r.unwrap_err().reason
}

fn native_with_key(key: &str) -> String {
    serde_json::json!({"id": key, "type": "email.send", "payload": {}}).to_string()
}

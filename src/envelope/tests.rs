//! Envelope tests: every shape, key source and rejection reason; never a panic.

use super::*;
use crate::routes::RouteConfig;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::num::NonZeroUsize;

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

// ---- shapes, auto mode ----

#[test]
fn auto_detects_native() {
    let c = rec(NATIVE).ok();
    assert_eq!(c.shape, Shape::Native);
    assert_eq!(c.key, "k1");
    assert_eq!(c.kind, "email.send");
    assert_eq!(c.payload, serde_json::json!({"to": "a@b", "n": 1}));
    assert_eq!(c.route, 0);
    assert_eq!(c.ttl, Duration::from_secs(HOUR));
    assert_eq!(c.created_at_ms, None);
    assert_eq!(c.produced_at_ms, Some(TS));
    assert_eq!(c.traceparent, None);
}

#[test]
fn auto_detects_tool_call_and_payload_is_the_whole_arguments() {
    let c = rec(TOOL).ok();
    assert_eq!(c.shape, Shape::ToolCall);
    assert_eq!(c.key, "tk-1");
    assert_eq!(c.kind, "charge_card");
    assert_eq!(c.payload, serde_json::json!({"amount": 5, "idempotency_key": "tk-1"}));
    assert_eq!(c.route, 1);
    assert_eq!(c.ttl, Duration::from_secs(2 * HOUR));
}

#[test]
fn auto_detects_structured_cloudevents() {
    let c = rec(STRUCTURED).ok();
    assert_eq!(c.shape, Shape::CloudEventsStructured);
    assert_eq!(c.key, "/orders/e1");
    assert_eq!(c.kind, "com.example.placed");
    assert_eq!(c.payload, serde_json::json!({"order": 7}));
    assert_eq!(c.route, 2);
    assert_eq!(c.ttl, Duration::from_secs(24 * HOUR));
}

#[test]
fn structured_cloudevent_without_data_has_null_payload() {
    let c = rec(r#"{"specversion":"1.0","id":"e1","source":"s","type":"com.example.x"}"#).ok();
    assert_eq!(c.payload, Value::Null);
}

#[test]
fn auto_detects_binary_cloudevents_with_any_json_data() {
    let c = binary(r#"{"amount": 3}"#).ok();
    assert_eq!(c.shape, Shape::CloudEventsBinary);
    assert_eq!(c.key, "/billing/evt-1");
    assert_eq!(c.kind, "com.example.charged");
    assert_eq!(c.payload, serde_json::json!({"amount": 3}));
    for data in ["[1,2]", "\"text\"", "42", "null", "true"] {
        let c = binary(data).ok();
        assert_eq!(c.payload, serde_json::from_str::<Value>(data).unwrap(), "{data}");
    }
}

#[test]
fn binary_cloudevent_headers_match_case_insensitively_and_last_wins() {
    let c = rec("{}")
        .h("CE_SpecVersion", "1.0")
        .h("ce_id", "old")
        .h("Ce_Id", "new")
        .h("CE_SOURCE", "src")
        .h("ce_type", "com.example.a")
        .ok();
    assert_eq!(c.key, "src/new");
    assert_eq!(c.shape, Shape::CloudEventsBinary);
}

#[test]
fn native_is_detected_by_any_of_id_type_payload() {
    // Each alone is enough to be read as native; the other fields then fail on their own.
    assert_eq!(rec(r#"{"id":"k"}"#).err().reason, RejectReason::MissingType);
    assert_eq!(rec(r#"{"type":"email.send"}"#).err().reason, RejectReason::MissingKey);
    assert_eq!(rec(r#"{"payload":{}}"#).err().reason, RejectReason::MissingKey);
}

#[test]
fn detection_order_is_specversion_then_tool_then_native() {
    let both = r#"{"specversion":"1.0","tool":"charge_card","id":"e","source":"s","type":"com.example.x"}"#;
    assert_eq!(rec(both).ok().shape, Shape::CloudEventsStructured);
    let tool_and_id = r#"{"tool":"charge_card","id":"x","arguments":{"idempotency_key":"k"}}"#;
    assert_eq!(rec(tool_and_id).ok().shape, Shape::ToolCall);
    // A ce_specversion header beats anything in the value.
    assert_eq!(binary(NATIVE).ok().shape, Shape::CloudEventsBinary);
}

#[test]
fn object_of_no_shape_is_bad_envelope() {
    let r = rec(r#"{"hello":"world"}"#).err();
    assert_eq!(r.reason, RejectReason::BadEnvelope);
    assert!(r.message.contains("specversion"), "{}", r.message);
    assert_eq!(rec("{}").err().reason, RejectReason::BadEnvelope);
}

// ---- pinned formats ----

#[test]
fn pinned_native() {
    let e = env_format(EnvelopeFormat::Native);
    assert_eq!(rec(NATIVE).env(&e).unwrap().shape, Shape::Native);
    let r = rec(TOOL).env(&e).unwrap_err();
    assert_eq!(r.reason, RejectReason::BadEnvelope);
    assert!(r.message.contains("tool call") && r.message.contains("native"), "{}", r.message);
    assert_eq!(reason(rec(r#"{"specversion":"1.0","source":"s"}"#).env(&e)), RejectReason::BadEnvelope);
    assert_eq!(reason(binary("{}").env(&e)), RejectReason::BadEnvelope);
    // A native command with an extra `tool` member is read as native when pinned.
    let extra = r#"{"id":"k","type":"email.send","payload":1,"tool":"x"}"#;
    assert_eq!(rec(extra).env(&e).unwrap().shape, Shape::Native);
    // In auto mode `tool` wins, and a tool call needs `arguments`.
    assert_eq!(rec(extra).err().reason, RejectReason::BadEnvelope);
}

#[test]
fn pinned_tool_call() {
    let e = env_format(EnvelopeFormat::ToolCall);
    assert_eq!(rec(TOOL).env(&e).unwrap().shape, Shape::ToolCall);
    assert_eq!(reason(rec(NATIVE).env(&e)), RejectReason::BadEnvelope);
    assert_eq!(reason(rec(STRUCTURED).env(&e)), RejectReason::BadEnvelope);
    assert_eq!(reason(binary("{}").env(&e)), RejectReason::BadEnvelope);
}

#[test]
fn pinned_cloudevents() {
    let e = env_format(EnvelopeFormat::Cloudevents);
    assert_eq!(rec(STRUCTURED).env(&e).unwrap().shape, Shape::CloudEventsStructured);
    assert_eq!(binary("{}").env(&e).unwrap().shape, Shape::CloudEventsBinary);
    assert_eq!(reason(rec(NATIVE).env(&e)), RejectReason::BadEnvelope);
    assert_eq!(reason(rec(TOOL).env(&e)), RejectReason::BadEnvelope);
}

#[test]
fn only_cloudevents_1_0_is_accepted() {
    let r = rec(r#"{"specversion":"0.3","id":"e","source":"s","type":"com.example.x"}"#).err();
    assert_eq!(r.reason, RejectReason::BadEnvelope);
    assert!(r.message.contains("0.3"), "{}", r.message);
    assert_eq!(rec(r#"{"specversion":1,"id":"e","source":"s","type":"t"}"#).err().reason, RejectReason::BadEnvelope);
    let b = binary("{}");
    let mut b03 = b.clone();
    b03.headers[0].1 = Some(b"0.3".to_vec());
    assert_eq!(b03.err().reason, RejectReason::BadEnvelope);
    let mut bbin = b.clone();
    bbin.headers[0].1 = Some(vec![0xff]);
    assert_eq!(bbin.err().reason, RejectReason::BadEnvelope);
}

// ---- keys ----

#[test]
fn idempotency_key_header_overrides_every_shape() {
    for value in [NATIVE, TOOL, STRUCTURED] {
        let c = rec(value).h("idempotency-key", "H").ok();
        assert_eq!(c.key, "H", "{value}");
    }
    assert_eq!(binary("{}").h("idempotency-key", "H").ok().key, "H");
    // The shape's own key is then not needed at all.
    let c = rec(r#"{"type":"email.send","payload":{}}"#).h("Idempotency-Key", "H").ok();
    assert_eq!(c.key, "H");
    let c = rec(r#"{"tool":"charge_card","arguments":{}}"#).h("IDEMPOTENCY-KEY", "H").ok();
    assert_eq!(c.key, "H");
}

#[test]
fn idempotency_key_header_last_occurrence_wins_and_null_is_absent() {
    assert_eq!(rec(NATIVE).h("idempotency-key", "a").h("idempotency-key", "b").ok().key, "b");
    assert_eq!(rec(NATIVE).h("idempotency-key", "a").hb("idempotency-key", None).ok().key, "k1");
}

#[test]
fn a_bad_idempotency_key_header_does_not_fall_back() {
    assert_eq!(rec(NATIVE).hb("idempotency-key", Some(&[0xc3, 0x28])).err().reason, RejectReason::BadKey);
    assert_eq!(rec(NATIVE).h("idempotency-key", "").err().reason, RejectReason::BadKey);
}

#[test]
fn key_source_header_uses_only_that_header() {
    let e = env_key("header:x-request-key");
    let c = rec(NATIVE).h("idempotency-key", "ignored").h("X-Request-Key", "R").env(&e).unwrap();
    assert_eq!(c.key, "R");
    let r = rec(NATIVE).h("idempotency-key", "ignored").env(&e).unwrap_err();
    assert_eq!(r.reason, RejectReason::MissingKey);
    assert!(r.message.contains("x-request-key"), "{}", r.message);
    assert_eq!(reason(rec(NATIVE).hb("x-request-key", Some(&[0xff])).env(&e)), RejectReason::BadKey);
    assert_eq!(reason(rec(NATIVE).hb("x-request-key", None).env(&e)), RejectReason::MissingKey);
}

#[test]
fn key_source_json_pointer_uses_only_that_pointer() {
    let e = env_key("json:/payload/order_id");
    let v = r#"{"id":"k1","type":"email.send","payload":{"order_id":"o-9"}}"#;
    let c = rec(v).h("idempotency-key", "ignored").env(&e).unwrap();
    assert_eq!(c.key, "o-9");
    assert_eq!(reason(rec(NATIVE).env(&e)), RejectReason::MissingKey);
    let num = r#"{"id":"k1","type":"email.send","payload":{"order_id":9}}"#;
    assert_eq!(reason(rec(num).env(&e)), RejectReason::BadKey);
    let null = r#"{"id":"k1","type":"email.send","payload":{"order_id":null}}"#;
    assert_eq!(reason(rec(null).env(&e)), RejectReason::MissingKey);
    // Binary CloudEvents: the pointer goes into the data.
    let e = env_key("json:/ref");
    assert_eq!(binary(r#"{"ref":"r-1"}"#).env(&e).unwrap().key, "r-1");
    assert_eq!(reason(binary("[1]").env(&e)), RejectReason::MissingKey);
}

#[test]
fn key_source_record_key() {
    let e = env_key("record-key");
    assert_eq!(rec(NATIVE).key(b"rk").h("idempotency-key", "ignored").env(&e).unwrap().key, "rk");
    assert_eq!(reason(rec(NATIVE).env(&e)), RejectReason::MissingKey);
    assert_eq!(reason(rec(NATIVE).key(&[0x80]).env(&e)), RejectReason::BadKey);
    assert_eq!(reason(rec(NATIVE).key(b"").env(&e)), RejectReason::BadKey);
    // Auto ignores the record key.
    assert_eq!(rec(NATIVE).key(b"rk").ok().key, "k1");
}

#[test]
fn key_source_auto_falls_back_to_the_shape_key() {
    assert_eq!(rec(NATIVE).env(&env_key("auto")).unwrap().key, "k1");
}

#[test]
fn missing_shape_keys_are_missing_key() {
    assert_eq!(rec(r#"{"type":"email.send","payload":1}"#).err().reason, RejectReason::MissingKey);
    assert_eq!(rec(r#"{"id":null,"type":"email.send","payload":1}"#).err().reason, RejectReason::MissingKey);
    assert_eq!(rec(r#"{"tool":"charge_card","arguments":{}}"#).err().reason, RejectReason::MissingKey);
    assert_eq!(rec(r#"{"specversion":"1.0","id":"e","type":"t"}"#).err().reason, RejectReason::MissingKey);
    assert_eq!(rec(r#"{"specversion":"1.0","source":"s","type":"t"}"#).err().reason, RejectReason::MissingKey);
    let mut b = binary("{}");
    b.headers.retain(|(n, _)| n != "ce_id");
    assert_eq!(b.err().reason, RejectReason::MissingKey);
}

#[test]
fn non_string_keys_are_bad_key() {
    assert_eq!(rec(r#"{"id":7,"type":"email.send","payload":1}"#).err().reason, RejectReason::BadKey);
    assert_eq!(rec(r#"{"id":["k"],"type":"email.send","payload":1}"#).err().reason, RejectReason::BadKey);
    let t = r#"{"tool":"charge_card","arguments":{"idempotency_key":{"a":1}}}"#;
    assert_eq!(rec(t).err().reason, RejectReason::BadKey);
    let ce = r#"{"specversion":"1.0","id":1,"source":"s","type":"t"}"#;
    assert_eq!(rec(ce).err().reason, RejectReason::BadKey);
    let ce = r#"{"specversion":"1.0","id":"","source":"s","type":"t"}"#;
    assert_eq!(rec(ce).err().reason, RejectReason::BadKey);
}

fn native_with_key(key: &str) -> String {
    serde_json::json!({"id": key, "type": "email.send", "payload": {}}).to_string()
}

#[test]
fn key_of_255_bytes_is_ok_and_256_is_bad() {
    let k255 = "k".repeat(255);
    assert_eq!(rec(&native_with_key(&k255)).ok().key, k255);
    let r = rec(&native_with_key(&"k".repeat(256))).err();
    assert_eq!(r.reason, RejectReason::BadKey);
    assert!(r.message.contains("256 bytes"), "{}", r.message);
    assert_eq!(r.key, None);
    // Bytes, not characters: 85 three-byte characters are 255 bytes.
    let euro = "€".repeat(85);
    assert_eq!(rec(&native_with_key(&euro)).ok().key, euro);
    assert_eq!(rec(&native_with_key(&format!("{euro}x"))).err().reason, RejectReason::BadKey);
    // The same limit for a header key and a composed CloudEvents key.
    assert_eq!(rec(NATIVE).h("idempotency-key", &k255).ok().key, k255);
    assert_eq!(rec(NATIVE).h("idempotency-key", &"k".repeat(256)).err().reason, RejectReason::BadKey);
    let ce = |id: &str| {
        serde_json::json!({"specversion": "1.0", "source": "s", "id": id, "type": "com.example.x"}).to_string()
    };
    assert!(rec(&ce(&"i".repeat(253))).env(&env()).is_ok());
    assert_eq!(rec(&ce(&"i".repeat(254))).err().reason, RejectReason::BadKey);
    assert_eq!(rec(&native_with_key("")).err().reason, RejectReason::BadKey);
}

#[test]
fn keys_with_control_characters_are_bad() {
    for k in ["a\nb", "\u{0}", "tab\there", "del\u{7f}", "c1\u{85}", "\u{9f}", "\r"] {
        let r = rec(&native_with_key(k)).err();
        assert_eq!(r.reason, RejectReason::BadKey, "{k:?}");
        assert!(r.message.contains("control character U+"), "{}", r.message);
        assert_eq!(rec(NATIVE).h("idempotency-key", k).err().reason, RejectReason::BadKey, "{k:?}");
    }
    // Spaces, punctuation and non-ASCII letters are fine.
    for k in ["a b", "order/42:retry", "ключ-😀", "\u{200b}zero-width"] {
        assert_eq!(rec(&native_with_key(k)).ok().key, k);
    }
}

#[test]
fn non_utf8_key_sources_are_bad_key() {
    assert_eq!(rec(NATIVE).hb("idempotency-key", Some(&[0xe2, 0x82])).err().reason, RejectReason::BadKey);
    let mut b = binary("{}");
    b.headers.push(("ce_id".into(), Some(vec![0xff, 0xfe])));
    assert_eq!(b.err().reason, RejectReason::BadKey);
    let mut b = binary("{}");
    b.headers.push(("ce_source".into(), Some(vec![])));
    assert_eq!(b.err().reason, RejectReason::BadKey);
}

// ---- value: presence, size, encoding ----

#[test]
fn absent_value_is_invalid_json() {
    let mut r = rec("");
    r.value = None;
    assert_eq!(r.err().reason, RejectReason::InvalidJson);
    let mut b = binary("");
    b.value = None;
    assert_eq!(b.err().reason, RejectReason::InvalidJson);
}

#[test]
fn non_utf8_non_json_and_non_objects_are_invalid_json() {
    let r = Rec::raw(b"{\"id\":\"\xff\"}").err();
    assert_eq!(r.reason, RejectReason::InvalidJson);
    assert!(r.message.contains("UTF-8"), "{}", r.message);
    assert_eq!(rec("").err().reason, RejectReason::InvalidJson);
    assert_eq!(rec("{\"id\":").err().reason, RejectReason::InvalidJson);
    assert_eq!(rec("{} trailing").err().reason, RejectReason::InvalidJson);
    for v in ["[]", "\"s\"", "1", "null", "true"] {
        let r = rec(v).err();
        assert_eq!(r.reason, RejectReason::InvalidJson, "{v}");
        assert!(r.message.contains("not an object"), "{}", r.message);
    }
    assert_eq!(binary("not json").err().reason, RejectReason::InvalidJson);
    assert_eq!(binary("").err().reason, RejectReason::InvalidJson);
    let mut b = binary("");
    b.value = Some(vec![0xff]);
    assert_eq!(b.err().reason, RejectReason::InvalidJson);
    // Numbers JSON cannot hold as finite doubles.
    assert_eq!(rec(r#"{"id":"k","type":"email.send","payload":1e999}"#).err().reason, RejectReason::InvalidJson);
}

#[test]
fn too_large_is_checked_at_the_boundary_and_before_parsing() {
    let n = NATIVE.len();
    assert!(rec(NATIVE).parse_with(&env(), &limits(n)).is_ok());
    let r = rec(NATIVE).parse_with(&env(), &limits(n - 1)).unwrap_err();
    assert_eq!(r.reason, RejectReason::TooLarge);
    assert_eq!(r.message, format!("value is {n} bytes, over limits.max_command_bytes = {}", n - 1));
    assert_eq!(r.key, None);
    // Size comes first: an oversized non-JSON value is too_large, not invalid_json.
    let junk = Rec::raw(&[0xff; 100]);
    assert_eq!(reason(junk.parse_with(&env(), &limits(99))), RejectReason::TooLarge);
    assert_eq!(reason(junk.parse_with(&env(), &limits(100))), RejectReason::InvalidJson);
    // The default limit is 1 MiB.
    let big = Rec::raw(&vec![b' '; 1024 * 1024 + 1]);
    let r = big.err();
    assert_eq!(r.message, "value is 1048577 bytes, over limits.max_command_bytes = 1048576");
    // Binary CloudEvents are held to it too.
    assert_eq!(reason(binary("[1,2,3]").parse_with(&env(), &limits(6))), RejectReason::TooLarge);
}

// ---- type and route ----

#[test]
fn missing_or_non_string_type_is_missing_type() {
    for v in [
        r#"{"id":"k","payload":1}"#,
        r#"{"id":"k","type":null,"payload":1}"#,
        r#"{"id":"k","type":"","payload":1}"#,
        r#"{"id":"k","type":5,"payload":1}"#,
        r#"{"id":"k","type":{"a":1},"payload":1}"#,
        r#"{"tool":"","arguments":{"idempotency_key":"k"}}"#,
        r#"{"tool":1,"arguments":{"idempotency_key":"k"}}"#,
        r#"{"specversion":"1.0","id":"e","source":"s"}"#,
    ] {
        let r = rec(v).err();
        assert_eq!(r.reason, RejectReason::MissingType, "{v}");
        assert_eq!(r.key.as_deref().map(|k| !k.is_empty()), Some(true), "{v}: key carried");
    }
    let mut b = binary("{}");
    b.headers.retain(|(n, _)| n != "ce_type");
    assert_eq!(b.err().reason, RejectReason::MissingType);
    let b = binary("{}").hb("ce_type", Some(&[0xff]));
    assert_eq!(b.err().reason, RejectReason::MissingType);
}

#[test]
fn unrouted_type_is_no_route_with_the_key() {
    let r = rec(r#"{"id":"k9","type":"sms.send","payload":{}}"#).err();
    assert_eq!(r.reason, RejectReason::NoRoute);
    assert_eq!(r.key.as_deref(), Some("k9"));
    assert!(r.message.contains("\"sms.send\""), "{}", r.message);
    assert_eq!(r.to_string(), format!("no_route: {}", r.message));
}

#[test]
fn a_default_route_takes_every_type() {
    let router = Router::new(
        &[route("mail", &["email.*"], None, &[]), route("rest", &["*"], None, &[])],
        Duration::from_secs(60),
        Duration::from_secs(600),
    )
    .unwrap();
    let v = br#"{"id":"k","type":"anything.at.all","payload":{}}"#;
    let record = InputRecord {
        topic: "t",
        partition: 0,
        offset: 0,
        timestamp_ms: None,
        key: None,
        value: Some(v),
        headers: &[],
    };
    let c = parse(&record, &env(), &LimitsConfig::default(), &router).unwrap();
    assert_eq!(c.route, 1);
    assert_eq!(c.ttl, Duration::from_secs(60));
}

// ---- payload shape ----

#[test]
fn payload_rules() {
    // Native: payload required, null allowed.
    let r = rec(r#"{"id":"k","type":"email.send"}"#).err();
    assert_eq!(r.reason, RejectReason::BadEnvelope);
    assert_eq!(r.key.as_deref(), Some("k"));
    assert_eq!(rec(r#"{"id":"k","type":"email.send","payload":null}"#).ok().payload, Value::Null);
    // Tool call: arguments must be an object.
    for v in [
        r#"{"tool":"charge_card"}"#,
        r#"{"tool":"charge_card","arguments":"{\"idempotency_key\":\"k\"}"}"#,
        r#"{"tool":"charge_card","arguments":[1]}"#,
    ] {
        assert_eq!(rec(v).err().reason, RejectReason::BadEnvelope, "{v}");
        // Also when the key comes from the header, and then the key is reported.
        let r = rec(v).h("idempotency-key", "H").err();
        assert_eq!((r.reason, r.key.as_deref()), (RejectReason::BadEnvelope, Some("H")), "{v}");
    }
    // CloudEvents: data_base64 is not supported.
    let v = r#"{"specversion":"1.0","id":"e","source":"s","type":"com.example.x","data_base64":"AAE="}"#;
    assert_eq!(rec(v).err().reason, RejectReason::BadEnvelope);
}

// ---- ttl, created_at, stale_by ----

#[test]
fn ttl_parses_humantime_and_is_capped() {
    let with = |ttl: &str| format!(r#"{{"id":"k","type":"plain","payload":{{}},"ttl":{ttl}}}"#);
    assert_eq!(rec(&with("\"72h\"")).ok().ttl, Duration::from_secs(72 * HOUR));
    assert_eq!(rec(&with("\"1h 30m\"")).ok().ttl, Duration::from_secs(90 * 60));
    assert_eq!(rec(&with("\"30s\"")).ok().ttl, Duration::from_secs(30));
    assert_eq!(rec(&with("\"30d\"")).ok().ttl, Duration::from_secs(7 * 24 * HOUR), "capped by max_ttl");
    assert_eq!(rec(&with("null")).ok().ttl, Duration::from_secs(24 * HOUR), "route has none: default");
    // The command's ttl beats the route's.
    let mail = r#"{"id":"k","type":"email.send","payload":{},"ttl":"5m"}"#;
    assert_eq!(rec(mail).ok().ttl, Duration::from_secs(300));
    for bad in ["\"0s\"", "\"0h\"", "\"soon\"", "\"\"", "\"-1h\"", "3600", "true", "\"99999999999999999999h\""] {
        let r = rec(&with(bad)).err();
        assert_eq!(r.reason, RejectReason::BadField, "{bad}");
        assert!(r.message.contains("`ttl`"), "{}", r.message);
        assert_eq!(r.key.as_deref(), Some("k"));
    }
}

#[test]
fn created_at_parses_rfc3339() {
    let with = |c: &str| format!(r#"{{"id":"k","type":"plain","payload":{{}},"created_at":{c}}}"#);
    assert_eq!(rec(&with("\"2023-11-14T22:13:20Z\"")).ok().created_at_ms, Some(1_700_000_000_000));
    assert_eq!(rec(&with("\"2023-11-14T23:13:20.5+01:00\"")).ok().created_at_ms, Some(1_700_000_000_500));
    assert_eq!(rec(&with("null")).ok().created_at_ms, None);
    for bad in ["\"2023-11-14\"", "\"yesterday\"", "\"2023-11-14 22:13:20\"", "1700000000", "\"2023-13-01T00:00:00Z\""]
    {
        assert_eq!(rec(&with(bad)).err().reason, RejectReason::BadField, "{bad}");
    }
}

#[test]
fn cloudevents_time_serves_as_created_at() {
    let v = r#"{"specversion":"1.0","id":"e","source":"s","type":"com.example.x","time":"2023-11-14T22:13:20Z"}"#;
    assert_eq!(rec(v).ok().created_at_ms, Some(1_700_000_000_000));
    let v = r#"{"specversion":"1.0","id":"e","source":"s","type":"com.example.x","time":"noon"}"#;
    assert_eq!(rec(v).err().reason, RejectReason::BadField);
    assert_eq!(binary("{}").h("ce_time", "2023-11-14T22:13:20Z").ok().created_at_ms, Some(1_700_000_000_000));
    assert_eq!(binary("{}").h("ce_time", "noon").err().reason, RejectReason::BadField);
    assert_eq!(binary("{}").hb("ce_time", Some(&[0xff])).err().reason, RejectReason::BadField);
    // Tool calls have neither ttl nor created_at: such members are only arguments' business.
    let t = r#"{"tool":"charge_card","arguments":{"idempotency_key":"k"},"ttl":"garbage","created_at":"x"}"#;
    assert_eq!(rec(t).ok().created_at_ms, None);
}

#[test]
fn stale_by_picks_the_production_time() {
    let v = r#"{"id":"k","type":"plain","payload":{},"created_at":"2023-11-14T22:13:20Z"}"#;
    let kafka = EnvelopeConfig { stale_by: StaleBy::KafkaTimestamp, ..env() };
    let created = EnvelopeConfig { stale_by: StaleBy::CreatedAt, ..env() };
    let r = rec(v).ts(Some(TS + 5000));
    assert_eq!(r.env(&kafka).unwrap().produced_at_ms, Some(TS + 5000));
    assert_eq!(r.env(&created).unwrap().produced_at_ms, Some(TS));
    // No created_at: the Kafka timestamp.
    let r = rec(NATIVE).ts(Some(TS + 5000));
    assert_eq!(r.env(&created).unwrap().produced_at_ms, Some(TS + 5000));
    // No timestamp at all, or Kafka's -1: unknown.
    assert_eq!(rec(NATIVE).ts(None).env(&kafka).unwrap().produced_at_ms, None);
    assert_eq!(rec(NATIVE).ts(Some(-1)).env(&kafka).unwrap().produced_at_ms, None);
    assert_eq!(rec(NATIVE).ts(Some(-1)).env(&created).unwrap().produced_at_ms, None);
    // stale_guard does not change parsing: staleness is decided later, with the clock.
    let off = EnvelopeConfig { stale_guard: false, ..env() };
    assert_eq!(rec(NATIVE).env(&off).unwrap(), rec(NATIVE).ok());
}

// ---- traceparent ----

#[test]
fn traceparent_is_carried() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(rec(NATIVE).h("traceparent", tp).ok().traceparent.as_deref(), Some(tp));
    assert_eq!(rec(TOOL).h("TraceParent", "x").h("traceparent", tp).ok().traceparent.as_deref(), Some(tp));
    assert_eq!(rec(NATIVE).ok().traceparent, None);
    assert_eq!(rec(NATIVE).hb("traceparent", Some(&[0xff])).ok().traceparent, None);
    // CloudEvents distributed tracing extension.
    assert_eq!(binary("{}").h("ce_traceparent", tp).ok().traceparent.as_deref(), Some(tp));
    let v = format!(r#"{{"specversion":"1.0","id":"e","source":"s","type":"com.example.x","traceparent":"{tp}"}}"#);
    assert_eq!(rec(&v).ok().traceparent.as_deref(), Some(tp));
}

#[test]
fn tracestate_comes_from_where_the_traceparent_came_from() {
    let (tp, ts) =
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
    let state = |r: Rec| r.ok().tracestate;
    assert_eq!(state(rec(NATIVE).h("traceparent", tp).h("tracestate", ts)).as_deref(), Some(ts));
    // Alone it means nothing (W3C), and it never pairs with a traceparent from elsewhere.
    assert_eq!(state(rec(NATIVE).h("tracestate", ts)), None);
    assert_eq!(state(binary("{}").h("ce_traceparent", tp).h("tracestate", ts)), None);
    assert_eq!(state(binary("{}").h("ce_traceparent", tp).h("ce_tracestate", ts)).as_deref(), Some(ts));
    let v = format!(
        r#"{{"specversion":"1.0","id":"e","source":"s","type":"com.example.x","traceparent":"{tp}","tracestate":"{ts}"}}"#
    );
    assert_eq!(state(rec(&v)).as_deref(), Some(ts));
}

// ---- fingerprint ----

#[test]
fn fingerprint_ignores_key_order_whitespace_and_envelope_extras() {
    let a = rec(r#"{"id":"k1","type":"email.send","payload":{"to":"a@b","n":1,"x":[1,{"p":1,"q":2}]}}"#).ok();
    let b = rec("{\"payload\" : {\"x\":[1.0,{\"q\":2,\"p\":1}], \"n\":1e0,\"to\":\"a@b\"},\n \"type\":\"email.send\",\"id\":\"other\",\"ttl\":\"2h\",\"created_at\":\"2023-11-14T22:13:20Z\"}")
        .h("traceparent", "00-x")
        .ok();
    assert_eq!(a.fingerprint, b.fingerprint);
    assert_eq!(a.fingerprint, crate::fingerprint::fingerprint("email.send", &a.payload, &[]).unwrap());
    let c = rec(r#"{"id":"k1","type":"email.send","payload":{"to":"a@b","n":2,"x":[1,{"p":1,"q":2}]}}"#).ok();
    assert_ne!(a.fingerprint, c.fingerprint);
    // The same payload in a tool call and as binary CloudEvents data agree on the fingerprint
    // of {type, payload} whatever the shape.
    let t1 = rec(r#"{"tool":"charge_card","arguments":{"idempotency_key":"k","amount":5}}"#).ok();
    let t2 = rec(r#"{"arguments":{"amount":5,"idempotency_key":"k"},"tool":"charge_card"}"#).ok();
    assert_eq!(t1.fingerprint, t2.fingerprint);
}

#[test]
fn fingerprint_applies_the_route_exclusions() {
    let a = rec(r#"{"id":"k","type":"email.send","payload":{"to":"a","request_id":"r1"}}"#).ok();
    let b = rec(r#"{"id":"k","type":"email.send","payload":{"to":"a","request_id":"r2"}}"#).ok();
    assert_eq!(a.fingerprint, b.fingerprint);
    // The payload handed to the sink keeps the excluded field.
    assert_eq!(a.payload["request_id"], "r1");
}

// ---- every reason ----

#[test]
fn every_reason_but_stale_and_not_copartitioned_is_produced_by_some_input() {
    let cases: Vec<(Rec, LimitsConfig)> = vec![
        (rec("nope"), LimitsConfig::default()),
        (rec(NATIVE), limits(3)),
        (rec(r#"{"type":"email.send","payload":1}"#), LimitsConfig::default()),
        (rec(r#"{"id":1,"type":"email.send","payload":1}"#), LimitsConfig::default()),
        (rec(r#"{"id":"k","payload":1}"#), LimitsConfig::default()),
        (rec(r#"{"x":1}"#), LimitsConfig::default()),
        (rec(r#"{"id":"k","type":"email.send","payload":1,"ttl":"0s"}"#), LimitsConfig::default()),
        (rec(r#"{"id":"k","type":"nowhere","payload":1}"#), LimitsConfig::default()),
    ];
    let produced: BTreeSet<&str> =
        cases.iter().map(|(r, l)| r.parse_with(&env(), l).unwrap_err().reason.as_str()).collect();
    let expected =
        RejectReason::ALL.iter().filter(|r| !matches!(r, RejectReason::Stale | RejectReason::NotCopartitioned));
    let expected: BTreeSet<&str> = expected.map(|r| r.as_str()).collect();
    assert_eq!(produced, expected);
}

#[test]
fn reason_names_are_stable() {
    let names: Vec<&str> = RejectReason::ALL.iter().map(|r| r.as_str()).collect();
    for spec_name in ["invalid_json", "too_large", "missing_key", "bad_key", "no_route", "stale", "not_copartitioned"] {
        assert!(names.contains(&spec_name), "{spec_name}");
    }
    for r in RejectReason::ALL {
        assert_eq!(serde_json::to_value(r).unwrap(), Value::String(r.as_str().into()));
    }
}

#[test]
fn messages_quote_and_cut_long_values() {
    let long_type = "x".repeat(500);
    let r = rec(&format!(r#"{{"id":"k","type":"{long_type}","payload":1}}"#)).err();
    assert_eq!(r.reason, RejectReason::NoRoute);
    assert!(r.message.len() < 200, "{}", r.message);
    assert!(r.message.contains("500 bytes"), "{}", r.message);
}

// ---- robustness ----

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("idempotency-key".to_string()),
        Just("Idempotency-Key".to_string()),
        Just("ce_specversion".to_string()),
        Just("ce_id".to_string()),
        Just("ce_source".to_string()),
        Just("ce_type".to_string()),
        Just("ce_time".to_string()),
        Just("traceparent".to_string()),
        Just("x-key".to_string()),
        ".{0,12}",
    ]
}

fn header_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(Some(b"1.0".to_vec())),
        Just(Some(b"com.example.x".to_vec())),
        Just(Some(b"2023-11-14T22:13:20Z".to_vec())),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::option::of("\\PC{0,20}".prop_map(String::into_bytes)),
    ]
}

fn envelope_config() -> impl Strategy<Value = EnvelopeConfig> {
    let format = prop_oneof![
        Just(EnvelopeFormat::Auto),
        Just(EnvelopeFormat::Native),
        Just(EnvelopeFormat::ToolCall),
        Just(EnvelopeFormat::Cloudevents),
    ];
    let key = prop_oneof![
        Just(KeySource::Auto),
        Just(KeySource::RecordKey),
        Just(KeySource::Header("x-key".into())),
        Just(KeySource::JsonPointer("/payload/k".into())),
        Just(KeySource::JsonPointer("/".into())),
    ];
    (format, key, any::<bool>(), any::<bool>()).prop_map(|(format, key, stale_guard, created)| EnvelopeConfig {
        format,
        key,
        stale_guard,
        stale_by: if created { StaleBy::CreatedAt } else { StaleBy::KafkaTimestamp },
    })
}

/// Values that are mostly near-miss envelopes, plus raw bytes.
fn value() -> impl Strategy<Value = Option<Vec<u8>>> {
    let json_ish = proptest::collection::vec(
        prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("\"id\":".to_string()),
            Just("\"type\":\"email.send\"".to_string()),
            Just("\"tool\":\"charge_card\"".to_string()),
            Just("\"arguments\":{\"idempotency_key\":\"k\"}".to_string()),
            Just("\"specversion\":\"1.0\"".to_string()),
            Just("\"payload\":".to_string()),
            Just("\"ttl\":\"1h\"".to_string()),
            Just("\"created_at\":\"2023-11-14T22:13:20Z\"".to_string()),
            Just(",".to_string()),
            Just("null".to_string()),
            Just("1e308".to_string()),
            "\"\\PC{0,8}\"",
        ],
        0..16,
    )
    .prop_map(|parts| Some(parts.concat().into_bytes()));
    prop_oneof![Just(None), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..400)), json_ish,]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_records_never_panic(
        value in value(),
        key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        headers in proptest::collection::vec((header_name(), header_value()), 0..8),
        ts in proptest::option::of(any::<i64>()),
        envelope in envelope_config(),
        max in 1usize..500,
    ) {
        let r = Rec { value, key, headers, ts };
        match r.parse_with(&envelope, &limits(max)) {
            Ok(c) => {
                prop_assert!(!c.key.is_empty() && c.key.len() <= MAX_KEY_BYTES);
                prop_assert!(!c.key.chars().any(char::is_control));
                prop_assert!(!c.kind.is_empty());
                prop_assert!(c.route < router().routes().len());
                prop_assert!(!c.ttl.is_zero() && c.ttl <= router().max_ttl());
            }
            Err(e) => {
                prop_assert_ne!(e.reason, RejectReason::Stale);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn any_valid_key_round_trips(
        chars in proptest::collection::vec(any::<char>().prop_filter("control", |c| !c.is_control()), 1..60),
    ) {
        let key: String = chars.into_iter().collect();
        prop_assume!(key.len() <= MAX_KEY_BYTES);
        let c = rec(&native_with_key(&key)).ok();
        prop_assert_eq!(&c.key, &key);
        let h = rec(NATIVE).h("idempotency-key", &key).ok();
        prop_assert_eq!(h.key, key);
    }
}

//! Shapes: auto-detection of native commands, tool calls and structured and binary
//! CloudEvents; pinned formats; and what each shape requires of its payload.

use super::*;

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

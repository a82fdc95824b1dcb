//! Rejections: the value's presence, size and encoding, a missing type or an unrouted one,
//! and the reasons themselves (each produced by some input, stable names, cut messages).

use std::collections::BTreeSet;

use super::*;

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
fn a_member_name_twice_is_invalid_json_in_every_shape() {
    for v in [
        r#"{"id":"k","type":"email.send","payload":{"amount":1,"amount":1000}}"#,
        r#"{"id":"k","id":"k2","type":"email.send","payload":{}}"#,
        r#"{"tool":"email.send","id":"k","arguments":{"to":"a","to":"b"}}"#,
    ] {
        let r = rec(v).err();
        assert_eq!(r.reason, RejectReason::InvalidJson, "{v}");
        assert!(r.message.contains("appears twice"), "{}", r.message);
    }
    let b = binary(r#"{"to":"a","to":"b"}"#).err();
    assert_eq!(b.reason, RejectReason::InvalidJson);
    // The same name in sibling objects is fine.
    rec(r#"{"id":"k","type":"email.send","payload":{"a":{"x":1},"b":{"x":1}}}"#).ok();
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
fn missing_type_is_missing_type_and_a_non_string_one_a_bad_envelope() {
    for (v, reason) in [
        (r#"{"id":"k","payload":1}"#, RejectReason::MissingType),
        (r#"{"id":"k","type":null,"payload":1}"#, RejectReason::MissingType),
        (r#"{"id":"k","type":"","payload":1}"#, RejectReason::MissingType),
        (r#"{"id":"k","type":5,"payload":1}"#, RejectReason::BadEnvelope),
        (r#"{"id":"k","type":{"a":1},"payload":1}"#, RejectReason::BadEnvelope),
        (r#"{"tool":"","arguments":{"idempotency_key":"k"}}"#, RejectReason::MissingType),
        (r#"{"tool":1,"arguments":{"idempotency_key":"k"}}"#, RejectReason::BadEnvelope),
        (r#"{"specversion":"1.0","id":"e","source":"s"}"#, RejectReason::MissingType),
    ] {
        let r = rec(v).err();
        assert_eq!(r.reason, reason, "{v}");
        assert_eq!(r.key.as_deref().map(|k| !k.is_empty()), Some(true), "{v}: key carried");
        assert_eq!(r.kind, None, "{v}: no type was read");
    }
    let mut b = binary("{}");
    b.headers.retain(|(n, _)| n != "ce_type");
    assert_eq!(b.err().reason, RejectReason::MissingType);
    let b = binary("{}").hb("ce_type", Some(&[0xff]));
    assert_eq!(b.err().reason, RejectReason::MissingType);
}

#[test]
fn unrouted_type_is_no_route_with_the_key_and_the_type() {
    let r = rec(r#"{"id":"k9","type":"sms.send","payload":{}}"#).err();
    assert_eq!(r.reason, RejectReason::NoRoute);
    assert_eq!(r.key.as_deref(), Some("k9"));
    assert_eq!(r.kind.as_deref(), Some("sms.send"), "the type was read: the result names it");
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

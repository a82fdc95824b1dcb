//! The command's derived fields: ttl, created_at (and CloudEvents `time`), the production
//! time `stale_by` picks, trace context (traceparent, tracestate), and the fingerprint.

use super::*;

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
        assert_eq!(r.kind.as_deref(), Some("plain"), "read before the ttl");
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

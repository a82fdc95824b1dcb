//! Keys: the idempotency-key header over every shape, the configured key sources (header,
//! JSON pointer, record key, auto), and what makes a key missing or bad (type, length,
//! control characters, encoding).

use super::*;

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

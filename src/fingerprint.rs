//! Fingerprints (docs/contract.md §2): `sha256:` + hex of SHA-256 over the RFC 8785 (JCS) canonical
//! JSON of `{"type": TYPE, "payload": PAYLOAD}`, after removing a route's excluded pointers.
//!
//! JCS comes from `serde_json_canonicalizer` (ECMAScript number formatting via ryu-js,
//! UTF-16 key ordering); the RFC's own vectors in the tests below hold it to the standard.
//! serde_json is built with `float_roundtrip` so that parsing never moves a number by an ULP.
//! Payloads of plain strings, integers and keys take a direct road to the same bytes
//! (`simple`), checked against the canonicaliser by a property test.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;

mod simple;

/// A command's fingerprint: the raw 32 bytes of the digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // On the stack: one is formatted per result, and `hex::encode` builds a String
        // a char at a time.
        let mut hex = [0u8; 64];
        hex::encode_to_slice(self.0, &mut hex).map_err(|_| fmt::Error)?;
        f.write_str("sha256:")?;
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Fingerprint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let hex_part = s.strip_prefix("sha256:").ok_or_else(|| format!("`{s}` does not start with sha256:"))?;
        let bytes = hex::decode(hex_part).map_err(|e| format!("`{s}`: {e}"))?;
        let arr: [u8; 32] = bytes.try_into().map_err(|_| format!("`{s}` is not 32 bytes"))?;
        Ok(Fingerprint(arr))
    }
}

/// The value could not be canonicalised (only non-finite numbers, which JSON cannot hold).
#[derive(Debug, thiserror::Error)]
#[error("cannot canonicalise payload: {0}")]
pub struct FingerprintError(String);

/// The RFC 8785 canonical form of `value`.
pub fn canonical_json(value: &Value) -> Result<Vec<u8>, FingerprintError> {
    serde_json_canonicalizer::to_vec(value).map_err(|e| FingerprintError(e.to_string()))
}

/// Fingerprint of a command of type `kind` with `payload`, leaving out `exclude` pointers
/// (RFC 6901, rooted at `{"type", "payload"}`, e.g. `/payload/request_id`).
pub fn fingerprint(kind: &str, payload: &Value, exclude: &[String]) -> Result<Fingerprint, FingerprintError> {
    if exclude.is_empty() {
        // `{"payload":…,"type":…}`: the two members already in JCS order.
        let mut canonical = Vec::with_capacity(128);
        canonical.extend_from_slice(b"{\"payload\":");
        if simple::write(payload, &mut canonical) {
            canonical.extend_from_slice(b",\"type\":");
            if simple::write_str(kind, &mut canonical) {
                canonical.push(b'}');
                return Ok(Fingerprint(Sha256::digest(&canonical).into()));
            }
        }
    }
    let mut doc = serde_json::json!({ "type": kind, "payload": payload });
    for pointer in exclude {
        remove_pointer(&mut doc, pointer);
    }
    let canonical = canonical_json(&doc)?;
    Ok(Fingerprint(Sha256::digest(&canonical).into()))
}

/// Removes the member or element `pointer` names, if it exists.
fn remove_pointer(doc: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return };
    let last = last.replace("~1", "/").replace("~0", "~");
    match doc.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fp(kind: &str, payload_text: &str) -> Fingerprint {
        let v: Value = serde_json::from_str(payload_text).unwrap();
        fingerprint(kind, &v, &[]).unwrap()
    }

    fn jcs(text: &str) -> String {
        let v: Value = serde_json::from_str(text).unwrap();
        String::from_utf8(canonical_json(&v).unwrap()).unwrap()
    }

    #[test]
    fn display_is_sha256_prefixed_lowercase_hex() {
        let f = fp("t", "{}");
        let s = f.to_string();
        assert!(s.starts_with("sha256:"));
        assert_eq!(s.len(), 7 + 64);
        assert_eq!(s, s.to_lowercase());
        assert_eq!(s.parse::<Fingerprint>().unwrap(), f);
    }

    #[test]
    fn matches_sha256_of_the_canonical_document() {
        let f = fp("email.send", r#"{"to": "a@b", "n": 1}"#);
        let expected = Sha256::digest(br#"{"payload":{"n":1,"to":"a@b"},"type":"email.send"}"#);
        assert_eq!(f.0.as_slice(), expected.as_slice());
    }

    #[test]
    fn key_order_whitespace_and_number_spelling_do_not_matter() {
        let a = fp("t", r#"{"a": 1, "b": [1, 2, {"x": 100}], "c": "s"}"#);
        let b = fp("t", "{\n  \"c\":\"s\",\"b\":[1.0,2e0,{\"x\":1e2}],  \"a\":1.00}");
        assert_eq!(a, b);
        assert_eq!(fp("t", "1.0"), fp("t", "1"));
        assert_eq!(fp("t", "1e2"), fp("t", "100"));
        assert_eq!(fp("t", "-0"), fp("t", "0"));
    }

    #[test]
    fn any_change_of_type_value_or_array_order_changes_it() {
        let base = fp("t", r#"{"a": [1, 2], "b": "x"}"#);
        assert_ne!(base, fp("u", r#"{"a": [1, 2], "b": "x"}"#));
        assert_ne!(base, fp("t", r#"{"a": [2, 1], "b": "x"}"#));
        assert_ne!(base, fp("t", r#"{"a": [1, 2], "b": "y"}"#));
        assert_ne!(base, fp("t", r#"{"a": [1, 2], "b": "x", "c": null}"#));
        assert_ne!(base, fp("t", r#"{"a": [1, 3], "b": "x"}"#));
        assert_ne!(fp("t", r#"{"a": "1"}"#), fp("t", r#"{"a": 1}"#));
    }

    #[test]
    fn excluded_pointers_are_left_out() {
        let ex = vec!["/payload/request_id".to_string(), "/payload/meta/trace~1id".to_string()];
        let a = fingerprint("t", &json!({"x": 1, "request_id": "r1", "meta": {"trace/id": "a", "k": 1}}), &ex).unwrap();
        let b = fingerprint("t", &json!({"x": 1, "request_id": "r2", "meta": {"trace/id": "b", "k": 1}}), &ex).unwrap();
        let c = fingerprint("t", &json!({"x": 2, "request_id": "r1", "meta": {"trace/id": "a", "k": 1}}), &ex).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // A pointer that names nothing changes nothing.
        let d = fingerprint("t", &json!({"x": 1}), &["/payload/absent/deep".to_string()]).unwrap();
        assert_eq!(d, fingerprint("t", &json!({"x": 1}), &[]).unwrap());
    }

    /// RFC 8785 §3.2.2 (the sample input and its canonical output).
    #[test]
    fn rfc8785_sample_input() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assert_eq!(jcs(input), expected);
    }

    /// RFC 8785 §3.2.3: properties sorted by UTF-16 code units.
    #[test]
    fn rfc8785_property_sorting() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(jcs(input), expected);
    }

    /// RFC 8785 Appendix B: IEEE 754 bit patterns and their ECMAScript serialisation.
    #[test]
    fn rfc8785_number_samples() {
        let samples: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, expected) in samples {
            let v = Value::from(f64::from_bits(*bits));
            let got = String::from_utf8(canonical_json(&v).unwrap()).unwrap();
            assert_eq!(&got, expected, "bits {bits:016x}");
            // And the same number read back from its canonical text canonicalises to itself.
            assert_eq!(jcs(expected), *expected, "round trip of {expected}");
        }
    }

    #[test]
    fn integers_beyond_u64_are_doubles() {
        assert_eq!(jcs("295147905179352825856"), "295147905179352830000");
        assert_eq!(jcs("[1.0, 10, -3]"), "[1,10,-3]");
    }
}

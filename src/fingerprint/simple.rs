//! The common case, fast: most payloads hold only strings, integers, booleans, nulls,
//! arrays and objects with plain keys, and for those serde_json's compact output already
//! is the JCS form. Writing it directly skips the canonicaliser's copy-and-sort of every
//! object and the clone of the payload into `{"type", "payload"}`.
//!
//! Where the two could differ, this declines and the caller takes the full JCS road:
//! - numbers that are not integers of magnitude ≤ 2^53 (JCS prints ECMAScript doubles);
//! - objects whose keys do not iterate in strictly ascending order (serde_json built with
//!   `preserve_order` by some other crate), or hold a character at or above U+E000 (from
//!   there UTF-16 code-unit order, which JCS sorts by, differs from code-point order).
//!
//! String escaping is the same on both roads (`"`, `\`, `\b \t \n \f \r`, other controls as
//! lowercase `\u00xx`, everything else as UTF-8); the tests compare the two on random values.

use serde_json::Value;

/// Largest integer magnitude an ECMAScript number prints exactly as its digits.
const EXACT_INTEGER: u64 = 1 << 53;

/// Appends the JCS form of `value` to `out`; false (with `out` partly written) when the
/// value needs the full canonicaliser.
pub(super) fn write(value: &Value, out: &mut Vec<u8>) -> bool {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(u) = n.as_u64().filter(|u| *u <= EXACT_INTEGER) {
                out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
            } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= EXACT_INTEGER) {
                out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            } else {
                return false;
            }
        }
        Value::String(s) => return write_str(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if !write(item, out) {
                    return false;
                }
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            let mut previous: Option<&str> = None;
            for (i, (key, item)) in map.iter().enumerate() {
                if previous.is_some_and(|p| p >= key.as_str()) || key.chars().any(|c| c >= '\u{E000}') {
                    return false;
                }
                previous = Some(key);
                if i > 0 {
                    out.push(b',');
                }
                if !write_str(key, out) {
                    return false;
                }
                out.push(b':');
                if !write(item, out) {
                    return false;
                }
            }
            out.push(b'}');
        }
    }
    true
}

/// Appends `s` as a JSON string.
pub(super) fn write_str(s: &str, out: &mut Vec<u8>) -> bool {
    serde_json::to_writer(&mut *out, s).is_ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    fn fast(v: &Value) -> Option<String> {
        let mut out = Vec::new();
        super::write(v, &mut out).then(|| String::from_utf8(out).unwrap())
    }

    fn jcs(v: &Value) -> String {
        String::from_utf8(super::super::canonical_json(v).unwrap()).unwrap()
    }

    fn any_string() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_]{0,8}",
            any::<String>(),
            prop::collection::vec(
                prop_oneof![
                    Just('\u{7f}'),
                    Just('\u{2028}'),
                    Just('"'),
                    Just('\\'),
                    Just('\u{1f}'),
                    Just('\u{e000}'),
                    Just('\u{1f600}'),
                    any::<char>()
                ],
                0..6
            )
            .prop_map(|cs| cs.into_iter().collect()),
        ]
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-(1i64 << 54)..(1i64 << 54)).prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            any_string().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any_string(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Whenever the fast road answers, it answers exactly what JCS does.
        #[test]
        fn agrees_with_jcs_whenever_it_answers(v in any_json()) {
            if let Some(f) = fast(&v) {
                prop_assert_eq!(f, jcs(&v));
            }
        }
    }

    #[test]
    fn takes_the_common_shapes_and_declines_the_rest() {
        let common = json!({"id": "o-1", "amount": 1200, "to": ["a@b", "c@d"], "ok": true, "n": null, "neg": -5});
        assert_eq!(fast(&common).as_deref(), Some(jcs(&common).as_str()));
        assert_eq!(fast(&json!({"k": "\u{1}\"\\\n/\u{2028}é"})), Some(jcs(&json!({"k": "\u{1}\"\\\n/\u{2028}é"}))));
        assert_eq!(fast(&json!(9_007_199_254_740_992u64)).as_deref(), Some("9007199254740992"));
        assert_eq!(fast(&json!(9_007_199_254_740_993u64)), None, "beyond 2^53 JCS prints a double");
        assert_eq!(fast(&json!(1.5)), None);
        assert_eq!(fast(&json!({"\u{e000}": 1, "\u{1f600}": 2})), None, "UTF-16 order differs there");
    }
}

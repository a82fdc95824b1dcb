//! Reading a record's JSON with a member name twice in one object refused.
//!
//! The fingerprint is SHA-256 over the RFC 8785 (JCS) form of the command, and JCS is
//! defined on I-JSON (RFC 7493), whose objects have unique member names: RFC 8785 §3.1 has
//! a parser refuse duplicates. `serde_json::Value` keeps the last of them, so
//! `{"amount": 1, "amount": 1000}` would be fingerprinted, compared and sent as 1000
//! while a producer (or any other reader of the topic) that keeps the first means 1. A
//! money command must not hang on which reader's rule wins.
//!
//! The same walk as `serde_json::Value`'s own visitor: a number is what serde_json makes of
//! it, and a duplicate costs one lookup, the one inserting the member makes anyway.

use std::fmt;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

/// A JSON value whose objects have unique member names.
pub(super) struct UniqueNames(pub(super) Value);

impl<'de> Deserialize<'de> for UniqueNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueNamesVisitor).map(UniqueNames)
    }
}

struct UniqueNamesVisitor;

impl<'de> Visitor<'de> for UniqueNamesVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        // As serde_json's own visitor: a float JSON can spell is always finite.
        Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        UniqueNames::deserialize(deserializer).map(|UniqueNames(v)| v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(UniqueNames(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let UniqueNames(value) = map.next_value()?;
            match out.entry(name) {
                Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                Entry::Occupied(first) => {
                    let name = first.key();
                    return Err(A::Error::custom(format_args!("member name {name:?} appears twice in one object")));
                }
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::UniqueNames;
    use serde_json::json;

    fn read(text: &str) -> Result<serde_json::Value, String> {
        serde_json::from_str::<UniqueNames>(text).map(|UniqueNames(v)| v).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_what_serde_json_reads() {
        let text = r#"{"a": [1, -2, 3.5, 1e300, 18446744073709551615, true, null, "x\u00e9"], "b": {"c": {}}}"#;
        assert_eq!(read(text).unwrap(), serde_json::from_str::<serde_json::Value>(text).unwrap());
        assert_eq!(read("[]").unwrap(), json!([]));
    }

    #[test]
    fn a_member_name_twice_is_refused_at_any_depth() {
        for (text, name) in [
            (r#"{"id": "a", "type": "t", "id": "b"}"#, "id"),
            (r#"{"payload": {"amount": 1, "amount": 1000}}"#, "amount"),
            (r#"{"p": [{"x": 1}, {"y": 1, "y": 1}]}"#, "y"),
        ] {
            let err = read(text).unwrap_err();
            assert!(err.contains(&format!("member name \"{name}\" appears twice")), "{text}: {err}");
        }
        // The same name in two objects is not a duplicate.
        assert!(read(r#"{"a": {"x": 1}, "b": {"x": 1}}"#).is_ok());
    }
}

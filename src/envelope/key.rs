//! Where the idempotency key comes from: the shape's own key, a header, a JSON pointer
//! or the record key, and the key rules (1..=255 bytes of UTF-8, no control characters).

use super::*;

/// Checks a key candidate: 1..=255 bytes, no control characters. `what` names its source.
pub(super) fn validate_key(key: &str, what: &str) -> Result<String, Rejection> {
    let bad = |m: String| reject(RejectReason::BadKey, m, None);
    if key.is_empty() {
        return Err(bad(format!("the key ({what}) is empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(bad(format!("the key ({what}) is {} bytes, over the limit of {MAX_KEY_BYTES}", key.len())));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(bad(format!("the key ({what}) contains the control character U+{:04X}", u32::from(c))));
    }
    Ok(key.to_string())
}

pub(super) fn missing_key(message: String) -> Rejection {
    reject(RejectReason::MissingKey, message, None)
}

/// A key from a header value (already known to be present).
pub(super) fn key_from_bytes(bytes: &[u8], what: &str) -> Result<String, Rejection> {
    match std::str::from_utf8(bytes) {
        Ok(s) => validate_key(s, what),
        Err(e) => Err(reject(
            RejectReason::BadKey,
            format!("the key ({what}) is not UTF-8 (invalid byte at offset {})", e.valid_up_to()),
            None,
        )),
    }
}

/// A key from a JSON member: absent or null is missing, anything but a string is bad.
pub(super) fn key_from_json(v: Option<&Value>, what: &str) -> Result<String, Rejection> {
    match v {
        None | Some(Value::Null) => Err(missing_key(format!("the record has no key: {what} is missing"))),
        Some(Value::String(s)) => validate_key(s, what),
        Some(other) => Err(reject(
            RejectReason::BadKey,
            format!("the key ({what}) is a JSON {}, not a string", json_type(other)),
            None,
        )),
    }
}

/// One part of a CloudEvents key (`source` or `id`): a non-empty string.
pub(super) fn ce_part_json(obj: Option<&Value>, name: &str) -> Result<String, Rejection> {
    match obj {
        None | Some(Value::Null) => {
            Err(missing_key(format!("the CloudEvent has no `{name}`, which makes half of its key")))
        }
        Some(Value::String(s)) if s.is_empty() => {
            Err(reject(RejectReason::BadKey, format!("the CloudEvent's `{name}` is empty"), None))
        }
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(reject(
            RejectReason::BadKey,
            format!("the CloudEvent's `{name}` is a JSON {}, not a string", json_type(other)),
            None,
        )),
    }
}

pub(super) fn ce_part_header(headers: &[(String, Option<Vec<u8>>)], name: &str) -> Result<String, Rejection> {
    let Some(bytes) = header(headers, name) else {
        return Err(missing_key(format!("the binary CloudEvent has no {name} header, which makes half of its key")));
    };
    match std::str::from_utf8(bytes) {
        Ok("") => Err(reject(RejectReason::BadKey, format!("header {name} is empty"), None)),
        Ok(s) => Ok(s.to_string()),
        Err(_) => Err(reject(RejectReason::BadKey, format!("header {name} is not UTF-8"), None)),
    }
}

/// The tool call's `arguments`, which must be a JSON object.
pub(super) fn tool_arguments(doc: &Value) -> Result<&serde_json::Map<String, Value>, String> {
    match doc.get("arguments") {
        Some(Value::Object(args)) => Ok(args),
        None => Err("the tool call has no `arguments` (it must be a JSON object)".to_string()),
        Some(other) => Err(format!(
            "the tool call's `arguments` is a JSON {}, not an object (a JSON-encoded string is not decoded)",
            json_type(other)
        )),
    }
}

/// The key the shape carries itself.
pub(super) fn shape_key(shape: Shape, record: &InputRecord<'_>, doc: &Value) -> Result<String, Rejection> {
    match shape {
        Shape::Native => key_from_json(doc.get("id"), "`id`"),
        Shape::ToolCall => {
            let args = tool_arguments(doc).map_err(bad_envelope)?;
            key_from_json(args.get("idempotency_key"), "`arguments.idempotency_key`")
        }
        Shape::CloudEventsStructured => {
            let source = ce_part_json(doc.get("source"), "source")?;
            let id = ce_part_json(doc.get("id"), "id")?;
            validate_key(&format!("{source}/{id}"), "`source` + \"/\" + `id`")
        }
        Shape::CloudEventsBinary => {
            let source = ce_part_header(record.headers, "ce_source")?;
            let id = ce_part_header(record.headers, "ce_id")?;
            validate_key(&format!("{source}/{id}"), "ce_source + \"/\" + ce_id")
        }
    }
}

/// The key per `envelope.key`.
pub(super) fn read_key(
    record: &InputRecord<'_>,
    source: &KeySource,
    shape: Shape,
    doc: &Value,
) -> Result<String, Rejection> {
    match source {
        KeySource::Auto => match header(record.headers, "idempotency-key") {
            Some(bytes) => key_from_bytes(bytes, "header idempotency-key"),
            None => shape_key(shape, record, doc),
        },
        KeySource::Header(name) => match header(record.headers, name) {
            Some(bytes) => key_from_bytes(bytes, &format!("header {name}")),
            None => Err(missing_key(format!("the record has no {name} header (envelope.key = header:{name})"))),
        },
        KeySource::JsonPointer(pointer) => {
            let what = format!("json:{pointer}");
            match doc.pointer(pointer) {
                None | Some(Value::Null) => Err(missing_key(format!(
                    "the record has no key: nothing at JSON pointer {pointer} (envelope.key = {what})"
                ))),
                v => key_from_json(v, &what),
            }
        }
        KeySource::RecordKey => match record.key {
            Some(bytes) => key_from_bytes(bytes, "Kafka record key"),
            None => Err(missing_key("the record has no Kafka record key (envelope.key = record-key)".to_string())),
        },
    }
}

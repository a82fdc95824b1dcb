//! The three shapes: detection (auto or pinned), and reading type, `ttl`/`created_at`,
//! trace context and payload from each.

use super::*;

/// Finds the shape and parses the value: the envelope object, or a binary CloudEvent's data.
pub(super) fn detect(
    record: &InputRecord<'_>,
    format: EnvelopeFormat,
    bytes: &[u8],
) -> Result<(Shape, Value), Rejection> {
    if let Some(version) = header(record.headers, "ce_specversion") {
        return read_binary_cloudevent(version, format, bytes);
    }

    let doc = parse_json(bytes, "the value")?;
    let Value::Object(obj) = &doc else {
        return Err(reject(
            RejectReason::InvalidJson,
            format!("the value is a JSON {}, not an object", json_type(&doc)),
            None,
        ));
    };
    let has = |k: &str| obj.contains_key(k);
    let is_native = has("id") || has("type") || has("payload");
    let auto = if has("specversion") {
        Some(Shape::CloudEventsStructured)
    } else if has("tool") {
        Some(Shape::ToolCall)
    } else if is_native {
        Some(Shape::Native)
    } else {
        None
    };
    // A pinned format reads the record as that shape whenever it has that shape's marker
    // fields, even if auto-detection would have picked another one.
    let (shape, wanted) = match format {
        EnvelopeFormat::Auto => {
            (auto, "`specversion` (CloudEvents), `tool` (tool call) or `id`/`type`/`payload` (native)")
        }
        EnvelopeFormat::Native => (is_native.then_some(Shape::Native), "`id`, `type` or `payload`"),
        EnvelopeFormat::ToolCall => (has("tool").then_some(Shape::ToolCall), "`tool`"),
        EnvelopeFormat::Cloudevents => {
            (has("specversion").then_some(Shape::CloudEventsStructured), "`specversion` (nor a ce_specversion header)")
        }
    };
    let Some(shape) = shape else {
        let looks = match auto {
            Some(s) => format!(" (it looks like {})", shape_name(s)),
            None => String::new(),
        };
        return Err(bad_envelope(format!(
            "the JSON object has none of {wanted}, so it is not a command for envelope.format = {}{looks}",
            format_name(format)
        )));
    };
    if shape == Shape::CloudEventsStructured {
        check_specversion(obj.get("specversion"))?;
    }
    Ok((shape, doc))
}

/// A binary CloudEvent (a `ce_specversion` header): the version must be ours and the value
/// is its data.
fn read_binary_cloudevent(version: &[u8], format: EnvelopeFormat, bytes: &[u8]) -> Result<(Shape, Value), Rejection> {
    if matches!(format, EnvelopeFormat::Native | EnvelopeFormat::ToolCall) {
        return Err(bad_envelope(format!(
            "the record is a binary CloudEvent (it has a ce_specversion header), but envelope.format = {}",
            format_name(format)
        )));
    }
    match std::str::from_utf8(version) {
        Ok(CE_SPECVERSION) => {}
        Ok(other) => {
            return Err(bad_envelope(format!(
                "header ce_specversion is {}; only CloudEvents {CE_SPECVERSION} is supported",
                quote(other)
            )));
        }
        Err(_) => return Err(bad_envelope("header ce_specversion is not UTF-8".to_string())),
    }
    let data = parse_json(bytes, "the value (the data of a binary CloudEvent)")?;
    Ok((Shape::CloudEventsBinary, data))
}

/// A structured CloudEvent's `specversion` must be the string of the version we read.
fn check_specversion(specversion: Option<&Value>) -> Result<(), Rejection> {
    match specversion {
        Some(Value::String(v)) if v == CE_SPECVERSION => Ok(()),
        Some(Value::String(v)) => {
            Err(bad_envelope(format!("`specversion` is {}; only CloudEvents {CE_SPECVERSION} is supported", quote(v))))
        }
        Some(v) => Err(bad_envelope(format!("`specversion` is a JSON {}, not the string \"1.0\"", json_type(v)))),
        None => Err(bad_envelope("`specversion` is missing".to_string())),
    }
}

/// The command type: a non-empty string. Errors are `missing_type` messages.
/// The command type, or why there is none: `missing_type` for an absent or empty one,
/// `bad_envelope` for a member of the wrong JSON type (docs/contract.md §1).
pub(super) fn read_type(shape: Shape, record: &InputRecord<'_>, doc: &Value) -> Result<String, (RejectReason, String)> {
    let missing = |m: String| (RejectReason::MissingType, m);
    let (value, name) = match shape {
        Shape::Native => (doc.get("type"), "`type`"),
        Shape::ToolCall => (doc.get("tool"), "`tool`"),
        Shape::CloudEventsStructured => (doc.get("type"), "`type`"),
        Shape::CloudEventsBinary => {
            return match header(record.headers, "ce_type").map(std::str::from_utf8) {
                None => Err(missing("the binary CloudEvent has no ce_type header".to_string())),
                Some(Err(_)) => Err(missing("header ce_type is not UTF-8".to_string())),
                Some(Ok("")) => Err(missing("header ce_type is empty".to_string())),
                Some(Ok(s)) => Ok(s.to_string()),
            };
        }
    };
    match value {
        None | Some(Value::Null) => Err(missing(format!("{} has no {name}", shape_name(shape)))),
        Some(Value::String(s)) if s.is_empty() => Err(missing(format!("{name} is empty"))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err((RejectReason::BadEnvelope, format!("{name} is a JSON {}, not a string", json_type(other)))),
    }
}

pub(super) fn parse_time(text: &str, name: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{name} = {} is not an RFC 3339 timestamp: {e}", quote(text)))
}

pub(super) fn time_from_json(v: Option<&Value>, name: &str) -> Result<Option<i64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_time(s, name).map(Some),
        Some(other) => Err(format!("{name} is a JSON {}, not an RFC 3339 string", json_type(other))),
    }
}

/// `ttl` and `created_at` (CloudEvents: `time`/`ce_time`). Errors are `bad_field` messages.
pub(super) fn read_fields(
    shape: Shape,
    record: &InputRecord<'_>,
    doc: &Value,
) -> Result<(Option<Duration>, Option<i64>), String> {
    match shape {
        Shape::Native => {
            let ttl = match doc.get("ttl") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => match humantime::parse_duration(s) {
                    Ok(d) if d.is_zero() => {
                        return Err("`ttl` is zero; leave it out to use the route's TTL".to_string());
                    }
                    Ok(d) => Some(d),
                    Err(e) => return Err(format!("`ttl` = {} is not a duration like \"72h\": {e}", quote(s))),
                },
                Some(other) => {
                    return Err(format!("`ttl` is a JSON {}, not a duration string like \"72h\"", json_type(other)));
                }
            };
            Ok((ttl, time_from_json(doc.get("created_at"), "`created_at`")?))
        }
        Shape::ToolCall => Ok((None, None)),
        Shape::CloudEventsStructured => Ok((None, time_from_json(doc.get("time"), "`time`")?)),
        Shape::CloudEventsBinary => match header(record.headers, "ce_time").map(std::str::from_utf8) {
            None => Ok((None, None)),
            Some(Ok(s)) => Ok((None, Some(parse_time(s, "header ce_time")?))),
            Some(Err(_)) => Err("header ce_time is not UTF-8".to_string()),
        },
    }
}

/// W3C trace context, `traceparent` and `tracestate` from the same place: the headers; for
/// CloudEvents also the distributed tracing extension (`ce_traceparent`/`ce_tracestate`
/// headers, `traceparent`/`tracestate` attributes). Not UTF-8: dropped. No `tracestate`
/// without a `traceparent` (W3C: it means nothing alone).
pub(super) fn read_trace_context(
    shape: Shape,
    record: &InputRecord<'_>,
    doc: &Value,
) -> (Option<String>, Option<String>) {
    let from_header =
        |name: &str| header(record.headers, name).and_then(|b| std::str::from_utf8(b).ok()).map(str::to_string);
    let from_doc = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_string);
    if let Some(traceparent) = from_header("traceparent") {
        return (Some(traceparent), from_header("tracestate"));
    }
    let (traceparent, tracestate) = match shape {
        Shape::CloudEventsBinary => (from_header("ce_traceparent"), from_header("ce_tracestate")),
        Shape::CloudEventsStructured => (from_doc("traceparent"), from_doc("tracestate")),
        Shape::Native | Shape::ToolCall => (None, None),
    };
    (traceparent.clone(), tracestate.filter(|_| traceparent.is_some()))
}

/// Moves the payload out of the parsed value. Errors are `bad_envelope` messages.
pub(super) fn take_payload(shape: Shape, doc: &mut Value) -> Result<Value, String> {
    match shape {
        Shape::Native => match doc.as_object_mut().and_then(|o| o.remove("payload")) {
            Some(p) => Ok(p),
            None => Err("the native command has no `payload` (use \"payload\": null for none)".to_string()),
        },
        Shape::ToolCall => {
            tool_arguments(doc)?;
            Ok(doc.as_object_mut().and_then(|o| o.remove("arguments")).unwrap_or(Value::Null))
        }
        Shape::CloudEventsStructured => {
            let Some(obj) = doc.as_object_mut() else { return Ok(Value::Null) };
            match obj.remove("data") {
                Some(data) => Ok(data),
                None if obj.contains_key("data_base64") => {
                    Err("the CloudEvent carries `data_base64`; only JSON `data` is supported".to_string())
                }
                None => Ok(Value::Null),
            }
        }
        Shape::CloudEventsBinary => Ok(std::mem::take(doc)),
    }
}

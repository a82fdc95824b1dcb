//! An `http` sink's response body as stored in the result: JSON when it parses, else
//! text, bounded by `max_response_bytes`.

use std::error::Error as _;

use serde_json::{Value, json};

/// Default of `max_response_bytes`: most bytes of a response body kept in a result (64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Most characters of a response body quoted in an error message.
const MESSAGE_SNIPPET_CHARS: usize = 256;

/// A response body, read up to `max_response_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Body {
    /// The body as stored: JSON, text or null.
    value: Value,
    /// Whether the body was longer than the bound.
    truncated: bool,
    /// Why reading the body failed part way, if it did (the status still counts).
    error: Option<String>,
    /// Whether `value` is the whole body parsed as JSON (a JSON string and a text body are
    /// both a string `value`; a check's `found_pointer` may only look into the former).
    json: bool,
}

impl Body {
    /// Renders raw bytes (at most `limit` of them): JSON when the whole body is valid JSON,
    /// else lossy UTF-8 text cut to `limit` bytes at a character boundary, null when empty.
    pub(crate) fn from_bytes(bytes: &[u8], truncated: bool, limit: usize) -> Body {
        if bytes.is_empty() {
            return Body { value: Value::Null, truncated, error: None, json: false };
        }
        if !truncated && let Ok(value) = serde_json::from_slice::<Value>(bytes) {
            return Body { value, truncated, error: None, json: true };
        }
        // A cut may split the last character: drop the incomplete tail.
        let whole = match std::str::from_utf8(bytes) {
            Err(e) if truncated && e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        };
        let mut text = String::from_utf8_lossy(whole).into_owned();
        let mut truncated = truncated;
        if text.len() > limit {
            // Replacement characters grew invalid bytes; keep the bound on the stored text.
            let mut cut = limit;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            truncated = true;
        }
        Body { value: Value::String(text), truncated, error: None, json: false }
    }

    /// The result stored for a response: `{"status", "body"}`, plus `"truncated": true`
    /// or `"body_error"` when those happened.
    pub(super) fn into_result(self, code: u16) -> Value {
        let mut result = json!({ "status": code, "body": self.value });
        if self.truncated {
            result["truncated"] = Value::Bool(true);
        }
        if let Some(error) = self.error {
            result["body_error"] = Value::String(error);
        }
        result
    }

    /// The body as JSON, read whole; `Err` says why it is not (empty, not JSON, longer
    /// than `max_response_bytes`, or cut short by an error).
    pub(super) fn json(&self) -> Result<&Value, String> {
        match (&self.error, self.truncated, self.json) {
            (Some(error), _, _) => Err(format!("reading the body failed: {error}")),
            (None, true, _) => Err("the body is longer than max_response_bytes".into()),
            (None, false, false) if self.value.is_null() => Err("the body is empty".into()),
            (None, false, false) => Err("the body is not JSON".into()),
            (None, false, true) => Ok(&self.value),
        }
    }

    /// A short quote of the body for an error message.
    pub(super) fn snippet(&self) -> Option<String> {
        let text = match &self.value {
            Value::Null => return None,
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let mut snippet: String = text.chars().take(MESSAGE_SNIPPET_CHARS).collect();
        if snippet.len() < text.len() {
            snippet.push('…');
        }
        Some(snippet)
    }
}

/// Reads the body up to the bound (bounded in time by the client's request timeout) and
/// stops there; a read error keeps the status and records the error with a null body.
pub(super) async fn read_body(response: &mut reqwest::Response, limit: usize) -> Body {
    let mut bytes: Vec<u8> = Vec::new();
    let mut truncated = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - bytes.len();
                if chunk.len() > room {
                    bytes.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(err) => {
                return Body {
                    value: Value::Null,
                    truncated: false,
                    error: Some(describe(err.without_url())),
                    json: false,
                };
            }
        }
    }
    Body::from_bytes(&bytes, truncated, limit)
}

/// An error with its causes ("error sending request: client error (Connect): tcp connect
/// error: Connection refused"), without the URL (it may carry credentials).
pub(super) fn describe(err: reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_json_text_and_empty() {
        assert_eq!(Body::from_bytes(br#"{"id":7}"#, false, MAX_BODY_BYTES).value, json!({"id": 7}));
        assert_eq!(Body::from_bytes(b"accepted", false, MAX_BODY_BYTES).value, json!("accepted"));
        assert_eq!(Body::from_bytes(b"", false, MAX_BODY_BYTES).value, Value::Null);
        assert_eq!(Body::from_bytes(b"\xff ok", false, MAX_BODY_BYTES).value, json!("\u{fffd} ok"));
    }

    #[test]
    fn truncated_body_is_text_cut_at_a_char_boundary() {
        // 'é' is two bytes; the cut lands in the middle of the last one.
        let mut bytes = br#"{"x":""#.to_vec();
        while bytes.len() < MAX_BODY_BYTES - 1 {
            bytes.extend_from_slice("é".as_bytes());
        }
        bytes.truncate(MAX_BODY_BYTES);
        let body = Body::from_bytes(&bytes, true, MAX_BODY_BYTES);
        assert!(body.truncated);
        let text = body.value.as_str().expect("a truncated body is text");
        assert!(text.len() <= MAX_BODY_BYTES);
        assert!(!text.ends_with('\u{fffd}'));
        assert!(text.starts_with(r#"{"x":"é"#));
    }

    #[test]
    fn invalid_bytes_do_not_break_the_bound() {
        let bytes = vec![0xffu8; MAX_BODY_BYTES];
        let body = Body::from_bytes(&bytes, false, MAX_BODY_BYTES);
        assert!(body.truncated);
        assert!(body.value.as_str().unwrap().len() <= MAX_BODY_BYTES);
    }

    #[test]
    fn result_shape() {
        assert_eq!(Body::from_bytes(b"", false, MAX_BODY_BYTES).into_result(204), json!({"status": 204, "body": null}));
        assert_eq!(
            Body::from_bytes(b"abc", true, MAX_BODY_BYTES).into_result(200),
            json!({"status": 200, "body": "abc", "truncated": true})
        );
    }

    #[test]
    fn only_a_whole_json_body_is_json() {
        assert_eq!(Body::from_bytes(br#""text""#, false, MAX_BODY_BYTES).json(), Ok(&json!("text")));
        assert_eq!(Body::from_bytes(b"[]", false, MAX_BODY_BYTES).json(), Ok(&json!([])));
        for (bytes, truncated, why) in
            [(&b"text"[..], false, "not JSON"), (b"", false, "empty"), (b"[1,", true, "longer than")]
        {
            let err = Body::from_bytes(bytes, truncated, MAX_BODY_BYTES).json().unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn snippet_is_short() {
        let long = "x".repeat(1000);
        let snippet = Body::from_bytes(long.as_bytes(), false, MAX_BODY_BYTES).snippet().unwrap();
        assert_eq!(snippet.chars().count(), MESSAGE_SNIPPET_CHARS + 1);
        assert_eq!(Body::from_bytes(b"", false, MAX_BODY_BYTES).snippet(), None);
    }
}

//! Templates that put payload fields into a sink's URL, body or message (shared by the
//! `http` and `kafka` sinks).
//!
//! A placeholder names one payload field, in either form:
//! - `{/customer/id}`: a JSON pointer (RFC 6901) into the payload; `{}` is not a
//!   placeholder, the whole payload is `{payload}`;
//! - `{payload.customer.id}`: the same field as dotted path (segments are object keys or
//!   array indices).
//!
//! `{{` and `}}` stand for literal braces. Two kinds of template use them:
//! - [`StringTemplate`]: text with placeholders; a field's value is inserted as text
//!   (strings as they are, numbers and booleans as JSON text), percent-encoded when the
//!   template is a URL. `null`, arrays and objects cannot be inserted into text.
//! - [`JsonTemplate`]: a JSON value whose string leaves are templates: a leaf that is
//!   exactly one placeholder (`"{/customer}"`) is replaced by the field's JSON value,
//!   whatever its type; any other leaf containing a placeholder is rendered as text.
//!
//! A field missing from a payload is an error naming it: retrying the same payload cannot
//! make it appear, so sinks report it as a permanent failure.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// A template that does not parse, or a payload it cannot be rendered with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template text is malformed (unclosed or stray brace, bad placeholder).
    #[error("template `{template}`: {reason}")]
    Syntax {
        /// The template text.
        template: String,
        /// What is wrong.
        reason: String,
    },
    /// The payload has no field at this pointer.
    #[error("payload has no field `{pointer}` (required by the template)")]
    Missing {
        /// The JSON pointer that names the field.
        pointer: String,
    },
    /// The field is `null`, an array or an object and cannot be inserted into text.
    #[error("payload field `{pointer}` is {found}, which cannot be inserted into text")]
    NotText {
        /// The JSON pointer that names the field.
        pointer: String,
        /// What the field holds.
        found: &'static str,
    },
}

/// How field values are written into a [`StringTemplate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As they are (message text, header values).
    Plain,
    /// Percent-encoded so that a value stays one URL path segment or query value: every
    /// byte except RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`) is escaped.
    Url,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    /// A JSON pointer; `""` is the whole payload.
    Field(String),
}

/// Text with placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringTemplate {
    parts: Vec<Part>,
}

impl StringTemplate {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<StringTemplate, TemplateError> {
        let syntax = |reason: String| TemplateError::Syntax { template: text.to_string(), reason };
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().is_some_and(|(_, n)| *n == '{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().is_some_and(|(_, n)| *n == '}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => {
                    return Err(syntax(format!("stray `}}` at byte {at} (write `}}}}` for a literal brace)")));
                }
                '{' => {
                    let rest = &text[at + 1..];
                    let Some(len) = rest.find('}') else {
                        return Err(syntax(format!(
                            "`{{` at byte {at} is never closed (write `{{{{` for a literal brace)"
                        )));
                    };
                    let pointer = placeholder_pointer(&rest[..len]).map_err(syntax)?;
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(pointer));
                    // Skip the placeholder's characters and its closing brace.
                    while chars.next_if(|(i, _)| *i <= at + 1 + len).is_some() {}
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(StringTemplate { parts })
    }

    /// Whether the template has any placeholder.
    pub fn has_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// The literal text before the first placeholder (to check a URL's scheme).
    pub fn literal_prefix(&self) -> &str {
        match self.parts.first() {
            Some(Part::Literal(text)) => text,
            _ => "",
        }
    }

    /// The pointer when the whole template is one placeholder.
    fn single_field(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Field(pointer)] => Some(pointer),
            _ => None,
        }
    }

    /// Renders with every field taken from `payload`.
    pub fn render(&self, payload: &Value, encoding: Encoding) -> Result<String, TemplateError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Field(pointer) => {
                    let value = lookup(payload, pointer)?;
                    let text = as_text(value, pointer)?;
                    match encoding {
                        Encoding::Plain => out.push_str(&text),
                        Encoding::Url => percent_encode_into(&text, &mut out),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Renders with every field replaced by `filler` (to check a template's shape at
    /// build time without a payload).
    pub fn render_with(&self, filler: &str) -> String {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Literal(text) => text.as_str(),
                Part::Field(_) => filler,
            })
            .collect()
    }
}

/// A JSON value whose string leaves may be templates (see the module comment).
#[derive(Debug, Clone, PartialEq)]
pub struct JsonTemplate {
    node: Node,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Fixed(Value),
    Text(StringTemplate),
    Field(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

impl JsonTemplate {
    /// Parses every string leaf of `value`. Object keys are taken literally.
    pub fn parse(value: &Value) -> Result<JsonTemplate, TemplateError> {
        Ok(JsonTemplate { node: parse_node(value)? })
    }

    /// The value with every placeholder filled from `payload`.
    pub fn render(&self, payload: &Value) -> Result<Value, TemplateError> {
        render_node(&self.node, payload)
    }
}

fn parse_node(value: &Value) -> Result<Node, TemplateError> {
    Ok(match value {
        Value::String(text) => {
            let template = StringTemplate::parse(text)?;
            match template.single_field() {
                Some(pointer) => Node::Field(pointer.to_string()),
                None if template.has_fields() => Node::Text(template),
                // Keep `{{` unescaped in a leaf without placeholders.
                None => Node::Fixed(Value::String(template.render_with(""))),
            }
        }
        Value::Array(items) => Node::Array(items.iter().map(parse_node).collect::<Result<_, _>>()?),
        Value::Object(map) => Node::Object(
            map.iter().map(|(k, v)| Ok((k.clone(), parse_node(v)?))).collect::<Result<_, TemplateError>>()?,
        ),
        other => Node::Fixed(other.clone()),
    })
}

fn render_node(node: &Node, payload: &Value) -> Result<Value, TemplateError> {
    Ok(match node {
        Node::Fixed(value) => value.clone(),
        Node::Text(template) => Value::String(template.render(payload, Encoding::Plain)?),
        Node::Field(pointer) => lookup(payload, pointer)?.clone(),
        Node::Array(items) => Value::Array(items.iter().map(|n| render_node(n, payload)).collect::<Result<_, _>>()?),
        Node::Object(entries) => Value::Object(
            entries
                .iter()
                .map(|(k, n)| Ok((k.clone(), render_node(n, payload)?)))
                .collect::<Result<_, TemplateError>>()?,
        ),
    })
}

/// The JSON pointer a placeholder's inside (`/a/b`, `payload.a.b` or `payload`) stands for.
fn placeholder_pointer(inside: &str) -> Result<String, String> {
    if inside.starts_with('/') {
        return Ok(inside.to_string());
    }
    if inside == "payload" {
        return Ok(String::new());
    }
    if let Some(path) = inside.strip_prefix("payload.") {
        if path.split('.').any(str::is_empty) {
            return Err(format!("placeholder `{{{inside}}}` has an empty path segment"));
        }
        return Ok(path.split('.').map(|seg| format!("/{}", seg.replace('~', "~0").replace('/', "~1"))).collect());
    }
    Err(format!("placeholder `{{{inside}}}` must be a JSON pointer (`{{/a/b}}`) or `{{payload.a.b}}`"))
}

fn lookup<'v>(payload: &'v Value, pointer: &str) -> Result<&'v Value, TemplateError> {
    payload.pointer(pointer).ok_or_else(|| TemplateError::Missing { pointer: pointer.to_string() })
}

fn as_text(value: &Value, pointer: &str) -> Result<String, TemplateError> {
    let found = match value {
        Value::String(text) => return Ok(text.clone()),
        Value::Number(_) | Value::Bool(_) => return Ok(value.to_string()),
        Value::Null => "null",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    Err(TemplateError::NotText { pointer: pointer.to_string(), found })
}

/// Every byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn percent_encode_into(text: &str, out: &mut String) {
    out.extend(utf8_percent_encode(text, NOT_UNRESERVED));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn payload() -> Value {
        json!({"customer": {"id": "c/1 ü", "n": 7}, "ok": true, "items": [1, {"sku": "A"}], "a/b": "slash", "nothing": null})
    }

    #[test]
    fn url_fields_are_percent_encoded() {
        let t = StringTemplate::parse("https://api.test/x/{/customer/id}?n={payload.customer.n}&ok={/ok}").unwrap();
        assert_eq!(t.render(&payload(), Encoding::Url).unwrap(), "https://api.test/x/c%2F1%20%C3%BC?n=7&ok=true");
        assert_eq!(t.literal_prefix(), "https://api.test/x/");
    }

    #[test]
    fn plain_text_braces_and_array_indices() {
        let t = StringTemplate::parse("{{literal}} {/items/1/sku} {payload.items.1.sku} {/a~1b}").unwrap();
        assert_eq!(t.render(&payload(), Encoding::Plain).unwrap(), "{literal} A A slash");
        assert!(!StringTemplate::parse("no fields {{}}").unwrap().has_fields());
    }

    #[test]
    fn missing_and_non_text_fields_are_named() {
        let t = StringTemplate::parse("x{/customer/email}").unwrap();
        assert_eq!(
            t.render(&payload(), Encoding::Url),
            Err(TemplateError::Missing { pointer: "/customer/email".into() })
        );
        let err = StringTemplate::parse("{payload.customer}").unwrap().render(&payload(), Encoding::Plain).unwrap_err();
        assert_eq!(err, TemplateError::NotText { pointer: "/customer".into(), found: "an object" });
        assert!(err.to_string().contains("/customer"));
        let err = StringTemplate::parse("{/nothing}").unwrap().render(&payload(), Encoding::Plain).unwrap_err();
        assert!(matches!(err, TemplateError::NotText { found: "null", .. }));
    }

    #[test]
    fn malformed_templates_are_refused() {
        for bad in ["{/a", "a}", "{customer}", "{payload..x}", "{}", "{payload.}"] {
            assert!(matches!(StringTemplate::parse(bad), Err(TemplateError::Syntax { .. })), "{bad}");
        }
    }

    #[test]
    fn json_template_replaces_exact_leaves_by_values() {
        let t = JsonTemplate::parse(&json!({
            "to": "{/customer/id}",
            "customer": "{payload.customer}",
            "text": "order for {/customer/id}: {/customer/n} items",
            "whole": "{payload}",
            "fixed": [1, "{{not a field}}", null],
        }))
        .unwrap();
        assert_eq!(
            t.render(&payload()).unwrap(),
            json!({
                "to": "c/1 ü",
                "customer": {"id": "c/1 ü", "n": 7},
                "text": "order for c/1 ü: 7 items",
                "whole": payload(),
                "fixed": [1, "{not a field}", null],
            })
        );
        let missing = JsonTemplate::parse(&json!({"x": ["{/missing/field}"]})).unwrap().render(&payload());
        assert_eq!(missing, Err(TemplateError::Missing { pointer: "/missing/field".into() }));
    }

    proptest! {
        #[test]
        fn url_encoding_round_trips_and_stays_one_segment(text in "\\PC*") {
            let t = StringTemplate::parse("{/v}").unwrap();
            let rendered = t.render(&json!({"v": text}), Encoding::Url).unwrap();
            prop_assert!(rendered.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
            let mut decoded = Vec::new();
            let bytes = rendered.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i] == b'%' {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                    decoded.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    decoded.push(bytes[i]);
                    i += 1;
                }
            }
            prop_assert_eq!(String::from_utf8(decoded).unwrap(), text);
        }

        #[test]
        fn literal_text_with_escaped_braces_renders_as_itself(text in "[^{}]*") {
            let escaped = format!("{{{{{text}}}}}");
            let t = StringTemplate::parse(&escaped).unwrap();
            prop_assert_eq!(t.render(&json!({}), Encoding::Plain).unwrap(), format!("{{{text}}}"));
        }
    }
}

//! The `Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header): a
//! Structured Field string (RFC 9651 `sf-string`, `"..."`), or, as many clients send it, a
//! bare token; and the key it becomes in the store, scoped to its client.

use crate::envelope::MAX_KEY_BYTES;

/// Why a header is not a usable key (the problem's detail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key must be a Structured Field string (\"...\") or a token: {0}")]
    Syntax(&'static str),
    #[error("Idempotency-Key must not be empty")]
    Empty,
    #[error("Idempotency-Key is {len} bytes; with the client's name it may be at most {max}")]
    TooLong { len: usize, max: usize },
}

/// The key a header carries: the string's contents, or the token itself.
pub fn parse(header: &[u8]) -> Result<String, KeyError> {
    let text = std::str::from_utf8(header).map_err(|_| KeyError::Syntax("not ASCII"))?.trim_matches(' ');
    let key = match text.strip_prefix('"') {
        Some(rest) => sf_string(rest)?,
        None => token(text)?,
    };
    if key.is_empty() { Err(KeyError::Empty) } else { Ok(key) }
}

/// The rest of an `sf-string` after its opening quote: printable ASCII, `\"` and `\\`
/// escapes, the closing quote last.
fn sf_string(rest: &str) -> Result<String, KeyError> {
    let mut key = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => key.push(e),
                _ => return Err(KeyError::Syntax("a backslash may only escape '\"' or '\\'")),
            },
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(key)
                } else {
                    Err(KeyError::Syntax("nothing may follow the closing quote (no parameters)"))
                };
            }
            ' '..='~' => key.push(c),
            _ => return Err(KeyError::Syntax("only printable ASCII may be quoted")),
        }
    }
    Err(KeyError::Syntax("the string has no closing quote"))
}

/// An `sf-token`: a letter or `*` first, then token characters, `:` or `/`.
fn token(text: &str) -> Result<String, KeyError> {
    let mut chars = text.chars();
    match chars.next() {
        None => return Err(KeyError::Empty),
        Some(c) if c.is_ascii_alphabetic() || c == '*' => {}
        Some(_) => return Err(KeyError::Syntax("an unquoted key must start with a letter or '*'")),
    }
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c);
    if chars.all(tchar) {
        Ok(text.to_string())
    } else {
        Err(KeyError::Syntax("an unquoted key may hold only token characters"))
    }
}

/// The store key of `client`'s idempotency key: `CLIENT/KEY`, so that two clients never
/// share one. Client names have no `/`.
pub fn scoped(client: &str, key: &str) -> Result<String, KeyError> {
    let max = MAX_KEY_BYTES.saturating_sub(client.len() + 1);
    if key.len() > max {
        return Err(KeyError::TooLong { len: key.len(), max });
    }
    Ok(format!("{client}/{key}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_structured_field_string_is_read_with_its_escapes() {
        assert_eq!(parse(br#""order-17""#), Ok("order-17".into()));
        assert_eq!(parse(br#""a \"b\" \\c""#), Ok(r#"a "b" \c"#.into()));
        assert_eq!(parse(br#"  "spaced"  "#), Ok("spaced".into()));
    }

    #[test]
    fn a_bare_token_is_accepted() {
        assert_eq!(parse(b"order-17"), Ok("order-17".into()));
        assert_eq!(parse(b"task:42/step:3"), Ok("task:42/step:3".into()));
    }

    #[test]
    fn what_is_neither_is_refused() {
        for bad in [&br#""open"#[..], br#""x";a=1"#, br#""\n""#, b"1abc", b"a b", "\"caf\u{e9}\"".as_bytes(), b"a,b"] {
            assert!(matches!(parse(bad), Err(KeyError::Syntax(_))), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(br#""""#), Err(KeyError::Empty));
        assert_eq!(parse(b""), Err(KeyError::Empty));
    }

    #[test]
    fn a_key_is_scoped_to_its_client_within_the_store_limit() {
        assert_eq!(scoped("alice", "k1"), Ok("alice/k1".into()));
        let longest = "k".repeat(MAX_KEY_BYTES - "alice/".len());
        assert_eq!(scoped("alice", &longest).map(|k| k.len()), Ok(MAX_KEY_BYTES));
        assert_eq!(scoped("alice", &format!("{longest}k")), Err(KeyError::TooLong { len: 250, max: 249 }));
    }
}

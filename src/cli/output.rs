//! What the CLI prints. `println!` panics when stdout is a closed pipe (`dedupd inspect KEY
//! | head -1` closes it after one line); here a closed stdout ends the output quietly
//! instead: the reader took what it wanted, and the command itself has already run.

use std::fmt::Display;
use std::io::{ErrorKind, Write};

use super::CliError;

/// Prints `text` and a newline to stdout; a closed stdout is not an error.
pub(super) fn print_line(text: impl Display) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(CliError::Stdout),
    }
}

/// Prints a JSON document, indented.
pub(super) fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::Other(e.to_string()))?;
    print_line(text)
}

/// Prints `dedupd: MESSAGE` to stderr; a closed stderr leaves nowhere to say it, so it is
/// ignored rather than a panic.
pub fn print_error(message: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "dedupd: {message}");
}

/// A key as a JSON string: quoted, with `"`, `\` and control characters escaped.
pub(super) fn quoted(key: &str) -> String {
    serde_json::Value::from(key).to_string()
}

/// The name a config file uses for `value` (e.g. `fjall` for the store backend), from its
/// serde form; an enum without one falls back to an empty name rather than debug text.
pub(super) fn config_name(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_quoted_as_json_strings() {
        assert_eq!(quoted("cli-forget-me"), "\"cli-forget-me\"");
        assert_eq!(quoted("a \"b\" \\ c"), r#""a \"b\" \\ c""#);
        assert_eq!(quoted("ключ"), "\"ключ\"");
    }

    #[test]
    fn config_names_are_the_config_file_spelling() {
        assert_eq!(config_name(&crate::store::StoreBackend::Fjall), "fjall");
        assert_eq!(config_name(&crate::store::StoreBackend::Sled), "sled");
    }
}

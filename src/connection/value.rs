//! One property value of a connection table: written in the file, or read from an
//! environment variable or a file when a client is made, so that secrets stay out of the
//! config file (`"sasl.password" = { env = "KAFKA_PASSWORD" }`).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A property's value, or where to read it from.
#[derive(Clone, PartialEq, Eq)]
pub enum PropertyValue {
    /// The value itself (TOML strings, numbers and booleans are all accepted).
    Text(String),
    /// `{ env = "NAME" }`: the value of an environment variable.
    Env(String),
    /// `{ file = "PATH" }`: the contents of a file, without its trailing newline (as
    /// Kubernetes and Docker secrets are mounted).
    File(PathBuf),
}

/// Why a value could not be read. Never holds the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("environment variable {0} is not set")]
    EnvUnset(String),
    #[error("environment variable {0} is not valid UTF-8")]
    EnvNotUnicode(String),
    #[error("cannot read {path}: {reason}")]
    File { path: PathBuf, reason: String },
}

impl PropertyValue {
    /// The value, read from the environment or the file now.
    pub fn resolve(&self) -> Result<String, ValueError> {
        self.resolve_with(|name| std::env::var(name))
    }

    /// Like [`resolve`](Self::resolve), with `env` standing in for the process environment.
    pub fn resolve_with(&self, env: impl Fn(&str) -> Result<String, std::env::VarError>) -> Result<String, ValueError> {
        match self {
            PropertyValue::Text(text) => Ok(text.clone()),
            PropertyValue::Env(name) => env(name).map_err(|e| match e {
                std::env::VarError::NotPresent => ValueError::EnvUnset(name.clone()),
                std::env::VarError::NotUnicode(_) => ValueError::EnvNotUnicode(name.clone()),
            }),
            PropertyValue::File(path) => read_secret_file(path),
        }
    }

    /// How the value may be shown in logs, errors and `check-config`: secrets and
    /// indirections never show their contents.
    pub fn shown(&self, secret: bool) -> String {
        match self {
            PropertyValue::Text(_) if secret => "<redacted>".into(),
            PropertyValue::Text(text) => format!("{text:?}"),
            PropertyValue::Env(name) => format!("{{ env = {name:?} }}"),
            PropertyValue::File(path) => format!("{{ file = {:?} }}", path.display().to_string()),
        }
    }
}

fn read_secret_file(path: &Path) -> Result<String, ValueError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ValueError::File { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_string())
}

/// Debug never shows a written value: the type cannot know whether it is a secret.
impl fmt::Debug for PropertyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PropertyValue::Text(_) => f.write_str("Text(..)"),
            other => f.write_str(&other.shown(false)),
        }
    }
}

impl Serialize for PropertyValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            PropertyValue::Text(text) => s.serialize_str(text),
            PropertyValue::Env(name) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("env", name)?;
                m.end()
            }
            PropertyValue::File(path) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("file", path)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for PropertyValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = PropertyValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a string, number or boolean, { env = "NAME" } or { file = "PATH" }"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PropertyValue, E> {
        Ok(PropertyValue::Text(v.to_string()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<PropertyValue, E> {
        Ok(PropertyValue::Text(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<PropertyValue, E> {
        Ok(PropertyValue::Text(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<PropertyValue, E> {
        Ok(PropertyValue::Text(v.to_string()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PropertyValue, A::Error> {
        let Some(kind) = map.next_key::<String>()? else {
            return Err(de::Error::custom(r#"expected { env = "NAME" } or { file = "PATH" }, found {}"#));
        };
        let value = match kind.as_str() {
            "env" => PropertyValue::Env(map.next_value()?),
            "file" => PropertyValue::File(map.next_value()?),
            other => return Err(de::Error::unknown_field(other, &["env", "file"])),
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!("`{extra}`: give either env or file, nothing else")));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct One {
        v: PropertyValue,
    }

    fn parse(text: &str) -> Result<PropertyValue, toml::de::Error> {
        toml::from_str::<One>(text).map(|o| o.v)
    }

    #[test]
    fn strings_numbers_and_booleans_are_text() {
        assert_eq!(parse("v = \"SASL_SSL\"").unwrap(), PropertyValue::Text("SASL_SSL".into()));
        assert_eq!(parse("v = 45000").unwrap(), PropertyValue::Text("45000".into()));
        assert_eq!(parse("v = true").unwrap(), PropertyValue::Text("true".into()));
    }

    #[test]
    fn env_and_file_references_parse_and_anything_else_is_refused() {
        assert_eq!(parse("v = { env = \"P\" }").unwrap(), PropertyValue::Env("P".into()));
        assert_eq!(parse("v = { file = \"/s\" }").unwrap(), PropertyValue::File("/s".into()));
        assert!(parse("v = { path = \"/s\" }").unwrap_err().to_string().contains("env"));
        assert!(parse("v = { env = \"P\", file = \"/s\" }").unwrap_err().to_string().contains("either"));
        assert!(parse("v = {}").is_err());
        assert!(parse("v = [1]").is_err());
    }

    #[test]
    fn values_resolve_from_env_and_files_without_the_trailing_newline() {
        let env = |name: &str| if name == "P" { Ok("s3cret".to_string()) } else { Err(std::env::VarError::NotPresent) };
        assert_eq!(PropertyValue::Env("P".into()).resolve_with(env).unwrap(), "s3cret");
        assert_eq!(PropertyValue::Env("Q".into()).resolve_with(env), Err(ValueError::EnvUnset("Q".into())));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "pa ss\n").unwrap();
        assert_eq!(PropertyValue::File(path.clone()).resolve().unwrap(), "pa ss");
        let missing = PropertyValue::File(dir.path().join("nope")).resolve().unwrap_err();
        assert!(matches!(missing, ValueError::File { .. }), "{missing}");
    }

    #[test]
    fn secrets_are_never_shown() {
        let v = PropertyValue::Text("hunter2".into());
        assert_eq!(v.shown(true), "<redacted>");
        assert!(!format!("{v:?}").contains("hunter2"));
        assert_eq!(PropertyValue::Env("P".into()).shown(true), "{ env = \"P\" }");
    }
}

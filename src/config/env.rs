//! `DEDUPD_SECTION__KEY=value` environment overrides, laid over the file with figment.
//!
//! A value is read as the type of the key it sets, never guessed from its text: it enters
//! figment as a string, and figment reads a string as a number or a boolean only where the
//! key is one (so `DEDUPD_HTTP__ADMIN_TOKEN=1234567890123456` stays a string and
//! `DEDUPD_PIPELINE__MAX_IN_FLIGHT=64` is a number). Two cases need more than that:
//! - a value written as a TOML array (`["a", "b"]`) is an array: a shell has no other way to
//!   spell a list. One that starts with `[` but is no TOML value stays the string it is (a
//!   password or a token may start with `[`); set for a list key, it is refused as a string
//!   where a list belongs, naming its variable;
//! - inside a sink table (an internally tagged enum, which serde buffers before figment can
//!   see the target type) a string is not read as a number; when extraction fails on such a
//!   key, the value is retried once as the TOML scalar it spells.
//!
//! Segments are lower-cased and may contain dots, so librdkafka properties can be set:
//! `DEDUPD_KAFKA__CONSUMER__SESSION.TIMEOUT.MS=45000`. A bad override names its variable.
//!
//! A variable with one underscore where the key needs two (`DEDUPD_PIPELINE_MAX_IN_FLIGHT`,
//! `DEDUPD_STORE_PATH`) is refused, naming the spelling that works, rather than ignored: the
//! operator meant to set that key, and a store path silently not set is a store elsewhere.
//! It is refused only when `SECTION__REST` is a key of that section: other `DEDUPD_*`
//! variables without `__` are left alone (scripts/kafka/kafka.sh reads `DEDUPD_KAFKA_HOME`,
//! and Kubernetes gives every container `DEDUPD_SERVICE_HOST`, `DEDUPD_PORT_…` for a
//! Service named `dedupd`).

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::DeserializeOwned;

use super::ConfigError;

/// Variables the command line reads itself; they are not config keys.
const CLI_VARIABLES: [&str; 4] = ["CONFIG", "ADMIN_TOKEN", "ADMIN_URL", "LOG"];

/// The config's sections (the top-level keys of [`super::Config`]), lowercase.
pub(super) const SECTIONS: [&str; 12] = [
    "kafka",
    "envelope",
    "limits",
    "store",
    "pipeline",
    "retry",
    "sinks",
    "routes",
    "http",
    "log",
    "telemetry",
    "intake",
];

/// Sections whose keys are names the operator chooses (a sink's), or a list: any
/// `SECTION__REST` is one, so one underscore says nothing of what was meant.
const NAMED_SECTIONS: [&str; 2] = ["sinks", "routes"];

/// The name figment gives this source in errors and metadata.
const SOURCE_NAME: &str = "DEDUPD_ environment variables";

/// One override: the variable, the key path it sets, and the value as written.
#[derive(Debug, Clone)]
struct EnvOverride {
    var: String,
    path: Vec<String>,
    text: String,
    /// Read as the TOML value its text spells (after a failed extraction as a string).
    as_toml_scalar: bool,
}

/// The TOML value `text` spells, if it spells one (`64`, `true`, `["a", "b"]`).
fn toml_value(text: &str) -> Option<toml::Value> {
    toml::from_str::<toml::Table>(&format!("v = {text}")).ok().and_then(|mut t| t.remove("v"))
}

impl EnvOverride {
    /// Whether it is written as a list: the only way a shell can spell one.
    fn is_list(&self) -> bool {
        self.text.trim_start().starts_with('[')
    }

    fn value(&self) -> Result<Value, ConfigError> {
        if self.is_list() || self.as_toml_scalar {
            match toml_value(&self.text) {
                Some(parsed) => return Value::serialize(parsed).map_err(|e| self.error(&e.to_string())),
                None if self.as_toml_scalar => return Err(self.error("is not a TOML value")),
                None => {}
            }
        }
        Ok(Value::from(self.text.clone()))
    }

    fn error(&self, reason: &str) -> ConfigError {
        ConfigError::Env { var: self.var.clone(), reason: reason.to_string() }
    }

    /// Whether its text spells a TOML scalar other than a string (a number or a boolean).
    fn spells_toml_scalar(&self) -> bool {
        toml_value(&self.text).is_some_and(|v| !v.is_str() && !v.is_array() && !v.is_table())
    }
}

/// The key path `rest` (a variable's name after `DEDUPD_`, without `__`) may have meant,
/// when it starts with a section whose keys are the config's own and one underscore:
/// `PIPELINE_MAX_IN_FLIGHT` gives `pipeline.max_in_flight`.
fn meant_path(rest: &str) -> Option<Vec<String>> {
    let lower = rest.to_ascii_lowercase();
    SECTIONS.iter().filter(|s| !NAMED_SECTIONS.contains(s)).find_map(|section| {
        let key = lower.strip_prefix(section)?.strip_prefix('_').filter(|key| !key.is_empty())?;
        Some(vec![section.to_string(), key.to_string()])
    })
}

/// The `DEDUPD_*` overrides found in an environment.
#[derive(Debug, Clone, Default)]
pub struct EnvOverrides {
    overrides: Vec<EnvOverride>,
    /// Variables with one underscore after a section ([`meant_path`]): refused by
    /// [`EnvOverrides::apply`] where the key they meant exists.
    near_misses: Vec<EnvOverride>,
}

impl EnvOverrides {
    /// Picks the overrides out of `env`. Other variables are ignored.
    pub fn read(env: impl IntoIterator<Item = (String, String)>) -> Result<EnvOverrides, ConfigError> {
        let (mut overrides, mut near_misses) = (Vec::new(), Vec::new());
        for (var, text) in env {
            let Some(rest) = var.strip_prefix("DEDUPD_") else { continue };
            if CLI_VARIABLES.contains(&rest) {
                continue;
            }
            if SECTIONS.iter().any(|s| rest.eq_ignore_ascii_case(s)) {
                let reason = "sets no key: a section is not set whole; set its keys, DEDUPD_SECTION__KEY";
                return Err(ConfigError::Env { var, reason: reason.into() });
            }
            if !rest.contains("__") {
                if let Some(path) = meant_path(rest) {
                    near_misses.push(EnvOverride { var, path, text, as_toml_scalar: false });
                }
                continue;
            }
            let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            if path.iter().any(|p| p.is_empty()) {
                return Err(ConfigError::Env { var, reason: "has an empty path segment".into() });
            }
            overrides.push(EnvOverride { var, path, text, as_toml_scalar: false });
        }
        // Deterministic order: the environment's order is the OS's.
        overrides.sort_by(|a, b| a.var.cmp(&b.var));
        near_misses.sort_by(|a, b| a.var.cmp(&b.var));
        Ok(EnvOverrides { overrides, near_misses })
    }

    /// Each override's key as config errors spell it (`store.default_ttl`,
    /// `kafka.consumer."session.timeout.ms"`), lowercase, with its variable.
    pub fn keys(&self) -> Vec<(String, String)> {
        self.overrides.iter().map(|o| (spelled_key(&o.path), o.var.clone())).collect()
    }

    /// Lays the overrides over `file` (the parsed TOML of `text`) and reads the result as
    /// `T`. An error caused by an override names the variable; one caused by the file is
    /// toml's own, with the line.
    pub fn apply<T: DeserializeOwned>(mut self, text: &str, file: toml::Table) -> Result<T, ConfigError> {
        if let Some(miss) = self.near_misses.iter().find(|miss| names_a_key::<T>(miss)) {
            let meant = format!("DEDUPD_{}", miss.path.join("__").to_ascii_uppercase());
            return Err(miss.error(&format!(
                "sets no key: an override is DEDUPD_SECTION__KEY, with two underscores after the section (did you mean {meant}?)"
            )));
        }
        for over in &mut self.overrides {
            spell_as_the_file(&mut over.path, &file);
        }
        // Each retry turns one more override into its TOML scalar, so this ends.
        loop {
            let figment = Figment::from(figment::providers::Serialized::defaults(&file)).merge(&self);
            let err = match figment.extract::<T>() {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let Some(culprit) = self.culprit(&err) else {
                return Err(file_error::<T>(text, &err));
            };
            let over = &mut self.overrides[culprit];
            if !over.as_toml_scalar && over.spells_toml_scalar() {
                over.as_toml_scalar = true;
                continue;
            }
            return Err(over.error(&describe(&err)));
        }
    }

    /// The override an extraction error is about: the one whose key path is the error's
    /// path (or that path plus the unknown field it names); else, below the error's path
    /// (serde reports a tagged enum's field errors at the enum), the one whose text is the
    /// string the error found, or the only one there.
    fn culprit(&self, err: &figment::Error) -> Option<usize> {
        use figment::error::{Actual, Kind};
        let mut path: Vec<String> = err.path.iter().map(|p| p.to_ascii_lowercase()).collect();
        if let Kind::UnknownField(field, _) = &err.kind
            && path.last() != Some(field)
        {
            path.push(field.to_ascii_lowercase());
        }
        // Paths compared ignoring case: an override is spelled as the file's key it matches.
        let lower = |p: &[String]| p.iter().map(|s| s.to_ascii_lowercase()).collect::<Vec<_>>();
        if let Some(exact) = self.overrides.iter().position(|o| lower(&o.path) == path) {
            return Some(exact);
        }
        let below: Vec<usize> =
            (0..self.overrides.len()).filter(|&i| lower(&self.overrides[i].path).starts_with(&path)).collect();
        if let Kind::InvalidType(Actual::Str(found), _) = &err.kind
            && let Some(&i) = below.iter().find(|&&i| self.overrides[i].text == *found)
        {
            return Some(i);
        }
        match below.as_slice() {
            [only] => Some(*only),
            _ => None,
        }
    }
}

/// Spells each segment of `path` as the file spells the key it matches ignoring case, so
/// that `DEDUPD_SINKS__PAYMENTSAPI__URL` reaches `[sinks.PaymentsApi]` (a variable's name
/// has no case to keep, and a sink's name is the operator's).
fn spell_as_the_file(path: &mut [String], file: &toml::Table) {
    let mut table = Some(file);
    for segment in path.iter_mut() {
        let Some(level) = table else { return };
        match level.iter().find(|(key, _)| key.eq_ignore_ascii_case(segment)) {
            Some((key, value)) => {
                segment.clone_from(key);
                table = value.as_table();
            }
            None => return,
        }
    }
}

/// Whether `miss`'s path is a key of `T`: an empty config with it set is read, or refused
/// for its value, but not as an unknown key.
fn names_a_key<T: DeserializeOwned>(miss: &EnvOverride) -> bool {
    let alone = EnvOverrides { overrides: vec![miss.clone()], near_misses: Vec::new() };
    match Figment::from(&alone).extract::<T>() {
        Ok(_) => true,
        Err(errors) => !errors.into_iter().any(|e| matches!(e.kind, figment::error::Kind::UnknownField(..))),
    }
}

impl Provider for EnvOverrides {
    fn metadata(&self) -> Metadata {
        Metadata::named(SOURCE_NAME)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut root = Dict::new();
        for over in &self.overrides {
            let value = over.value().map_err(|e| figment::Error::from(e.to_string()))?;
            insert_at(&mut root, &over.path, value)
                .map_err(|seg| figment::Error::from(format!("{}: `{seg}` is not a table", over.var)))?;
        }
        Ok(Profile::Default.collect(root))
    }
}

/// Puts `value` at `path` in `root`, making tables on the way. Err: a segment that is set
/// to a value by an earlier override, so cannot be a table too.
fn insert_at(root: &mut Dict, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else { return Ok(()) };
    let mut node = root;
    for seg in parents {
        let entry = node.entry(seg.clone()).or_insert_with(|| Value::from(Dict::new()));
        node = match entry {
            Value::Dict(_, dict) => dict,
            _ => return Err(seg.clone()),
        };
    }
    node.insert(last.clone(), value);
    Ok(())
}

/// A key path as config errors spell it: dotted, a segment with a dot in it quoted.
fn spelled_key(path: &[String]) -> String {
    let quoted = |seg: &String| if seg.contains('.') { format!("\"{seg}\"") } else { seg.clone() };
    path.iter().map(quoted).collect::<Vec<_>>().join(".")
}

/// figment's message without the key path and source it appends (the variable or the key
/// says both); an unknown key's list of the known ones without serde's nested quotes.
fn describe(err: &figment::Error) -> String {
    use figment::error::{Kind, OneOf};
    match &err.kind {
        Kind::UnknownField(_, []) => "is not a key here".to_string(),
        Kind::UnknownField(_, expected) => format!("is not a key here; expected {}", OneOf(expected)),
        kind => kind.to_string(),
    }
}

/// An extraction error not caused by an override: the key it is about and why, with the
/// line of the key (toml's, when the file alone fails too).
fn file_error<T: DeserializeOwned>(text: &str, err: &figment::Error) -> ConfigError {
    use figment::error::Kind;
    let mut path: Vec<String> = err.path.clone();
    if let Kind::UnknownField(field, _) = &err.kind
        && path.last() != Some(field)
    {
        path.push(field.clone());
    }
    let toml_line = toml::from_str::<T>(text).err().and_then(|e| line_at(text, e.span()));
    if path.is_empty() {
        return ConfigError::Parse { line: toml_line, message: describe(err) };
    }
    let key = spelled_key(&path);
    let line = toml_line.or_else(|| super::line_of(text, &key));
    ConfigError::Value { key, line, reason: describe(err) }
}

/// The error of a file that is not TOML: toml's message and the line it points at.
pub(super) fn not_toml(text: &str, err: &toml::de::Error) -> ConfigError {
    ConfigError::Parse { line: line_at(text, err.span()), message: err.message().to_string() }
}

/// The 1-based line of a byte offset's span in `text`.
fn line_at(text: &str, span: Option<std::ops::Range<usize>>) -> Option<usize> {
    span.map(|s| text.get(..s.start).unwrap_or(text).matches('\n').count() + 1)
}

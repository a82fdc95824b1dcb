//! `[kafka.connection]`: the librdkafka properties that every Kafka client dedupd makes
//! shares — security protocol, SASL mechanism and credentials, CA, certificate and key
//! (paths or PEM strings), client id. The consumer, the results producer, the kafka sinks
//! on the same cluster and the clients of `check-config --connect` all start from it, and
//! their own tables (`kafka.consumer`, `kafka.producer`, `sinks.NAME.producer`) override it.
//!
//! Values may come from the environment or from files (`{ env = "NAME" }`,
//! `{ file = "PATH" }`, see [`value`]), read when a client is made. Secrets are never
//! shown: [`is_secret`] names them, and everything that prints a table goes through
//! [`PropertyValue::shown`].
//!
//! - [`value`]: one property value and where it is read from;
//! - [`check`]: what `check-config` checks without a cluster (librdkafka's own parser,
//!   files, environment variables);
//! - [`probe`]: connecting with a deadline and naming why it failed;
//! - [`servers`]: `bootstrap.servers` entries, and whether two lists name the same brokers.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

pub mod check;
pub mod probe;
pub mod servers;
pub mod value;

pub use value::{PropertyValue, ValueError};

/// librdkafka properties shared by every client that talks to one cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct ConnectionConfig {
    properties: BTreeMap<String, PropertyValue>,
}

/// A property whose value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct ConnectionError {
    /// The full config key, e.g. `kafka.connection."sasl.password"`.
    pub key: String,
    /// What went wrong reading it.
    pub reason: ValueError,
}

impl ConnectionConfig {
    /// A table of written values (tests and defaults).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        Self { properties: pairs.into_iter().map(|(k, v)| (k.into(), PropertyValue::Text(v.into()))).collect() }
    }

    /// Sets `property` to `value`, replacing what was there.
    pub fn insert(&mut self, property: impl Into<String>, value: PropertyValue) {
        self.properties.insert(property.into(), value);
    }

    /// Whether the table sets nothing.
    pub fn is_empty(&self) -> bool {
        self.properties.is_empty()
    }

    /// The properties, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &PropertyValue)> {
        self.properties.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value written or referenced for `property`.
    pub fn get(&self, property: &str) -> Option<&PropertyValue> {
        self.properties.get(property)
    }

    /// Sets every property on `client`, reading `env` and `file` values now. `at` is the
    /// table's config key (`kafka.connection`), used to name a property that cannot be read.
    pub fn apply(&self, at: &str, client: &mut ClientConfig) -> Result<(), ConnectionError> {
        for (property, value) in &self.properties {
            let text = value.resolve().map_err(|reason| ConnectionError { key: key_of(at, property), reason })?;
            client.set(property, text);
        }
        Ok(())
    }

    /// The table as `property = shown value` lines, secrets redacted.
    pub fn shown(&self) -> Vec<String> {
        self.iter().map(|(k, v)| format!("{k} = {}", v.shown(is_secret(k)))).collect()
    }
}

/// Properties a connection table must not set: dedupd sets them for each client, and
/// delivery and offset handling rest on them.
pub const PER_CLIENT: [&str; 8] = [
    "bootstrap.servers",
    "group.id",
    "group.instance.id",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
    "transactional.id",
    "message.timeout.ms",
];

impl ConnectionConfig {
    /// The [`PER_CLIENT`] properties this table sets, with their values as they may be shown.
    pub fn per_client_properties(&self) -> Vec<(&'static str, String)> {
        PER_CLIENT.iter().filter_map(|p| self.properties.get(*p).map(|v| (*p, v.shown(is_secret(p))))).collect()
    }
}

/// The config key of `property` in the table at `at`: `kafka.connection."sasl.password"`.
pub fn key_of(at: &str, property: &str) -> String {
    format!("{at}.\"{property}\"")
}

/// Whether a librdkafka property holds a secret: passwords, secrets, passphrases, private
/// keys, the OAUTHBEARER config (which may embed a client secret) and a JAAS line (the Java
/// client's, which librdkafka refuses, but which holds a password when pasted).
pub fn is_secret(property: &str) -> bool {
    let p = property.to_ascii_lowercase();
    ["password", "secret", "passphrase", "private", "jaas"].iter().any(|word| p.contains(word))
        || matches!(p.as_str(), "ssl.key.pem" | "ssl_key" | "sasl.oauthbearer.config")
}

/// `value` as it may be shown for `property`.
pub fn shown_text(property: &str, value: &str) -> String {
    if is_secret(property) { "<redacted>".into() } else { format!("{value:?}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_recognised_by_name() {
        for p in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.assertion.private.key.pem",
            "sasl.jaas.config",
        ] {
            assert!(is_secret(p), "{p}");
        }
        for p in ["sasl.username", "ssl.ca.location", "security.protocol", "ssl.certificate.pem"] {
            assert!(!is_secret(p), "{p}");
        }
    }

    #[test]
    fn apply_sets_every_property_and_names_an_unreadable_one() {
        let mut table = ConnectionConfig::from_pairs([("security.protocol", "SASL_SSL")]);
        let mut client = ClientConfig::new();
        table.apply("kafka.connection", &mut client).unwrap();
        assert_eq!(client.get("security.protocol"), Some("SASL_SSL"));
        table.insert("sasl.password", PropertyValue::Env("DEDUPD_TEST_SURELY_UNSET_VAR".into()));
        let err = table.apply("kafka.connection", &mut ClientConfig::new()).unwrap_err();
        assert_eq!(err.key, "kafka.connection.\"sasl.password\"");
        assert!(err.to_string().contains("DEDUPD_TEST_SURELY_UNSET_VAR is not set"), "{err}");
    }

    #[test]
    fn shown_tables_hide_secrets() {
        let table = ConnectionConfig::from_pairs([("sasl.password", "hunter2"), ("sasl.username", "u")]);
        let shown = table.shown().join("\n");
        assert!(!shown.contains("hunter2") && shown.contains("sasl.username = \"u\""), "{shown}");
        assert!(!format!("{table:?}").contains("hunter2"));
    }
}

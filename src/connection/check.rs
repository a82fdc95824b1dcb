//! What can be known about a Kafka client's settings without a cluster, and is refused by
//! `check-config` before `run` would fail: each property through librdkafka's own parser
//! (unknown names, bad values, features this build lacks), the files properties name, the
//! environment variables and files values come from, and the whole client as librdkafka
//! builds it (TLS material loaded, the key matching the certificate, the SASL mechanism
//! available) — with no bootstrap servers, so nothing connects.
//!
//! Every problem is reported, not only the first, and no secret is ever part of one.

use std::path::Path;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::BaseProducer;

use super::{PropertyValue, is_secret, key_of};

/// One thing wrong with a client's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The config key, e.g. `kafka.connection."ssl.ca.location"`, or the client checked.
    pub key: String,
    /// What is wrong; never holds a secret.
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// Checks each property of the table at `at` on its own: its value can be read, librdkafka
/// accepts the name and the value, and a file it names is there and readable.
pub fn check_properties<'a>(at: &str, table: impl IntoIterator<Item = (&'a str, PropertyValue)>) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (property, value) in table {
        let key = key_of(at, property);
        let text = match value.resolve() {
            Ok(text) => text,
            Err(e) => {
                problems.push(Problem { key, reason: e.to_string() });
                continue;
            }
        };
        if let Err(reason) = parse_one(property, &text) {
            problems.push(Problem { key, reason });
        } else if let Some(reason) = named_file_problem(property, &text) {
            problems.push(Problem { key, reason });
        }
    }
    problems
}

/// librdkafka's verdict on one property set alone.
fn parse_one(property: &str, text: &str) -> Result<(), String> {
    match ClientConfig::new().set(property, text).create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, desc, _, _)) => Err(redact(property, text, &desc)),
        Err(other) => Err(redact(property, text, &other.to_string())),
    }
}

/// Properties whose value is a path librdkafka opens when the client is made.
fn names_a_file(property: &str) -> bool {
    property.ends_with(".location") || property.ends_with(".file") || property == "sasl.kerberos.keytab"
}

fn named_file_problem(property: &str, text: &str) -> Option<String> {
    // `probe` asks librdkafka to look for the system's CA bundle.
    if !names_a_file(property) || text.is_empty() || (property == "ssl.ca.location" && text == "probe") {
        return None;
    }
    let path = Path::new(text);
    let readable = match std::fs::metadata(path) {
        // A CA directory is read by hash name only: whether it has one.
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path).map(|mut entries| {
            property != "ssl.ca.location" || entries.any(|e| e.is_ok_and(|e| is_hash_name(&e.file_name())))
        }),
        Ok(_) => std::fs::File::open(path).map(|_| true),
        Err(e) => Err(e),
    };
    match readable {
        Err(e) => Some(format!("names {}, which cannot be read: {e}", path.display())),
        Ok(false) => Some(format!(
            "names the directory {}, which holds no certificate under a hash name (HASH.0): OpenSSL looks \
             a CA up in a directory by its subject's hash only, so it would trust none of them; run \
             `openssl rehash {}`, or name the PEM bundle file instead",
            path.display(),
            path.display()
        )),
        Ok(true) => None,
    }
}

/// Whether `name` is how OpenSSL's hashed directory lookup names a certificate: eight hex
/// digits, a dot and a number (`5ed36f99.0`), as `openssl rehash` (c_rehash) makes them.
fn is_hash_name(name: &std::ffi::OsStr) -> bool {
    let Some((hash, n)) = name.to_str().and_then(|n| n.split_once('.')) else { return false };
    hash.len() == 8
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
}

/// Builds the client `what` from `config` as `run` would, without its bootstrap servers
/// so that nothing connects: librdkafka then loads TLS material, matches the key with the
/// certificate and picks the SASL mechanism, and refuses what it cannot do.
pub fn check_client(what: &str, config: &ClientConfig) -> Result<(), Problem> {
    let mut offline = config.clone();
    offline.remove("bootstrap.servers");
    // The producer type is the cheapest full client; the checks above are the same for a
    // consumer, and consumer-only properties only draw a warning from a producer.
    offline.set("log_level", "0");
    match offline.create::<BaseProducer>() {
        Ok(_) => Ok(()),
        Err(e) => Err(Problem { key: what.to_string(), reason: client_error(config, &e) }),
    }
}

/// Why librdkafka would not make a client from `config`, without any value: its own
/// `Display` of a refused property ends with the property's value, which may be a secret
/// under a name dedupd does not know as one (a typo of `sasl.password`, a JAAS line).
pub fn client_error(config: &ClientConfig, e: &KafkaError) -> String {
    let text = match e {
        KafkaError::ClientCreation(text) => text.clone(),
        KafkaError::ClientConfig(_, desc, key, _) => format!("{desc} ({key})"),
        other => other.to_string(),
    };
    redact_all(config, &text)
}

/// `text` with the value of `property` cut out when it is a secret.
fn redact(property: &str, value: &str, text: &str) -> String {
    if is_secret(property) && !value.is_empty() { cut_out(text, value) } else { text.to_string() }
}

/// `text` with each occurrence of `secret` that stands on its own replaced: not one inside a
/// longer word, so that a short secret ("a") neither garbles the text around it nor shows
/// itself by the pattern of what was cut.
fn cut_out(text: &str, secret: &str) -> String {
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let (starts_word, ends_word) = (is_word(secret.chars().next()), is_word(secret.chars().next_back()));
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (at, _) in text.match_indices(secret) {
        let end = at + secret.len();
        let joined_before = starts_word && is_word(text[..at].chars().next_back());
        let joined_after = ends_word && is_word(text[end..].chars().next());
        if at < from || joined_before || joined_after {
            continue;
        }
        out.push_str(&text[from..at]);
        out.push_str("<redacted>");
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// `text` with every secret value of `config` cut out.
pub fn redact_all(config: &ClientConfig, text: &str) -> String {
    // `config_map` hides the values librdkafka deems sensitive; `get` gives them all.
    config.config_map().into_keys().fold(text.to_string(), |t, k| redact(k, config.get(k).unwrap_or_default(), &t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &str) -> PropertyValue {
        PropertyValue::Text(v.to_string())
    }

    #[test]
    fn every_bad_property_is_reported_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("ca.pem");
        let problems = check_properties(
            "kafka.connection",
            [
                ("security.protocol", text("SASL_SSL")),
                ("sasl.mechanisms", text("SCRAM-SHA-512")),
                ("no.such.property", text("1")),
                ("ssl.ca.location", text(missing.to_str().unwrap())),
                ("sasl.password", PropertyValue::Env("DEDUPD_TEST_SURELY_UNSET_VAR".into())),
                ("socket.timeout.ms", text("soon")),
            ],
        );
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "kafka.connection.\"no.such.property\"",
                "kafka.connection.\"ssl.ca.location\"",
                "kafka.connection.\"sasl.password\"",
                "kafka.connection.\"socket.timeout.ms\"",
            ],
            "{problems:?}"
        );
        assert!(problems[0].reason.contains("No such configuration property"), "{}", problems[0]);
        assert!(problems[1].reason.contains("cannot be read"), "{}", problems[1]);
        assert!(problems[2].reason.contains("is not set"), "{}", problems[2]);
    }

    #[test]
    fn a_ca_directory_needs_its_hash_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "not read").unwrap();
        let ca_dir = || [("ssl.ca.location", text(dir.path().to_str().unwrap()))];
        let problems = check_properties("kafka.connection", ca_dir());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].reason.contains("openssl rehash"), "{}", problems[0]);
        // What `openssl rehash` leaves: a link named by the subject's hash.
        std::os::unix::fs::symlink("ca.pem", dir.path().join("5ed36f99.0")).unwrap();
        assert!(check_properties("kafka.connection", ca_dir()).is_empty());
        // Other directories (a keytab's, say) are not CA directories.
        assert!(!is_hash_name(std::ffi::OsStr::new("5ed36f99.pem")));
        assert!(!is_hash_name(std::ffi::OsStr::new("5ed36f9.0")));
        assert!(is_hash_name(std::ffi::OsStr::new("0A1b2C3d.12")));
    }

    #[test]
    fn probe_needs_no_file() {
        assert!(check_properties("k", [("ssl.ca.location", text("probe"))]).is_empty());
    }

    #[test]
    fn a_client_librdkafka_cannot_build_is_refused_without_connecting() {
        let dir = tempfile::tempdir().unwrap();
        let bad_pem = dir.path().join("ca.pem");
        std::fs::write(&bad_pem, "not a certificate").unwrap();
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", "127.0.0.1:1")
            .set("security.protocol", "SSL")
            .set("ssl.ca.location", bad_pem.to_str().unwrap());
        let problem = check_client("the consumer", &c).unwrap_err();
        assert_eq!(problem.key, "the consumer");
        assert!(problem.reason.contains("ssl.ca.location"), "{problem}");
        let mut plain = ClientConfig::new();
        plain.set("bootstrap.servers", "127.0.0.1:1");
        assert!(check_client("the consumer", &plain).is_ok());
    }

    #[test]
    fn secrets_are_cut_out_of_librdkafka_errors() {
        let mut c = ClientConfig::new();
        c.set("sasl.password", "hunter2");
        assert_eq!(redact_all(&c, "bad value hunter2 here"), "bad value <redacted> here");
        assert_eq!(redact_all(&c, "user:hunter2@host, 'hunter2';"), "user:<redacted>@host, '<redacted>';");
    }

    #[test]
    fn a_short_secret_is_cut_out_only_where_it_stands_alone() {
        let mut c = ClientConfig::new();
        c.set("sasl.password", "a");
        let text = "sasl_ssl://127.0.0.1:9092/bootstrap: SASL authentication error (password a)";
        assert_eq!(
            redact_all(&c, text),
            "sasl_ssl://127.0.0.1:9092/bootstrap: SASL authentication error (password <redacted>)"
        );
        // A secret whose edges are not letters is cut out wherever it is.
        c.set("sasl.password", "-pw-");
        assert_eq!(redact_all(&c, "x-pw-y"), "x<redacted>y");
    }

    #[test]
    fn a_refused_property_is_named_without_its_value() {
        // librdkafka's own text of this error ends with "sasl.passwd hunter2".
        let mut c = ClientConfig::new();
        c.set("sasl.passwd", "hunter2");
        let Err(e) = c.create_native_config() else { panic!("sasl.passwd is no property") };
        assert!(e.to_string().contains("hunter2"), "librdkafka's Display shows the value: {e}");
        let text = client_error(&c, &e);
        assert!(text.contains("sasl.passwd") && !text.contains("hunter2"), "{text}");
    }
}

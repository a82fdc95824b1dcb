//! dedupd on a secured cluster: a second, real broker (tests/common/secured_kafka.rs) with
//! a SASL_SSL listener (SCRAM-SHA-512, certificates from a test CA) and a mutual-TLS one.
//!
//! - `run` end to end over SASL_SSL with CA and host name verification, the password read
//!   from an environment variable through `[kafka.connection]`, and again over mutual TLS
//!   with a client certificate: every command executed once through a kafka sink that
//!   inherits the connection, a result per input, the secret nowhere in the log;
//! - `check-config --connect` connects, finds the topics and reads the group's offsets;
//! - a wrong password, an untrusted CA, a certificate for another host, a client without TLS
//!   at a TLS port and a missing client certificate each end `run` with exit 2 and the cause
//!   named, before the connect timeout;
//!   the host whose certificate names another is never sent the credentials.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_secured::`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use common::secured_kafka::{Listener, SecuredBroker};
use rdkafka::message::Message;
use serde_json::{Value, json};

const PASSWORD_VAR: &str = "DEDUPD_TEST_SCRAM_PASSWORD";
/// Long enough that a refusal can only beat it by failing at once, not by waiting.
const CONNECT_TIMEOUT_S: u64 = 90;

/// The `[kafka.connection]` table for `listener`, with `changes` (property, TOML value)
/// replacing or adding entries.
fn connection_table(broker: &SecuredBroker, listener: Listener, changes: &[(&str, String)]) -> String {
    let ca = format!("{:?}", broker.ca_pem.display().to_string());
    let mut entries: Vec<(&str, String)> = match listener {
        Listener::SaslSsl | Listener::WrongHost => vec![
            ("security.protocol", "\"SASL_SSL\"".into()),
            ("sasl.mechanisms", "\"SCRAM-SHA-512\"".into()),
            ("sasl.username", format!("{:?}", broker.user)),
            ("sasl.password", format!("{{ env = \"{PASSWORD_VAR}\" }}")),
            ("ssl.ca.location", ca),
        ],
        Listener::Mtls => vec![
            ("security.protocol", "\"SSL\"".into()),
            ("ssl.ca.location", ca),
            ("ssl.certificate.location", format!("{:?}", broker.client_cert_pem.display().to_string())),
            ("ssl.key.location", format!("{:?}", broker.client_key_pem.display().to_string())),
        ],
        Listener::Plaintext => vec![],
    };
    for (property, value) in changes {
        entries.retain(|(p, _)| p != property);
        if !value.is_empty() {
            entries.push((property, value.clone()));
        }
    }
    entries.iter().map(|(p, v)| format!("\"{p}\" = {v}\n")).collect()
}

struct Topics {
    input: String,
    results: String,
    dlq: String,
    out: String,
}

async fn topics(broker: &SecuredBroker, name: &str) -> Topics {
    let t = Topics {
        input: kafka::unique(&format!("{name}-in")),
        results: kafka::unique(&format!("{name}-results")),
        dlq: kafka::unique(&format!("{name}-dlq")),
        out: kafka::unique(&format!("{name}-out")),
    };
    kafka::create_topics(&broker.plaintext, &[(&t.input, 2), (&t.results, 1), (&t.dlq, 1), (&t.out, 1)]).await;
    t
}

/// A config for `listener` whose kafka sink names no cluster: it inherits the connection.
fn write_config(
    dir: &Path,
    broker: &SecuredBroker,
    listener: Listener,
    t: &Topics,
    connection: &str,
) -> std::path::PathBuf {
    let path = dir.join("dedupd.toml");
    let text = format!(
        "{kafka_table}connect_timeout = \"{CONNECT_TIMEOUT_S}s\"\n\n[kafka.connection]\n{connection}\n\
         [store]\npath = {store:?}\n\n[sinks.out]\nkind = \"kafka\"\ntopic = \"{out}\"\ndelivery_timeout = \"20s\"\n\n\
         [[routes]]\ntypes = [\"*\"]\nsink = \"out\"\n\n[http]\nlisten = \"127.0.0.1:0\"\n",
        kafka_table =
            kafka::kafka_table(broker.address(listener), &kafka::unique("sec-group"), &t.input, &t.results, &t.dlq),
        store = dir.join("store"),
        out = t.out,
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Runs dedupd over `listener` until every input has its result; checks the sink topic.
async fn end_to_end(broker: &SecuredBroker, listener: Listener) {
    let t = topics(broker, "sec").await;
    let command =
        |i: usize| serde_json::to_vec(&json!({"id": format!("cmd-{i}"), "type": "t", "payload": {"n": i}})).unwrap();
    let mut records: Vec<kafka::Outgoing> = (0..5).map(|i| (format!("k-{i}"), command(i), vec![])).collect();
    records.push(("k-1".into(), command(1), vec![]));
    records.push(("k-3".into(), command(3), vec![]));
    kafka::produce_all(&broker.plaintext, &t.input, records).await;

    let mut dir = KeptOnFailure::new();
    let config = write_config(dir.path(), broker, listener, &t, &connection_table(broker, listener, &[]));
    let log = dir.path().join("dedupd.log");
    let config_arg = config.to_str().expect("utf-8");
    let mut child =
        DedupdProcess::spawn_with_env(&["run", "-c", config_arg], &[(PASSWORD_VAR, &broker.password)], &log);
    let results = kafka::read_all(&broker.plaintext, &t.results, 7, Duration::from_secs(120)).await;
    let exited = child.terminate(Duration::from_secs(30));
    if results.len() != 7 || !exited.is_some_and(|s| s.success()) {
        let kept = dir.keep();
        panic!(
            "{listener:?}: {} of 7 results, exit {exited:?} (kept {}):\n{}",
            results.len(),
            kept.display(),
            tail_of_file(&log, 40)
        );
    }
    let mut outcomes: Vec<String> = results
        .iter()
        .map(|m| serde_json::from_slice::<Value>(m.payload().expect("value")).expect("json")["outcome"].to_string())
        .collect();
    outcomes.sort();
    assert_eq!(outcomes.iter().filter(|o| o.as_str() == "\"succeeded\"").count(), 5, "{listener:?}: {outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| o.as_str() == "\"duplicate\"").count(), 2, "{listener:?}: {outcomes:?}");
    // The sink inherited [kafka.connection]: it produced over the secured listener.
    let sunk = kafka::read_all(&broker.plaintext, &t.out, 6, Duration::from_secs(10)).await;
    assert_eq!(sunk.len(), 5, "{listener:?}: one sink record per command");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("connected to Kafka"), "{text}");
    assert!(!text.contains(&broker.password), "{listener:?}: the password is in the log");
}

/// `check-config --connect` over SASL_SSL: brokers, topics and the group.
async fn check_config_connects(broker: &SecuredBroker) {
    let t = topics(broker, "chk").await;
    let dir = KeptOnFailure::new();
    let config =
        write_config(dir.path(), broker, Listener::SaslSsl, &t, &connection_table(broker, Listener::SaslSsl, &[]));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["check-config", "--connect", "-c"])
        .arg(&config)
        .env(PASSWORD_VAR, &broker.password)
        .output()
        .expect("run check-config");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text}");
    for expected in [
        "kafka.connection: sasl.password = { env = \"DEDUPD_TEST_SCRAM_PASSWORD\" }".to_string(),
        "connect: consumer: ok".into(),
        "connect: results producer: ok".into(),
        format!("connect: kafka.input_topics: {} (2 partition(s))", t.input),
        format!("connect: sinks.out.topic: {} (1 partition(s))", t.out),
        "(offsets readable; 0 of 2 partition(s)".into(),
        "connect: ok".into(),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains(&broker.password), "{text}");
}

/// How a case breaks the connection: its name, the listener, changed properties, and the
/// password dedupd is given.
struct Breakage<'a> {
    case: &'a str,
    listener: Listener,
    changes: Vec<(&'a str, String)>,
    password: &'a str,
}

/// `run` with a broken connection: exit 2 before the connect timeout, naming `cause` and
/// the setting to look at (`hint`).
async fn refused(broker: &SecuredBroker, b: Breakage<'_>, cause: &str, hint: &str) {
    let Breakage { case, listener, changes, password } = b;
    let t = topics(broker, "bad").await;
    let mut dir = KeptOnFailure::new();
    let config = write_config(dir.path(), broker, listener, &t, &connection_table(broker, listener, &changes));
    let log = dir.path().join("dedupd.log");
    let config_arg = config.to_str().expect("utf-8");
    let mut child = DedupdProcess::spawn_with_env(&["run", "-c", config_arg], &[(PASSWORD_VAR, password)], &log);
    let deadline = Instant::now() + Duration::from_secs(CONNECT_TIMEOUT_S);
    let status = loop {
        if let Some(status) = child.exited() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let Some(status) = status else {
        let kept = dir.keep();
        panic!("{case}: still running at the connect timeout (kept {}):\n{text}", kept.display());
    };
    assert_eq!(status.code(), Some(2), "{case}:\n{text}");
    assert!(text.contains(cause), "{case}: no {cause:?} in:\n{text}");
    assert!(text.contains(hint), "{case}: no hint {hint:?} in:\n{text}");
    assert!(!text.contains(&broker.password), "{case}: the password is in the log");
    let sunk = kafka::count_records(&broker.plaintext, &t.results).await;
    assert_eq!(sunk, 0, "{case}: nothing was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupd_runs_on_a_secured_cluster_and_names_what_refuses_it() {
    if kafka::bootstrap().is_none() {
        return;
    }
    let broker = tokio::task::spawn_blocking(SecuredBroker::start).await.expect("start task");
    let Some(broker) = broker else { return };

    end_to_end(&broker, Listener::SaslSsl).await;
    end_to_end(&broker, Listener::Mtls).await;
    check_config_connects(&broker).await;

    let other_ca = format!("{:?}", broker.other_ca_pem.display().to_string());
    let password = broker.password.as_str();
    let cases = [
        (
            Breakage {
                case: "wrong password",
                listener: Listener::SaslSsl,
                changes: vec![],
                password: "not-the-password",
            },
            "SASL authentication error",
            "check sasl.username, sasl.password",
        ),
        (
            Breakage {
                case: "untrusted CA",
                listener: Listener::SaslSsl,
                changes: vec![("ssl.ca.location", other_ca)],
                password,
            },
            "certificate verify failed",
            "not signed by a CA dedupd trusts",
        ),
        (
            // With a wrong password, so that the broker would log a login had the credentials
            // reached it (see below).
            Breakage {
                case: "another host's certificate",
                listener: Listener::WrongHost,
                changes: vec![],
                password: "not-the-password",
            },
            "certificate verify failed",
            "does not name the address",
        ),
        (
            // A client without TLS at a TLS port: the broker closes each connection, and
            // librdkafka says no more than that all brokers are down.
            Breakage {
                case: "no TLS at a TLS port",
                listener: Listener::SaslSsl,
                changes: vec![("security.protocol", "\"SASL_PLAINTEXT\"".into())],
                password,
            },
            "its port speaks TLS",
            "set security.protocol to SSL",
        ),
        (
            Breakage {
                case: "no client certificate",
                listener: Listener::Mtls,
                changes: vec![("ssl.certificate.location", String::new()), ("ssl.key.location", String::new())],
                password,
            },
            "alert",
            "client certificate",
        ),
    ];
    for (breakage, cause, hint) in cases {
        refused(&broker, breakage, cause, hint).await;
    }
    // A server whose certificate failed verification is never sent the credentials, also not
    // by the diagnosis that tells a wrong host from an untrusted CA. The wrong password on the
    // verified listener shows what the broker logs when it is.
    let log = broker.broker_log();
    let refused_logins = |address: &str| {
        let port = address.rsplit(':').next().unwrap_or_default().to_string();
        log.lines().filter(|l| l.contains("Authentication failed") && l.contains(&format!(":{port}-"))).count()
    };
    assert!(refused_logins(broker.address(Listener::SaslSsl)) > 0, "the broker logs a refused login:\n{log}");
    assert_eq!(refused_logins(broker.address(Listener::WrongHost)), 0, "credentials went to the wrong host:\n{log}");
}

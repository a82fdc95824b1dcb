//! `dedupd check-config` without a cluster, with the real binary: every problem is
//! reported (not only the first) with the line of the file it is on; librdkafka's own
//! parser judges every Kafka table; files named must be readable and secret env vars set;
//! secrets never appear in what it prints.

use std::path::Path;
use std::process::{Command, Stdio};

/// `dedupd check-config -c PATH` with `env` and no other `DEDUPD_*` or `OTEL_*` variable; returns
/// (exit code, stdout + stderr).
fn check_config(path: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupd"));
    cmd.args(["check-config", "-c"]).arg(path).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k.starts_with("OTEL_") {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run dedupd");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

const TAIL: &str = r#"
[sinks.log]
kind = "log"

[[routes]]
types = ["*"]
sink = "log"
"#;

fn write(dir: &Path, head: &str) -> std::path::PathBuf {
    let path = dir.join("dedupd.toml");
    std::fs::write(&path, format!("{head}{TAIL}")).expect("write config");
    path
}

#[test]
fn every_problem_is_reported_with_its_line_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let missing_ca = dir.path().join("no-such-ca.pem");
    let head = format!(
        r#"[kafka]
bootstrap_servers = "127.0.0.1:9"
input_topics = ["in"]

[kafka.connection]
"security.protocol" = "SASL_SSL"
"sasl.mechanisms" = "SCRAM-SHA-512"
"sasl.username" = "dedupd"
"sasl.password" = {{ env = "DEDUPD_CHECK_TEST_UNSET_PASSWORD" }}
"ssl.ca.location" = {missing_ca:?}

[kafka.consumer]
"no.such.property" = "1"

[kafka.producer]
"ssl.key.password" = "hunter2-but-longer"
"linger.ms" = "soon"

[store]
default_ttl = "0s"
"#
    );
    let path = write(dir.path(), &head);
    let (code, out) = check_config(&path, &[]);
    assert_eq!(code, 2, "{out}");
    let p = path.display();
    for expected in [
        format!(
            "{p}:9: kafka.connection.\"sasl.password\": environment variable DEDUPD_CHECK_TEST_UNSET_PASSWORD is not set"
        ),
        format!("{p}:10: kafka.connection.\"ssl.ca.location\": names {}, which cannot be read", missing_ca.display()),
        format!("{p}:13: kafka.consumer.\"no.such.property\": No such configuration property"),
        format!("{p}:17: kafka.producer.\"linger.ms\": Invalid value"),
        format!("{p}:20: config key `store.default_ttl`"),
    ] {
        assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    }
    assert!(out.contains("5 problem(s)"), "{out}");
    assert!(!out.contains("hunter2"), "a secret was printed:\n{out}");
}

#[test]
fn a_client_librdkafka_would_refuse_is_reported_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "this is not a certificate\n").unwrap();
    let head = format!(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n\n[kafka.connection]\n\
         \"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = {ca:?}\n"
    );
    let path = write(dir.path(), &head);
    let (code, out) = check_config(&path, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(&format!("{}: consumer and results producer: ", path.display())), "{out}");
    assert!(out.contains("ssl.ca.location"), "{out}");

    // A feature this build lacks: SASL without a mechanism means Kerberos (GSSAPI).
    let head = "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n\n[kafka.connection]\n\
                \"security.protocol\" = \"SASL_SSL\"\n";
    let path = write(dir.path(), head);
    let (code, out) = check_config(&path, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("No provider for SASL mechanism GSSAPI"), "{out}");
}

#[test]
fn a_good_config_shows_its_connection_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("password");
    std::fs::write(&secret_file, "from-a-file\n").unwrap();
    let head = format!(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n\n[kafka.connection]\n\
         \"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"PLAIN\"\n\"sasl.username\" = \"u\"\n\
         \"sasl.password\" = \"hunter2-written\"\n\"ssl.key.password\" = {{ file = {secret_file:?} }}\n\
         \"client.id\" = {{ env = \"DEDUPD_CHECK_TEST_CLIENT_ID\" }}\n"
    );
    let path = write(dir.path(), &head);
    let (code, out) = check_config(&path, &[("DEDUPD_CHECK_TEST_CLIENT_ID", "orders-dedupd")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("kafka.connection: sasl.password = <redacted>"), "{out}");
    assert!(out.contains("kafka.connection: sasl.username = \"u\""), "{out}");
    assert!(out.contains("kafka.connection: client.id = { env = \"DEDUPD_CHECK_TEST_CLIENT_ID\" }"), "{out}");
    assert!(!out.contains("hunter2") && !out.contains("from-a-file"), "a secret was printed:\n{out}");
}

#[test]
fn a_standard_otel_variable_run_would_refuse_is_reported_at_the_telemetry_key() {
    let dir = tempfile::tempdir().unwrap();
    let head =
        "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n\n[telemetry]\ntraces = \"otlp\"\n";
    let path = write(dir.path(), head);
    let (code, out) = check_config(&path, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(":6: environment variable OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""), "{out}");
    // The same variable with traces off is no problem, nor http/protobuf with them on.
    let (code, out) = check_config(&path, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = check_config(&path, &[("OTEL_TRACES_EXPORTER", "none"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_file_that_is_not_a_config_is_one_problem_in_the_same_form() {
    let dir = tempfile::tempdir().unwrap();
    for (head, line, says) in [
        ("[retry]\nmax_attempts = \"three\"\n", 2, "config key `retry.max_attempts`: invalid type"),
        ("[limits]\n\nmax_comand_bytes = 5\n", 3, "config key `limits.max_comand_bytes`: is not a key here"),
        ("[kafka]\ngroup_id =\n", 2, "config is not valid TOML: "),
    ] {
        let path = write(dir.path(), head);
        let (code, out) = check_config(&path, &[]);
        let p = path.display();
        assert_eq!(code, 2, "{out}");
        assert!(out.contains(&format!("{p}:{line}: {says}")), "{head}: {out}");
        assert!(out.trim_end().ends_with(&format!("{p}: 1 problem(s)")), "{head}: {out}");
    }
}

#[test]
fn a_rule_an_environment_variable_breaks_is_reported_with_the_variable_not_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "[store]\nmax_ttl = \"7d\"\n");
    let (code, out) = check_config(&path, &[("DEDUPD_STORE__DEFAULT_TTL", "0s")]);
    let p = path.display();
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!(
            "{p}: environment variable DEDUPD_STORE__DEFAULT_TTL: config key `store.default_ttl` = 0s: must be positive"
        )),
        "{out}"
    );
    assert!(out.trim_end().ends_with(&format!("{p}: 1 problem(s)")), "{out}");
}

#[test]
fn every_problem_of_one_sink_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let head = "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n\n\
                [sinks.runner]\nkind = \"exec\"\nprogram = \"\"\ntimeout = \"0s\"\ntransient_exit_codes = [0]\n\n\
                [sinks.runner.circuit]\nprobe_backoff = \"0s\"\n\n\
                [sinks.runner.check]\nprogram = \"/no/such/check-program\"\ndelay = \"2d\"\n";
    let path = write(dir.path(), head);
    let (code, out) = check_config(&path, &[]);
    let p = path.display();
    assert_eq!(code, 2, "{out}");
    for (line, key) in [
        (7, "sinks.runner.program"),
        (8, "sinks.runner.timeout"),
        (9, "sinks.runner.transient_exit_codes"),
        (12, "sinks.runner.circuit.probe_backoff"),
        (15, "sinks.runner.check.program"),
        (16, "sinks.runner.check.delay"),
    ] {
        assert!(out.contains(&format!("{p}:{line}: config key `{key}`")), "missing {key} in:\n{out}");
    }
    assert!(out.trim_end().ends_with(&format!("{p}: 6 problem(s)")), "{out}");
}

#[test]
fn a_kafka_property_an_environment_variable_sets_is_reported_with_the_variable_not_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing_ca = dir.path().join("no-such-ca.pem");
    let path = write(dir.path(), "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n");
    let var = "DEDUPD_KAFKA__CONNECTION__SSL.CA.LOCATION";
    let (code, out) = check_config(&path, &[(var, missing_ca.to_str().unwrap())]);
    let p = path.display();
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!("{p}: environment variable {var}: kafka.connection.\"ssl.ca.location\": names ")),
        "{out}"
    );
    assert!(!out.contains(&format!("{p}:1:")), "no line of the file: {out}");
}

/// `dedupd run` refuses what check-config refuses without a cluster, in its words: the
/// key, the file and the reason, before any client is made (nothing listens at the
/// bootstrap address, so a connect attempt would wait out its timeout instead).
#[test]
fn run_refuses_kafka_settings_as_check_config_does_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let missing_ca = dir.path().join("no-such-ca.pem");
    let head = format!(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\nconnect_timeout = \"10m\"\n\n\
         [kafka.connection]\n\"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = {missing_ca:?}\n\
         \"sasl.passwd\" = \"hunter2-typo\"\n\n[store]\npath = {:?}\n",
        dir.path().join("store")
    );
    let path = write(dir.path(), &head);
    let out = Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["run", "-c"])
        .arg(&path)
        .env_remove("DEDUPD_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run dedupd");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("kafka.connection.\"ssl.ca.location\": names {}", missing_ca.display())),
        "the key, the path and the reason: {text}"
    );
    assert!(text.contains("No such file or directory"), "{text}");
    assert!(text.contains("kafka.connection.\"sasl.passwd\""), "{text}");
    assert!(!text.contains("hunter2-typo"), "a refused property's value is never printed: {text}");
}

#[test]
fn every_problem_of_an_http_check_is_reported_at_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let head = "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\n\n\
                [sinks.pay]\nkind = \"http\"\nurl = \"http://127.0.0.1:9/payments\"\nforward_key = true\n\n\
                [sinks.pay.check]\nurl = \"{/base}/payments\"\nmethod = \"PUT\"\nfound_status = [200, 404]\n\
                found_pointer = \"data/0\"\n";
    let path = write(dir.path(), head);
    let (code, out) = check_config(&path, &[]);
    let p = path.display();
    assert_eq!(code, 2, "{out}");
    for (line, key) in [
        (8, "sinks.pay.forward_key"),
        (11, "sinks.pay.check.url"),
        (12, "sinks.pay.check.method"),
        // Unwritten (its default, [404]): the line of its table.
        (10, "sinks.pay.check.absent_status"),
        (14, "sinks.pay.check.found_pointer"),
    ] {
        assert!(out.contains(&format!("{p}:{line}: config key `{key}`")), "missing {key} in:\n{out}");
    }
    assert!(out.contains("a check is only used when forward_key = false"), "{out}");
    assert!(out.trim_end().ends_with(&format!("{p}: 5 problem(s)")), "{out}");
}

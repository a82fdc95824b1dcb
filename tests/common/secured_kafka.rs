//! A second, secured Kafka broker for tests, beside the plain one of `kafka.sh with …`
//! (see docs/kafka-for-tests.md, "Secured broker").
//!
//! [`SecuredBroker::start`] makes a test CA and certificates with rcgen, then runs
//! `kafka.sh start` with four listeners on 127.0.0.1:
//! - PLAINTEXT: no security (inter-broker traffic, readiness probe, topic setup);
//! - SECURE (SASL_SSL): SCRAM-SHA-512 and SCRAM-SHA-256, server cert for 127.0.0.1/localhost;
//! - MTLS (SSL): the same server cert, and a client cert signed by the test CA is required;
//! - WRONGHOST (SASL_SSL, SCRAM-SHA-512): a cert signed by the test CA for
//!   `wrong-host.invalid` only, so a client that verifies the host name 127.0.0.1 must
//!   refuse it, and must not send it its credentials.
//!
//! The SCRAM user is written into the metadata log when the storage is formatted
//! (`kafka-storage format --add-scram`), so it exists before the broker first answers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

/// The SCRAM user the broker knows.
pub const SCRAM_USER: &str = "dedupd";

/// The listeners `kafka.sh` opens, as `NAME:PROTOCOL` (DEDUPD_KAFKA_EXTRA_LISTENERS).
const EXTRA_LISTENERS: &str = "SECURE:SASL_SSL MTLS:SSL WRONGHOST:SASL_SSL";

/// Which listener of a [`SecuredBroker`] a client talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// No TLS, no authentication.
    Plaintext,
    /// SASL_SSL with SCRAM-SHA-512, server verified against the test CA.
    SaslSsl,
    /// SSL with a client certificate (mutual TLS).
    Mtls,
    /// SASL_SSL (SCRAM-SHA-512) whose server certificate names another host.
    WrongHost,
}

/// A running secured broker, stopped and deleted on drop (kept, without its data, when
/// the test panics, so its logs can be read).
pub struct SecuredBroker {
    /// PLAINTEXT listener, `127.0.0.1:PORT`.
    pub plaintext: String,
    /// SASL_SSL listener (SCRAM-SHA-512/256).
    pub sasl_ssl: String,
    /// SSL listener that requires a client certificate.
    pub mtls: String,
    /// SSL listener whose certificate is for `wrong-host.invalid`.
    pub wrong_host: String,
    /// The test CA that signed every server and client certificate (PEM).
    pub ca_pem: PathBuf,
    /// A CA that signed nothing the broker uses (PEM).
    pub other_ca_pem: PathBuf,
    /// The client certificate for MTLS, CN `dedupd-client` (PEM).
    pub client_cert_pem: PathBuf,
    /// Its private key, unencrypted PKCS#8 (PEM).
    pub client_key_pem: PathBuf,
    /// The SCRAM user name.
    pub user: String,
    /// The SCRAM password (random per broker).
    pub password: String,
    script: PathBuf,
    broker_dir: PathBuf,
    dir: Option<tempfile::TempDir>,
}

/// The server side PEM text the broker is configured with.
struct ServerPems {
    cert: String,
    key: String,
    wrong_host_cert: String,
    wrong_host_key: String,
}

/// A CA made for one broker: its certificate and what signs with it.
struct TestCa {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn new_ca(common_name: &str) -> TestCa {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    TestCa { cert_pem: cert.pem(), issuer: Issuer::new(params, key) }
}

/// A leaf certificate signed by `ca`, with these subject alternative names (IP addresses
/// become IP SANs); returns (certificate PEM, PKCS#8 key PEM).
fn new_leaf(ca: &TestCa, common_name: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans).expect("leaf params");
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, &ca.issuer).expect("leaf certificate");
    (cert.pem(), key.serialize_pem())
}

fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A PEM text as one server.properties value: Java properties turn `\n` back into newlines.
fn inline_pem(pem: &str) -> String {
    pem.trim_end().replace('\n', "\\n")
}

/// server.properties lines for the three secured listeners (DEDUPD_KAFKA_BROKER_PROPS).
fn broker_props(pems: &ServerPems, ca_pem: &Path) -> String {
    let scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
    let mut lines = vec![
        "listener.name.secure.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256".to_string(),
        format!("listener.name.secure.scram-sha-512.sasl.jaas.config={scram_jaas}"),
        format!("listener.name.secure.scram-sha-256.sasl.jaas.config={scram_jaas}"),
        format!("listener.name.mtls.ssl.truststore.location={}", ca_pem.display()),
        "listener.name.mtls.ssl.truststore.type=PEM".to_string(),
        "listener.name.mtls.ssl.client.auth=required".to_string(),
        "listener.name.wronghost.sasl.enabled.mechanisms=SCRAM-SHA-512".to_string(),
        format!("listener.name.wronghost.scram-sha-512.sasl.jaas.config={scram_jaas}"),
    ];
    // PEM keystores inline (an unencrypted PKCS#8 key is accepted), so no server key is
    // written to a file.
    for (listener, cert, key) in [
        ("secure", &pems.cert, &pems.key),
        ("mtls", &pems.cert, &pems.key),
        ("wronghost", &pems.wrong_host_cert, &pems.wrong_host_key),
    ] {
        lines.push(format!("listener.name.{listener}.ssl.keystore.type=PEM"));
        lines.push(format!("listener.name.{listener}.ssl.keystore.certificate.chain={}", inline_pem(cert)));
        lines.push(format!("listener.name.{listener}.ssl.keystore.key={}", inline_pem(key)));
    }
    lines.join("\n")
}

/// The path of kafka.sh, or `None` when the test should skip (same rules as
/// [`super::kafka::bootstrap`]).
fn kafka_script() -> Option<PathBuf> {
    super::kafka::set_by_kafka_sh("DEDUPD_TEST_KAFKA_SCRIPT").map(PathBuf::from)
}

/// `DIR/listeners` as written by kafka.sh: `NAME 127.0.0.1:PORT` per line.
fn read_listeners(broker_dir: &Path) -> HashMap<String, String> {
    let path = broker_dir.join("listeners");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines().filter_map(|l| l.split_once(' ')).map(|(n, a)| (n.to_string(), a.trim().to_string())).collect()
}

impl SecuredBroker {
    /// Makes the certificates and starts the broker (blocking, about 10–20 s; from async code
    /// call it through `tokio::task::spawn_blocking`). Returns once the SCRAM user can fetch
    /// metadata over SASL_SSL. `None` means skip: no `DEDUPD_TEST_KAFKA_SCRIPT` (and no
    /// `DEDUPD_REQUIRE_KAFKA=1`). Panics when the script is there but the broker fails.
    pub fn start() -> Option<SecuredBroker> {
        let script = kafka_script()?;
        let t0 = Instant::now();
        let dir = tempfile::Builder::new().prefix("dedupd-secured-kafka.").tempdir().expect("temp dir");
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).expect("certs dir");
        let ca = new_ca("dedupd test CA");
        let other_ca = new_ca("dedupd unrelated CA");
        let (cert, key) = new_leaf(&ca, "localhost", &["127.0.0.1", "localhost"], ExtendedKeyUsagePurpose::ServerAuth);
        let (wrong_host_cert, wrong_host_key) =
            new_leaf(&ca, "wrong-host.invalid", &["wrong-host.invalid"], ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = new_leaf(&ca, "dedupd-client", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let pems = ServerPems { cert, key, wrong_host_cert, wrong_host_key };
        let files = [
            ("ca.pem", ca.cert_pem.as_str()),
            ("other-ca.pem", other_ca.cert_pem.as_str()),
            ("client.pem", client_cert.as_str()),
            ("client.key", client_key.as_str()),
            ("server.pem", pems.cert.as_str()),
            ("wrong-host.pem", pems.wrong_host_cert.as_str()),
        ];
        for (name, text) in files {
            write_file(&certs.join(name), text);
        }
        let password = format!("pw-{:016x}", rand::random::<u64>());
        let broker_dir = dir.path().join("broker");
        let mut broker = SecuredBroker {
            plaintext: String::new(),
            sasl_ssl: String::new(),
            mtls: String::new(),
            wrong_host: String::new(),
            ca_pem: certs.join("ca.pem"),
            other_ca_pem: certs.join("other-ca.pem"),
            client_cert_pem: certs.join("client.pem"),
            client_key_pem: certs.join("client.key"),
            user: SCRAM_USER.to_string(),
            password,
            script,
            broker_dir,
            dir: Some(dir),
        };
        broker.run_kafka_sh(&pems);
        let listeners = read_listeners(&broker.broker_dir);
        let address = |name: &str| listeners.get(name).cloned().unwrap_or_else(|| panic!("no {name} in listeners"));
        broker.plaintext = address("PLAINTEXT");
        broker.sasl_ssl = address("SECURE");
        broker.mtls = address("MTLS");
        broker.wrong_host = address("WRONGHOST");
        broker.wait_for_scram_user(Duration::from_secs(30));
        eprintln!("secured broker ready in {} ms ({})", t0.elapsed().as_millis(), broker.broker_dir.display());
        Some(broker)
    }

    /// `kafka.sh start` with the secured listeners; panics (after the broker is stopped)
    /// when it fails.
    fn run_kafka_sh(&self, pems: &ServerPems) {
        let scram =
            |mechanism: &str| format!("--add-scram {mechanism}=[name={},password={}]", self.user, self.password);
        let status = Command::new(&self.script)
            .arg("start")
            .arg(&self.broker_dir)
            .env("DEDUPD_KAFKA_EXTRA_LISTENERS", EXTRA_LISTENERS)
            .env("DEDUPD_KAFKA_FORMAT_ARGS", format!("{} {}", scram("SCRAM-SHA-512"), scram("SCRAM-SHA-256")))
            .env("DEDUPD_KAFKA_BROKER_PROPS", broker_props(pems, &self.ca_pem))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.script.display()));
        assert!(status.success(), "kafka.sh start {} failed: {status}", self.broker_dir.display());
    }

    /// Waits until the SCRAM user fetches metadata over SASL_SSL.
    fn wait_for_scram_user(&self, within: Duration) {
        let outcome = try_connect(&self.rdkafka_config(Listener::SaslSsl), within);
        assert!(
            outcome.connected(),
            "the SCRAM user could not fetch metadata over SASL_SSL within {within:?}: {:?} {:?}",
            outcome.metadata,
            outcome.errors
        );
    }

    /// What the broker has logged so far (kafka.sh's `DIR/broker.log`).
    pub fn broker_log(&self) -> String {
        std::fs::read_to_string(self.broker_dir.join("broker.log")).unwrap_or_default()
    }

    /// The address of a listener.
    pub fn address(&self, listener: Listener) -> &str {
        match listener {
            Listener::Plaintext => &self.plaintext,
            Listener::SaslSsl => &self.sasl_ssl,
            Listener::Mtls => &self.mtls,
            Listener::WrongHost => &self.wrong_host,
        }
    }

    /// A librdkafka config that connects to `listener` with the right credentials: the test
    /// CA (host name verification is librdkafka's default, `https`), the SCRAM user, the
    /// client certificate. Tests change single keys to make it wrong.
    pub fn rdkafka_config(&self, listener: Listener) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.address(listener));
        let ca = self.ca_pem.display().to_string();
        match listener {
            Listener::Plaintext => {}
            Listener::SaslSsl | Listener::WrongHost => {
                config
                    .set("security.protocol", "SASL_SSL")
                    .set("sasl.mechanism", "SCRAM-SHA-512")
                    .set("sasl.username", &self.user)
                    .set("sasl.password", &self.password)
                    .set("ssl.ca.location", ca);
            }
            Listener::Mtls => {
                config
                    .set("security.protocol", "SSL")
                    .set("ssl.ca.location", ca)
                    .set("ssl.certificate.location", self.client_cert_pem.display().to_string())
                    .set("ssl.key.location", self.client_key_pem.display().to_string());
            }
        }
        config
    }
}

impl Drop for SecuredBroker {
    fn drop(&mut self) {
        let stopped = Command::new(&self.script).arg("stop").arg(&self.broker_dir).stdin(Stdio::null()).status();
        if !matches!(stopped, Ok(s) if s.success()) {
            eprintln!("stopping the secured broker in {} failed: {stopped:?}", self.broker_dir.display());
        }
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("kept the secured broker's logs in {}", dir.keep().display());
        }
    }
}

/// Errors and warnings a client reported through its context.
#[derive(Clone, Default)]
pub struct RecordingContext {
    errors: Arc<Mutex<Vec<String>>>,
    logs: Arc<Mutex<Vec<String>>>,
}

impl ClientContext for RecordingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if (level as i32) <= RDKafkaLogLevel::Warning as i32 {
            self.logs.lock().push(format!("{level:?} {fac} {log_message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.lock().push(format!("{error}: {reason}"));
    }
}

impl ProducerContext for RecordingContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// What a client saw when it asked for metadata.
#[derive(Debug)]
pub struct ConnectOutcome {
    /// The number of brokers in the metadata, or the last fetch's error.
    pub metadata: Result<usize, KafkaError>,
    /// Every `error()` callback, as `"{KafkaError}: {reason}"`.
    pub errors: Vec<String>,
    /// librdkafka's log lines at warning level or worse.
    pub logs: Vec<String>,
    /// How long it took.
    pub elapsed: Duration,
}

impl ConnectOutcome {
    /// Whether metadata was fetched.
    pub fn connected(&self) -> bool {
        self.metadata.is_ok()
    }
}

/// Fetches metadata with `config` until it succeeds, the client reports an error through
/// its `error()` callback, or `within` passes.
pub fn try_connect(config: &ClientConfig, within: Duration) -> ConnectOutcome {
    let t0 = Instant::now();
    let context = RecordingContext::default();
    let producer: BaseProducer<RecordingContext> =
        config.create_with_context(context.clone()).expect("client from config");
    let deadline = t0 + within;
    let metadata = loop {
        let slice = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(500));
        let fetched = producer.client().fetch_metadata(None, slice).map(|md| md.brokers().len());
        producer.poll(Duration::from_millis(50)); // serves the error callbacks
        if fetched.is_ok() || !context.errors.lock().is_empty() || Instant::now() >= deadline {
            break fetched;
        }
    };
    let errors = context.errors.lock().clone();
    let logs = context.logs.lock().clone();
    ConnectOutcome { metadata, errors, logs, elapsed: t0.elapsed() }
}

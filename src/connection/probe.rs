//! Connecting to a cluster with a deadline, and saying why it failed.
//!
//! librdkafka retries a failed connection forever, so a client with a wrong password or an
//! untrusted certificate would otherwise wait silently. A probe asks the cluster for its
//! metadata until `timeout`; it gives up at once on what retrying cannot fix (a refused
//! SASL authentication, a certificate that does not verify) and names the cause with
//! librdkafka's own words and the setting to look at.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::check::{client_error, redact_all};

/// What the cluster reported to a successful probe.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// `id@host:port` of each broker.
    pub brokers: Vec<String>,
    /// Every topic the client may see, with its partition count.
    pub topics: BTreeMap<String, usize>,
}

/// Why a probe failed. Never holds a secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    /// librdkafka would not make the client.
    #[error("cannot create the {client}: {reason}")]
    Create { client: String, reason: String },
    /// The cluster refused the client for a reason retrying cannot fix.
    #[error("the {client} cannot connect to {bootstrap}: {cause}{hint}")]
    Refused { client: String, bootstrap: String, cause: String, hint: String },
    /// Nothing answered in time.
    #[error("the {client} could not reach {bootstrap} within {waited}: {last}")]
    TimedOut { client: String, bootstrap: String, waited: String, last: String },
    /// A topic dedupd writes to is not there (or not visible to it).
    #[error(
        "{key}: topic {topic} does not exist (or is not visible): create it first; dedupd creates no topic it \
         publishes to, and a broker's auto-creation would make one with its defaults (one partition, its replication)"
    )]
    MissingTopic { key: String, topic: String },
}

/// Creates a client from `config`; a refusal names `client` and never a secret.
pub fn create<T: rdkafka::config::FromClientConfig>(config: &ClientConfig, client: &str) -> Result<T, ConnectError> {
    config.create().map_err(|e| ConnectError::Create { client: client.into(), reason: client_error(config, &e) })
}

/// Records librdkafka's errors and error log lines while a probe waits.
#[derive(Default)]
struct ProbeContext {
    errors: Mutex<Vec<(Option<RDKafkaErrorCode>, String)>>,
}

impl ClientContext for ProbeContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if matches!(
            level,
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error
        ) {
            self.errors.lock().push((None, format!("{fac}: {message}")));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.lock().push((error.rdkafka_error_code(), reason.to_string()));
    }

    /// The consumer's settings ask for statistics (they feed the lag metric), and the
    /// default would log each whole report at info every few seconds while a probe waits.
    fn stats(&self, _: rdkafka::Statistics) {}
}

impl rdkafka::consumer::ConsumerContext for ProbeContext {}

impl ProducerContext for ProbeContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Connects as `client` (a name for messages: "consumer", "results producer") with
/// `config` and returns what the cluster reports, or why it could not within `timeout`.
pub fn probe(client: &str, config: &ClientConfig, timeout: Duration) -> Result<ClusterView, ConnectError> {
    let bootstrap = config.get("bootstrap.servers").unwrap_or("(no bootstrap.servers)").to_string();
    let producer: BaseProducer<ProbeContext> = config
        .create_with_context(ProbeContext::default())
        .map_err(|e| ConnectError::Create { client: client.into(), reason: client_error(config, &e) })?;
    let started = Instant::now();
    let mut last = String::from(NO_ANSWER);
    let mut tls_asked = false;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(ConnectError::TimedOut {
                client: client.into(),
                bootstrap,
                waited: humantime::format_duration(timeout).to_string(),
                last: redact_all(config, &last),
            });
        }
        if let Ok(metadata) = producer.client().fetch_metadata(None, left.min(Duration::from_millis(500))) {
            return Ok(view(&metadata));
        }
        // Serves the error events queued meanwhile into the context.
        producer.poll(Duration::ZERO);
        let seen = std::mem::take(&mut *producer.context().errors.lock());
        if let Some((_, text)) = seen.iter().rev().find(|(code, text)| is_definitive(*code, text)) {
            let hint = if text.contains("certificate verify failed") && hostname_is_the_cause(config, left) {
                hint("hostname mismatch")
            } else {
                hint(text)
            };
            return Err(ConnectError::Refused {
                client: client.into(),
                bootstrap,
                cause: redact_all(config, text),
                hint,
            });
        }
        // "all brokers are down" follows every failed connection: the one before it says why.
        if let Some((_, text)) = seen.iter().rev().find(|(code, _)| *code != Some(RDKafkaErrorCode::AllBrokersDown)) {
            last = text.clone();
        }
        // Connections dropped without a word: a client without TLS at a TLS port says nothing
        // else (the broker closes on the first bytes). Asked once, without credentials.
        let dropped = seen.iter().any(|(code, _)| *code == Some(RDKafkaErrorCode::AllBrokersDown));
        if dropped && last == NO_ANSWER && !tls_asked && !uses_tls(config) {
            tls_asked = true;
            if speaks_tls(config, left) {
                return Err(ConnectError::Refused {
                    client: client.into(),
                    bootstrap,
                    cause: "the broker closes every connection, and its port speaks TLS".into(),
                    hint: hint("speaks TLS"),
                });
            }
        }
    }
}

/// What a probe says when librdkafka reported nothing but its connections going down.
const NO_ANSWER: &str = "no broker answered (every connection failed or was closed before an answer)";

/// Whether `config`'s security protocol is one with TLS.
fn uses_tls(config: &ClientConfig) -> bool {
    config.get("security.protocol").is_some_and(|p| p.eq_ignore_ascii_case("ssl") || p.eq_ignore_ascii_case("sasl_ssl"))
}

/// Whether the brokers of `config` answer a TLS handshake: a client that does not speak
/// TLS to a TLS port gets its connections closed and nothing more from librdkafka. Asked
/// without credentials, and without verifying the certificate (only whether TLS answers).
fn speaks_tls(config: &ClientConfig, left: Duration) -> bool {
    let mut tls = without_credentials(config);
    tls.set("security.protocol", "SSL")
        .set("enable.ssl.certificate.verification", "false")
        .set("ssl.endpoint.identification.algorithm", "none");
    handshake_passes(tls, left)
}

/// librdkafka words an untrusted CA and a certificate for another host alike. To tell
/// them apart, connect once more without the host name check (for this diagnosis only):
/// if the TLS handshake then passes, the certificate names another host. That connection
/// carries no SASL credentials: its server has not proven to be the broker, so nothing
/// secret may reach it.
fn hostname_is_the_cause(config: &ClientConfig, left: Duration) -> bool {
    if config.get("ssl.endpoint.identification.algorithm").is_some_and(|a| a.eq_ignore_ascii_case("none")) {
        return false;
    }
    let mut diagnosis = without_credentials(config);
    diagnosis.set("ssl.endpoint.identification.algorithm", "none");
    handshake_passes(diagnosis, left)
}

/// Whether a TLS handshake with `config`'s brokers passes within `left` (at most 5 s), read
/// from librdkafka's account of the connection (its state leaving SSL_HANDSHAKE): a broker
/// may drop the client right after, without a word.
fn handshake_passes(mut config: ClientConfig, left: Duration) -> bool {
    config.set("debug", "broker").set_log_level(RDKafkaLogLevel::Debug);
    let Ok(producer) = config.create_with_context::<_, BaseProducer<HandshakeWatch>>(HandshakeWatch::default()) else {
        return false;
    };
    let deadline = Instant::now() + left.min(Duration::from_secs(5));
    while Instant::now() < deadline {
        // Connects, and serves the error callbacks; log lines come on librdkafka's threads.
        let _ = producer.client().fetch_metadata(None, Duration::from_millis(100));
        producer.poll(Duration::ZERO);
        let watch = producer.context();
        if watch.passed.load(Ordering::Acquire) {
            return true;
        }
        if watch.failed.load(Ordering::Acquire) {
            return false;
        }
    }
    false
}

/// What a diagnosis connection tells of its TLS handshake.
#[derive(Default)]
struct HandshakeWatch {
    passed: AtomicBool,
    failed: AtomicBool,
}

impl HandshakeWatch {
    fn read(&self, text: &str) {
        if is_tls_failure(text) {
            self.failed.store(true, Ordering::Release);
        } else if let Some((_, next)) = text.split_once("Broker changed state SSL_HANDSHAKE -> ")
            // Not to DOWN, as after a failed handshake: to the API version query or SASL.
            && ["APIVERSION_QUERY", "AUTH", "UP"].iter().any(|state| next.starts_with(state))
        {
            self.passed.store(true, Ordering::Release);
        }
    }
}

impl ClientContext for HandshakeWatch {
    fn log(&self, _: RDKafkaLogLevel, _: &str, message: &str) {
        self.read(message);
    }

    fn error(&self, _: KafkaError, reason: &str) {
        self.read(reason);
    }
}

impl ProducerContext for HandshakeWatch {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// `config` without what authenticates the client by SASL: every `sasl.*` property, and
/// SASL_SSL turned into SSL (TLS alone; a client certificate stays, as TLS needs it).
fn without_credentials(config: &ClientConfig) -> ClientConfig {
    let mut plain = config.clone();
    for property in config.config_map().into_keys().filter(|p| p.starts_with("sasl.")) {
        plain.remove(property);
    }
    if config.get("security.protocol").is_some_and(|p| p.eq_ignore_ascii_case("sasl_ssl")) {
        plain.set("security.protocol", "SSL");
    }
    plain
}

/// Whether librdkafka's `text` says a TLS handshake failed.
fn is_tls_failure(text: &str) -> bool {
    ["certificate verify failed", "SSL handshake failed", "alert bad certificate", "alert certificate required"]
        .iter()
        .any(|words| text.contains(words))
}

fn view(metadata: &rdkafka::metadata::Metadata) -> ClusterView {
    ClusterView {
        brokers: metadata.brokers().iter().map(|b| format!("{}@{}:{}", b.id(), b.host(), b.port())).collect(),
        topics: metadata.topics().iter().map(|t| (t.name().to_string(), t.partitions().len())).collect(),
    }
}

/// Errors that retrying cannot fix: the cluster refused the credentials or the
/// certificates do not verify. (A refused TCP connection or a broker restarting is not.)
fn is_definitive(code: Option<RDKafkaErrorCode>, text: &str) -> bool {
    matches!(code, Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed))
        || text.contains("SASL authentication error")
        || text.contains("Unsupported SASL mechanism")
        || is_tls_failure(text)
}

/// The setting to look at for a refusal librdkafka described as `text`.
fn hint(text: &str) -> String {
    let hint = if text.contains("Unsupported SASL mechanism") {
        "set sasl.mechanisms to one the broker lists"
    } else if text.contains("SASL authentication") || text.contains("Authentication failed") {
        "check sasl.username, sasl.password and sasl.mechanisms"
    } else if text.contains("hostname mismatch") {
        "the broker's certificate does not name the address dedupd connects to; connect by a name the \
         certificate lists (ssl.endpoint.identification.algorithm = \"none\" turns the check off)"
    } else if text.contains("certificate verify failed") {
        "the broker's certificate is not signed by a CA dedupd trusts; set ssl.ca.location (or ssl.ca.pem) \
         to the CA that signed it"
    } else if text.contains("alert bad certificate") || text.contains("alert certificate required") {
        "the broker refused dedupd's client certificate, or got none; set ssl.certificate.location and \
         ssl.key.location (or their .pem forms) to a certificate the broker trusts"
    } else if text.contains("speaks TLS") {
        "set security.protocol to SSL (or SASL_SSL with SASL), or connect to the broker's plaintext listener"
    } else if text.contains("SSL handshake failed") {
        "the TLS handshake failed; check security.protocol, the client certificate and key \
         (ssl.certificate.location, ssl.key.location) if the cluster requires one"
    } else {
        return String::new();
    };
    format!(" ({hint})")
}

/// Checks that the consumer group `config` names can be used, without joining it (a join
/// would rebalance a running group): finds its coordinator and reads its committed offsets
/// for `partitions` of `topic`. Returns how many partitions have a committed offset.
pub fn check_group(config: &ClientConfig, topic: &str, partitions: usize, timeout: Duration) -> Result<usize, String> {
    let consumer: BaseConsumer<ProbeContext> =
        config.create_with_context(ProbeContext::default()).map_err(|e| client_error(config, &e))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, i32::try_from(p).unwrap_or(i32::MAX));
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.committed_offsets(tpl.clone(), left) {
            Ok(committed) => {
                return Ok(committed.elements().iter().filter(|e| matches!(e.offset(), Offset::Offset(_))).count());
            }
            // A new cluster (or one that just moved the group) is still electing or loading
            // the group's coordinator: it answers within moments, so ask again until `timeout`.
            Err(e) if coordinator_not_ready(e.rdkafka_error_code()) && left > COORDINATOR_RETRY => {
                std::thread::sleep(COORDINATOR_RETRY);
            }
            Err(e) => return Err(client_error(config, &e)),
        }
    }
}

/// How long [`check_group`] waits before asking a coordinator that was not ready again.
const COORDINATOR_RETRY: Duration = Duration::from_millis(200);

/// The transient answers of a group coordinator that is being elected or is loading.
fn coordinator_not_ready(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart_from_unreachable_brokers() {
        assert!(is_definitive(Some(RDKafkaErrorCode::Authentication), "anything"));
        assert!(is_definitive(None, "SSL handshake failed: certificate verify failed"));
        assert!(!is_definitive(Some(RDKafkaErrorCode::BrokerTransportFailure), "Connection refused"));
        assert!(hint("SASL authentication error: Authentication failed").contains("sasl.password"));
        assert!(hint("hostname mismatch").contains("does not name"));
        assert!(hint("SSL handshake failed: certificate verify failed").contains("ssl.ca.location"));
        assert!(hint("Receive failed: ssl/tls alert bad certificate").contains("client certificate"));
        assert!(hint("Broker: Unsupported SASL mechanism").contains("sasl.mechanisms"));
        assert_eq!(hint("Connection refused"), "");
    }

    #[test]
    fn a_coordinator_being_elected_or_loading_is_asked_again() {
        for code in [
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::CoordinatorLoadInProgress,
        ] {
            assert!(coordinator_not_ready(Some(code)), "{code:?}");
        }
        for code in [Some(RDKafkaErrorCode::GroupAuthorizationFailed), Some(RDKafkaErrorCode::UnknownTopic), None] {
            assert!(!coordinator_not_ready(code), "{code:?}");
        }
    }

    #[test]
    fn an_unreachable_cluster_times_out_naming_the_address() {
        let mut c = ClientConfig::new();
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        c.set("bootstrap.servers", "127.0.0.1:1").set("log_level", "0");
        let err = probe("consumer", &c, Duration::from_millis(1500)).unwrap_err();
        assert!(matches!(err, ConnectError::TimedOut { .. }), "{err}");
        assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
        assert!(err.to_string().contains("Connection refused"), "the cause is named: {err}");
    }
}

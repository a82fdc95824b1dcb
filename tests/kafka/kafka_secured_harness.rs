//! The secured test broker (tests/common/secured_kafka.rs) does what the end-to-end tests
//! rely on, checked with rdkafka directly: records go through over SASL_SSL (SCRAM-SHA-512
//! and SCRAM-SHA-256, CA and host name verified) and over mutual TLS; a wrong password, an
//! untrusted CA, a certificate for another host and a missing client certificate are each
//! refused, reported through the client's `error()` callback within a bounded time.
//!
//! One broker serves every check, so they run in one test. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_secured_harness:: -- --nocapture`;
//! without a broker the test prints "skipped: no broker" and passes, unless
//! `DEDUPD_REQUIRE_KAFKA=1`.

use crate::common;

use std::time::{Duration, Instant};

use common::kafka;
use common::secured_kafka::{ConnectOutcome, Listener, SecuredBroker, try_connect};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// How long a refused client may take to report why.
const REFUSAL_WITHIN: Duration = Duration::from_secs(10);

/// Produces one record with `config` and reads it back with the same settings.
fn round_trip(config: &ClientConfig, topic: &str, what: &str) {
    let t0 = Instant::now();
    let value = format!("{what}-{}", kafka::unique("value"));
    let producer: BaseProducer = config.clone().set("acks", "all").create().expect("producer");
    producer.send(BaseRecord::to(topic).key("k").payload(&value)).map_err(|(e, _)| e).expect("enqueue");
    producer.flush(Duration::from_secs(20)).unwrap_or_else(|e| panic!("{what}: producing: {e}"));

    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", kafka::unique("harness"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, 0, Offset::Beginning).expect("partition");
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "{what}: the produced record was not read back within 20 s");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.payload() == Some(value.as_bytes()) => break,
            Some(Ok(_)) | None => {}
            Some(Err(e)) => panic!("{what}: consuming: {e}"),
        }
    }
    eprintln!("{what}: produced and consumed one record in {} ms", t0.elapsed().as_millis());
}

/// Prints each distinct line once, in first-seen order, with how often it came.
fn print_distinct(label: &str, lines: &[String]) {
    let mut seen: Vec<(&String, usize)> = Vec::new();
    for line in lines {
        match seen.iter_mut().find(|(l, _)| *l == line) {
            Some((_, n)) => *n += 1,
            None => seen.push((line, 1)),
        }
    }
    for (line, n) in seen {
        eprintln!("  {label} (x{n}): {line}");
    }
}

/// Asserts that `config` is refused: no metadata, an `error()` callback within
/// [`REFUSAL_WITHIN`] whose text contains every one of `expected` (case-insensitive).
fn assert_refused(config: &ClientConfig, what: &str, expected: &[&str]) -> ConnectOutcome {
    let outcome = try_connect(config, REFUSAL_WITHIN);
    eprintln!("{what}: refused after {} ms", outcome.elapsed.as_millis());
    eprintln!("  metadata: {:?}", outcome.metadata);
    print_distinct("error()", &outcome.errors);
    print_distinct("log", &outcome.logs);
    assert!(!outcome.connected(), "{what}: the client fetched metadata: {outcome:?}");
    assert!(outcome.elapsed < REFUSAL_WITHIN + Duration::from_secs(2), "{what}: took {:?}", outcome.elapsed);
    let text = outcome.errors.join("\n").to_lowercase();
    for word in expected {
        assert!(text.contains(&word.to_lowercase()), "{what}: no error mentions {word:?}: {:?}", outcome.errors);
    }
    outcome
}

fn check_secured_listeners(broker: &SecuredBroker, topic: &str) {
    // (a) SASL_SSL, SCRAM-SHA-512 and SCRAM-SHA-256, CA and host name verified.
    round_trip(&broker.rdkafka_config(Listener::SaslSsl), topic, "SASL_SSL SCRAM-SHA-512");
    let mut sha256 = broker.rdkafka_config(Listener::SaslSsl);
    sha256.set("sasl.mechanism", "SCRAM-SHA-256");
    round_trip(&sha256, topic, "SASL_SSL SCRAM-SHA-256");
    // (b) mutual TLS.
    round_trip(&broker.rdkafka_config(Listener::Mtls), topic, "MTLS");

    // (c) a wrong SCRAM password.
    let mut wrong_password = broker.rdkafka_config(Listener::SaslSsl);
    wrong_password.set("sasl.password", "not-the-password");
    assert_refused(&wrong_password, "wrong password", &["SASL authentication error", "invalid credentials"]);
    // (d) the server's certificate checked against a CA that did not sign it.
    let mut other_ca = broker.rdkafka_config(Listener::SaslSsl);
    other_ca.set("ssl.ca.location", broker.other_ca_pem.display().to_string());
    assert_refused(&other_ca, "untrusted CA", &["SSL handshake failed", "certificate verify failed"]);
    // (e) a certificate for another host.
    let wrong_host = broker.rdkafka_config(Listener::WrongHost);
    assert_refused(&wrong_host, "wrong host", &["SSL handshake failed", "certificate verify failed"]);
    // librdkafka words (d) and (e) the same; without host name verification only (e)
    // connects, which tells the two causes apart.
    let unverified_name = |config: &ClientConfig| {
        let mut config = config.clone();
        config.set("ssl.endpoint.identification.algorithm", "none");
        try_connect(&config, REFUSAL_WITHIN)
    };
    let outcome = unverified_name(&wrong_host);
    assert!(outcome.connected(), "wrong host without host name verification: {outcome:?}");
    let outcome = unverified_name(&other_ca);
    assert!(!outcome.connected(), "untrusted CA without host name verification connected: {outcome:?}");
    eprintln!("untrusted CA without host name verification: refused after {} ms", outcome.elapsed.as_millis());
    // (f) mutual TLS without a client certificate: the broker ends the handshake.
    let mut no_client_cert = broker.rdkafka_config(Listener::Mtls);
    no_client_cert.remove("ssl.certificate.location").remove("ssl.key.location");
    assert_refused(&no_client_cert, "MTLS without client certificate", &["bad certificate"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secured_broker_accepts_good_clients_and_refuses_bad_ones() {
    let t0 = Instant::now();
    let Some(broker) = tokio::task::spawn_blocking(SecuredBroker::start).await.expect("start task") else {
        return;
    };
    eprintln!("SecuredBroker::start took {} ms", t0.elapsed().as_millis());
    let topic = kafka::unique("secured");
    kafka::create_topics(&broker.plaintext, &[(&topic, 1)]).await;
    let broker = tokio::task::spawn_blocking(move || {
        check_secured_listeners(&broker, &topic);
        broker
    })
    .await
    .expect("checks");
    let t1 = Instant::now();
    drop(broker);
    eprintln!("stopping the secured broker took {} ms", t1.elapsed().as_millis());
}

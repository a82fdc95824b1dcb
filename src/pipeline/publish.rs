//! Publishing (SPEC §5): one result record per input record on `kafka.results_topic`, and
//! the unchanged input plus reason headers on `kafka.dead_letter_topic`, through an
//! idempotent producer (`enable.idempotence=true`, `acks=all`). `publish` returns only once
//! Kafka acknowledged every record, so the caller may then store the input offset.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::config::KafkaConfig;
use crate::outcome::Processed;

/// The producer of results and dead letters.
pub struct Publisher {
    producer: FutureProducer,
    results_topic: String,
    dead_letter_topic: String,
}

/// The producer settings dedupd chooses; `kafka.producer.*` overrides them.
pub fn producer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &kafka.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "60000");
    for (k, v) in &kafka.producer {
        c.set(k, v);
    }
    c
}

impl Publisher {
    /// Creates the idempotent producer.
    pub fn new(kafka: &KafkaConfig) -> Result<Publisher, KafkaError> {
        Ok(Publisher {
            producer: producer_config(kafka).create()?,
            results_topic: kafka.results_topic.clone(),
            dead_letter_topic: kafka.dead_letter_topic.clone(),
        })
    }

    /// Publishes the result (and dead letter) of each `(input, processed)` pair and waits
    /// for every acknowledgement. Fails if any record was not acknowledged.
    pub async fn publish(&self, records: &[(&OwnedMessage, &Processed)]) -> Result<(), KafkaError> {
        // Serialised up front: the send futures borrow their payloads until acknowledged.
        let values: Vec<Vec<u8>> =
            records.iter().map(|(_, p)| serde_json::to_vec(&p.result).unwrap_or_default()).collect();
        let sources: Vec<String> =
            records.iter().map(|(m, _)| format!("{}/{}/{}", m.topic(), m.partition(), m.offset())).collect();
        let mut acks = Vec::with_capacity(records.len() * 2);
        for (((input, processed), value), source) in records.iter().zip(&values).zip(&sources) {
            let mut headers = OwnedHeaders::new()
                .insert(Header { key: "dedupd-outcome", value: Some(processed.result.outcome.as_str()) });
            if processed.result.replay {
                headers = headers.insert(Header { key: "idempotent-replay", value: Some("true") });
            }
            if let Some(tp) = &processed.traceparent {
                headers = headers.insert(Header { key: "traceparent", value: Some(tp.as_str()) });
            }
            let mut record =
                FutureRecord::<[u8], [u8]>::to(&self.results_topic).payload(value.as_slice()).headers(headers);
            if let Some(k) = &processed.result.key {
                record = record.key(k.as_bytes());
            }
            acks.push(self.producer.send(record, Duration::from_secs(60)));

            if let Some(dl) = &processed.dead_letter {
                let mut headers = input.headers().cloned().unwrap_or_default();
                headers = headers
                    .insert(Header { key: "dedupd-reason", value: Some(dl.reason) })
                    .insert(Header { key: "dedupd-error", value: Some(dl.error.as_str()) })
                    .insert(Header { key: "dedupd-source", value: Some(source.as_str()) });
                let mut record = FutureRecord::<[u8], [u8]>::to(&self.dead_letter_topic).headers(headers);
                if let Some(v) = input.payload() {
                    record = record.payload(v);
                }
                if let Some(k) = input.key() {
                    record = record.key(k);
                }
                acks.push(self.producer.send(record, Duration::from_secs(60)));
            }
        }
        for ack in futures::future::join_all(acks).await {
            ack.map_err(|(e, _)| e)?;
        }
        Ok(())
    }

    /// Waits for queued records (shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        rdkafka::producer::Producer::flush(&self.producer, timeout)
    }
}

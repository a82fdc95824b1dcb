//! Publishing (docs/contract.md §5): one result record per input record on `kafka.results_topic`, and
//! the unchanged input plus reason headers on `kafka.dead_letter_topic`, through an
//! idempotent producer (`enable.idempotence=true`, `acks=all`). `send` queues a batch's
//! records and hands back their [`Acks`]; only once those resolve may the caller store the
//! input offset.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use super::{KafkaConfig, PipelineError};
use crate::connection::ConnectionError;
use crate::outcome::Processed;

/// How long `send` waits for room in a full producer queue before giving up (the
/// caller retries the batch).
const QUEUE_FULL_PATIENCE: Duration = Duration::from_secs(60);

/// The acknowledgements of records handed to the producer, in one future: polled by
/// `&mut` (it is `Unpin`), so a caller can wait on it in a `select!` and come back later.
pub struct Acks(Pin<Box<dyn Future<Output = Result<(), KafkaError>> + Send>>);

impl Acks {
    /// Resolves once Kafka acknowledged every record; fails if any was not.
    pub async fn acknowledged(&mut self) -> Result<(), KafkaError> {
        (&mut self.0).await
    }
}

/// The producer of results and dead letters.
pub struct Publisher {
    producer: FutureProducer,
    results_topic: String,
    dead_letter_topic: String,
}

/// The producer settings dedupd chooses; `[kafka.connection]` and then `kafka.producer.*`
/// override them (see [`KafkaConfig::client_config`]).
pub fn producer_config(kafka: &KafkaConfig) -> Result<ClientConfig, ConnectionError> {
    let mut c = kafka.client_config(&[("linger.ms", "2"), ("message.timeout.ms", "60000")], &kafka.producer)?;
    // Delivery rests on these (validation refuses them in `kafka.producer`).
    c.set("enable.idempotence", "true").set("acks", "all");
    Ok(c)
}

impl Publisher {
    /// Creates the idempotent producer.
    pub fn new(kafka: &KafkaConfig) -> Result<Publisher, PipelineError> {
        Ok(Publisher {
            producer: crate::connection::probe::create(&producer_config(kafka)?, "results producer")?,
            results_topic: kafka.results_topic.clone(),
            dead_letter_topic: kafka.dead_letter_topic.clone(),
        })
    }

    /// Hands the result (and dead letter) of each `(input, processed)` pair to the
    /// producer, waiting only for room in its queue, and returns their acknowledgements.
    /// The producer copies each record, so nothing here stays borrowed.
    pub async fn send(&self, records: &[(&OwnedMessage, &Processed)]) -> Result<Acks, KafkaError> {
        let mut acks = Vec::with_capacity(records.len());
        for (input, processed) in records {
            let value = serde_json::to_vec(&processed.result).unwrap_or_default();
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
            acks.push(self.enqueue(record).await?);

            if let Some(dl) = &processed.dead_letter {
                let source = format!("{}/{}/{}", input.topic(), input.partition(), input.offset());
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
                acks.push(self.enqueue(record).await?);
            }
        }
        Ok(Acks(Box::pin(async move {
            for ack in futures::future::join_all(acks).await {
                match ack {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => return Err(e),
                    Err(_) => return Err(KafkaError::Canceled),
                }
            }
            Ok(())
        })))
    }

    /// Publishes and waits for every acknowledgement.
    pub async fn publish(&self, records: &[(&OwnedMessage, &Processed)]) -> Result<(), KafkaError> {
        self.send(records).await?.acknowledged().await
    }

    /// Queues one record, waiting while the producer's queue is full (its messages time
    /// out after `message.timeout.ms`, so the wait is bounded by the producer itself).
    async fn enqueue<'a>(&self, mut record: FutureRecord<'a, [u8], [u8]>) -> Result<DeliveryFuture, KafkaError> {
        let deadline = tokio::time::Instant::now() + QUEUE_FULL_PATIENCE;
        loop {
            match self.producer.send_result(record) {
                Ok(ack) => return Ok(ack),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if tokio::time::Instant::now() < deadline =>
                {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits for queued records (shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        rdkafka::producer::Producer::flush(&self.producer, timeout)
    }
}

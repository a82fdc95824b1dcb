//! Publishing (docs/contract.md §5): one result record per input record on `kafka.results_topic`, and
//! the unchanged input plus reason headers on `kafka.dead_letter_topic`, through an
//! idempotent producer (`enable.idempotence=true`, `acks=all`). `send` queues a batch's
//! records and hands back their [`Acks`]; only once those resolve may the caller store the
//! input offset.
//!
//! No record stops its partition because of its size: a dead-letter copy larger than the
//! producer (`message.max.bytes`) or the broker accepts is replaced by one without key and
//! value whose `dedupd-original-size` header says how large it was (its `dedupd-source`
//! still names the input, which stays in its topic). In a transaction a copy the broker
//! refuses would abort it, so there the copy is measured against the dead-letter topic's
//! own `max.message.bytes` before it is sent ([`DeadLetterLimit`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use super::{KafkaConfig, PipelineError};
use crate::connection::ConnectionError;
use crate::outcome::Processed;

/// How long `send` waits for room in a full producer queue before giving up (the
/// caller sends again what was not queued).
const QUEUE_FULL_PATIENCE: Duration = Duration::from_secs(60);

/// Which of an input's records: its result, or its dead-letter copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The result record.
    Result,
    /// The dead-letter copy (or its stand-in).
    DeadLetter,
    /// The input's forward to the by-key topic (`hop`), sent by [`Publisher::send_forwards`].
    Forward,
}

/// Records of a batch, each named by its input's place in the batch: what to (re)send.
pub type Parts = Vec<(usize, Part)>;

/// Every record a batch publishes: each input's result, and its dead letter when it has one.
pub fn all_parts(records: &[(&OwnedMessage, &Processed)]) -> Parts {
    let mut parts = Vec::with_capacity(records.len());
    for (i, (_, processed)) in records.iter().enumerate() {
        parts.push((i, Part::Result));
        if processed.dead_letter.is_some() {
            parts.push((i, Part::DeadLetter));
        }
    }
    parts
}

/// Records Kafka has not taken (not queued, or not acknowledged) and the first error: what
/// to send again. The others were taken, and sending them again would publish them twice.
#[derive(Debug)]
pub struct NotTaken {
    /// The records to send again.
    pub parts: Parts,
    /// Why the first of them failed.
    pub error: KafkaError,
}

impl NotTaken {
    /// Adds `more` to what `failed` holds, keeping the first error.
    fn add(failed: &mut Option<NotTaken>, more: NotTaken) {
        match failed {
            Some(f) => f.parts.extend(more.parts),
            None => *failed = Some(more),
        }
    }
}

/// What [`Publisher::send`] queued, and what it could not.
pub struct Queued {
    /// The acknowledgements of what was queued.
    pub acks: Acks,
    /// What could not be queued, from the first failure on.
    pub rest: Option<NotTaken>,
}

/// One queued record's acknowledgement, with the part it publishes.
type PendingAck = ((usize, Part), Ack);

/// The acknowledgements of records handed to the producer, in one future: polled by
/// `&mut` (it is `Unpin`), so a caller can wait on it in a `select!` and come back later.
pub struct Acks(Pin<Box<dyn Future<Output = Result<(), NotTaken>> + Send>>);

impl Acks {
    /// Resolves once Kafka acknowledged every record; otherwise names those it did not.
    pub async fn acknowledged(&mut self) -> Result<(), NotTaken> {
        (&mut self.0).await
    }

    /// Waits for every acknowledgement of `pending` (not only up to the first failure: the
    /// records that failed are the ones to send again).
    fn of(pending: Vec<PendingAck>, producer: FutureProducer, dead_letter_topic: String) -> Acks {
        Acks(Box::pin(async move {
            let mut failed: Option<NotTaken> = None;
            for (part, ack) in pending {
                if let Err(error) = ack.settled(&producer, &dead_letter_topic).await {
                    NotTaken::add(&mut failed, NotTaken { parts: vec![part], error });
                }
            }
            failed.map_or(Ok(()), Err)
        }))
    }

    /// One future for the acknowledgements of several sends of one batch.
    pub fn join(all: Vec<Acks>) -> Acks {
        Acks(Box::pin(async move {
            let mut failed: Option<NotTaken> = None;
            for mut acks in all {
                if let Err(not_taken) = acks.acknowledged().await {
                    NotTaken::add(&mut failed, not_taken);
                }
            }
            failed.map_or(Ok(()), Err)
        }))
    }
}

/// The largest dead-letter copy to send, when it must be known before sending: the
/// dead-letter topic's `max.message.bytes` less room for the record batch around it.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterLimit(pub usize);

/// Room left for a record batch's own bytes (its header, the record's varints).
const BATCH_OVERHEAD: usize = 1024;

impl DeadLetterLimit {
    /// The limit of a topic whose `max.message.bytes` is `topic_max`.
    pub fn of_topic(topic_max: usize) -> DeadLetterLimit {
        DeadLetterLimit(topic_max.saturating_sub(BATCH_OVERHEAD))
    }
}

/// The producer of results and dead letters.
pub struct Publisher {
    producer: FutureProducer,
    results_topic: String,
    dead_letter_topic: String,
    /// Set under transactional results (see the module doc).
    dead_letter_limit: Option<DeadLetterLimit>,
}

/// The producer settings dedupd chooses; `[kafka.connection]` and then `kafka.producer.*`
/// override them (see [`KafkaConfig::client_config`]).
pub fn producer_config(kafka: &KafkaConfig) -> Result<ClientConfig, ConnectionError> {
    producer_config_with(kafka, None)
}

/// [`producer_config`], transactional under `transactional_id` when one is given.
pub(crate) fn producer_config_with(
    kafka: &KafkaConfig,
    transactional_id: Option<&str>,
) -> Result<ClientConfig, ConnectionError> {
    let max_bytes = super::config::RESULTS_PRODUCER_MAX_BYTES.to_string();
    let mut c = kafka.client_config(
        &[("linger.ms", "2"), ("message.timeout.ms", "60000"), ("message.max.bytes", &max_bytes)],
        &kafka.producer,
    )?;
    // Delivery rests on these (validation refuses them in `kafka.producer`).
    c.set("enable.idempotence", "true").set("acks", "all");
    if let Some(id) = transactional_id {
        c.set("transactional.id", id);
        // Kafka Streams' choice under exactly-once: a killed instance's open transaction
        // holds every `read_committed` reader of its partitions (the next owner's restore
        // and its by-key fetches) until the broker aborts it, librdkafka's 60 s by default
        // (docs/performance-notes.md, "Failover and open transactions"). Commits come every
        // transaction interval.
        if c.get("transaction.timeout.ms").is_none() {
            c.set("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS.to_string());
        }
        // librdkafka wants a message's timeout within its transaction's.
        if !kafka.producer.contains_key("message.timeout.ms") {
            let timeout = c.get("transaction.timeout.ms").map_or(TRANSACTION_TIMEOUT_MS.to_string(), str::to_string);
            c.set("message.timeout.ms", timeout);
        }
        // Every commit sends offsets (transactions, invariant 6), and the coordinator
        // answers the first request of a transaction `CONCURRENT_TRANSACTIONS` while it
        // still writes the markers of the one before; librdkafka then waits
        // `retry.backoff.ms` (100 ms by default) to ask again, for every commit under load
        // (measured: commits of 32 ms median, 120 ms p90, and a third of the throughput).
        if c.get("retry.backoff.ms").is_none() {
            c.set("retry.backoff.ms", RETRY_BACKOFF_MS);
        }
    }
    Ok(c)
}

/// The transactional producer's `transaction.timeout.ms` unless the config sets one.
const TRANSACTION_TIMEOUT_MS: u64 = 10_000;

/// The transactional producer's `transaction.timeout.ms`: `kafka.producer`'s, else dedupd's.
pub(crate) fn transaction_timeout(kafka: &KafkaConfig) -> std::time::Duration {
    let ms = kafka.producer.get("transaction.timeout.ms").and_then(|v| v.trim().parse().ok());
    std::time::Duration::from_millis(ms.unwrap_or(TRANSACTION_TIMEOUT_MS))
}
/// The transactional producer's `retry.backoff.ms` unless the config sets one (librdkafka
/// backs off exponentially from it, up to `retry.backoff.max.ms`).
const RETRY_BACKOFF_MS: &str = "10";

impl Publisher {
    /// Creates the idempotent producer.
    pub fn new(kafka: &KafkaConfig) -> Result<Publisher, PipelineError> {
        Self::with(kafka, None, None)
    }

    /// Creates the producer, transactional under `transactional_id` (its transactions are
    /// `transactions::Transactions`'), measuring dead-letter copies against `limit`.
    pub(crate) fn with(
        kafka: &KafkaConfig,
        transactional_id: Option<&str>,
        dead_letter_limit: Option<DeadLetterLimit>,
    ) -> Result<Publisher, PipelineError> {
        let config = producer_config_with(kafka, transactional_id)?;
        Ok(Publisher {
            producer: crate::connection::probe::create(&config, "results producer")?,
            results_topic: kafka.results_topic.clone(),
            dead_letter_topic: kafka.dead_letter_topic.clone(),
            dead_letter_limit,
        })
    }

    /// Hands `parts` of `records` to the producer in order, waiting only for room in its
    /// queue, and returns their acknowledgements; a record that cannot be queued ends it,
    /// and it and the parts after it are returned as not taken. The producer copies each
    /// record, so nothing here stays borrowed.
    pub async fn send(&self, records: &[(&OwnedMessage, &Processed)], parts: &[(usize, Part)]) -> Queued {
        let mut pending: Vec<PendingAck> = Vec::with_capacity(parts.len());
        let mut rest = None;
        for (at, &(i, part)) in parts.iter().enumerate() {
            let Some(&(input, processed)) = records.get(i) else { continue };
            let queued = match part {
                Part::Result => {
                    let value = serde_json::to_vec(&processed.result).unwrap_or_default();
                    self.enqueue(result_record(&self.results_topic, processed, &value)).await.map(Ack::Result)
                }
                Part::DeadLetter => match &processed.dead_letter {
                    Some(dl) => self.enqueue_dead_letter(input, DeadLetter::of(input, dl.reason, &dl.error)).await,
                    None => continue,
                },
                Part::Forward => continue,
            };
            match queued {
                Ok(ack) => pending.push(((i, part), ack)),
                Err(error) => {
                    rest = Some(NotTaken { parts: parts[at..].to_vec(), error });
                    break;
                }
            }
        }
        Queued { acks: Acks::of(pending, self.producer.clone(), self.dead_letter_topic.clone()), rest }
    }

    /// Queues the result record of a key the reconciler settled (which has no input record
    /// of its own to send with it); the future resolves with its acknowledgement.
    pub(crate) async fn queue_settlement(
        &self,
        processed: &Processed,
    ) -> Result<impl Future<Output = Result<(), KafkaError>> + use<>, KafkaError> {
        let value = serde_json::to_vec(&processed.result).unwrap_or_default();
        let ack = self.enqueue(result_record(&self.results_topic, processed, &value)).await?;
        Ok(async move {
            match ack.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(e),
                Err(_) => Err(KafkaError::Canceled),
            }
        })
    }

    /// Hands the by-key hop's forwards to the producer in order, as [`Publisher::send`]
    /// does results: the first that cannot be queued ends it, and it and those after it are
    /// returned as not taken.
    pub(crate) async fn send_forwards(&self, forwards: Vec<FutureRecord<'_, [u8], [u8]>>) -> Queued {
        let total = forwards.len();
        let mut pending: Vec<PendingAck> = Vec::with_capacity(total);
        let mut rest = None;
        for (i, record) in forwards.into_iter().enumerate() {
            match self.enqueue(record).await {
                Ok(ack) => pending.push(((i, Part::Forward), Ack::Result(ack))),
                Err(error) => {
                    rest = Some(NotTaken { parts: (i..total).map(|j| (j, Part::Forward)).collect(), error });
                    break;
                }
            }
        }
        Queued { acks: Acks::of(pending, self.producer.clone(), self.dead_letter_topic.clone()), rest }
    }

    /// Queues a dead-letter copy, or its stand-in when the producer refuses the copy for
    /// its size.
    async fn enqueue_dead_letter(&self, input: &OwnedMessage, letter: DeadLetter) -> Result<Ack, KafkaError> {
        if let Some(DeadLetterLimit(limit)) = self.dead_letter_limit
            && letter.copy_size(input) > limit
        {
            tracing::warn!(source = %letter.source, bytes = letter.original_size, limit, "the dead-letter copy is larger than the dead-letter topic takes; publishing a stand-in without key and value");
            return Ok(Ack::Result(self.enqueue(letter.stand_in(&self.dead_letter_topic)).await?));
        }
        match self.enqueue(letter.copy(&self.dead_letter_topic, input)).await {
            Ok(ack) => Ok(Ack::Copy(ack, letter)),
            Err(e) if is_too_large(&e) => {
                Ok(Ack::Result(self.enqueue(letter.stand_in(&self.dead_letter_topic)).await?))
            }
            Err(e) => Err(e),
        }
    }

    /// Queues one record, waiting while the producer's queue is full (its messages time
    /// out after `message.timeout.ms`, so the wait is bounded by the producer itself).
    async fn enqueue(&self, record: FutureRecord<'_, [u8], [u8]>) -> Result<DeliveryFuture, KafkaError> {
        Self::enqueue_on(&self.producer, record).await
    }

    /// Queues one record, waiting while the producer's queue is full.
    pub(crate) async fn enqueue_on(
        producer: &FutureProducer,
        mut record: FutureRecord<'_, [u8], [u8]>,
    ) -> Result<DeliveryFuture, KafkaError> {
        let deadline = tokio::time::Instant::now() + QUEUE_FULL_PATIENCE;
        loop {
            match producer.send_result(record) {
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

    /// The producer itself (a handle to the same client), for its transactions.
    pub(crate) fn producer(&self) -> FutureProducer {
        self.producer.clone()
    }

    /// Waits for queued records (shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        rdkafka::producer::Producer::flush(&self.producer, timeout)
    }
}

/// The result record of one input, whose value is `value` (its result as JSON).
fn result_record<'a>(topic: &'a str, processed: &'a Processed, value: &'a [u8]) -> FutureRecord<'a, [u8], [u8]> {
    let mut headers =
        OwnedHeaders::new().insert(Header { key: "dedupd-outcome", value: Some(processed.result.outcome.as_str()) });
    if processed.result.replay {
        headers = headers.insert(Header { key: "idempotent-replay", value: Some("true") });
    }
    for (key, value) in [("traceparent", &processed.traceparent), ("tracestate", &processed.tracestate)] {
        if let Some(value) = value {
            headers = headers.insert(Header { key, value: Some(value.as_str()) });
        }
    }
    let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(value).headers(headers);
    if let Some(k) = &processed.result.key {
        record = record.key(k.as_bytes());
    }
    record
}

/// Whether publishing failed for a reason that retrying cannot fix: the topic does not
/// exist or may not be written, or a result record is too large. The worker then stops
/// the process (exit non-zero, the batch uncommitted) rather than retry for ever.
pub fn is_permanent(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidMessage
        )
    )
}

/// Whether Kafka (the producer or the broker) refused a record for its size.
fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

/// What a dead-letter record says besides the input's own bytes.
struct DeadLetter {
    reason: &'static str,
    error: String,
    source: String,
    /// The input value's size in bytes.
    original_size: usize,
}

impl DeadLetter {
    fn of(input: &OwnedMessage, reason: &'static str, error: &str) -> DeadLetter {
        DeadLetter {
            reason,
            error: error.to_string(),
            source: format!("{}/{}/{}", input.topic(), input.partition(), input.offset()),
            original_size: input.payload().map_or(0, <[u8]>::len),
        }
    }

    fn headers(&self, base: OwnedHeaders) -> OwnedHeaders {
        base.insert(Header { key: "dedupd-reason", value: Some(self.reason) })
            .insert(Header { key: "dedupd-error", value: Some(self.error.as_str()) })
            .insert(Header { key: "dedupd-source", value: Some(self.source.as_str()) })
    }

    /// The bytes of the copy of `input`: its key, value and headers with the reason headers.
    fn copy_size(&self, input: &OwnedMessage) -> usize {
        let headers: usize =
            input.headers().map_or(0, |h| h.iter().map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len)).sum());
        let ours =
            "dedupd-reasondedupd-errordedupd-source".len() + self.reason.len() + self.error.len() + self.source.len();
        input.key().map_or(0, <[u8]>::len) + self.original_size + headers + ours
    }

    /// The input's key, value and headers, with the reason headers added.
    fn copy<'a>(&'a self, topic: &'a str, input: &'a OwnedMessage) -> FutureRecord<'a, [u8], [u8]> {
        let headers = self.headers(input.headers().cloned().unwrap_or_default());
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).headers(headers);
        if let Some(v) = input.payload() {
            record = record.payload(v);
        }
        if let Some(k) = input.key() {
            record = record.key(k);
        }
        record
    }

    /// What goes instead of a copy Kafka refused for its size: the reason headers and the
    /// size of the input's value, no key, no value.
    fn stand_in<'a>(&'a self, topic: &'a str) -> FutureRecord<'a, [u8], [u8]> {
        let size = self.original_size.to_string();
        let headers = self
            .headers(OwnedHeaders::new())
            .insert(Header { key: "dedupd-original-size", value: Some(size.as_bytes()) });
        FutureRecord::<[u8], [u8]>::to(topic).headers(headers)
    }
}

/// One queued record's acknowledgement.
enum Ack {
    /// A result or a stand-in: it must be acknowledged.
    Result(DeliveryFuture),
    /// A dead-letter copy: if the broker refuses it for its size, its stand-in goes instead.
    Copy(DeliveryFuture, DeadLetter),
}

impl Ack {
    async fn settled(self, producer: &FutureProducer, topic: &str) -> Result<(), KafkaError> {
        let (ack, letter) = match self {
            Ack::Result(ack) => (ack, None),
            Ack::Copy(ack, letter) => (ack, Some(letter)),
        };
        match (ack.await, letter) {
            (Ok(Ok(_)), _) => Ok(()),
            (Ok(Err((e, _))), Some(letter)) if is_too_large(&e) => {
                tracing::warn!(source = %letter.source, bytes = letter.original_size, "the dead-letter copy is too large for the broker; publishing a stand-in without key and value");
                let ack = Publisher::enqueue_on(producer, letter.stand_in(topic)).await?;
                match ack.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e),
                    Err(_) => Err(KafkaError::Canceled),
                }
            }
            (Ok(Err((e, _))), _) => Err(e),
            (Err(_), _) => Err(KafkaError::Canceled),
        }
    }
}

#[cfg(test)]
mod tests;

//! The door's one way to run a command, whichever protocol it came by (HTTP, MCP): its
//! record built and checked, its key held, produced, and its result awaited until
//! `intake.wait`.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::key::KeyError;
use super::problem::{Cause, Problem};
use super::results::Ticket;
use super::{Door, key, record};
use crate::outcome::SourceRef;

/// How long a client is told to wait before asking again about a key in flight.
pub const RETRY_AFTER_SECS: &str = "1";

/// Characters of a key left as they are in a `Location` path segment (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Where `key`'s state is read.
pub fn location_of(key: &str) -> String {
    format!("/v1/commands/{}", utf8_percent_encode(key, SEGMENT))
}

pub fn bad_key(e: KeyError) -> Problem {
    Problem::new(Cause::BadIdempotencyKey, e.to_string())
}

/// A key or value in a message, as a JSON string.
pub fn quoted(text: &str) -> String {
    Value::from(text).to_string()
}

/// A command as a client posted it.
pub struct Posted<'a> {
    /// The client's name (admitted).
    pub client: &'a str,
    /// Its idempotency key, unscoped.
    pub key: &'a str,
    /// The command type.
    pub kind: &'a str,
    /// The payload, JSON.
    pub body: &'a [u8],
    /// The request's headers, for its trace context.
    pub request: &'a HeaderMap,
}

/// How a command posted ended for its request.
pub enum Ran {
    /// Its result record (docs/contract.md §5), and where its key is read.
    Done { result: Value, location: String },
    /// Not done within `intake.wait`: what was produced, and where to poll.
    Accepted { body: Value, location: String },
}

impl Door {
    /// Runs `posted` through the pipeline: refused with a problem, or its result, or
    /// accepted when `intake.wait` passes first.
    pub(super) async fn run(self: &Arc<Self>, posted: Posted<'_>) -> Result<Ran, Problem> {
        let deadline = Instant::now() + self.wait;
        let scoped = key::scoped(posted.client, posted.key).map_err(bad_key)?;
        let produced = record::build(&self.checks, (posted.client, &scoped), posted.kind, posted.body, posted.request)?;
        let ticket = self.waiters.enter(&scoped).ok_or_else(|| {
            Problem::new(
                Cause::InFlight,
                format!("a request with the key {} is still being processed", quoted(posted.key)),
            )
            .header(header::RETRY_AFTER, RETRY_AFTER_SECS)
        })?;
        let source = self.produce(&produced, deadline).await?;
        let location = location_of(posted.key);
        tokio::select! {
            result = tokio::time::timeout_at(deadline, ticket.result_of(&source)) => match result {
                Ok(result) => Ok(Ran::Done { result, location }),
                Err(_) => Ok(self.accepted(ticket, source, posted.key, location)),
            },
            () = self.stop.cancelled() => Ok(self.accepted(ticket, source, posted.key, location)),
        }
    }

    /// Hands the record to Kafka (`acks=all`, idempotent): where it landed, the source
    /// its result names.
    async fn produce(&self, produced: &record::Produced, deadline: Instant) -> Result<SourceRef, Problem> {
        let mut headers = OwnedHeaders::new_with_capacity(produced.headers.len());
        for (name, value) in &produced.headers {
            headers = headers.insert(Header { key: name, value: value.as_deref() });
        }
        let record =
            FutureRecord::to(&self.topic).key(produced.key.as_bytes()).payload(&produced.value).headers(headers);
        let queue_timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let sent = if refused_at_produce(&produced.key) {
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::BrokerNotAvailable))
        } else {
            self.producer.send(record, queue_timeout).await.map_err(|(e, _)| e)
        };
        match sent {
            Ok(delivery) => Ok(SourceRef::at(&self.topic, delivery.partition, delivery.offset)),
            Err(e) => {
                tracing::warn!(topic = %self.topic, error = %e, "intake: producing a command");
                Err(Problem::new(Cause::Unavailable, format!("the command could not be handed to Kafka: {e}"))
                    .header(header::RETRY_AFTER, RETRY_AFTER_SECS))
            }
        }
    }

    /// Accepted: the result is not yet known. The key stays held (a repeat is told it is in
    /// flight) until its result arrives or the intake stops.
    fn accepted(self: &Arc<Self>, ticket: Ticket, source: SourceRef, key: &str, location: String) -> Ran {
        let stop = self.stop.clone();
        let body = json!({"key": key, "state": "accepted", "location": location, "source": source});
        tokio::spawn(async move {
            tokio::select! {
                _ = ticket.result_of(&source) => {}
                () = stop.cancelled() => {}
            }
        });
        Ran::Accepted { body, location }
    }
}

/// Whether (feature `failpoints`) the failpoint `intake.produce`, `return(KAFKA_KEY)`, makes
/// Kafka refuse the command with that record key (`CLIENT/KEY`): the test of the intake's
/// 503 without stopping the broker its other tests share.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
fn refused_at_produce(record_key: &str) -> bool {
    fail::fail_point!("intake.produce", |refused: Option<String>| refused.as_deref() == Some(record_key));
    false
}

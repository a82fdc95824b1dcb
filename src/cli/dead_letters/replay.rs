//! Re-producing one dead letter and marking it as replayed, in one Kafka transaction: the
//! replayed record on its target topic and the mark on the dead-letter topic land together
//! or not at all, so a mark is read only for a replay that happened, and a replay that
//! happened is always marked.
//!
//! The producer's `transactional.id` is one per consumer group (`<group_id>-dead-letters-
//! replay`), taken before the dead-letter topic is read: taking it fences a replay still
//! running with it and ends that one's open transaction, so what this run reads includes
//! every mark that one committed, and nothing it writes after can be missed. Two replays at
//! once thus never replay one record twice: the earlier one's writes fail instead.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::letter::{Letter, MARK_KEY, Position, REPLAY_OF, REPLAYED_OF, REPLAYED_TO};
use crate::cli::CliError;
use crate::connection::probe;
use crate::pipeline::{KafkaConfig, producer_config_with};

/// How long a call to the transaction coordinator may take (`init`, `commit`, `abort`).
const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(30);

/// A replay that did not happen.
#[derive(Debug)]
pub(super) struct Failed {
    /// Why.
    pub error: String,
    /// Whether the producer can go on with the next record (its transaction was aborted);
    /// when not (fenced by another replay, or the abort failed), the run stops.
    pub can_go_on: bool,
}

/// The transactional producer of a replay run.
pub(super) struct Replayer {
    producer: FutureProducer,
    dead_letter_topic: String,
}

impl Replayer {
    /// Creates the producer (`[kafka.connection]` and `kafka.producer` as the results
    /// producer has them) and takes its `transactional.id`.
    pub fn start(kafka: &KafkaConfig) -> Result<Replayer, CliError> {
        let id = format!("{}-dead-letters-replay", kafka.group_id);
        let mut config = producer_config_with(kafka, Some(&id)).map_err(|e| CliError::Other(e.to_string()))?;
        // The partitioner of Kafka's own producers (murmur2 of the key): with
        // `kafka.copartitioned` a replayed command must land on its key's partition, or it
        // is dead-lettered again as `not_copartitioned`.
        if !kafka.producer.contains_key("partitioner") {
            config.set("partitioner", "murmur2_random");
        }
        let producer: FutureProducer =
            probe::create(&config, "replay producer").map_err(|e| CliError::Other(e.to_string()))?;
        producer.init_transactions(COORDINATOR_TIMEOUT).map_err(|e| {
            CliError::Other(format!("the replay producer could not take its transactional.id {id}: {e}"))
        })?;
        Ok(Replayer { producer, dead_letter_topic: kafka.dead_letter_topic.clone() })
    }

    /// Re-produces `letter` to `to` and marks it, in one transaction; returns where the
    /// replayed record went.
    pub fn replay(&self, letter: &Letter, to: &str) -> Result<Position, Failed> {
        self.producer
            .begin_transaction()
            .map_err(|e| Failed { error: format!("beginning a transaction: {e}"), can_go_on: false })?;
        let written = self.write(letter, to).and_then(|at| {
            crate::crash::point("replay.delivered");
            self.producer.commit_transaction(COORDINATOR_TIMEOUT).map(|()| at).map_err(|e| {
                format!(
                    "committing: {e} (run the replay again: a record whose replay committed is marked, and skipped)"
                )
            })
        });
        written.map_err(|error| {
            let can_go_on = self.producer.abort_transaction(COORDINATOR_TIMEOUT).is_ok();
            Failed { error, can_go_on }
        })
    }

    /// The replayed record, then its mark, each waited for (one record at a time: the
    /// mark names where the replay went).
    fn write(&self, letter: &Letter, to: &str) -> Result<Position, String> {
        let of = letter.at.to_string();
        // A record replayed before and dead-lettered again names only this replay.
        let mut headers = OwnedHeaders::new_with_capacity(letter.headers.len() + 1);
        for (key, value) in letter.headers.iter().filter(|(key, _)| key != REPLAY_OF) {
            headers = headers.insert(Header { key: key.as_str(), value: value.as_deref() });
        }
        headers = headers.insert(Header { key: REPLAY_OF, value: Some(of.as_str()) });
        let mut record = FutureRecord::<[u8], [u8]>::to(to).headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &letter.value {
            record = record.payload(value.as_slice());
        }
        let at = self.send(record).map_err(|e| format!("producing to {to}: {e}"))?;
        let at = Position { topic: to.to_string(), partition: at.0, offset: at.1 };
        let went = at.to_string();
        let mark_headers = OwnedHeaders::new_with_capacity(2)
            .insert(Header { key: REPLAYED_OF, value: Some(of.as_str()) })
            .insert(Header { key: REPLAYED_TO, value: Some(went.as_str()) });
        // On the dead letter's own partition: a mark sits after what it marks.
        let mark = FutureRecord::<[u8], [u8]>::to(&self.dead_letter_topic)
            .partition(letter.at.partition)
            .key(MARK_KEY.as_bytes())
            .headers(mark_headers);
        self.send(mark).map_err(|e| format!("marking it on {}: {e}", self.dead_letter_topic))?;
        Ok(at)
    }

    /// Sends one record and waits for its acknowledgement (bounded by the producer's
    /// `message.timeout.ms`); returns its partition and offset.
    fn send(&self, record: FutureRecord<'_, [u8], [u8]>) -> Result<(i32, i64), String> {
        let ack = self.producer.send_result(record).map_err(|(e, _)| e.to_string())?;
        match futures::executor::block_on(ack) {
            Ok(Ok(delivery)) => Ok((delivery.partition, delivery.offset)),
            Ok(Err((e, _))) => Err(e.to_string()),
            Err(_) => Err("the producer went away before an answer".into()),
        }
    }
}

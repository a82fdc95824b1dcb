//! Reading the dead-letter topic once: every partition from its beginning up to where it
//! ended when the read started, `read_committed` (a replay's mark and its replayed record
//! are one transaction: a mark that is read is a replay that happened). Never waits for
//! records that come later, and gives up when nothing arrives for `kafka.connect_timeout`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::letter::{Letter, Position, Record, classify};
use crate::cli::CliError;
use crate::connection::probe;
use crate::pipeline::KafkaConfig;

/// How long one poll waits: short, so the stall deadline is checked often.
const POLL: Duration = Duration::from_millis(200);

/// What the dead-letter topic holds, as far as a replay cares.
#[derive(Debug, Default)]
pub(super) struct DeadLetters {
    /// The copies `keep` selected, in partition and offset order.
    pub letters: Vec<Letter>,
    /// The stand-ins `keep` selected: their place, reason, source and original size.
    pub stand_ins: Vec<(Position, String, Option<String>, String)>,
    /// Every dead letter a mark says was replayed.
    pub marked: HashSet<Position>,
}

/// The reader's settings: `[kafka.connection]` and `kafka.consumer` as every client has
/// them, then what this read needs whatever those say. The group id is only a name: the
/// reader is assigned its partitions and commits nothing.
pub(super) fn reader_config(kafka: &KafkaConfig) -> Result<ClientConfig, CliError> {
    let mut c = kafka
        .client_config(&[("fetch.queue.backoff.ms", "10")], &kafka.consumer)
        .map_err(|e| CliError::Other(e.to_string()))?;
    c.set("group.id", format!("{}-dead-letters-replay", kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    // Assigned, not subscribed: a static member id would mean nothing, and the stats the
    // pipeline's consumer asks for would only be logged.
    c.remove("group.instance.id").remove("statistics.interval.ms");
    Ok(c)
}

/// Reads `partitions` partitions of `kafka.dead_letter_topic`, keeping the copies and
/// stand-ins `keep` selects (by reason and timestamp) and every mark.
pub(super) fn read(
    kafka: &KafkaConfig,
    config: &ClientConfig,
    partitions: i32,
    keep: &dyn Fn(&str, Option<i64>) -> bool,
) -> Result<DeadLetters, CliError> {
    let topic = kafka.dead_letter_topic.as_str();
    let consumer: BaseConsumer =
        probe::create(config, "dead-letter reader").map_err(|e| CliError::Other(e.to_string()))?;
    let stall = kafka.connect_timeout;
    let failed = |what: &str, e: KafkaError| CliError::Other(format!("{what} of {topic}: {e}"));
    // Where each partition ends now; records after it are left for the next replay.
    let mut ends = Vec::with_capacity(usize::try_from(partitions).unwrap_or(0));
    let mut tpl = TopicPartitionList::new();
    let mut open = HashSet::new();
    for p in 0..partitions {
        let (low, high) =
            consumer.fetch_watermarks(topic, p, stall).map_err(|e| failed(&format!("the end of partition {p}"), e))?;
        ends.push((p, high));
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| failed("assigning", e))?;
            open.insert(p);
        }
    }
    consumer.assign(&tpl).map_err(|e| failed("assigning the partitions", e))?;
    let mut read = DeadLetters::default();
    let (mut last_progress, mut last_error) = (Instant::now(), None::<KafkaError>);
    while !open.is_empty() {
        if last_progress.elapsed() >= stall {
            let mut left: Vec<i32> = open.into_iter().collect();
            left.sort_unstable();
            let why = last_error.map_or("nothing arrived".to_string(), |e| e.to_string());
            return Err(CliError::Other(format!(
                "{topic}: partition(s) {left:?} not read to their end: nothing for {} ({why})",
                humantime::format_duration(stall)
            )));
        }
        match consumer.poll(POLL) {
            Some(Ok(message)) => {
                last_progress = Instant::now();
                let (p, offset) = (message.partition(), message.offset());
                let end = ends.iter().find(|(q, _)| *q == p).map_or(0, |(_, high)| *high);
                if offset >= end {
                    open.remove(&p);
                    continue;
                }
                if offset + 1 >= end {
                    open.remove(&p);
                }
                take(&mut read, classify(&message), keep);
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                last_progress = Instant::now();
                open.remove(&p);
            }
            Some(Err(e)) => last_error = Some(e),
            None => {}
        }
    }
    read.letters.sort_by(|a, b| a.at.cmp(&b.at));
    read.stand_ins.sort();
    Ok(read)
}

/// Keeps what a replay needs of one record.
fn take(read: &mut DeadLetters, record: Record, keep: &dyn Fn(&str, Option<i64>) -> bool) {
    match record {
        Record::Letter(letter) if keep(&letter.reason, letter.timestamp_ms) => read.letters.push(letter),
        Record::StandIn { at, reason, source, original_size, timestamp_ms } if keep(&reason, timestamp_ms) => {
            read.stand_ins.push((at, reason, source, original_size));
        }
        Record::Mark { of } => {
            read.marked.insert(of);
        }
        Record::Letter(_) | Record::StandIn { .. } | Record::Other => {}
    }
}

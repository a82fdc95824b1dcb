//! Reading the dead-letter topic once: every partition from its beginning up to where it
//! ended when the read started, `read_committed` (a replay's mark and its replayed record
//! are one transaction: a mark that is read is a replay that happened). Never waits for
//! records that come later; waits for a transaction still open below that end (the
//! pipeline's, under `kafka.transactional_results`), since a mark behind it would be
//! missed; gives up when nothing moves for `kafka.connect_timeout`.

use std::collections::{BTreeMap, HashSet};
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
    let stall = kafka.connect_timeout;
    let ends = ends(config, topic, partitions, stall)?;
    let consumer: BaseConsumer =
        probe::create(config, "dead-letter reader").map_err(|e| CliError::Other(e.to_string()))?;
    let mut tpl = TopicPartitionList::new();
    for &p in ends.keys() {
        tpl.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| failed(topic, "assigning", e))?;
    }
    consumer.assign(&tpl).map_err(|e| failed(topic, "assigning the partitions", e))?;
    let mut open: HashSet<i32> = ends.keys().copied().collect();
    let mut read = DeadLetters::default();
    let (mut last_progress, mut last_error, mut held) = (Instant::now(), None::<KafkaError>, false);
    while !open.is_empty() {
        if last_progress.elapsed() >= stall {
            return Err(stalled(topic, &open, stall, last_error, held));
        }
        match consumer.poll(POLL) {
            Some(Ok(message)) => {
                last_progress = Instant::now();
                let (p, offset) = (message.partition(), message.offset());
                let end = ends.get(&p).copied().unwrap_or(0);
                if offset + 1 >= end {
                    open.remove(&p);
                }
                if offset < end {
                    take(&mut read, classify(&message), keep);
                }
            }
            // At the end of what is committed: the partition's end unless a transaction
            // still open below it holds the last stable offset back. A mark after that
            // transaction would be missed, so the read waits for it to end.
            Some(Err(KafkaError::PartitionEOF(p))) => {
                let end = ends.get(&p).copied().unwrap_or(0);
                if position(&consumer, topic, p).is_some_and(|at| at >= end) {
                    last_progress = Instant::now();
                    open.remove(&p);
                } else {
                    held = true;
                }
            }
            Some(Err(e)) => last_error = Some(e),
            None => {}
        }
    }
    read.letters.sort_by(|a, b| a.at.cmp(&b.at));
    read.stand_ins.sort();
    Ok(read)
}

/// A failed Kafka call on `topic`.
fn failed(topic: &str, what: &str, e: KafkaError) -> CliError {
    CliError::Other(format!("{what} of {topic}: {e}"))
}

/// Where each non-empty partition of `topic` ends now (its high watermark); records after
/// it are left for the next replay. Asked `read_uncommitted`: asked as the reader, the
/// broker answers the last stable offset, which stops before a transaction still open, and
/// before the marks behind it.
fn ends(
    config: &ClientConfig,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<BTreeMap<i32, i64>, CliError> {
    let mut uncommitted = config.clone();
    uncommitted.set("isolation.level", "read_uncommitted");
    let client: BaseConsumer =
        probe::create(&uncommitted, "dead-letter reader").map_err(|e| CliError::Other(e.to_string()))?;
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = client
            .fetch_watermarks(topic, p, timeout)
            .map_err(|e| failed(topic, &format!("the end of partition {p}"), e))?;
        if high > low {
            ends.insert(p, high);
        }
    }
    Ok(ends)
}

/// Why the read gave up on the `open` partitions.
fn stalled(topic: &str, open: &HashSet<i32>, stall: Duration, last_error: Option<KafkaError>, held: bool) -> CliError {
    let mut left: Vec<i32> = open.iter().copied().collect();
    left.sort_unstable();
    let why = match (last_error, held) {
        (Some(e), _) => e.to_string(),
        (None, true) => {
            "a transaction open on them holds read_committed readers until its writer commits, aborts or times out"
                .to_string()
        }
        (None, false) => "nothing arrived".to_string(),
    };
    CliError::Other(format!(
        "{topic}: partition(s) {left:?} not read to their end: nothing for {} ({why})",
        humantime::format_duration(stall)
    ))
}

/// The consumer's position in partition `p`: the next offset it reads, past the
/// transaction markers it skipped.
fn position(consumer: &BaseConsumer, topic: &str, p: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    positions.find_partition(topic, p)?.offset().to_raw()
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

//! The `kafka` sink's check (`[sinks.NAME.check]`): whether the command's record is in the
//! sink's topic, found by the `idempotency-key` header the sink writes on every record.
//!
//! The check reads the topic with a consumer of its own: the sink's connection settings, no
//! group membership (a group id of its own that never joins nor commits: it assigns the
//! partitions itself), `read_committed`. It reads every partition of the topic, from the
//! first record stamped at or after the claim time less [`CLOCK_SKEW`]
//! (`offsets_for_times`) up to the high watermark taken when the check starts, because
//! the partition a record went to depends on the producer's `partitioner` and on the
//! topic's partition count at the time, neither of which the check can be sure of.
//!
//! Records of another producer's open transaction hold a `read_committed` reader back: a
//! check reaching one waits for it to end within `timeout`, else fails (never "absent").
//!
//! The window: a record stamped more than [`CLOCK_SKEW`] before the claim is not looked at,
//! and one the topic's retention already deleted is not seen (so a claim older than the
//! topic's `retention.ms` cannot be found).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::sinks::check::{CheckAnswer, CheckTimes, CheckTiming};
use crate::sinks::{Problems, SinkRequest};

/// The header that carries the idempotency key on every record the sink produces.
pub(crate) const KEY_HEADER: &str = "idempotency-key";

/// How long before the claim the check starts reading: a record's timestamp is taken on the
/// host that produced it (or, under `LogAppendTime`, the broker's), and a crash re-run's
/// claim time on the host of the first claim, so clocks a little apart must not hide it.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// `[sinks.NAME.check]` of a `kafka` sink.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaCheckConfig {
    /// How long after a call without an answer the check runs; twice `delivery_timeout`
    /// when unset.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub delay: Option<Duration>,
    /// How often the reconciler asks again about an `indeterminate` key (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// How long after its claim a key is still asked about (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub deadline: Option<Duration>,
    /// At most this many records read from each partition; reaching it before the high
    /// watermark leaves the answer unknown.
    #[serde(default = "default_max_records")]
    pub max_records: u64,
    /// A bound on the whole check (metadata, offsets and reading); past it the check fails.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_max_records() -> u64 {
    100_000
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

impl KafkaCheckConfig {
    /// The check's timing, `delivery_timeout` being the longest a call waits.
    pub fn timing(&self, delivery_timeout: Duration) -> CheckTiming {
        CheckTiming::new(
            CheckTimes { delay: self.delay, interval: self.interval, deadline: self.deadline },
            delivery_timeout,
        )
    }

    /// Adds a problem for each value that cannot work (keys `check.*`).
    pub fn validate(&self, delivery_timeout: Duration, problems: &mut Problems) {
        self.timing(delivery_timeout).validate(problems);
        if self.max_records == 0 {
            problems.add("check.max_records", "0", "must be at least 1");
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_millis(i32::MAX as u64) {
            problems.add(
                "check.timeout",
                humantime::format_duration(self.timeout).to_string(),
                "must be between 1ms and ~24 days",
            );
        }
    }
}

/// A `kafka` sink's check at run time.
pub(crate) struct KafkaCheck {
    topic: String,
    /// The consumer's settings (see the module's doc); the consumer is made per check, so
    /// that an idle sink holds no connection for it.
    client: ClientConfig,
    max_records: u64,
    timeout: Duration,
}

/// Sets the stop flag of a check's reader when the check is dropped or given up.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl KafkaCheck {
    /// The check of `topic` through a consumer made from `client`.
    pub(crate) fn new(topic: &str, client: ClientConfig, config: &KafkaCheckConfig) -> KafkaCheck {
        KafkaCheck { topic: topic.to_string(), client, max_records: config.max_records, timeout: config.timeout }
    }

    /// Whether the record of `request`'s command is in the topic (see the module's doc).
    pub(crate) async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        let Some(claimed_at_ms) = request.claimed_at_ms() else {
            return CheckAnswer::Error("the request has no claim time to read from".into());
        };
        let skew = i64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(i64::MAX);
        let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
        let read = Read {
            topic: self.topic.clone(),
            client: self.client.clone(),
            key: request.key().to_string(),
            since_ms: claimed_at_ms.saturating_sub(skew).max(0),
            max_records: self.max_records,
            timeout: self.timeout,
            deadline: Instant::now() + self.timeout,
            stop: Arc::clone(&stop.0),
        };
        // librdkafka's calls block: the read runs on a blocking thread, which the stop flag
        // ends within one poll when the caller gives up.
        let task = tokio::task::spawn_blocking(move || read.run());
        tokio::select! {
            () = request.given_up() => CheckAnswer::Error("given up before the topic was read".into()),
            joined = task => joined.unwrap_or_else(|e| CheckAnswer::Error(format!("the check's reader failed: {e}"))),
        }
    }
}

/// What is left to read of one partition.
#[derive(Debug)]
struct Span {
    partition: i32,
    /// The high watermark when the check started: the end of the read.
    high: i64,
    /// Records read so far.
    read: u64,
}

/// One check's read of the topic, on a blocking thread.
struct Read {
    topic: String,
    client: ClientConfig,
    key: String,
    /// Records stamped before this (Unix ms) are not read.
    since_ms: i64,
    max_records: u64,
    timeout: Duration,
    deadline: Instant,
    stop: Arc<AtomicBool>,
}

impl Read {
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Makes the librdkafka request `call` (given how long it may block) at most a second
    /// at a time, again while it fails for want of the cluster, until it answers, the
    /// check's time is up or its caller gave up: a request blocks this thread, and one that
    /// gave up must not keep it (and a shutdown waiting for it) for the whole `timeout`.
    fn patiently<T>(&self, mut call: impl FnMut(Duration) -> KafkaResult<T>) -> KafkaResult<T> {
        use RDKafkaErrorCode as C;
        loop {
            let answer = call(self.left().min(Duration::from_secs(1)));
            let code = answer.as_ref().err().and_then(KafkaError::rdkafka_error_code);
            let again = match code {
                Some(C::OperationTimedOut | C::TimedOutQueue) => Duration::ZERO,
                // Refused at once: wait a little before asking again, not in a tight loop.
                Some(C::BrokerTransportFailure | C::AllBrokersDown | C::Resolve) => Duration::from_millis(200),
                _ => return answer,
            };
            if self.left() <= again || self.stop.load(Ordering::Acquire) {
                return answer;
            }
            std::thread::sleep(again);
        }
    }

    fn run(self) -> CheckAnswer {
        // Two clients: the watermarks are asked `read_uncommitted`, because under
        // `read_committed` librdkafka asks for the last stable offset, which an open
        // transaction of another producer holds back, and a record of the sink written
        // after that transaction began would lie past it unseen: absent, wrongly. The
        // reader is `read_committed`, so it never takes an aborted record for the effect;
        // it waits at such a transaction until it ends or `timeout` passes.
        let mut listing = self.client.clone();
        listing.set("isolation.level", "read_uncommitted");
        let (lister, reader) = match (self.consumer(&listing), self.consumer(&self.client)) {
            (Ok(lister), Ok(reader)) => (lister, reader),
            (Err(answer), _) | (_, Err(answer)) => return answer,
        };
        let (spans, assignment) = match self.spans(&lister) {
            Ok(found) => found,
            Err(answer) => return answer,
        };
        drop(lister);
        if spans.is_empty() {
            return CheckAnswer::Absent;
        }
        if let Err(e) = reader.assign(&assignment) {
            return CheckAnswer::Error(format!("assigning the partitions of `{}`: {e}", self.topic));
        }
        self.scan(&reader, spans)
    }

    fn consumer(&self, config: &ClientConfig) -> Result<BaseConsumer, CheckAnswer> {
        config.create().map_err(|e| {
            let reason = crate::connection::check::client_error(config, &e);
            CheckAnswer::Error(format!("cannot create the check's consumer: {reason}"))
        })
    }

    /// Each partition to read (from its first record at or after `since_ms`, as an
    /// assignment) and up to where; partitions with nothing to read are left out.
    fn spans(&self, consumer: &BaseConsumer) -> Result<(Vec<Span>, TopicPartitionList), CheckAnswer> {
        let topic = self.topic.as_str();
        let failed = |what: &str, e: &dyn std::fmt::Display| CheckAnswer::Error(format!("{what} `{topic}`: {e}"));
        let metadata =
            self.patiently(|t| consumer.fetch_metadata(Some(topic), t)).map_err(|e| failed("reading topic", &e))?;
        let Some(listed) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(CheckAnswer::Unknown(format!("the cluster did not list topic `{topic}`")));
        };
        if let Some(err) = listed.error() {
            let code = RDKafkaErrorCode::from(err);
            return Err(CheckAnswer::Unknown(format!("the cluster answered for topic `{topic}`: {code}")));
        }
        let mut highs = Vec::new();
        let mut times = TopicPartitionList::new();
        for partition in listed.partitions().iter().map(|p| p.id()) {
            let (_, high) = self
                .patiently(|t| consumer.fetch_watermarks(topic, partition, t))
                .map_err(|e| failed("watermarks of", &e))?;
            highs.push((partition, high));
            times
                .add_partition_offset(topic, partition, Offset::Offset(self.since_ms))
                .map_err(|e| failed("listing the partitions of", &e))?;
        }
        let starts = self
            .patiently(|t| consumer.offsets_for_times(times.clone(), t))
            .map_err(|e| failed("offsets by time of", &e))?;
        let mut assignment = TopicPartitionList::new();
        let mut spans = Vec::new();
        for (partition, high) in highs {
            let start = match starts.find_partition(topic, partition).map(|e| (e.offset(), e.error())) {
                Some((_, Err(e))) => return Err(failed(&format!("offset by time of partition {partition} of"), &e)),
                Some((Offset::Offset(start), Ok(()))) => start,
                // No record at or after the time: nothing to read there.
                Some((Offset::End, Ok(()))) => high,
                other => return Err(failed("offsets by time of", &format!("partition {partition}: {other:?}"))),
            };
            if start < high {
                assignment
                    .add_partition_offset(topic, partition, Offset::Offset(start))
                    .map_err(|e| failed("listing the partitions of", &e))?;
                spans.push(Span { partition, high, read: 0 });
            }
        }
        Ok((spans, assignment))
    }

    /// Reads the assigned partitions to their high watermarks, looking for the key.
    fn scan(&self, consumer: &BaseConsumer, mut spans: Vec<Span>) -> CheckAnswer {
        let mut last_error = String::new();
        while !spans.is_empty() {
            if self.stop.load(Ordering::Acquire) {
                return CheckAnswer::Error("given up before the topic was read".into());
            }
            let left = self.left();
            if left.is_zero() {
                let pending: Vec<i32> = spans.iter().map(|s| s.partition).collect();
                return CheckAnswer::Error(format!(
                    "partitions {pending:?} of `{}` not read to their high watermark within check.timeout ({}){last_error}",
                    self.topic,
                    humantime::format_duration(self.timeout)
                ));
            }
            match consumer.poll(left.min(Duration::from_millis(100))) {
                None => {}
                Some(Ok(m)) => {
                    if let Some(answer) = self.read_one(&m, &mut spans) {
                        return answer;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    // At the end of what it may read: done once past the start's high
                    // watermark (read_committed stops early before an open transaction).
                    let at = position(consumer, &self.topic, partition);
                    spans.retain(|s| s.partition != partition || at.is_none_or(|at| at < s.high));
                }
                Some(Err(e)) => last_error = format!("; last error: {e}"),
            }
        }
        CheckAnswer::Absent
    }

    /// Takes one record into account: the answer when it is the command's, or when its
    /// partition ran out of `max_records`.
    fn read_one(&self, m: &BorrowedMessage<'_>, spans: &mut Vec<Span>) -> Option<CheckAnswer> {
        let i = spans.iter().position(|s| s.partition == m.partition())?;
        let span = &mut spans[i];
        if m.offset() >= span.high {
            spans.remove(i);
            return None;
        }
        span.read += 1;
        let carries_key =
            m.headers().is_some_and(|h| h.iter().any(|h| h.key == KEY_HEADER && h.value == Some(self.key.as_bytes())));
        if carries_key {
            return Some(CheckAnswer::Found(
                json!({ "topic": self.topic, "partition": m.partition(), "offset": m.offset() }),
            ));
        }
        if m.offset() + 1 >= span.high {
            spans.remove(i);
        } else if span.read >= self.max_records {
            return Some(CheckAnswer::Unknown(format!(
                "read check.max_records ({}) records of partition {} of `{}` without reaching offset {}, its high watermark when the check began",
                self.max_records, span.partition, self.topic, span.high
            )));
        }
        None
    }
}

/// The consumer's position in `partition` of `topic`, when it has one.
fn position(consumer: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(at) => Some(at),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        let c: KafkaCheckConfig = toml::from_str(text).unwrap();
        let mut problems = Problems::new("sinks.pay");
        c.validate(Duration::from_secs(30), &mut problems);
        problems.into_vec().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn defaults_and_timing() {
        let c: KafkaCheckConfig = toml::from_str("").unwrap();
        assert_eq!((c.max_records, c.timeout), (100_000, Duration::from_secs(10)));
        let t = c.timing(Duration::from_secs(30));
        assert_eq!(t.delay, Duration::from_secs(60), "twice delivery_timeout");
        let set: KafkaCheckConfig = toml::from_str("delay = \"5m\"").unwrap();
        assert_eq!(set.timing(Duration::from_secs(30)).delay, Duration::from_secs(300));
        assert!(toml::from_str::<KafkaCheckConfig>("max_record = 5").is_err(), "unknown keys are refused");
    }

    #[test]
    fn problems_name_their_keys() {
        assert!(problems("").is_empty());
        assert_eq!(
            problems("max_records = 0\ntimeout = \"0s\""),
            ["sinks.pay.check.max_records", "sinks.pay.check.timeout"]
        );
        assert_eq!(problems("delay = \"2d\""), ["sinks.pay.check.delay"]);
    }
}

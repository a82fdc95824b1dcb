//! Transactions left open on dedupd's own topics, aborted without waiting for the broker
//! (`transactions`, invariant 8).
//!
//! An instance killed or frozen with a transaction open leaves it open until the
//! transaction coordinator aborts it: once it is older than `transaction.timeout.ms`, at the
//! coordinator's next look for timed-out transactions (every
//! `transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s by default). Until
//! then every `read_committed` reader of a partition it wrote stops at that transaction's
//! first record, the partition's last stable offset: every instance's by-key fetches, and
//! the restore of the dead instance's state partitions by whoever takes them over.
//!
//! A thread of its own looks at every partition of the changelog and by-key topics every
//! few seconds. One whose last stable offset is below its high watermark and has not moved
//! for longer than the group session or the transaction timeout, whichever is shorter, is
//! stalled: past the transaction timeout the coordinator aborts the transaction anyway, and
//! past the session the group has given the writer's partitions away. The thread reads the
//! record at that offset (`read_uncommitted`), the open transaction's first record there,
//! which names its writer; unless that is this instance, it takes over the writer's
//! `transactional.id` with a producer of its own (`init_transactions`). The coordinator then
//! aborts the open transaction (or completes one that was committing) at once and fences
//! the writer: a frozen instance that wakes finds its producer fenced and starts again
//! (`transactions`, invariant 6), as it would after the coordinator's own abort.
//!
//! The offsets are this instance's own observations, not the records' timestamps, so
//! another machine's clock cannot make a transaction look older than it is.

use crate::connection::check::client_error;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::restore::{RestoreContext, reader_config};
use crate::envelope::read_headers;
use crate::ops::Metrics;
use crate::pipeline::control::Tp;
use crate::pipeline::publish::{producer_config_with, transaction_timeout};
use crate::pipeline::transactions::WRITER_HEADER;
use crate::pipeline::{KafkaConfig, PipelineError};

/// How long reading a partition's offsets, or the record at one, may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long taking over a `transactional.id` may take (the coordinator aborts meanwhile).
const FENCE_TIMEOUT: Duration = Duration::from_secs(30);
/// At most this long between warnings about a failing step.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// A partition's last stable offset as last seen below its high watermark.
#[derive(Debug, Clone, Copy)]
struct Seen {
    stable: i64,
    /// Since when it has not moved (or since the last try to unstick it).
    since: Instant,
}

/// Whether `tp`, with last stable offset `stable` and high watermark `high` at `now`, has
/// been stalled for `after`: its stable offset below the watermark and unmoved. A stall
/// found starts the count again, so that one not ended by a try is tried again after
/// `after`, not at every look.
fn stalled(seen: &mut HashMap<Tp, Seen>, tp: &Tp, (stable, high): (i64, i64), now: Instant, after: Duration) -> bool {
    if stable >= high {
        seen.remove(tp);
        return false;
    }
    let entry = seen.entry(tp.clone()).or_insert(Seen { stable, since: now });
    if entry.stable != stable {
        *entry = Seen { stable, since: now };
        return false;
    }
    if now.saturating_duration_since(entry.since) < after {
        return false;
    }
    entry.since = now;
    true
}

/// The writer a record names (the last [`WRITER_HEADER`]), if any.
fn writer_of(m: &impl Message) -> Option<String> {
    let headers = read_headers(m.headers()?).headers;
    let (_, value) = headers.into_iter().rev().find(|(name, _)| name == WRITER_HEADER)?;
    String::from_utf8(value?).ok()
}

/// The stalled-transaction thread: looks at `partitions` until stopped.
pub(crate) struct StalledTransactions {
    kafka: KafkaConfig,
    /// `read_committed`: the end it reports is a partition's last stable offset.
    committed: BaseConsumer<RestoreContext>,
    /// `read_uncommitted`: the high watermark, and the record at the last stable offset.
    uncommitted: BaseConsumer<RestoreContext>,
    partitions: Vec<Tp>,
    /// This instance's `transactional.id`: never fenced here.
    own_id: String,
    after: Duration,
    metrics: Arc<Metrics>,
    seen: HashMap<Tp, Seen>,
    last_warning: Option<Instant>,
}

impl StalledTransactions {
    /// Looks at every partition of `topics` (each with that many partitions), fencing
    /// writers other than `own_id` whose transactions stall one for `min(session,
    /// transaction timeout)`.
    pub(crate) fn new(
        kafka: &KafkaConfig,
        (topics, session): (&[(&str, i32)], Duration),
        own_id: &str,
        metrics: Arc<Metrics>,
    ) -> Result<StalledTransactions, PipelineError> {
        let config = reader_config(kafka, "stalled", &[("fetch.wait.max.ms", "10")])?;
        let committed = config.create_with_context(RestoreContext).map_err(|e| {
            PipelineError::Changelog(format!("creating the stalled-transaction reader: {}", client_error(&config, &e)))
        })?;
        let mut uncommitted_config = config.clone();
        uncommitted_config.set("isolation.level", "read_uncommitted");
        let uncommitted = uncommitted_config.create_with_context(RestoreContext).map_err(|e| {
            let reason = client_error(&uncommitted_config, &e);
            PipelineError::Changelog(format!("creating the stalled-transaction reader: {reason}"))
        })?;
        let partitions = topics.iter().flat_map(|&(t, n)| (0..n).map(move |p| (t.to_string(), p))).collect();
        Ok(StalledTransactions {
            kafka: kafka.clone(),
            committed,
            uncommitted,
            partitions,
            own_id: own_id.to_string(),
            after: stall_after(kafka, session),
            metrics,
            seen: HashMap::new(),
            last_warning: None,
        })
    }

    /// Runs the thread until `stop`.
    pub(crate) fn spawn(mut self, stop: CancellationToken) -> std::io::Result<std::thread::JoinHandle<()>> {
        // A few looks within the stall's length, and no more than one a second.
        let every = (self.after / 4).max(Duration::from_secs(1));
        std::thread::Builder::new().name("dedupd-stalled".into()).spawn(move || {
            while !stop.is_cancelled() {
                self.look(&stop);
                let next = Instant::now() + every;
                while !stop.is_cancelled() && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
    }

    /// One look at every partition, cut short by `stop` (each read may wait for a broker
    /// that does not answer).
    fn look(&mut self, stop: &CancellationToken) {
        for i in 0..self.partitions.len() {
            if stop.is_cancelled() {
                return;
            }
            let (topic, partition) = self.partitions[i].clone();
            let ends = self.ends(&topic, partition);
            let stable = match ends {
                Ok(ends) if stalled(&mut self.seen, &(topic.clone(), partition), ends, Instant::now(), self.after) => {
                    ends.0
                }
                Ok(_) => continue,
                Err(e) => {
                    self.warn(&format!("could not read the offsets of {topic}/{partition}: {e}"));
                    continue;
                }
            };
            self.unstick(&topic, partition, stable);
        }
    }

    /// The partition's last stable offset and high watermark.
    fn ends(&self, topic: &str, partition: i32) -> Result<(i64, i64), KafkaError> {
        // Not `ends::end_offsets`: a partition not known yet is read again at the next look.
        let (_, stable) = self.committed.fetch_watermarks(topic, partition, READ_TIMEOUT)?;
        let (_, high) = self.uncommitted.fetch_watermarks(topic, partition, READ_TIMEOUT)?;
        Ok((stable, high))
    }

    /// Fences the writer of the transaction open at `stable` on `topic`/`partition`.
    fn unstick(&mut self, topic: &str, partition: i32, stable: i64) {
        let writer = match self.writer_at(topic, partition, stable) {
            Ok(Some(writer)) => writer,
            Ok(None) => {
                return self.warn(&format!(
                    "{topic}/{partition} is held at offset {stable} by a transaction open for over {:?} whose \
                     writer is not named (not a dedupd instance, or one older than this): the coordinator aborts \
                     it within its transaction timeout",
                    self.after
                ));
            }
            Err(e) => return self.warn(&format!("could not read the record at {topic}/{partition}@{stable}: {e}")),
        };
        if writer == self.own_id {
            tracing::debug!(topic, partition, stable, "this instance's own transaction is open there");
            return;
        }
        tracing::warn!(topic, partition, stable, writer, after = ?self.after, "a transaction left open holds the partition: fencing its writer");
        let fenced = producer_config_with(&self.kafka, Some(&writer))
            .map_err(|e| e.to_string())
            .and_then(|config| config.create::<BaseProducer>().map_err(|e| e.to_string()))
            .and_then(|producer| producer.init_transactions(FENCE_TIMEOUT).map_err(|e| e.to_string()));
        match fenced {
            Ok(()) => {
                self.metrics.stalled_transaction_aborted();
                tracing::warn!(topic, partition, writer, "its open transaction was aborted and the writer fenced");
            }
            Err(e) => self.warn(&format!("could not fence {writer}, whose transaction holds {topic}/{partition}: {e}")),
        }
    }

    /// The writer named by the record at `offset` (`read_uncommitted`); `None` when it
    /// names none or the first record read is past `offset`.
    fn writer_at(&self, topic: &str, partition: i32, offset: i64) -> Result<Option<String>, String> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset)).map_err(|e| e.to_string())?;
        self.uncommitted.assign(&tpl).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + READ_TIMEOUT;
        let found = loop {
            if Instant::now() > deadline {
                break Err(format!("nothing read within {READ_TIMEOUT:?}"));
            }
            match self.uncommitted.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.topic() == topic && m.partition() == partition => {
                    break Ok((m.offset() == offset).then(|| writer_of(&m)).flatten());
                }
                Some(Ok(_) | Err(KafkaError::PartitionEOF(_))) | None => {}
                Some(Err(e)) => break Err(e.to_string()),
            }
        };
        let _ = self.uncommitted.unassign();
        found
    }

    fn warn(&mut self, message: &str) {
        if self.last_warning.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            self.last_warning = Some(Instant::now());
            tracing::warn!("{message}");
        }
    }
}

/// How long a partition's last stable offset must stay put to be stalled: the group
/// `session` the broker enforces or the transaction timeout, whichever is shorter.
fn stall_after(kafka: &KafkaConfig, session: Duration) -> Duration {
    transaction_timeout(kafka).min(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(6);

    fn tp() -> Tp {
        ("g.dedupd-by-key".to_string(), 3)
    }

    #[test]
    fn a_stable_offset_at_the_high_watermark_is_never_stalled() {
        let (mut seen, t0) = (HashMap::new(), Instant::now());
        assert!(!stalled(&mut seen, &tp(), (40, 40), t0, AFTER));
        assert!(!stalled(&mut seen, &tp(), (40, 40), t0 + AFTER * 3, AFTER));
        assert!(seen.is_empty());
    }

    #[test]
    fn a_stable_offset_unmoved_below_the_high_watermark_stalls_after_the_wait_and_again_after_another() {
        let (mut seen, t0) = (HashMap::new(), Instant::now());
        assert!(!stalled(&mut seen, &tp(), (40, 90), t0, AFTER), "first seen");
        assert!(!stalled(&mut seen, &tp(), (40, 95), t0 + AFTER - Duration::from_millis(1), AFTER));
        assert!(stalled(&mut seen, &tp(), (40, 99), t0 + AFTER, AFTER), "held for the whole wait");
        assert!(!stalled(&mut seen, &tp(), (40, 99), t0 + AFTER + Duration::from_secs(1), AFTER), "not at every look");
        assert!(stalled(&mut seen, &tp(), (40, 99), t0 + AFTER * 2, AFTER), "tried again after another wait");
    }

    #[test]
    fn a_stable_offset_that_moves_starts_the_wait_again() {
        let (mut seen, t0) = (HashMap::new(), Instant::now());
        assert!(!stalled(&mut seen, &tp(), (40, 90), t0, AFTER));
        assert!(!stalled(&mut seen, &tp(), (41, 90), t0 + AFTER, AFTER), "a commit moved it");
        assert!(!stalled(&mut seen, &tp(), (41, 90), t0 + AFTER + AFTER / 2, AFTER));
        assert!(stalled(&mut seen, &tp(), (41, 90), t0 + AFTER * 2, AFTER));
        assert!(!stalled(&mut seen, &tp(), (90, 90), t0 + AFTER * 3, AFTER), "the abort's markers: caught up");
        assert!(!stalled(&mut seen, &tp(), (90, 95), t0 + AFTER * 3, AFTER), "a new transaction is not an old one");
    }

    #[test]
    fn the_writer_is_the_last_header_naming_it() {
        use rdkafka::Timestamp;
        use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
        let headers = OwnedHeaders::new()
            .insert(Header { key: WRITER_HEADER, value: Some("dedupd-input-header") })
            .insert(Header { key: "other", value: Some("x") })
            .insert(Header { key: WRITER_HEADER, value: Some("dedupd-0123456789abcdef") });
        let m = OwnedMessage::new(None, None, "t".into(), Timestamp::NotAvailable, 0, 0, Some(headers));
        assert_eq!(writer_of(&m).as_deref(), Some("dedupd-0123456789abcdef"));
        let bare = OwnedMessage::new(None, None, "t".into(), Timestamp::NotAvailable, 0, 0, None);
        assert_eq!(writer_of(&bare), None);
    }
}

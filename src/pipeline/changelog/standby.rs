//! Standby copies (`store.standby`): every state partition this instance does not hold is
//! tailed from the changelog into its store, as Kafka Streams' standby tasks do, so that
//! taking one over (a failover, a rebalance) restores only what the tail had not applied.
//! A thread of its own polls one `read_committed` consumer assigned by hand (no group
//! membership, nothing committed) and applies what it reads in chunks, each with its
//! checkpoint, exactly as a restore does.
//!
//! Invariants:
//! 1. A chunk of partition *p* is applied only while *p* is neither owned nor being
//!    restored, checked under the restorer's lock ([`Restorer::held`]), which is held
//!    through the write of the records and their checkpoint. A restore marks *p* under that
//!    lock before it reads *p*'s checkpoint, and a let-go writes *p*'s checkpoint under it
//!    before it stops holding *p*: no standby write follows the checkpoint a restore
//!    reads, and a standby starts from the checkpoint the owner left.
//! 2. It writes nothing to Kafka: records applied are not captured (store `changelog`,
//!    invariant 2), and a key that expires in a standby copy is removed without a tombstone
//!    (store `expiries`, invariant 5): the partition's owner writes those.
//! 3. It stops before the clean stop's checkpoints and mark, and whatever it applied
//!    before is covered by its own checkpoints (store `changelog`, invariant 3).

use crate::connection::check::client_error;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::restore::{RestoreContext, Restorer, reader_config};
use crate::ops::Metrics;
use crate::pipeline::transactions::WRITER_KEY_PREFIX;
use crate::pipeline::{KafkaConfig, PipelineError};
use crate::store::Change;
use crate::time::{Clock, SystemClock};

/// Records applied per write.
const CHUNK: usize = 5_000;
/// How long one poll waits; also how often what is held is looked at (a partition taken
/// over is dropped by then, and a chunk of it is never applied: invariant 1).
const POLL: Duration = Duration::from_millis(100);
/// At most this long between warnings about the same failing step.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// One tailed partition: what is read and not yet applied, and where to go on from.
#[derive(Debug, Default)]
struct Tail {
    chunk: Vec<Change>,
    /// The offset after the last record read (or the position past the last markers).
    next: i64,
}

/// The standby thread: tails what `restorer` does not hold until `stop`.
pub(crate) struct Standby {
    restorer: Arc<Restorer>,
    consumer: BaseConsumer<RestoreContext>,
    partitions: i32,
    metrics: Arc<Metrics>,
    tails: BTreeMap<i32, Tail>,
    /// When what is held was last looked at.
    followed_at: Option<Instant>,
    last_warning: Option<Instant>,
}

impl Standby {
    pub(crate) fn new(
        kafka: &KafkaConfig,
        restorer: Arc<Restorer>,
        partitions: i32,
        metrics: Arc<Metrics>,
    ) -> Result<Standby, PipelineError> {
        let config = reader_config(kafka, "standby", &[])?;
        let consumer = config.create_with_context(RestoreContext).map_err(|e| {
            PipelineError::Changelog(format!("creating the standby consumer: {}", client_error(&config, &e)))
        })?;
        Ok(Standby {
            restorer,
            consumer,
            partitions,
            metrics,
            tails: BTreeMap::new(),
            followed_at: None,
            last_warning: None,
        })
    }

    /// Runs on a thread of its own until `stop`.
    pub(crate) fn spawn(self, stop: CancellationToken) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("dedupd-standby".into()).spawn(move || self.run(&stop))
    }

    fn run(mut self, stop: &CancellationToken) {
        tracing::info!("standby copies: tailing the state partitions this instance does not own");
        while !stop.is_cancelled() {
            if self.followed_at.is_none_or(|at| at.elapsed() >= POLL) {
                self.followed_at = Some(Instant::now());
                self.follow_what_is_not_held();
            }
            match self.consumer.poll(POLL) {
                Some(Ok(m)) => {
                    let p = m.partition();
                    let Some(tail) = self.tails.get_mut(&p) else { continue };
                    let Ok(key) = std::str::from_utf8(m.key().unwrap_or_default()) else {
                        self.warn(&format!(
                            "partition {p}: the record at offset {} has a key that is not UTF-8",
                            m.offset()
                        ));
                        continue;
                    };
                    // A record that only names its writer holds no key (transactions, invariant 8).
                    if !key.starts_with(WRITER_KEY_PREFIX) {
                        tail.chunk.push(Change { key: key.to_string(), value: m.payload().map(<[u8]>::to_vec) });
                    }
                    tail.next = m.offset() + 1;
                    if tail.chunk.len() >= CHUNK {
                        self.apply(p);
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    // Past the transaction markers too, so that a restore from here skips them.
                    let position = self.position(p);
                    if let Some(tail) = self.tails.get_mut(&p) {
                        tail.next = position.unwrap_or(tail.next).max(tail.next);
                    }
                    self.apply(p);
                }
                Some(Err(e)) => self.warn(&e.to_string()),
                None => {
                    let pending: Vec<i32> =
                        self.tails.iter().filter(|(_, t)| !t.chunk.is_empty()).map(|(p, _)| *p).collect();
                    for p in pending {
                        self.apply(p);
                    }
                }
            }
        }
        tracing::info!("standby copies stopped");
    }

    /// Tails exactly the partitions not held, each new one from its checkpoint (invariant 1).
    fn follow_what_is_not_held(&mut self) {
        let wanted: Vec<i32> = {
            let held = self.restorer.held();
            (0..self.partitions).filter(|p| !held.holds(*p)).collect()
        };
        if wanted.iter().eq(self.tails.keys()) {
            return;
        }
        let dropped: Vec<i32> = self.tails.keys().copied().filter(|p| !wanted.contains(p)).collect();
        for p in dropped {
            // Its owner's now: what was read of it is not applied.
            self.tails.remove(&p);
        }
        for &p in &wanted {
            if !self.tails.contains_key(&p) {
                match self.restorer.store().checkpoint(self.restorer.topic(), p) {
                    Ok(from) => {
                        self.tails.insert(p, Tail { chunk: Vec::new(), next: from.unwrap_or(-1) });
                    }
                    Err(e) => self.warn(&format!("partition {p}: reading its checkpoint: {e}")),
                }
            }
        }
        if let Err(e) = self.assign() {
            self.warn(&format!("assigning the tailed partitions: {e}"));
        }
        self.metrics.set_standby_partitions(self.tails.len());
    }

    /// Assigns every tailed partition from where its tail goes on (the start of the
    /// partition when it has no checkpoint).
    fn assign(&self) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::with_capacity(self.tails.len());
        for (p, tail) in &self.tails {
            let from = if tail.next < 0 { Offset::Beginning } else { Offset::Offset(tail.next) };
            tpl.add_partition_offset(self.restorer.topic(), *p, from)?;
        }
        self.consumer.assign(&tpl)
    }

    fn position(&self, p: i32) -> Option<i64> {
        let positions = self.consumer.position().ok()?;
        positions.find_partition(self.restorer.topic(), p).and_then(|e| e.offset().to_raw())
    }

    /// Applies what was read of `p`, with its checkpoint, if `p` is still not held
    /// (invariant 1); otherwise drops it.
    fn apply(&mut self, p: i32) {
        let Some(tail) = self.tails.get_mut(&p) else { return };
        if tail.next < 0 {
            return;
        }
        let chunk = std::mem::take(&mut tail.chunk);
        let n = chunk.len() as u64;
        let next = tail.next;
        let held = self.restorer.held();
        if held.holds(p) {
            return;
        }
        let store = self.restorer.store();
        // Expired keys are the owner's to tombstone (invariant 2): the set is not used.
        let mut expired = std::collections::HashSet::new();
        let applied = store.restore_batch((self.restorer.topic(), p), chunk, next, SystemClock.now_ms(), &mut expired);
        drop(held);
        match applied {
            Ok(_) => self.metrics.standby_records(n),
            Err(e) => {
                // The checkpoint did not move: the records are read again from it.
                self.tails.remove(&p);
                self.warn(&format!("partition {p}: applying {n} records: {e}"));
            }
        }
    }

    fn warn(&mut self, what: &str) {
        if self.last_warning.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            self.last_warning = Some(Instant::now());
            tracing::warn!(error = what, "standby copies (the owners are not affected; a takeover restores more)");
        }
    }
}

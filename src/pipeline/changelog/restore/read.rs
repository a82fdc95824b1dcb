//! Reading a restore's partitions from their checkpoints to their ends, and applying
//! what is read in chunks, each with its checkpoint.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::super::ends::end_offsets;
use super::{RestoreContext, Restorer, WATERMARKS_TIMEOUT};
use crate::pipeline::transactions::WRITER_KEY_PREFIX;
use crate::store::Change;
use crate::time::{Clock, SystemClock};

/// Records applied to the store per write.
const RESTORE_CHUNK: usize = 10_000;

/// One partition's restore as it goes.
pub(super) struct Restoring {
    /// The end offset at assignment (for the progress shown).
    high: i64,
    /// The next offset to apply from.
    next: i64,
    chunk: Vec<Change>,
    pub(super) applied: u64,
    done: bool,
    /// Keys whose last record read is an expired completion (`store::expiries`, invariant 7).
    pub(super) expired: HashSet<String>,
}

impl Restoring {
    /// A partition to read from `from` to `high` (nothing to read when `from >= high`).
    fn starting(from: i64, high: i64) -> Restoring {
        Restoring { high, next: from, chunk: Vec::new(), applied: 0, done: from >= high, expired: HashSet::new() }
    }
}

impl Restorer {
    /// Reads each of `partitions` from its checkpoint to its high watermark at assignment
    /// (see `read_to_end`) and applies it in chunks, each with its checkpoint. Returns each
    /// partition's restore.
    pub(super) fn restore_all(&self, id: u64, partitions: &[i32]) -> Result<BTreeMap<i32, Restoring>, String> {
        let consumer = self.consumer.lock();
        crate::crash::point("restore.started");
        let mut reading = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            let (low, high) =
                end_offsets(&self.end_reader.lock(), &self.topic, p, WATERMARKS_TIMEOUT).map_err(|e| e.to_string())?;
            let from = self.store.checkpoint(&self.topic, p).map_err(|e| e.to_string())?.unwrap_or(low).max(low);
            reading.insert(p, Restoring::starting(from, high));
            if from < high {
                tpl.add_partition_offset(&self.topic, p, Offset::Offset(from)).map_err(|e| e.to_string())?;
            }
        }
        if tpl.count() > 0 {
            consumer.assign(&tpl).map_err(|e| e.to_string())?;
            let read = self.read_to_end(id, &consumer, &mut reading);
            let _ = consumer.unassign();
            read?;
        }
        Ok(reading)
    }
    /// Polls until every partition of `reading` has its last stable offset at or past the
    /// high watermark seen at assignment, or was given up (`abandon`). No time bound: the
    /// group consumer polls on meanwhile, and the progress shows in `/readyz`.
    fn read_to_end(
        &self,
        id: u64,
        consumer: &BaseConsumer<RestoreContext>,
        reading: &mut BTreeMap<i32, Restoring>,
    ) -> Result<(), String> {
        let started = Instant::now();
        while reading.values().any(|r| !r.done) {
            match consumer.poll(Duration::from_millis(200)) {
                None => {
                    for (&p, r) in reading.iter_mut().filter(|(_, r)| !r.done) {
                        self.apply(id, p, r, r.next)?;
                    }
                }
                Some(Ok(m)) => {
                    let Some(r) = reading.get_mut(&m.partition()).filter(|r| !r.done) else { continue };
                    let key = std::str::from_utf8(m.key().unwrap_or_default())
                        .map_err(|_| format!("the record at offset {} has a key that is not UTF-8", m.offset()))?;
                    // A record that only names its writer holds no key (transactions, invariant 8).
                    if !key.starts_with(WRITER_KEY_PREFIX) {
                        r.chunk.push(Change { key: key.to_string(), value: m.payload().map(<[u8]>::to_vec) });
                    }
                    r.next = m.offset() + 1;
                    if r.chunk.len() >= RESTORE_CHUNK {
                        self.apply(id, m.partition(), r, r.next)?;
                        self.show_progress(m.partition(), r, started.elapsed());
                    }
                }
                // At the last stable offset: every committed record up to it is read.
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    let Some(r) = reading.get_mut(&p).filter(|r| !r.done) else { continue };
                    // Past the transaction markers too, so that the next restore starts after them.
                    let position = consumer
                        .position()
                        .ok()
                        .and_then(|tpl| tpl.find_partition(&self.topic, p).and_then(|e| e.offset().to_raw()))
                        .unwrap_or(r.next);
                    self.apply(id, p, r, position.max(r.next))?;
                    // Done only once the stable offset has reached the high watermark seen at
                    // assignment: short of it, a transaction is still open there. It is the
                    // previous owner's last one, committed but with its markers not yet
                    // written (the claims in it may have run their sinks: stopping at the
                    // stable offset lost them, and a repeat ran its sink again, found by
                    // tests/kafka/kafka_chaos.rs), or a dead instance's, which the broker aborts
                    // within its `transaction.timeout.ms`. Nobody writes the partition
                    // meanwhile, and reading on is what tells which.
                    r.done |= position >= r.high;
                }
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
        Ok(())
    }

    /// Applies what `r`, partition `p` of restore `id`, has read, up to `next`, with its
    /// checkpoint; under the lock a let-go takes, and only while the restore is still `p`'s
    /// (else `r` is given up, its chunk dropped: `abandon`).
    fn apply(&self, id: u64, p: i32, r: &mut Restoring, next: i64) -> Result<(), String> {
        let held = self.held.lock();
        if held.restoring.get(&p) != Some(&id) {
            r.done = true;
            r.chunk.clear();
            return Ok(());
        }
        if r.chunk.is_empty() && next == r.next {
            return Ok(());
        }
        let (chunk, now) = (std::mem::take(&mut r.chunk), SystemClock.now_ms());
        let n =
            self.store.restore_batch((&self.topic, p), chunk, next, now, &mut r.expired).map_err(|e| e.to_string())?;
        drop(held);
        self.metrics.restored_records(n as u64);
        r.applied += n as u64;
        if n > 0 {
            crate::crash::point("restore.applied");
        }
        Ok(())
    }

    /// Shows how far partition `p`'s restore is, `elapsed` after it began: offsets, rate
    /// and the time left at that rate.
    fn show_progress(&self, p: i32, r: &Restoring, elapsed: Duration) {
        let rate = r.applied as f64 / elapsed.as_secs_f64().max(0.001);
        let left = (r.high - r.next).max(0) as f64 / rate.max(1.0);
        let progress = format!(
            "{}: at offset {} of {}, {} records applied, {rate:.0} records/s, about {left:.0} s left",
            crate::ops::RESTORING,
            r.next,
            r.high,
            r.applied
        );
        self.health.set_down(&self.name(p), Some(&progress));
    }
}

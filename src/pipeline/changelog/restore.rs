//! Restore before work: on assignment, each state partition's records are read from the
//! changelog (`read_committed`, so an aborted transaction is never restored) from the
//! store's checkpoint to the end, and applied to the store, before any record of the
//! partition is processed. The consumer thread does it inside the rebalance callback, so
//! no worker of the partition starts meanwhile; `/readyz` is 503 and
//! `dedupd_state_restoring{partition}` is 1 until it is done.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::ops::{Health, Metrics};
use crate::pipeline::{KafkaConfig, PipelineError};
use crate::store::{Change, KeyStore};
use crate::time::{Clock, SystemClock};

/// Records applied to the store per write.
const RESTORE_CHUNK: usize = 10_000;
/// How long one partition's restore may take before it fails (and the process stops).
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long reading a partition's end offsets may take.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(30);

/// Restores state partitions from the changelog and checkpoints them when let go.
pub(crate) struct Restorer {
    store: Arc<KeyStore>,
    topic: String,
    consumer: Mutex<BaseConsumer>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// The state partitions restored and not let go since.
    owned: Mutex<BTreeSet<i32>>,
}

impl Restorer {
    pub(crate) fn new(
        kafka: &KafkaConfig,
        topic: &super::ChangelogTopic,
        store: Arc<KeyStore>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Result<Restorer, PipelineError> {
        let group = format!("{}.dedupd-restore", kafka.group_id);
        let defaults = [
            ("group.id", group.as_str()),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
            ("enable.partition.eof", "true"),
            ("auto.offset.reset", "earliest"),
        ];
        let config = kafka.client_config(&defaults, &Default::default())?;
        let consumer = crate::connection::probe::create(&config, "changelog restore consumer")?;
        Ok(Restorer {
            store,
            topic: topic.name.clone(),
            consumer: Mutex::new(consumer),
            metrics,
            health,
            owned: Mutex::new(BTreeSet::new()),
        })
    }

    /// Restores each of `partitions` not restored since it was last let go. Blocking.
    pub(crate) fn restore(&self, partitions: &[i32]) -> Result<(), String> {
        for &p in partitions {
            if self.owned.lock().contains(&p) {
                continue;
            }
            let name = format!("{}/{p}", self.topic);
            self.metrics.set_restoring(p, true);
            self.health.set_down(&name, Some("restoring its state from the changelog"));
            let started = Instant::now();
            let restored = self.restore_one(p);
            self.metrics.set_restoring(p, false);
            self.health.set_down(&name, None);
            let records = restored.map_err(|e| format!("restoring {name}: {e}"))?;
            tracing::info!(partition = %name, records, ms = started.elapsed().as_millis() as u64, "state partition restored");
            self.owned.lock().insert(p);
        }
        Ok(())
    }

    /// Reads partition `p` from the checkpoint to the end (the last stable offset) and
    /// applies it in chunks, each with its checkpoint. Returns the records applied.
    fn restore_one(&self, p: i32) -> Result<u64, String> {
        let consumer = self.consumer.lock();
        let (low, high) = consumer.fetch_watermarks(&self.topic, p, WATERMARKS_TIMEOUT).map_err(|e| e.to_string())?;
        let from = self.store.checkpoint(&self.topic, p).map_err(|e| e.to_string())?.unwrap_or(low).max(low);
        if from >= high {
            return Ok(0);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, p, Offset::Offset(from)).map_err(|e| e.to_string())?;
        consumer.assign(&tpl).map_err(|e| e.to_string())?;
        let read = self.read_to_end(&consumer, p, from);
        let _ = consumer.unassign();
        read
    }

    fn read_to_end(&self, consumer: &BaseConsumer, p: i32, from: i64) -> Result<u64, String> {
        let deadline = Instant::now() + RESTORE_TIMEOUT;
        let mut chunk: Vec<Change> = Vec::with_capacity(RESTORE_CHUNK);
        let mut next = from;
        let mut applied = 0u64;
        loop {
            if Instant::now() > deadline {
                return Err(format!("not at the end within {RESTORE_TIMEOUT:?} (at offset {next})"));
            }
            match consumer.poll(Duration::from_millis(200)) {
                None => continue,
                Some(Ok(m)) => {
                    let key = std::str::from_utf8(m.key().unwrap_or_default())
                        .map_err(|_| format!("the record at offset {} has a key that is not UTF-8", m.offset()))?;
                    chunk.push(Change { key: key.to_string(), value: m.payload().map(<[u8]>::to_vec) });
                    next = m.offset() + 1;
                    if chunk.len() >= RESTORE_CHUNK {
                        applied += self.apply(p, std::mem::take(&mut chunk), next)?;
                    }
                }
                // At the last stable offset: every committed record up to it is read.
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
        // Past the transaction markers too, so that the next restore starts after them.
        let position = consumer
            .position()
            .ok()
            .and_then(|tpl| tpl.find_partition(&self.topic, p).and_then(|e| e.offset().to_raw()))
            .unwrap_or(next);
        applied += self.apply(p, chunk, position.max(next))?;
        Ok(applied)
    }

    fn apply(&self, p: i32, chunk: Vec<Change>, next: i64) -> Result<u64, String> {
        let now = SystemClock.now_ms();
        let n = self.store.restore_batch(&self.topic, p, chunk, next, now).map_err(|e| e.to_string())?;
        self.metrics.restored_records(n as u64);
        Ok(n as u64)
    }

    /// Lets `partitions` go once every change of theirs is committed: their checkpoint
    /// becomes the changelog's end, which this store has applied (its own writes). Blocking.
    pub(crate) fn let_go(&self, partitions: &[i32]) -> Vec<(String, i32, i64)> {
        let mut checkpoints = Vec::with_capacity(partitions.len());
        for &p in partitions {
            if !self.owned.lock().remove(&p) {
                continue;
            }
            match self.consumer.lock().fetch_watermarks(&self.topic, p, WATERMARKS_TIMEOUT) {
                Ok((_, high)) => checkpoints.push((self.topic.clone(), p, high)),
                // Without one the next restore reads from the older checkpoint: slower, as right.
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "could not read the changelog's end; keeping the older checkpoint")
                }
            }
        }
        checkpoints
    }

    /// Every state partition restored and not let go.
    pub(crate) fn owned(&self) -> Vec<i32> {
        self.owned.lock().iter().copied().collect()
    }
}

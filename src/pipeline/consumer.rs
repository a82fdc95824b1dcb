//! The consumer: a `BaseConsumer` polled on a thread of its own, so that rebalance
//! callbacks (which run inside `poll`) may block until the revoked partitions' workers
//! have drained, published and stored their offsets, then commit, before letting go.
//!
//! Offsets: `enable.auto.offset.store=false`; a worker stores an offset only after the
//! results up to it are acknowledged, and auto-commit (plus a synchronous commit on revoke
//! and shutdown) commits only stored offsets.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::worker::{PartitionWorker, WorkerShared};
use crate::config::KafkaConfig;
use crate::ops::{Health, Metrics};
use crate::store::KeyStore;

/// How long a revoke or shutdown waits for a partition's in-flight batch.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

type Tp = (String, i32);

struct WorkerHandle {
    tx: mpsc::Sender<OwnedMessage>,
    cancel: CancellationToken,
    join: JoinHandle<()>,
}

/// State the rebalance callbacks need.
pub struct PipelineContext {
    workers: Mutex<HashMap<Tp, WorkerHandle>>,
    /// Records polled for a partition whose worker queue was full, in offset order. The
    /// partition is paused while it has any, so the poll thread never blocks on one
    /// partition (which would starve every other partition and stop serving callbacks).
    held: Mutex<HashMap<Tp, VecDeque<OwnedMessage>>>,
    assigned: Mutex<HashSet<Tp>>,
    refused: Mutex<HashSet<Tp>>,
    /// Partitions paused because their in-flight batch waits for a sink whose circuit is
    /// open (see `circuits`). A partition is resumed only when it is in none of `held`,
    /// `refused` and this; decisions are taken under the `held` lock.
    circuit_paused: Mutex<HashSet<Tp>>,
    runtime: tokio::runtime::Handle,
    store: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    accept_empty_store: bool,
}

impl ClientContext for PipelineContext {
    /// librdkafka's statistics (every `statistics.interval.ms`): the lag of each assigned
    /// partition, as librdkafka computes it (high watermark − committed/stored position).
    fn stats(&self, statistics: rdkafka::Statistics) {
        let assigned = self.assigned.lock().clone();
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                let tp = (topic.clone(), *partition);
                // -1 = not known yet (no fetch or no committed offset): skip, not zero.
                if assigned.contains(&tp) && p.consumer_lag >= 0 {
                    self.metrics.lag(topic, *partition, p.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for PipelineContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        // Every rebalance ends in an assignment (possibly empty) for every member, while a
        // revoke comes only before some of them: counting assignments counts rebalances
        // once each, not twice when partitions move.
        if let Rebalance::Assign(_) = rebalance {
            self.metrics.rebalance();
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let revoked: Vec<Tp> = tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
            tracing::info!(partitions = ?revoked, "partitions revoked: draining");
            {
                let mut held = self.held.lock();
                let mut circuit_paused = self.circuit_paused.lock();
                for tp in &revoked {
                    held.remove(tp);
                    circuit_paused.remove(tp);
                }
            }
            self.stop_workers(&revoked);
            for (topic, partition) in &revoked {
                self.metrics.forget_lag(topic, *partition);
            }
            // Commit what the drained workers stored before the partitions move on.
            if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
                tracing::debug!(error = %e, "commit on revoke (nothing stored is fine)");
            }
            let mut assigned = self.assigned.lock();
            for tp in &revoked {
                assigned.remove(tp);
                self.refused.lock().remove(tp);
                self.health.set_refused(&format!("{}/{}", tp.0, tp.1), false);
            }
            self.metrics.set_refused_partitions(self.refused.lock().len());
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let parts: Vec<Tp> = tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
            tracing::info!(partitions = ?parts, "partitions assigned");
            self.assigned.lock().extend(parts.iter().cloned());
            // Nothing is held for a newly assigned partition: undo any backpressure pause
            // from before a revoke (the watermark check pauses refused ones again).
            if let Err(e) = consumer.resume(tpl) {
                tracing::warn!(error = %e, "could not resume assigned partitions");
            }
            self.check_watermarks(consumer, tpl);
            self.health.set_joined(true);
        }
    }
}

impl PipelineContext {
    /// Refuses partitions whose committed offset is beyond what the store recorded: the
    /// store was lost or replaced, and going on would re-run or skip history (docs/contract.md §3).
    fn check_watermarks(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let committed = match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "could not read committed offsets for the watermark check");
                return;
            }
        };
        for e in committed.elements() {
            let Offset::Offset(next) = e.offset() else { continue };
            let watermark = match self.store.watermark(e.topic(), e.partition()) {
                Ok(w) => w,
                Err(err) => {
                    tracing::error!(error = %err, "store failed reading a watermark");
                    None
                }
            };
            let expected_next = watermark.map_or(0, |w| w + 1);
            if next > expected_next {
                let name = format!("{}/{}", e.topic(), e.partition());
                if self.accept_empty_store {
                    tracing::warn!(partition = %name, committed = next, watermark = ?watermark,
                        "committed offset is beyond the store's watermark; accepted (--accept-empty-store)");
                    continue;
                }
                tracing::error!(partition = %name, committed = next, watermark = ?watermark,
                    "REFUSING partition: its committed offset is beyond the store's watermark, so the store was lost or replaced; restore the store or restart with --accept-empty-store");
                let mut one = TopicPartitionList::new();
                one.add_partition(e.topic(), e.partition());
                if let Err(err) = consumer.pause(&one) {
                    tracing::error!(error = %err, partition = %name, "could not pause refused partition");
                }
                self.refused.lock().insert((e.topic().to_string(), e.partition()));
                self.health.set_refused(&name, true);
            }
        }
        self.metrics.set_refused_partitions(self.refused.lock().len());
    }

    /// Cancels the workers of `parts` (no new sink calls), waits for their current batch
    /// to finish publishing, and forgets them.
    fn stop_workers(&self, parts: &[Tp]) {
        let handles: Vec<(Tp, WorkerHandle)> = {
            let mut workers = self.workers.lock();
            parts.iter().filter_map(|tp| workers.remove(tp).map(|h| (tp.clone(), h))).collect()
        };
        for (tp, h) in handles {
            h.cancel.cancel();
            drop(h.tx);
            let joined = self.runtime.block_on(async { tokio::time::timeout(DRAIN_TIMEOUT, h.join).await });
            if joined.is_err() {
                tracing::error!(topic = %tp.0, partition = tp.1, "worker did not drain in time; its uncommitted records will be redelivered");
            }
        }
    }

    /// Hands `msg` to its worker without blocking: behind already held records of its
    /// partition, else into the queue, else (queue full) held, and the partition paused.
    fn dispatch(&self, consumer: &BaseConsumer<Self>, tp: Tp, tx: &mpsc::Sender<OwnedMessage>, msg: OwnedMessage) {
        let mut held = self.held.lock();
        if let Some(q) = held.get_mut(&tp) {
            q.push_back(msg);
            return;
        }
        match tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(m)) => {
                let mut one = TopicPartitionList::new();
                one.add_partition(&tp.0, tp.1);
                if let Err(e) = consumer.pause(&one) {
                    tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not pause a partition for backpressure");
                }
                held.insert(tp, VecDeque::from([m]));
            }
            // Worker gone (fatal): the record is not stored, it comes again.
            Err(TrySendError::Closed(_)) => {}
        }
    }

    /// Moves held records into queues with room; resumes partitions that have none left.
    /// Returns whether any records are still held.
    fn release_held(&self, consumer: &BaseConsumer<Self>) -> bool {
        let mut held = self.held.lock();
        if held.is_empty() {
            return false;
        }
        let mut resume = TopicPartitionList::new();
        held.retain(|tp, q| {
            let tx = match self.workers.lock().get(tp) {
                Some(h) => h.tx.clone(),
                None => return false, // revoked or stopped: dropped, they come again
            };
            while let Some(m) = q.pop_front() {
                match tx.try_send(m) {
                    Ok(()) => {}
                    Err(TrySendError::Full(m)) => {
                        q.push_front(m);
                        return true;
                    }
                    Err(TrySendError::Closed(_)) => return false,
                }
            }
            if !self.refused.lock().contains(tp) && !self.circuit_paused.lock().contains(tp) {
                resume.add_partition(&tp.0, tp.1);
            }
            false
        });
        if resume.count() > 0
            && let Err(e) = consumer.resume(&resume)
        {
            tracing::warn!(error = %e, "could not resume partitions after backpressure");
        }
        !held.is_empty()
    }

    /// Pauses `tp` because its batch waits for the open circuits of `sinks`.
    pub(super) fn pause_for_circuit(&self, consumer: &BaseConsumer<Self>, tp: &Tp, sinks: &[&str]) {
        let _held = self.held.lock();
        if !self.assigned.lock().contains(tp) || !self.circuit_paused.lock().insert(tp.clone()) {
            return;
        }
        let mut one = TopicPartitionList::new();
        one.add_partition(&tp.0, tp.1);
        match consumer.pause(&one) {
            Ok(()) => {
                tracing::info!(topic = %tp.0, partition = tp.1, sinks = ?sinks, "partition paused: its batch waits for a sink whose circuit is open")
            }
            Err(e) => {
                tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not pause a partition for an open circuit")
            }
        }
    }

    /// Undoes [`PipelineContext::pause_for_circuit`]; the partition stays paused while it has
    /// held records (`release_held` resumes it) or is refused.
    pub(super) fn resume_after_circuit(&self, consumer: &BaseConsumer<Self>, tp: &Tp) {
        let held = self.held.lock();
        if !self.circuit_paused.lock().remove(tp) {
            return;
        }
        let refused = self.refused.lock().contains(tp);
        let assigned = self.assigned.lock().contains(tp);
        if held.contains_key(tp) || refused || !assigned {
            return;
        }
        let mut one = TopicPartitionList::new();
        one.add_partition(&tp.0, tp.1);
        match consumer.resume(&one) {
            Ok(()) => {
                tracing::info!(topic = %tp.0, partition = tp.1, "partition resumed: its sinks' circuits are closed or its batch ended")
            }
            Err(e) => {
                tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not resume a partition after an open circuit")
            }
        }
    }

    fn all_workers(&self) -> Vec<Tp> {
        self.workers.lock().keys().cloned().collect()
    }
}

/// The consumer settings dedupd chooses; `kafka.consumer.*` overrides them.
pub fn consumer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &kafka.bootstrap_servers)
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // librdkafka's default of 1000 ms stalls a consumer draining a backlog for a second
        // each time its prefetch queue fills; 10 ms drained 5x faster on our machines.
        .set("fetch.queue.backoff.ms", "10")
        // Statistics feed `dedupd_consumer_lag`; every 5 s is cheap and fresh enough.
        .set("statistics.interval.ms", "5000");
    for (k, v) in &kafka.consumer {
        c.set(k, v);
    }
    c
}

/// Everything the consumer thread needs.
pub(crate) struct ConsumerParts {
    pub kafka: KafkaConfig,
    pub shared: Arc<WorkerShared>,
    pub health: Arc<Health>,
    pub accept_empty_store: bool,
    pub stop: CancellationToken,
    pub queue_per_partition: usize,
}

/// Creates the consumer and runs it on a thread until `stop`; returns the thread's handle.
pub(crate) fn spawn(parts: ConsumerParts) -> Result<std::thread::JoinHandle<()>, rdkafka::error::KafkaError> {
    let ctx = PipelineContext {
        workers: Mutex::new(HashMap::new()),
        held: Mutex::new(HashMap::new()),
        assigned: Mutex::new(HashSet::new()),
        refused: Mutex::new(HashSet::new()),
        circuit_paused: Mutex::new(HashSet::new()),
        runtime: tokio::runtime::Handle::current(),
        store: Arc::clone(parts.shared.engine.store()),
        metrics: Arc::clone(&parts.shared.metrics),
        health: Arc::clone(&parts.health),
        accept_empty_store: parts.accept_empty_store,
    };
    let consumer: BaseConsumer<PipelineContext> = consumer_config(&parts.kafka).create_with_context(ctx)?;
    let topics: Vec<&str> = parts.kafka.input_topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let consumer = Arc::new(consumer);
    std::thread::Builder::new()
        .name("dedupd-consumer".into())
        .spawn(move || poll_loop(consumer, parts))
        .map_err(|e| rdkafka::error::KafkaError::Subscription(e.to_string()))
}

fn poll_loop(consumer: Arc<BaseConsumer<PipelineContext>>, parts: ConsumerParts) {
    let ctx = consumer.context();
    while !parts.stop.is_cancelled() {
        // Held records go on as soon as their queue has room; poll briefly meanwhile.
        let holding = ctx.release_held(&consumer);
        let msg = match consumer.poll(Duration::from_millis(if holding { 10 } else { 100 })) {
            None => continue,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "consumer error");
                continue;
            }
            Some(Ok(m)) => m.detach(),
        };
        let tp = (msg.topic().to_string(), msg.partition());
        if !ctx.assigned.lock().contains(&tp) || ctx.refused.lock().contains(&tp) {
            // Prefetched before a revoke or pause: not ours to process; nothing is stored,
            // so it comes again to whoever owns the partition.
            tracing::debug!(topic = %tp.0, partition = tp.1, offset = msg.offset(), "dropping a record of a partition not ours");
            continue;
        }
        let tx = {
            let mut workers = ctx.workers.lock();
            let handle = workers.entry(tp.clone()).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(parts.queue_per_partition);
                let cancel = CancellationToken::new();
                let worker = PartitionWorker {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    rx,
                    cancel: cancel.clone(),
                    shared: Arc::clone(&parts.shared),
                    consumer: Arc::clone(&consumer),
                };
                let join = ctx.runtime.spawn(worker.run());
                WorkerHandle { tx, cancel, join }
            });
            handle.tx.clone()
        };
        // Backpressure without blocking the poll thread (see `held`).
        ctx.dispatch(&consumer, tp, &tx, msg);
    }
    // Shutdown: stop taking records, drain every worker, commit, then leave the group.
    let all = ctx.all_workers();
    ctx.stop_workers(&all);
    if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        tracing::debug!(error = %e, "final commit (nothing stored is fine)");
    }
    consumer.unsubscribe();
    tracing::info!("consumer stopped");
}

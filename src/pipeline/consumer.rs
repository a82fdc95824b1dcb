//! The consumer: a `BaseConsumer` polled on a thread of its own, so that rebalance
//! callbacks (which run inside `poll`) may block until the revoked partitions' workers
//! have drained, published and stored their offsets, then commit, before letting go.
//!
//! Offsets: `enable.auto.offset.store=false`; a worker stores an offset only after the
//! results up to it are acknowledged, and auto-commit (plus a synchronous commit on revoke
//! and shutdown) commits only stored offsets.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::control::{PartitionControl, Tp};
use super::partitions::{Dispatched, Fetching, PartitionTable, WorkerHandle};
use super::worker::{PartitionWorker, WorkerShared};
use super::{KafkaConfig, PipelineError};
use crate::connection::ConnectionError;
use crate::connection::probe::ConnectError;
use crate::ops::{Health, Metrics};
use crate::store::KeyStore;

/// How long a revoke or shutdown waits for a partition's in-flight batch.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// State the rebalance callbacks need.
pub struct PipelineContext {
    /// Every partition's state and worker, and the rule for whether it is fetched.
    partitions: PartitionTable,
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
        let assigned = self.partitions.assigned();
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
            self.revoke(consumer, &partitions_of(tpl));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let parts = partitions_of(tpl);
            tracing::info!(partitions = ?parts, "partitions assigned");
            // Nothing is held for a newly assigned partition: this undoes any backpressure
            // pause from before a revoke (the watermark check pauses refused ones again).
            self.partitions.assign(consumer, &parts);
            self.check_watermarks(consumer, tpl);
            self.health.set_joined(true);
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()
}

/// The consumer switches fetching for the partition table.
impl Fetching for BaseConsumer<PipelineContext> {
    type Error = KafkaError;

    fn pause(&self, tps: &[Tp]) -> Result<(), KafkaError> {
        Consumer::pause(self, &list_of(tps))
    }

    fn resume(&self, tps: &[Tp]) -> Result<(), KafkaError> {
        Consumer::resume(self, &list_of(tps))
    }
}

fn list_of(tps: &[Tp]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (topic, partition) in tps {
        list.add_partition(topic, *partition);
    }
    list
}

/// What workers and circuits may ask of the consumer.
impl PartitionControl for BaseConsumer<PipelineContext> {
    fn pause_for_circuit(&self, tp: &Tp, open_sinks: &[&str]) {
        self.context().partitions.pause_for_circuit(self, tp, open_sinks);
    }

    fn resume_after_circuit(&self, tp: &Tp) {
        self.context().partitions.resume_after_circuit(self, tp);
    }

    fn store_offset(&self, topic: &str, partition: i32, offset: i64) -> Result<(), KafkaError> {
        Consumer::store_offset(self, topic, partition, offset)
    }
}

impl PipelineContext {
    /// Lets `revoked` go: drops what they hold, drains their workers (results published,
    /// offsets stored), commits, and only then forgets them.
    fn revoke(&self, consumer: &BaseConsumer<Self>, revoked: &[Tp]) {
        tracing::info!(partitions = ?revoked, "partitions revoked: draining");
        self.partitions.drop_held_and_pauses(revoked);
        self.stop_workers(self.partitions.take_workers(revoked));
        for (topic, partition) in revoked {
            self.metrics.forget_lag(topic, *partition);
        }
        // Commit what the drained workers stored before the partitions move on.
        if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
            tracing::debug!(error = %e, "commit on revoke (nothing stored is fine)");
        }
        let still_refused = self.partitions.forget(revoked);
        for tp in revoked {
            self.health.set_refused(&format!("{}/{}", tp.0, tp.1), false);
        }
        self.metrics.set_refused_partitions(still_refused);
    }

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
                self.partitions.refuse(consumer, &(e.topic().to_string(), e.partition()));
                self.health.set_refused(&name, true);
            }
        }
        self.metrics.set_refused_partitions(self.partitions.refused_count());
    }

    /// Cancels `workers` (no new sink calls), waits for each one's current batch to finish
    /// publishing, and drops them. Called outside the table's lock: a draining worker may
    /// still ask for a circuit pause.
    fn stop_workers(&self, workers: Vec<(Tp, WorkerHandle)>) {
        for (tp, h) in workers {
            h.cancel.cancel();
            drop(h.tx);
            let joined = self.runtime.block_on(async { tokio::time::timeout(DRAIN_TIMEOUT, h.join).await });
            if joined.is_err() {
                tracing::error!(topic = %tp.0, partition = tp.1, "worker did not drain in time; its uncommitted records will be redelivered");
            }
        }
    }
}

/// The consumer settings dedupd chooses; `[kafka.connection]` and then `kafka.consumer.*`
/// override them (see [`KafkaConfig::client_config`]).
pub fn consumer_config(kafka: &KafkaConfig) -> Result<ClientConfig, ConnectionError> {
    let mut c = kafka.client_config(
        &[
            ("enable.auto.commit", "true"),
            ("auto.commit.interval.ms", "1000"),
            ("auto.offset.reset", "earliest"),
            // librdkafka's default of 1000 ms stalls a consumer draining a backlog for a
            // second each time its prefetch queue fills; 10 ms drained 5x faster here.
            ("fetch.queue.backoff.ms", "10"),
            // Statistics feed `dedupd_consumer_lag`; every 5 s is cheap and fresh enough.
            ("statistics.interval.ms", "5000"),
        ],
        &kafka.consumer,
    )?;
    // The offset is stored only after the record's result is acknowledged (validation
    // refuses these keys in `kafka.consumer`).
    c.set("group.id", &kafka.group_id).set("enable.auto.offset.store", "false");
    Ok(c)
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
pub(crate) fn spawn(parts: ConsumerParts) -> Result<std::thread::JoinHandle<()>, PipelineError> {
    let ctx = PipelineContext {
        partitions: PartitionTable::default(),
        runtime: tokio::runtime::Handle::current(),
        store: Arc::clone(parts.shared.engine.store()),
        metrics: Arc::clone(&parts.shared.metrics),
        health: Arc::clone(&parts.health),
        accept_empty_store: parts.accept_empty_store,
    };
    let config = consumer_config(&parts.kafka)?;
    let consumer: BaseConsumer<PipelineContext> =
        config.create_with_context(ctx).map_err(|e| ConnectError::Create {
            client: "consumer".into(),
            reason: crate::connection::check::redact_all(&config, &e.to_string()),
        })?;
    let topics: Vec<&str> = parts.kafka.input_topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let consumer = Arc::new(consumer);
    std::thread::Builder::new()
        .name("dedupd-consumer".into())
        .spawn(move || poll_loop(consumer, parts))
        .map_err(|e| PipelineError::Kafka(KafkaError::Subscription(e.to_string())))
}

fn poll_loop(consumer: Arc<BaseConsumer<PipelineContext>>, parts: ConsumerParts) {
    let ctx = consumer.context();
    while !parts.stop.is_cancelled() {
        // Held records go on as soon as their queue has room; poll briefly meanwhile.
        let holding = ctx.partitions.release_held(&*consumer);
        let msg = match consumer.poll(Duration::from_millis(if holding { 10 } else { 100 })) {
            None => continue,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "consumer error");
                continue;
            }
            Some(Ok(m)) => m.detach(),
        };
        let tp = (msg.topic().to_string(), msg.partition());
        let offset = msg.offset();
        // Backpressure without blocking the poll thread (see `partitions`).
        let start_worker = |tp: &Tp| start_worker(&consumer, &parts, tp);
        if ctx.partitions.dispatch(&*consumer, &tp, msg, start_worker) == Dispatched::NotOurs {
            // Prefetched before a revoke or pause: not ours to process; nothing is stored,
            // so it comes again to whoever owns the partition.
            tracing::debug!(topic = %tp.0, partition = tp.1, offset, "dropping a record of a partition not ours");
        }
    }
    // Shutdown: stop taking records, drain every worker, commit, then leave the group.
    ctx.stop_workers(ctx.partitions.take_all_workers());
    if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        tracing::debug!(error = %e, "final commit (nothing stored is fine)");
    }
    consumer.unsubscribe();
    tracing::info!("consumer stopped");
}

/// Starts the worker of `tp` on the runtime, with a queue of `queue_per_partition` records.
fn start_worker(consumer: &Arc<BaseConsumer<PipelineContext>>, parts: &ConsumerParts, tp: &Tp) -> WorkerHandle {
    let (tx, rx) = mpsc::channel(parts.queue_per_partition);
    let cancel = CancellationToken::new();
    let control: Arc<dyn PartitionControl> = Arc::clone(consumer) as Arc<dyn PartitionControl>;
    let worker = PartitionWorker {
        topic: tp.0.clone(),
        partition: tp.1,
        rx,
        cancel: cancel.clone(),
        shared: Arc::clone(&parts.shared),
        control,
    };
    let join = consumer.context().runtime.spawn(worker.run());
    WorkerHandle { tx, cancel, join }
}

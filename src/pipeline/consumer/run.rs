//! The consumer thread: creating a consumer, its poll loop, replacing a fenced consumer,
//! and starting each partition's worker on the runtime.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use tokio_util::sync::CancellationToken;

use super::PipelineContext;
use super::fence::{RestartBudget, Session, Verdict};
use super::settings::{bound_prefetch, consumer_config, static_member_id};
use crate::connection::probe::ConnectError;
use crate::ops::Health;
use crate::pipeline::changelog::Restorer;
use crate::pipeline::control::{PartitionControl, Tenure, Tp};
use crate::pipeline::partitions::{CurrentTable, Dispatched, PartitionTable, WorkerHandle};
use crate::pipeline::queue::{SplitQueue, partition_queue};
use crate::pipeline::transactions::BeforeCommit;
use crate::pipeline::worker::{BatchOffsets, PanicWatch, PartitionWorker, WorkerShared, supervise};
use crate::pipeline::{KafkaConfig, PipelineError};

/// Everything the consumer thread needs.
pub(crate) struct ConsumerParts {
    pub kafka: KafkaConfig,
    pub shared: Arc<WorkerShared>,
    pub health: Arc<Health>,
    pub accept_empty_store: bool,
    /// Under `store.changelog`: restores state partitions on assignment.
    pub restorer: Option<Arc<Restorer>>,
    /// Under `store.changelog`: sends the store's captured changes, before a revoke's commit.
    pub changes: Option<Arc<dyn BeforeCommit>>,
    pub stop: CancellationToken,
    pub queue_per_partition: usize,
    /// The byte budget of each partition's queue (`pipeline.partition_buffer_bytes`).
    pub queue_bytes_per_partition: usize,
    /// Told the partition table of each consumer made (the reconciler asks it).
    pub current_table: Arc<CurrentTable>,
}

/// Creates the consumer and runs it on a thread until `stop`; returns the thread's handle.
pub(crate) fn spawn(parts: ConsumerParts) -> Result<std::thread::JoinHandle<()>, PipelineError> {
    let runtime = tokio::runtime::Handle::current();
    let consumer = create_consumer(&parts, &runtime)?;
    parts.health.watch_consumer_loop(parts.kafka.max_poll_interval());
    std::thread::Builder::new()
        .name("dedupd-consumer".into())
        .spawn(move || {
            let fatal = parts.shared.fatal.clone();
            // The consumer thread is the only one polling: if it panicked, every partition
            // would stop silently. Stop the process instead (exit non-zero).
            let run = std::panic::AssertUnwindSafe(|| run_consumers(consumer, parts, &runtime));
            if std::panic::catch_unwind(run).is_err() {
                tracing::error!("the consumer thread panicked; stopping");
                fatal.cancel();
            }
        })
        .map_err(|e| PipelineError::Kafka(KafkaError::Subscription(e.to_string())))
}

/// A new consumer, subscribed to the input topics (and the by-key topic under the hop), with its own empty partition table.
fn create_consumer(
    parts: &ConsumerParts,
    runtime: &tokio::runtime::Handle,
) -> Result<Arc<BaseConsumer<PipelineContext>>, PipelineError> {
    let partitions = Arc::new(PartitionTable::default());
    parts.current_table.set(&partitions);
    let ctx = PipelineContext {
        partitions,
        runtime: runtime.clone(),
        store: Arc::clone(parts.shared.engine.store()),
        metrics: Arc::clone(&parts.shared.metrics),
        health: Arc::clone(&parts.health),
        accept_empty_store: parts.accept_empty_store,
        restorer: parts.restorer.clone(),
        changes: parts.changes.clone(),
        restores: Default::default(),
        check_retry: Mutex::new(None),
        unfetched_lag_due: Mutex::new(Instant::now()),
        session: Mutex::new(Session::default()),
        consumer: OnceLock::new(),
        transactions: parts.shared.transactions.clone(),
        fatal: parts.shared.fatal.clone(),
    };
    let mut config = consumer_config(&parts.kafka)?;
    if parts.shared.by_key_topic().is_some() {
        // A forward whose transaction aborted must never be processed: its input comes
        // again (whatever `kafka.consumer` says; librdkafka's default is this too).
        config.set("isolation.level", "read_committed");
    }
    bound_prefetch(&mut config, &parts.kafka, parts.queue_per_partition, parts.queue_bytes_per_partition);
    if let Some(member) = static_member_id(&parts.kafka, &ctx.store)? {
        tracing::info!(group_instance_id = %member, "joining the consumer group as a static member");
        config.set("group.instance.id", member);
    }
    let consumer: BaseConsumer<PipelineContext> = config.create_with_context(ctx).map_err(|e| {
        ConnectError::Create { client: "consumer".into(), reason: crate::connection::check::client_error(&config, &e) }
    })?;
    let consumer = Arc::new(consumer);
    parts.health.show_partitions(Arc::clone(&consumer.context().partitions) as Arc<dyn crate::ops::PartitionsView>);
    // Before the first poll, where rebalance callbacks run.
    let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
    let mut topics: Vec<&str> = parts.kafka.input_topics.iter().map(String::as_str).collect();
    if let Some(by_key) = parts.shared.by_key_topic() {
        topics.push(by_key);
    }
    consumer.subscribe(&topics)?;
    Ok(consumer)
}

/// How a consumer's poll loop ended.
enum PollEnd {
    /// `stop` was cancelled.
    Stopped,
    /// librdkafka failed the consumer for good; its session stood at `session`.
    Failed { reason: String, session: Session },
}

/// Polls `consumer` until `stop`, replacing it when librdkafka fenced it after its own lost
/// session (see `fence`); any other fatal error fires `fatal`.
fn run_consumers(
    mut consumer: Arc<BaseConsumer<PipelineContext>>,
    parts: ConsumerParts,
    runtime: &tokio::runtime::Handle,
) {
    let mut budget = RestartBudget::default();
    while let PollEnd::Failed { reason, session } = poll_loop(&consumer, &parts) {
        match budget.judge(session, Instant::now()) {
            Verdict::Replace => {
                tracing::warn!(%reason, "the Kafka consumer fenced itself while rejoining after its group session was lost; replacing it");
                parts.shared.metrics.consumer_restarted();
            }
            Verdict::Stop(why) => {
                tracing::error!(%reason, why, "the Kafka consumer failed for good; stopping");
                parts.shared.fatal.cancel();
                return;
            }
        }
        // The fenced consumer closes here, before its successor joins with the same id (or
        // later, once a worker that did not drain in time lets go of it).
        drop(consumer);
        consumer = match create_consumer(&parts, runtime) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "could not create a new Kafka consumer; stopping");
                parts.shared.fatal.cancel();
                return;
            }
        };
    }
}

fn poll_loop(consumer: &Arc<BaseConsumer<PipelineContext>>, parts: &ConsumerParts) -> PollEnd {
    let ctx = consumer.context();
    let mut end = PollEnd::Stopped;
    while !parts.stop.is_cancelled() {
        parts.health.consumer_loop_turned();
        crate::crash::point("consumer.turn");
        // Held records go on as soon as their queue has room; poll briefly meanwhile.
        ctx.retry_check_if_due(consumer);
        ctx.report_unfetched_lag_if_due(consumer);
        ctx.finish_restores(&**consumer);
        // Partitions assigned (or checked, or restored) since the last turn start reading
        // their queues.
        ctx.partitions.start_split_workers(|tp, split| start_worker(consumer, parts, tp, split));
        let holding = ctx.partitions.release_held(&**consumer);
        let msg = match consumer.poll(Duration::from_millis(if holding { 10 } else { 100 })) {
            None => continue,
            Some(Err(e)) => {
                // A fatal error ends this consumer for good: never poll a dead consumer and
                // leave every partition silently stopped.
                if let Some((code, reason)) = consumer.client().fatal_error() {
                    end = PollEnd::Failed { reason: format!("{code:?}: {reason}"), session: *ctx.session.lock() };
                    break;
                }
                tracing::warn!(error = %e, "consumer error");
                continue;
            }
            Some(Ok(m)) => m.detach(),
        };
        let tp = (msg.topic().to_string(), msg.partition());
        let offset = msg.offset();
        // Backpressure without blocking the poll thread (see `partitions`).
        let start_worker = |tp: &Tp, split| start_worker(consumer, parts, tp, split);
        if ctx.partitions.dispatch(&**consumer, &tp, msg, start_worker) == Dispatched::NotOurs {
            // Prefetched before a revoke or pause: not ours to process; nothing is stored,
            // so it comes again to whoever owns the partition.
            tracing::debug!(topic = %tp.0, partition = tp.1, offset, "dropping a record of a partition not ours");
        }
    }
    // Stop taking records and drain every worker; then commit and leave the group, which a
    // failed consumer can no longer do (what its workers stored comes again).
    ctx.stop_workers(ctx.partitions.take_all_workers());
    if let Some(restorer) = &ctx.restorer {
        // Nothing of this consumer's restores is applied after it is gone: a consumer made
        // in its place starts its own.
        restorer.abandon_all();
    }
    if matches!(end, PollEnd::Stopped) {
        if let Some(transactions) = &ctx.transactions {
            ctx.end_transaction(transactions, false, "at shutdown");
        } else if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
            tracing::debug!(error = %e, "final commit (nothing stored is fine)");
        }
        consumer.unsubscribe();
        tracing::info!("consumer stopped");
    }
    end
}

/// Starts the worker of `tp` on the runtime, reading `split` (its own queue) and a channel
/// of `queue_per_partition` records and `queue_bytes_per_partition` bytes for records that
/// come through the consumer's queue.
fn start_worker(
    consumer: &Arc<BaseConsumer<PipelineContext>>,
    parts: &ConsumerParts,
    tp: &Tp,
    split: Option<SplitQueue>,
) -> WorkerHandle {
    let (tx, rx) = partition_queue(parts.queue_per_partition, parts.queue_bytes_per_partition);
    let rx = rx.with_split(split);
    let cancel = CancellationToken::new();
    let control: Arc<dyn PartitionControl> = Arc::clone(consumer) as Arc<dyn PartitionControl>;
    let in_batch = Arc::new(BatchOffsets::default());
    let tenure = Tenure::default();
    let worker = PartitionWorker {
        topic: tp.0.clone(),
        partition: tp.1,
        rx,
        cancel: cancel.clone(),
        shared: Arc::clone(&parts.shared),
        control,
        in_batch: Arc::clone(&in_batch),
        tenure: tenure.clone(),
    };
    let watch = PanicWatch {
        topic: tp.0.clone(),
        partition: tp.1,
        in_batch,
        metrics: Arc::clone(&parts.shared.metrics),
        health: Arc::clone(&parts.health),
        fatal: parts.shared.fatal.clone(),
    };
    let join = consumer.context().runtime.spawn(supervise(worker.run(), watch));
    WorkerHandle { tx, cancel, join, tenure }
}

//! One partition's worker: takes a batch of records in offset order, parses them, raises
//! the store watermark, runs the batch through the engine and hands every result to the
//! producer. It takes the next batch while Kafka acknowledges (and, without transactions,
//! while the last batch's last durability point is made: `overlap`), and stores a batch's
//! last offset only once its results and those of every earlier batch are acknowledged. Under
//! the by-key hop an input partition's worker forwards its commands instead (`forward`),
//! and a by-key partition's worker decides each as the input it was made of. `record`
//! turns each record into an engine item and ends each command (its log line and span);
//! `stops` says how a batch stops short (a store failure, or a partition let go under it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureRecord;
use tokio_util::sync::CancellationToken;

use super::control::{PartitionControl, Tenure};
use super::publish::{Acks, NotTaken, Parts, Publisher, all_parts};
use super::queue::QueueReceiver;
use super::transactions::Transactions;
use crate::engine::{BatchReport, Clock, Engine, Item, ItemResult, SystemClock};
use crate::envelope::{EnvelopeConfig, LimitsConfig};
use crate::ops::{Health, Metrics};
use crate::outcome::{Outcome, Processed};
use crate::telemetry::CommandTracer;

mod supervise;
pub(crate) use supervise::{BatchOffsets, PanicWatch, supervise};

mod forward;
mod overlap;
mod record;
mod resend;
mod stops;
use overlap::{Deferred, Finished, Ran};
use record::log_command;

/// Batches whose results may await acknowledgement at once, per partition. Enough to
/// keep the engine busy while Kafka acknowledges; bounded so an unresponsive broker stops
/// the partition instead of growing memory.
const MAX_UNACKED_BATCHES: usize = 4;

/// How long a stopping worker waits for the acknowledgements of what it sent (within
/// the consumer's own drain timeout).
const ACK_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Waits for the oldest unacknowledged batch's acknowledgements; never resolves when
/// there is none.
async fn front_acks(unacked: &mut VecDeque<Unacked>) -> Result<(), NotTaken> {
    match unacked.front_mut() {
        Some(u) => u.acks.acknowledged().await,
        None => std::future::pending().await,
    }
}

/// What every worker shares.
pub(crate) struct WorkerShared {
    pub engine: Arc<Engine>,
    pub publisher: Arc<Publisher>,
    pub metrics: Arc<Metrics>,
    pub envelope: EnvelopeConfig,
    pub limits: LimitsConfig,
    pub batch_size: usize,
    pub batch_linger: Duration,
    /// Fired when the process must stop (a store failure).
    pub fatal: CancellationToken,
    /// Told when a store write fails (`/readyz` 503 while the process stops).
    pub health: Arc<Health>,
    /// Under `kafka.transactional_results`: the transactions results go out in.
    pub transactions: Option<Arc<Transactions>>,
    /// Under `store.changelog`: where records are decided.
    pub state: Option<StatePartitions>,
    /// With traces on: makes each command's span.
    pub tracer: Option<CommandTracer>,
    /// `kafka.group_id`, for the spans.
    pub group: String,
}

/// Under `store.changelog`: the state partitions, and how records reach them.
pub(crate) struct StatePartitions {
    /// How many there are (the changelog topic's partitions).
    pub count: i32,
    /// Under the by-key hop: the by-key topic, whose partitions they are; an input
    /// partition's records are forwarded there (`hop`). `None` with `kafka.copartitioned`:
    /// every input partition is one.
    pub by_key: Option<String>,
    /// Under the hop: the largest forward (key, value and headers) the producer and the
    /// by-key topic take; a larger command is rejected `too_large` instead of stopping the
    /// process on a transaction Kafka would refuse.
    pub forward_limit: usize,
}

impl WorkerShared {
    /// The by-key topic, under the by-key hop.
    pub(crate) fn by_key_topic(&self) -> Option<&str> {
        self.state.as_ref().and_then(|s| s.by_key.as_deref())
    }
}

/// What a partition's worker does with its records.
enum Role<'a> {
    /// Decides them. With `Some(n)` each record is checked to be on its key's partition of
    /// `n` (a state partition); `unwrap` reads each as the input a forward was made of.
    Decide { check_among: Option<i32>, unwrap: bool },
    /// Forwards them to their key's partition of the by-key topic (an input partition
    /// under the hop).
    Forward(&'a StatePartitions),
}

/// One partition's worker.
pub(crate) struct PartitionWorker {
    pub topic: String,
    pub partition: i32,
    pub rx: QueueReceiver,
    pub cancel: CancellationToken,
    pub shared: Arc<WorkerShared>,
    /// The consumer, for circuit pauses and storing offsets.
    pub control: Arc<dyn PartitionControl>,
    /// The offsets of the batch being processed, for the report of a panic.
    pub in_batch: Arc<BatchOffsets>,
    /// Its hold on the partition, ended when it is stopped (see [`Tenure`]).
    pub tenure: Tenure,
}

/// A batch whose results are with the producer: its offset is stored once they are
/// acknowledged, and only after every earlier batch's.
struct Unacked {
    /// The records whose results were sent (a prefix of the batch, in offset order).
    records: Vec<(OwnedMessage, Processed)>,
    acks: Acks,
    started: Instant,
    /// The offset consumed last in the batch's sent part: the one to store (under the hop
    /// a record's own offset is its input's, not the by-key topic's).
    last_offset: i64,
}

impl Unacked {
    /// Every record the batch publishes.
    fn parts(&self) -> Parts {
        let refs: Vec<(&OwnedMessage, &Processed)> = self.records.iter().map(|(m, p)| (m, p)).collect();
        all_parts(&refs)
    }
}

/// Why a worker stops taking batches.
enum Stop {
    /// Cancelled (revoke, shutdown) or a record was abandoned: settle what was sent.
    Drain,
    /// The store or engine failed: the process is stopping.
    Fatal,
}

impl PartitionWorker {
    pub(crate) async fn run(mut self) {
        // Batches run through the engine while earlier batches' results wait for their
        // acknowledgements: the wait for Kafka is off the per-batch path, and offsets are
        // still stored strictly in order.
        let mut unacked: VecDeque<Unacked> = VecDeque::new();
        let mut first_seen = false;
        // The last batch, while its last durability point is under way (worker/overlap.rs);
        // never under transactions.
        let mut deferred: Option<Deferred> = None;
        let stop = loop {
            let room = unacked.len() < MAX_UNACKED_BATCHES;
            if deferred.is_some() {
                // A record already queued starts the next batch beside the point; else the
                // batch is published now, so an idle partition's latency stays as it was.
                let queued = match room && !self.cancel.is_cancelled() {
                    true => self.rx.try_recv().ok(),
                    false => None,
                };
                let stopped = match queued {
                    Some(first) => self.next_batch(first, &mut deferred, &mut unacked).await,
                    None => self
                        .publish_ran(deferred.take().map(Ran::Deferred))
                        .await
                        .map(|sent| unacked.extend(sent))
                        .err(),
                };
                match stopped {
                    Some(stop) => break stop,
                    None => continue,
                }
            }
            let first = tokio::select! {
                biased;
                () = self.cancel.cancelled() => break Stop::Drain,
                r = front_acks(&mut unacked) => {
                    let settled = unacked.pop_front();
                    if let Some(u) = settled && !self.settle(u, r).await {
                        break Stop::Drain;
                    }
                    continue;
                }
                m = self.rx.recv(), if room => m,
            };
            let Some(first) = first else { break Stop::Drain };
            if !first_seen && let Some(transactions) = &self.shared.transactions {
                // Every commit proves this generation still owns the partition
                // (transactions, invariant 6), also before the group holds an offset for it.
                transactions.note_first_offset(&(self.topic.clone(), self.partition), first.offset());
            }
            first_seen = true;
            if let Some(stop) = self.next_batch(first, &mut deferred, &mut unacked).await {
                break stop;
            }
        };
        // What was run is published before it is settled, unless the process is stopping.
        let stop = match (stop, deferred) {
            (Stop::Drain, Some(deferred)) => match self.publish_ran(Some(Ran::Deferred(deferred))).await {
                Ok(sent) => {
                    unacked.extend(sent);
                    Stop::Drain
                }
                Err(stop) => stop,
            },
            (stop, _) => stop,
        };
        self.settle_all(stop, unacked).await;
    }

    /// Takes a batch starting with `first` and runs it while the previous batch (`deferred`)
    /// reaches its last durability point and is published (see `overlap`); `Some` when the
    /// worker stops.
    async fn next_batch(
        &mut self,
        first: OwnedMessage,
        deferred: &mut Option<Deferred>,
        unacked: &mut VecDeque<Unacked>,
    ) -> Option<Stop> {
        let mut batch = vec![first];
        // Take what is already queued; wait up to `batch_linger` for more only when it
        // is set. With the default of 0, batches grow by themselves under load (records
        // queue while the previous batch is at its sinks) and stay small when idle.
        while batch.len() < self.shared.batch_size {
            match self.rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        if !self.shared.batch_linger.is_zero() {
            let deadline = tokio::time::Instant::now() + self.shared.batch_linger;
            while batch.len() < self.shared.batch_size {
                match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    Ok(Some(m)) => batch.push(m),
                    _ => break,
                }
            }
        }
        self.overlap(batch, deferred, unacked).await
    }

    /// Settles in order what was sent.
    async fn settle_all(&self, stop: Stop, mut unacked: VecDeque<Unacked>) {
        if let Stop::Fatal = stop {
            // The process starts stopping now; what was sent is still settled below.
            self.shared.fatal.cancel();
        }
        // Settle in order what was sent; the first failure ends it (later offsets must not
        // be stored past an unacknowledged result).
        let deadline = tokio::time::Instant::now() + ACK_DRAIN_TIMEOUT;
        while let Some(mut u) = unacked.pop_front() {
            let r = match tokio::time::timeout_at(deadline, u.acks.acknowledged()).await {
                Ok(r) => r,
                Err(_) => Err(NotTaken { parts: u.parts(), error: rdkafka::error::KafkaError::Canceled }),
            };
            if !self.settle(u, r).await {
                break;
            }
        }
    }

    /// What this partition's records are for.
    fn role(&self) -> Role<'_> {
        match &self.shared.state {
            None => Role::Decide { check_among: None, unwrap: false },
            Some(StatePartitions { count, by_key: None, .. }) => {
                Role::Decide { check_among: Some(*count), unwrap: false }
            }
            Some(StatePartitions { count, by_key: Some(by_key), .. }) if *by_key == self.topic => {
                Role::Decide { check_among: Some(*count), unwrap: true }
            }
            Some(state) => Role::Forward(state),
        }
    }

    /// Runs one batch through the engine (or forwards it, see [`Role`]). Returns its
    /// finished prefix, for the caller to publish in offset order (worker/overlap.rs), and
    /// whether the whole batch finished.
    async fn process(&self, batch: Vec<OwnedMessage>) -> Result<(Option<Ran>, bool), Stop> {
        let (check_among, unwrap) = match self.role() {
            Role::Forward(state) => {
                return self.forward(batch, state).await.map(|(u, complete)| (u.map(Ran::Sent), complete));
            }
            Role::Decide { check_among, unwrap } => (check_among, unwrap),
        };
        let started = Instant::now();
        if tracing::enabled!(tracing::Level::DEBUG) {
            // How long the batch's first record took from its timestamp to here (produce,
            // broker, fetch and queueing), for latency analysis.
            let age_ms = batch.first().and_then(|m| m.timestamp().to_millis()).map(|t| SystemClock.now_ms() - t);
            tracing::debug!(topic = %self.topic, partition = self.partition, first = batch.first().map(Message::offset), records = batch.len(), age_ms, "batch");
        }
        self.in_batch.set(&batch);
        let consumed: Vec<i64> = batch.iter().map(Message::offset).collect();
        let batch: Vec<OwnedMessage> = match unwrap {
            true => batch.into_iter().map(super::hop::original).collect(),
            false => batch,
        };
        let items: Vec<Item> = batch.iter().map(|m| self.item(m, check_among)).collect();
        let last = consumed.last().copied().unwrap_or(0);
        let wm = vec![(self.topic.clone(), self.partition, last)];
        // Under transactions the watermark is raised first and the batch's own flushes make
        // it durable; overlapping, at the batch's last durability point, off its turn
        // (worker/overlap.rs, rule 3).
        if !self.overlapping() {
            let (store, wm) = (Arc::clone(self.shared.engine.store()), wm.clone());
            self.on_store("raising the watermark", move || store.raise_watermarks(&wm)).await?;
        }
        let watermark_us = started.elapsed().as_micros() as u64;
        let sinks = super::circuits::sinks_of(&self.shared.engine, &items);
        let run = self.engine_run(&items);
        let tp = (self.topic.clone(), self.partition);
        let (BatchReport { results, flushed }, carried) =
            super::circuits::pausing_while_open(&*self.control, tp, &sinks, run)
                .await
                .map_err(|e| self.engine_failed(e, "running a batch"))?;
        let durable = self.watermark_durable(wm, carried, flushed).await?;
        // Send the longest prefix of finished records; an abandoned record ends it.
        let total = batch.len();
        let records: Vec<(OwnedMessage, Processed)> = batch
            .into_iter()
            .zip(results)
            .map_while(|(m, r)| match r {
                ItemResult::Done(p) => Some((m, *p)),
                ItemResult::Abandoned => None,
            })
            .collect();
        let complete = records.len() == total;
        // Where a batch's time goes (docs/performance-notes.md, "Batches that overlap at their
        // last durability point"); the last durability point is traced apart (worker/overlap.rs).
        let engine_us = (started.elapsed().as_micros() as u64).saturating_sub(watermark_us);
        tracing::debug!(topic = %self.topic, partition = self.partition, records = total, watermark_us, engine_us, "batch through the engine");
        let Some(&last_offset) = records.len().checked_sub(1).and_then(|last| consumed.get(last)) else {
            return Ok((None, complete));
        };
        let finished = Finished { records, last_offset, started };
        let ran = match durable {
            Some(point) => Ran::Deferred(Deferred { finished, point }),
            None => Ran::Durable(finished),
        };
        Ok((Some(ran), complete))
    }

    /// Hands a batch's results (and, under the hop, its forwards) to the producer; the
    /// batch's sent part ends at `last_offset`. Under transactional results, as a member of
    /// the open transaction, with that offset recorded in it (transactions, invariants
    /// 1–3); a batch that could not be queued whole then stops the process, as its queued
    /// part would otherwise commit without its offset.
    async fn publish(
        &self,
        refs: &[(&OwnedMessage, &Processed)],
        forwards: Vec<FutureRecord<'_, [u8], [u8]>>,
        last_offset: i64,
    ) -> Result<Acks, Stop> {
        let Some(transactions) = &self.shared.transactions else {
            // Without transactions a result cannot be kept from a partition let go once it is
            // sent: at least none is sent after the revoke ended the tenure.
            self.still_held()?;
            // Forwards exist only under the hop, which needs transactions (config validation).
            return self.send_until_queued(refs, all_parts(refs)).await.ok_or(Stop::Drain);
        };
        let member = transactions.join().await.map_err(|e| {
            // Fenced, the pipeline starts again from the committed offsets: expected, not a stop.
            if transactions.was_fenced() {
                tracing::warn!(error = %e, topic = %self.topic, partition = self.partition, "fenced: results not published, they come again from the committed offsets");
            } else {
                tracing::error!(error = %e, topic = %self.topic, partition = self.partition, "cannot publish results: no transaction is open");
            }
            Stop::Fatal
        })?;
        // Inside the member: the revoke's commit either carries all of this batch or, past
        // its tenure, none of it (transactions, invariant 9).
        self.still_held()?;
        let results = self.send_until_queued(refs, all_parts(refs)).await;
        if !forwards.is_empty() {
            // Each names its writer (transactions, invariant 8).
            transactions.named(&member);
        }
        let forwarded = self.shared.publisher.send_forwards(forwards).await;
        let (Some(results), None) = (results, &forwarded.rest) else {
            tracing::error!(topic = %self.topic, partition = self.partition, "results or forwards only partly queued in the open transaction; aborting it and stopping");
            transactions.fail();
            return Err(Stop::Fatal);
        };
        // The consumer refuses the offset of a partition no longer assigned, and so does the
        // transaction: its new owner commits it.
        match self.control.store_offset(&self.topic, self.partition, last_offset) {
            Ok(()) => transactions.include_offset(&member, (self.topic.clone(), self.partition), last_offset),
            Err(e) => {
                tracing::warn!(error = %e, topic = %self.topic, partition = self.partition, "offset not recorded (partition revoked?)")
            }
        }
        Ok(Acks::join(vec![results, forwarded.acks]))
    }

    /// Called in offset order with the outcome of `u`'s acknowledgements: sends again what
    /// Kafka did not take until it does (false when the partition is let go meanwhile), then
    /// stores the batch's offset.
    async fn settle(&self, u: Unacked, acked: Result<(), NotTaken>) -> bool {
        if let (Err(not_taken), Some(transactions)) = (&acked, &self.shared.transactions) {
            // The open transaction cannot commit without this record: abort it and stop.
            tracing::error!(error = %not_taken.error, topic = %self.topic, partition = self.partition, "a result of the open transaction was not acknowledged; aborting it and stopping");
            transactions.fail_on(&not_taken.error);
            self.shared.fatal.cancel();
            return false;
        }
        if let Err(not_taken) = acked {
            if self.cancel.is_cancelled() {
                tracing::warn!(error = %not_taken.error, topic = %self.topic, partition = self.partition, "results not acknowledged while letting the partition go; they come again");
                return false;
            }
            let refs: Vec<(&OwnedMessage, &Processed)> = u.records.iter().map(|(m, p)| (m, p)).collect();
            if !self.publish_until_acked(&refs, not_taken).await {
                return false;
            }
        }
        crate::crash::point("result.published");
        // Under transactional results the offset is in the transaction already.
        if self.shared.transactions.is_none()
            && let Err(e) = self.control.store_offset(&self.topic, self.partition, u.last_offset)
        {
            tracing::warn!(error = %e, topic = %self.topic, partition = self.partition, "could not store offset (partition revoked?)");
        }
        if u.records.is_empty() {
            // Only forwards: their results come from the by-key partition's worker.
            return true;
        }
        for (m, p) in &u.records {
            self.record_metrics(p);
            log_command(m, p);
        }
        self.shared.metrics.batch_processed(u.started.elapsed().as_secs_f64());
        tracing::debug!(topic = %self.topic, partition = self.partition, records = u.records.len(), ms = u.started.elapsed().as_millis() as u64, "batch done");
        true
    }

    fn record_metrics(&self, p: &Processed) {
        let m = &self.shared.metrics;
        m.command(p.result.outcome, p.result.route.as_deref());
        if let Some(dl) = &p.dead_letter {
            m.dead_lettered(dl.reason);
        }
        if p.result.outcome == Outcome::Duplicate
            && let Some(age) = p.duplicate_age_ms
        {
            m.duplicate_age(p.result.route.as_deref(), age as f64 / 1000.0);
        }
    }
}

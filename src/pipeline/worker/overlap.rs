//! A partition's batches overlap at their last durability point: a batch's last round's
//! completions are made durable while the partition's next batch starts (its watermark,
//! starts, tickets and claims), instead of before it. Measured at 5,000 commands/s, a
//! partition runs batches back to back and each waited for that point (BENCHMARKS.md,
//! "Where a command's latency goes"). Only without transactional results (and so without
//! the store on Kafka): a transaction commits a batch's results and offset together (and,
//! with the store on Kafka, its completions), so there the point stays in the batch.
//!
//! The rules stay where they were:
//! 1. A batch's results are published only once its completions are durable: [`finish`]
//!    awaits that point before it publishes (the crash point `completion.written` sits
//!    between the two).
//! 2. Its keys stay held until then (`Engine::sync_and_release` flushes, then lets go), so
//!    a later batch with one of them waits for the point instead of replaying a completion
//!    a crash could take back.
//! 3. The point flushes the store, so it also makes the batch's watermark durable (raised
//!    before the batch ran) before the batch's offset can be stored.
//! 4. Batches are published in offset order: a batch is finished before the next one's
//!    results can be, as [`PartitionWorker::overlap`] finishes the previous batch alongside
//!    running the next and hands both on in order.
//!
//! [`finish`]: PartitionWorker::finish

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use rdkafka::message::OwnedMessage;
use tokio::task::JoinHandle;

use super::{PartitionWorker, Stop, Unacked};
use crate::engine::{BatchReport, Engine, EngineError, Item};
use crate::outcome::Processed;

/// A batch through the engine whose results wait to be published.
pub(super) enum Pending {
    /// Published already: the batch made its own durability point (or needed none).
    Sent(Unacked),
    /// Its last round's completions are being made durable by `durable`; published after.
    Deferred {
        records: Vec<(OwnedMessage, Processed)>,
        last_offset: i64,
        started: Instant,
        durable: JoinHandle<Result<bool, EngineError>>,
    },
}

/// The batch's last durability point, made while the partition's next batch starts: the
/// completions of `carried` flushed (with the store, so the watermark too), then their keys
/// let go.
pub(super) fn last_point(engine: Arc<Engine>, carried: Vec<String>) -> JoinHandle<Result<bool, EngineError>> {
    tokio::spawn(async move {
        let (point, keys) = (Instant::now(), carried.len());
        let made = engine.sync_and_release(carried).await;
        let us = point.elapsed().as_micros() as u64;
        tracing::trace!(target: "dedupd::engine::batch", keys, us, "batch end: µs for the last round's completions made durable");
        made
    })
}

impl PartitionWorker {
    /// Runs `batch` while the previous batch (`pending`) is finished (rule 4): the finished
    /// one goes to `unacked`, the new one becomes `pending`. `Some` when the worker stops.
    pub(super) async fn overlap(
        &self,
        batch: Vec<OwnedMessage>,
        pending: &mut Option<Pending>,
        unacked: &mut VecDeque<Unacked>,
    ) -> Option<Stop> {
        let previous = pending.take();
        let (ran, finished) = futures::future::join(self.process(batch), self.finish(previous)).await;
        match finished {
            Ok(sent) => unacked.extend(sent),
            Err(stop) => return Some(stop),
        }
        match ran {
            Ok((next, complete)) => {
                *pending = next;
                // An abandoned record ends the batch's sent part, and the worker's run.
                (!complete).then_some(Stop::Drain)
            }
            Err(stop) => Some(stop),
        }
    }

    /// The batch through the engine. Without transactions its last durability point is
    /// left to overlap the next batch (worker/overlap.rs); with them the point stays in
    /// the batch, since a transaction carries a batch's results and offset (and, with the
    /// store on Kafka, its completions) and commits them together.
    pub(super) async fn engine_run(&self, items: &[Item]) -> Result<(BatchReport, Vec<String>), EngineError> {
        let engine = &self.shared.engine;
        if self.shared.transactions.is_none() {
            return engine.process_batch_leaving_last_point(items, &self.cancel).await;
        }
        Ok((engine.process_batch_reporting_flush(items, &self.cancel).await?, Vec::new()))
    }

    /// Publishes `pending` once its completions are durable (rules 1 and 3); the batch
    /// then waits for its acknowledgements as any other.
    pub(super) async fn finish(&self, pending: Option<Pending>) -> Result<Option<Unacked>, Stop> {
        let (records, last_offset, started, durable) = match pending {
            None => return Ok(None),
            Some(Pending::Sent(sent)) => return Ok(Some(sent)),
            Some(Pending::Deferred { records, last_offset, started, durable }) => {
                (records, last_offset, started, durable)
            }
        };
        match durable.await {
            Ok(Ok(_)) => {}
            Ok(Err(EngineError::Store(e))) => {
                self.store_failed(&e, "making completions durable");
                return Err(Stop::Fatal);
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, topic = %self.topic, partition = self.partition, "engine failed; stopping");
                return Err(Stop::Fatal);
            }
            Err(e) => {
                tracing::error!(error = %e, topic = %self.topic, partition = self.partition, "making completions durable failed; stopping");
                return Err(Stop::Fatal);
            }
        }
        Ok(Some(self.send_finished(records, last_offset, started).await?))
    }
}

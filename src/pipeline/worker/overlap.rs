//! A partition's batches overlap at their last durability point: a batch's last round's
//! completions are made durable while the partition's next batch starts (its starts,
//! tickets, claims and sink calls), instead of before it. Measured at 5,000 commands/s, a
//! partition runs batches back to back and each waited for that point
//! (docs/performance-notes.md, "Batches that overlap at their last durability point"). Only
//! without transactional results (and so without the store on Kafka): a transaction commits
//! a batch's results and offset together (and, with the store on Kafka, its completions), so
//! there the point stays in the batch and the worker runs exactly as without the overlap
//! (nothing is ever [`Deferred`]).
//!
//! The rules stay where they were:
//! 1. A batch's results are published only once its completions are durable:
//!    [`PartitionWorker::publish_ran`] awaits that point before it publishes
//!    (the crash point `completion.written` sits between the two).
//! 2. Its keys stay held until then (`Engine::sync_and_release` flushes, then lets go), so
//!    a later batch with one of them waits for the point instead of replaying a completion
//!    a crash could take back.
//! 3. The point raises the batch's watermark, then flushes the store, so the watermark is
//!    durable before the batch's offset can be stored (docs/contract.md §3 asks no more).
//!    The raise is a blocking-pool call of its own, so it is made there, off the batch's
//!    turn, not before the batch runs; a batch with nothing to make durable raises it and
//!    flushes in one call.
//! 4. Batches are published in offset order: the engine never publishes, and
//!    [`PartitionWorker::overlap`] publishes the previous batch before the one it ran
//!    meanwhile. If the previous batch's point fails, the one run meanwhile is never
//!    published (the process stops; both come again).
//!
//! tests/engine/batch_overlap.rs holds the point with a failpoint and sees the next batch's call
//! come, and the batch's result wait, meanwhile.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use rdkafka::message::OwnedMessage;
use tokio::task::JoinHandle;

use super::{PartitionWorker, Stop, Unacked};
use crate::engine::{BatchReport, Engine, EngineError, Item};
use crate::outcome::Processed;

/// A batch through [`PartitionWorker::process`].
pub(super) enum Ran {
    /// Published already: an input partition's forwards, under the by-key hop (which runs
    /// only in transactions, where nothing is deferred).
    Sent(Unacked),
    /// Finished, its completions durable, to be published in offset order.
    Durable(Finished),
    /// Finished, its last durability point under way.
    Deferred(Deferred),
}

/// A finished batch whose last round's completions `point` is making durable (rule 1): the
/// one batch a worker holds back while it runs the next.
pub(super) struct Deferred {
    pub finished: Finished,
    pub point: JoinHandle<Result<bool, EngineError>>,
}

/// A batch's finished records, not yet published.
pub(super) struct Finished {
    pub records: Vec<(OwnedMessage, Processed)>,
    /// The offset consumed last in the batch's finished part (see [`Unacked`]).
    pub last_offset: i64,
    pub started: Instant,
}

/// The batch's last durability point, made while the partition's next batch starts: its
/// watermark raised to `wm`, then the completions of `carried` flushed (with the store, so
/// the watermark too), then their keys let go.
fn last_point(
    engine: Arc<Engine>,
    carried: Vec<String>,
    wm: Vec<(String, i32, i64)>,
) -> JoinHandle<Result<bool, EngineError>> {
    tokio::spawn(async move {
        if let Some(ms) = held_ms() {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let (point, keys) = (Instant::now(), carried.len());
        let store = Arc::clone(engine.store());
        tokio::task::spawn_blocking(move || store.raise_watermarks(&wm))
            .await
            .map_err(|e| EngineError::Join(e.to_string()))??;
        let made = engine.sync_and_release(carried).await;
        let us = point.elapsed().as_micros() as u64;
        tracing::trace!(target: "dedupd::engine::batch", keys, us, "batch end: µs for the watermark raised and the last round's completions made durable");
        made
    })
}

/// Failpoint `overlap.last_point=return(MS)` (tests only: tests/engine/batch_overlap.rs): holds
/// every last durability point MS ms before it starts, so that a test sees the next batch
/// run meanwhile.
fn held_ms() -> Option<u64> {
    fail::fail_point!("overlap.last_point", |ms: Option<String>| ms.and_then(|ms| ms.parse().ok()));
    None
}

impl PartitionWorker {
    /// Runs `batch` while the previous batch (`deferred`) reaches its last durability
    /// point, then publishes both in offset order (rule 4): each published batch joins
    /// `unacked`; one whose point is still to come becomes `deferred`. `Some` when the
    /// worker stops.
    pub(super) async fn overlap(
        &self,
        batch: Vec<OwnedMessage>,
        deferred: &mut Option<Deferred>,
        unacked: &mut VecDeque<Unacked>,
    ) -> Option<Stop> {
        let previous = deferred.take().map(Ran::Deferred);
        let (ran, published) = futures::future::join(self.process(batch), self.publish_ran(previous)).await;
        match published {
            Ok(sent) => unacked.extend(sent),
            // Rule 4: what ran meanwhile is not published either.
            Err(stop) => return Some(stop),
        }
        let (ran, complete) = match ran {
            Ok(ran) => ran,
            Err(stop) => return Some(stop),
        };
        match ran {
            Some(Ran::Deferred(held)) => *deferred = Some(held),
            ran => match self.publish_ran(ran).await {
                Ok(sent) => unacked.extend(sent),
                Err(stop) => return Some(stop),
            },
        }
        // An abandoned record ends the batch's finished part, and the worker's run.
        (!complete).then_some(Stop::Drain)
    }

    /// The batch through the engine, with the keys whose completions are written but not
    /// yet durable. Without transactions its last durability point is left to overlap the
    /// next batch; with them the point stays in the batch (none left), since a transaction
    /// carries a batch's results and offset (and, with the store on Kafka, its
    /// completions) and commits them together.
    pub(super) async fn engine_run(&self, items: &[Item]) -> Result<(BatchReport, Vec<String>), EngineError> {
        let engine = &self.shared.engine;
        if self.overlapping() {
            return engine.process_batch_leaving_last_point(items, &self.cancel).await;
        }
        Ok((engine.process_batch_reporting_flush(items, &self.cancel).await?, Vec::new()))
    }

    /// Makes a batch's watermark `wm` durable before its offset can be committed
    /// (docs/contract.md §3): a flush after the raise makes it so. Overlapping, the batch's
    /// last point raises it and flushes (rule 3), and is returned to be awaited before the
    /// batch is published; a batch with no completions to make durable (replays and
    /// rejections) raises it and flushes in one call. Under transactions it was raised
    /// before the batch ran, so a flush of the engine's (`flushed`) covers it, else one is
    /// made here.
    pub(super) async fn watermark_durable(
        &self,
        wm: Vec<(String, i32, i64)>,
        carried: Vec<String>,
        flushed: bool,
    ) -> Result<Option<JoinHandle<Result<bool, EngineError>>>, Stop> {
        let store = Arc::clone(self.shared.engine.store());
        if !self.overlapping() {
            if !flushed {
                self.on_store("flushing", move || store.flush()).await?;
            }
            return Ok(None);
        }
        if !carried.is_empty() {
            return Ok(Some(last_point(Arc::clone(&self.shared.engine), carried, wm)));
        }
        self.on_store("raising the watermark", move || store.raise_watermarks(&wm).and_then(|()| store.flush()))
            .await?;
        Ok(None)
    }

    /// Whether this worker's batches overlap at their last durability point: only without
    /// transactional results.
    pub(super) fn overlapping(&self) -> bool {
        self.shared.transactions.is_none()
    }

    /// Publishes `ran` once its completions are durable (rules 1 and 3); the batch then
    /// waits for its acknowledgements as any other.
    pub(super) async fn publish_ran(&self, ran: Option<Ran>) -> Result<Option<Unacked>, Stop> {
        let finished = match ran {
            None => return Ok(None),
            Some(Ran::Sent(sent)) => return Ok(Some(sent)),
            Some(Ran::Durable(finished)) => finished,
            Some(Ran::Deferred(Deferred { finished, point })) => {
                let made = point.await.unwrap_or_else(|e| Err(EngineError::Join(e.to_string())));
                made.map_err(|e| self.engine_failed(e, "making completions durable"))?;
                finished
            }
        };
        let Finished { records, last_offset, started } = finished;
        crate::crash::point("completion.written");
        let refs: Vec<(&OwnedMessage, &Processed)> = records.iter().map(|(m, p)| (m, p)).collect();
        let acks = self.publish(&refs, Vec::new(), last_offset).await?;
        Ok(Some(Unacked { records, acks, started, last_offset }))
    }
}

//! One batch through the engine, in rounds (see the module docs of `engine` for the steps
//! and the two rules they keep).

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::queue::{Head, KeyQueues};
use super::{BatchReport, Engine, EngineError, Item, ItemResult};

impl Engine {
    /// Processes `items` (one partition's batch, in offset order). Returns one result per
    /// item, in the same order.
    pub async fn process_batch(
        &self,
        items: &[Item],
        cancel: &CancellationToken,
    ) -> Result<Vec<ItemResult>, EngineError> {
        Ok(self.process_batch_reporting_flush(items, cancel).await?.results)
    }

    /// [`Engine::process_batch`], also telling whether it flushed the store at least once
    /// (then every write made before the call is durable too, e.g. a watermark).
    pub async fn process_batch_reporting_flush(
        &self,
        items: &[Item],
        cancel: &CancellationToken,
    ) -> Result<BatchReport, EngineError> {
        let (mut report, carried) = self.process_batch_leaving_last_point(items, cancel).await?;
        let last_point = std::time::Instant::now();
        let last_keys = carried.len();
        report.flushed |= self.sync_and_release(carried).await?;
        tracing::trace!(
            keys = last_keys,
            us = last_point.elapsed().as_micros() as u64,
            "batch end: µs for the last round's completions made durable"
        );
        Ok(report)
    }

    /// [`Engine::process_batch_reporting_flush`] without its last durability point: also
    /// returns the keys whose completions are written but not yet durable, still held. The
    /// caller must pass them to [`Engine::sync_and_release`] before it publishes any of the
    /// batch's results (the pipeline does it while the partition's next batch starts).
    pub async fn process_batch_leaving_last_point(
        &self,
        items: &[Item],
        cancel: &CancellationToken,
    ) -> Result<(BatchReport, Vec<String>), EngineError> {
        let mut queues = KeyQueues::new(items);
        let mut flushed = false;
        // Keys of the last round whose completions are written but not yet durable: the
        // next round's claims make them durable (overlapping rounds), or the batch's end.
        let mut carried: Vec<String> = Vec::new();
        loop {
            // At most `max_in_flight` records per round: claims are made for sinks about to
            // run, so a crash leaves no more unsent claims (future `indeterminate` keys for
            // non-forwarding sinks) than could have been in flight anyway.
            let heads = queues.heads(self.max_in_flight);
            if heads.is_empty() || cancel.is_cancelled() {
                break;
            }
            let end = self.round(&mut queues, heads, std::mem::take(&mut carried), cancel).await?;
            flushed |= end.flushed;
            carried = end.unsynced;
            if !end.waits.is_empty() {
                // Another batch holds keys this one needs: make this batch's completions
                // durable and let go of its keys before waiting, so two batches never wait
                // on each other.
                flushed |= self.sync_and_release(std::mem::take(&mut carried)).await?;
                wait_for_others(end.waits, cancel).await;
            }
        }
        Ok((BatchReport { results: queues.into_results(), flushed }, carried))
    }

    /// One round over `heads`: start, take tickets, claim, run sinks, write the completions.
    /// The claims' durability point also makes durable the completions of the keys `before`
    /// carries (the previous round's), whose keys are then let go. Returns what the round
    /// leaves (see [`RoundEnd`]).
    async fn round<'a>(
        &'a self,
        queues: &mut KeyQueues<'a>,
        heads: Vec<Head<'a>>,
        before: Vec<String>,
        cancel: &CancellationToken,
    ) -> Result<RoundEnd, EngineError> {
        let now = self.clock.now_ms();
        // Where a round's time goes, for `RUST_LOG=dedupd::engine=trace`.
        let mut marks = RoundMarks::new();
        // Carried completions wait for no ticket (so never for another partition's sink
        // calls to free a permit): without a ticket at once they are made durable alone,
        // and the next round waits for its tickets.
        let started = match self.start_heads(queues, heads, now, before.is_empty(), cancel).await {
            Ok(started) => started,
            Err(e) => return Err(self.release_if_let_go(e, &before)),
        };
        let (ticketed, waits) = (started.to_claim, started.waits);
        marks.mark();
        if ticketed.is_empty() {
            if !started.short_of_tickets {
                // Nothing to claim (replays, waits): the carried keys stay carried.
                return Ok(RoundEnd { flushed: false, unsynced: before, waits });
            }
            let flushed = self.sync_and_release(before).await?;
            return Ok(RoundEnd { flushed, unsynced: Vec::new(), waits });
        }
        let carrying = !before.is_empty();
        let claimed = match self.claim(ticketed, carrying).await {
            Ok(claimed) => claimed,
            Err(e) => return Err(self.release_if_let_go(e, &before)),
        };
        // Their completions are durable with the claims: a waiter may replay them now.
        self.release(&before);
        marks.mark();
        let ran = self.run_sinks(queues.items(), claimed, cancel).await;
        marks.mark();
        let done = self.settle_runs(queues, ran)?;
        marks.mark();
        self.complete(done.to_write).await?;
        marks.mark();
        tracing::trace!(records = done.keys.len(), carried = before.len(), waits = waits.len(), ms = ?marks.ms, "round: ms for starts and tickets, claims + flush, sinks, results, completions written");
        Ok(RoundEnd { flushed: carrying, unsynced: done.keys, waits })
    }

    /// Makes every completion written so far durable (one flush, shared with other
    /// batches flushing at the same moment), then lets go of `keys`. Returns whether it
    /// flushed (not when `keys` is empty: nothing to make durable).
    pub async fn sync_and_release(&self, keys: Vec<String>) -> Result<bool, EngineError> {
        if keys.is_empty() {
            return Ok(false);
        }
        self.flush_store().await?;
        // Release the keys only once their completions are durable: a waiter must not
        // replay a result that a crash could still take back.
        self.release(&keys);
        Ok(true)
    }

    /// Lets go of `keys`, waking the batches waiting for them.
    pub(super) fn release(&self, keys: &[String]) {
        let mut map = self.inflight.lock();
        for key in keys {
            map.remove(key);
        }
    }

    /// Returns `e`, having let go of `keys` if it is a write the store refused because the
    /// partition was let go (`store::ownership`): the batch ends there, and its keys must
    /// not keep a later batch of this process waiting. Any other failure stops the process
    /// with them held: a waiter must never replay a completion a failed write may not have
    /// made durable.
    pub(super) fn release_if_let_go(&self, e: EngineError, keys: &[String]) -> EngineError {
        if e.is_let_go() {
            self.release(keys);
        }
        e
    }
}

/// What a round leaves to the next.
struct RoundEnd {
    /// Whether it flushed the store.
    flushed: bool,
    /// Keys whose completions (or put-back records) are written but not yet durable: still
    /// held, to be let go once they are.
    unsynced: Vec<String>,
    /// Keys other batches are executing: awaited once this batch's keys are let go.
    waits: Vec<watch::Receiver<()>>,
}

/// Waits until the other batches executing the keys behind `waits` let go of them, or
/// `cancel` fires.
async fn wait_for_others(waits: Vec<watch::Receiver<()>>, cancel: &CancellationToken) {
    for mut rx in waits {
        tokio::select! {
            _ = rx.changed() => {}
            () = cancel.cancelled() => {}
        }
    }
}

/// Milliseconds between successive points of a round.
struct RoundMarks {
    last: std::time::Instant,
    ms: Vec<u64>,
}

impl RoundMarks {
    fn new() -> RoundMarks {
        RoundMarks { last: std::time::Instant::now(), ms: Vec::with_capacity(8) }
    }

    fn mark(&mut self) {
        let now = std::time::Instant::now();
        self.ms.push(now.duration_since(self.last).as_millis() as u64);
        self.last = now;
    }
}

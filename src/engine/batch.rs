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
        let mut queues = KeyQueues::new(items);
        let mut flushed = false;
        loop {
            // At most `max_in_flight` records per round: claims are made for sinks about to
            // run, so a crash leaves no more unsent claims (future `indeterminate` keys for
            // non-forwarding sinks) than could have been in flight anyway.
            let heads = queues.heads(self.max_in_flight);
            if heads.is_empty() || cancel.is_cancelled() {
                break;
            }
            flushed |= self.round(&mut queues, heads, cancel).await?;
        }
        Ok(BatchReport { results: queues.into_results(), flushed })
    }

    /// One round over `heads`: start, take tickets, claim, run sinks, complete, then release
    /// the round's keys and wait for the keys other batches hold. Returns whether it flushed
    /// the store.
    async fn round<'a>(
        &'a self,
        queues: &mut KeyQueues<'a>,
        heads: Vec<Head<'a>>,
        cancel: &CancellationToken,
    ) -> Result<bool, EngineError> {
        let now = self.clock.now_ms();
        // Where a round's time goes, for `RUST_LOG=dedupd::engine=trace`.
        let mut marks = RoundMarks::new();
        let started = self.start_heads(queues, heads, now)?;
        let ticketed = self.take_tickets(started.to_claim, cancel).await;
        marks.mark();
        let claimed = self.claim(ticketed).await?;
        marks.mark();
        let mut flushed = !claimed.is_empty();
        let ran = self.run_sinks(queues.items(), claimed, cancel).await;
        marks.mark();
        let done = self.settle_runs(queues, ran)?;
        marks.mark();
        let must_flush = !done.keys.is_empty();
        flushed |= must_flush;
        self.complete(done.to_write, must_flush).await?;
        marks.mark();
        tracing::trace!(records = done.keys.len(), waits = started.waits.len(), ms = ?marks.ms, "round: ms for starts and tickets, claims + flush, sinks, results, completions + flush");
        // Release the keys only once their completions are durable: a waiter must not
        // replay a result that a crash could still take back.
        self.release(&done.keys);
        wait_for_others(started.waits, cancel).await;
        Ok(flushed)
    }

    /// Lets go of `keys`, waking the batches waiting for them.
    fn release(&self, keys: &[String]) {
        let mut map = self.inflight.lock();
        for key in keys {
            map.remove(key);
        }
    }
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

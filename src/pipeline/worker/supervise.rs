//! A partition worker's supervisor: a panic in the worker never leaves its partition
//! silently stopped.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use futures::FutureExt;
use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use crate::ops::{Health, Metrics};

/// The first and last offsets of the batch a worker is processing (-1 before the first).
#[derive(Debug)]
pub(crate) struct BatchOffsets {
    first: AtomicI64,
    last: AtomicI64,
}

impl Default for BatchOffsets {
    fn default() -> BatchOffsets {
        BatchOffsets { first: AtomicI64::new(-1), last: AtomicI64::new(-1) }
    }
}

impl BatchOffsets {
    pub(super) fn set(&self, batch: &[OwnedMessage]) {
        self.first.store(batch.first().map_or(-1, Message::offset), Ordering::Relaxed);
        self.last.store(batch.last().map_or(-1, Message::offset), Ordering::Relaxed);
    }
}

/// What a worker's supervisor reports a panic to.
pub(crate) struct PanicWatch {
    pub topic: String,
    pub partition: i32,
    pub in_batch: Arc<BatchOffsets>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// Fired on a panic: the process drains the other partitions and exits non-zero.
    pub fatal: CancellationToken,
}

/// Runs a partition's worker so that a panic in it never leaves the partition silently
/// stopped: the panic is logged naming the partition and the offsets being processed,
/// counted in `dedupd_worker_panics_total`, the partition reported down on `/readyz`, and
/// the process stopped (exit non-zero). Its records are not stored, so after the restart
/// they come again from the committed offset. Stopping rather than restarting the
/// partition in place: a worker that panicked may have left its batch half done in ways
/// only the store's recovery at start-up is built to resolve.
pub(crate) async fn supervise(worker: impl Future<Output = ()>, watch: PanicWatch) {
    let Err(panic) = AssertUnwindSafe(worker).catch_unwind().await else { return };
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string());
    let (first, last) = (watch.in_batch.first.load(Ordering::Relaxed), watch.in_batch.last.load(Ordering::Relaxed));
    tracing::error!(topic = %watch.topic, partition = watch.partition, first_offset = first, last_offset = last, panic = %message,
        "partition worker panicked: the partition is down; stopping so that a restart resumes it from its committed offset");
    watch.metrics.worker_panicked(&watch.topic, watch.partition);
    let name = format!("{}/{}", watch.topic, watch.partition);
    watch.health.set_down(&name, Some(&format!("worker panicked at offsets {first}..={last}")));
    watch.fatal.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(metrics: &Arc<Metrics>, health: &Arc<Health>, fatal: &CancellationToken) -> PanicWatch {
        let in_batch = Arc::new(BatchOffsets::default());
        in_batch.first.store(7, Ordering::Relaxed);
        in_batch.last.store(9, Ordering::Relaxed);
        PanicWatch {
            topic: "in".into(),
            partition: 3,
            in_batch,
            metrics: Arc::clone(metrics),
            health: Arc::clone(health),
            fatal: fatal.clone(),
        }
    }

    #[tokio::test]
    async fn a_panicking_worker_is_counted_reported_down_and_stops_the_process() {
        let (metrics, health, fatal) =
            (Arc::new(Metrics::new().expect("metrics")), Arc::new(Health::default()), CancellationToken::new());
        health.set_joined(true);
        // Spawned like a real worker: the panic must not escape the supervisor's task.
        let worker = async { panic!("injected worker panic") };
        tokio::spawn(supervise(worker, watch(&metrics, &health, &fatal))).await.expect("the supervisor returns");
        assert!(fatal.is_cancelled(), "the process stops (exit non-zero)");
        assert!(!health.is_ready(), "/readyz 503 while the partition is down");
        assert_eq!(health.down(), [("in/3".to_string(), "worker panicked at offsets 7..=9".to_string())]);
        assert!(
            metrics.render().contains(r#"dedupd_worker_panics_total{partition="3",topic="in"} 1"#),
            "{}",
            metrics.render()
        );
    }

    #[tokio::test]
    async fn a_worker_that_returns_changes_nothing() {
        let (metrics, health, fatal) =
            (Arc::new(Metrics::new().expect("metrics")), Arc::new(Health::default()), CancellationToken::new());
        health.set_joined(true);
        supervise(async {}, watch(&metrics, &health, &fatal)).await;
        assert!(!fatal.is_cancelled());
        assert!(health.is_ready());
    }
}

//! Split partition queues: each assigned partition's records go to a librdkafka queue of its
//! own, which its worker reads when it has room (see `queue`), instead of the consumer's
//! queue, which the poll thread would have to drain and pause partitions against.
//!
//! librdkafka keeps a queue split once the application has split it, across revokes and
//! later assignments of the same partition, so every assignment splits every partition it
//! brings and each gets a worker that reads it (an unread split queue would stall its
//! partition). The split is made in the rebalance callback *before* the assignment takes
//! effect, so no record of the partition is ever fetched into the consumer's queue first.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::message::OwnedMessage;
use tokio::sync::Notify;

use super::super::control::Tp;
use super::super::queue::{Prefetched, SplitQueue};
use super::PipelineContext;

/// How many errors one `take` passes over before it reports no record (errors are events
/// in the queue, not records; they are logged).
const ERRORS_PER_TAKE: usize = 16;

impl Prefetched for PartitionQueue<PipelineContext> {
    fn take(&self) -> Option<OwnedMessage> {
        for _ in 0..ERRORS_PER_TAKE {
            match self.poll(Duration::ZERO)? {
                Ok(m) => return Some(m.detach()),
                Err(e) => tracing::warn!(error = %e, "consumer error on a partition queue"),
            }
        }
        None
    }
}

/// Splits the queues of `tps`, each with a wake-up for its worker. A partition whose queue
/// cannot be split (librdkafka does not know it) is left out: its records come through the
/// consumer's queue and are dispatched by the poll thread.
pub(super) fn split_queues(consumer: &Arc<BaseConsumer<PipelineContext>>, tps: &[Tp]) -> Vec<(Tp, SplitQueue)> {
    let mut out = Vec::with_capacity(tps.len());
    for tp in tps {
        let Some(mut queue) = consumer.split_partition_queue(&tp.0, tp.1) else {
            tracing::warn!(topic = %tp.0, partition = tp.1, "could not split the partition's queue; its records come through the consumer's queue");
            continue;
        };
        let ready = Arc::new(Notify::new());
        let wake = Arc::clone(&ready);
        queue.set_nonempty_callback(move || wake.notify_one());
        out.push((tp.clone(), SplitQueue { records: Box::new(queue), ready }));
    }
    out
}

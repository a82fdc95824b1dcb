//! What a partition's worker and the circuit watch may ask of the consumer, and nothing
//! more: pause or resume fetching a partition while its batch waits for an open circuit,
//! and store an offset once results are acknowledged. The consumer implements it; workers
//! and circuits hold an `Arc<dyn PartitionControl>`, so they never import the consumer.
//!
//! A request is not an order: the consumer's partition table decides whether a partition
//! is fetched (a refused or held partition stays paused after a circuit closes).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::error::KafkaError;

/// A topic and partition.
pub(crate) type Tp = (String, i32);

/// The consumer as workers and circuits see it.
pub(crate) trait PartitionControl: Send + Sync {
    /// Stop fetching `tp`: its in-flight batch waits for sinks whose circuit is open
    /// (`open_sinks`, for the log). Ignored for a partition no longer assigned.
    fn pause_for_circuit(&self, tp: &Tp, open_sinks: &[&str]);

    /// Undoes [`PartitionControl::pause_for_circuit`]; the partition is fetched again only
    /// if nothing else stops it.
    fn resume_after_circuit(&self, tp: &Tp);

    /// Stores `offset`, the last record of `topic`/`partition` whose result is
    /// acknowledged, for the next commit (librdkafka commits the offset after it).
    fn store_offset(&self, topic: &str, partition: i32, offset: i64) -> Result<(), KafkaError>;
}

/// A worker's hold on its partition, from the worker's start until the revoke (or shutdown)
/// that stops it ends it: after the drain bound, before the commit that ends the
/// partition's generation here. Under transactional results a worker queues results,
/// forwards and its offset only while its tenure holds, checked inside the transaction
/// member it queues them with (transactions, invariant 9); so a worker still at its sink
/// past the drain bound can add nothing to a transaction committed after it lost the
/// partition. A partition assigned again gets a new worker with a new tenure.
#[derive(Clone, Default)]
pub(crate) struct Tenure(Arc<AtomicBool>);

impl Tenure {
    /// Ends the tenure: the worker publishes nothing more.
    pub(crate) fn end(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the worker still holds its partition.
    pub(crate) fn holds(&self) -> bool {
        !self.0.load(Ordering::Acquire)
    }
}

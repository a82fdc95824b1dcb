//! What a partition's worker and the circuit watch may ask of the consumer, and nothing
//! more: pause or resume fetching a partition while its batch waits for an open circuit,
//! and store an offset once results are acknowledged. The consumer implements it; workers
//! and circuits hold an `Arc<dyn PartitionControl>`, so they never import the consumer.
//!
//! A request is not an order: the consumer's partition table decides whether a partition
//! is fetched (a refused or held partition stays paused after a circuit closes).

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

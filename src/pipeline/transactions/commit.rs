//! One transaction's end at the broker: its records delivered, then the group's offsets,
//! then the commit, and the next transaction begun; what a failed step leaves is aborted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::{COORDINATOR_TIMEOUT, TransactionError};
use crate::pipeline::control::Tp;

/// Sends `offsets` to the open transaction, commits it and begins the next; a failure the
/// transaction can survive only by aborting is aborted here.
pub(super) fn commit_and_begin(
    producer: &FutureProducer,
    offsets: &HashMap<Tp, i64>,
    group: Option<Arc<ConsumerGroupMetadata>>,
) -> Result<(), TransactionError> {
    let committed = (|| {
        // The records first, then the offsets, so that the broker never holds this
        // transaction's offsets without its records on dedupd's topics, which name the
        // writer (invariant 8): pending offsets hold every read of the group's committed
        // offsets, and only a record naming the writer lets another instance end them.
        wait_until_delivered(producer, COORDINATOR_TIMEOUT);
        if !offsets.is_empty() {
            let group = group.ok_or(TransactionError::NoGroup)?;
            let mut list = TopicPartitionList::with_capacity(offsets.len());
            for ((topic, partition), next) in offsets {
                list.add_partition_offset(topic, *partition, Offset::Offset(*next))?;
            }
            retrying("sending the offsets", || {
                producer.send_offsets_to_transaction(&list, &group, COORDINATOR_TIMEOUT)
            })?;
        }
        crate::crash::point("transaction.delivered");
        retrying("committing the transaction", || producer.commit_transaction(COORDINATOR_TIMEOUT))
    })();
    match committed {
        Ok(()) => Ok(producer.begin_transaction()?),
        Err(e) => {
            if let Err(abort) = producer.abort_transaction(COORDINATOR_TIMEOUT) {
                tracing::warn!(error = %abort, "aborting the failed transaction failed; the broker aborts it when it times out");
            }
            Err(e)
        }
    }
}

/// Waits, in steps of a millisecond and at most `bound`, until no message of `producer` is
/// in flight. rust-rdkafka's `commit_transaction` flushes first, and its flush of a producer
/// whose delivery reports another thread serves (a `FutureProducer`'s) polls for 100 ms at a
/// time for events that never come to it: every commit with a message still in flight took
/// 100 ms more (measured: a commit every 100 ms here, whatever it carried). With nothing in
/// flight the flush returns at once; past `bound` it is left to the flush.
fn wait_until_delivered(producer: &FutureProducer, bound: Duration) {
    let deadline = std::time::Instant::now() + bound;
    while producer.in_flight_count() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Calls `step` again, up to three times, while librdkafka says it may be retried (a
/// coordinator moving, a timeout): librdkafka documents both steps as safe to call again
/// for the same transaction.
fn retrying(what: &str, step: impl Fn() -> Result<(), KafkaError>) -> Result<(), TransactionError> {
    let mut tries = 0;
    loop {
        match step() {
            Ok(()) => return Ok(()),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && tries < 3 => {
                tries += 1;
                tracing::warn!(error = %e, tries, "{what}: retrying");
            }
            Err(e) => return Err(e.into()),
        }
    }
}

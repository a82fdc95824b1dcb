//! A partition's queue of records for its worker, bounded in records and in bytes.
//!
//! Why bytes too: a bound in records alone lets a partition of 1 MiB commands buffer
//! `batch_size × 4` of them (2,000 by default: 2 GiB). The queue counts each record's key,
//! value and header bytes while it waits; a record that would take it past its byte budget
//! is refused as if the queue were full, so the poll thread holds it and pauses the
//! partition (see `partitions`). An empty queue takes any one record, whatever its size, so
//! a record larger than the budget still goes through, alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::{TryRecvError, TrySendError};

use crate::envelope::header_bytes;

/// The bytes a record holds while it waits: its key, value and headers.
pub(super) fn record_bytes(m: &OwnedMessage) -> usize {
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len) + m.headers().map_or(0, header_bytes)
}

/// A queue of at most `records` records and, past its first, `bytes` bytes.
pub(super) fn partition_queue(records: usize, bytes: usize) -> (QueueSender, QueueReceiver) {
    let (tx, rx) = mpsc::channel(records.max(1));
    let buffered = Arc::new(AtomicUsize::new(0));
    (QueueSender { tx, buffered: Arc::clone(&buffered), budget: bytes }, QueueReceiver { rx, buffered })
}

/// The poll thread's end.
#[derive(Debug)]
pub(super) struct QueueSender {
    tx: mpsc::Sender<(OwnedMessage, usize)>,
    /// Bytes of the records in the queue.
    buffered: Arc<AtomicUsize>,
    budget: usize,
}

impl QueueSender {
    /// Queues `m` without waiting; `Full` when the queue holds its most records or `m`
    /// would take a non-empty queue past its byte budget.
    pub(super) fn try_send(&self, m: OwnedMessage) -> Result<(), TrySendError<OwnedMessage>> {
        let size = record_bytes(&m);
        // Counted before it is sent: the worker may take it (and subtract) at once.
        let before = self.buffered.fetch_add(size, Ordering::AcqRel);
        let refused = if before > 0 && before.saturating_add(size) > self.budget {
            Err(TrySendError::Full(m))
        } else {
            self.tx.try_send((m, size)).map_err(|e| match e {
                TrySendError::Full((m, _)) => TrySendError::Full(m),
                TrySendError::Closed((m, _)) => TrySendError::Closed(m),
            })
        };
        if refused.is_err() {
            self.buffered.fetch_sub(size, Ordering::AcqRel);
        }
        refused
    }
}

/// The worker's end.
#[derive(Debug)]
pub(crate) struct QueueReceiver {
    rx: mpsc::Receiver<(OwnedMessage, usize)>,
    buffered: Arc<AtomicUsize>,
}

impl QueueReceiver {
    /// The next record; `None` once the sender is gone and the queue is empty.
    pub(crate) async fn recv(&mut self) -> Option<OwnedMessage> {
        self.rx.recv().await.map(|taken| self.taken(taken))
    }

    /// The next record if one is queued.
    pub(crate) fn try_recv(&mut self) -> Result<OwnedMessage, TryRecvError> {
        self.rx.try_recv().map(|taken| self.taken(taken))
    }

    fn taken(&self, (m, size): (OwnedMessage, usize)) -> OwnedMessage {
        self.buffered.fetch_sub(size, Ordering::AcqRel);
        m
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;
    use rdkafka::message::{Header, OwnedHeaders};

    use super::*;

    fn record(value: usize, header: usize) -> OwnedMessage {
        let headers = OwnedHeaders::new().insert(Header { key: "h", value: Some(&vec![b'x'; header]) });
        OwnedMessage::new(
            Some(vec![0; value]),
            Some(b"key".to_vec()),
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(headers),
        )
    }

    #[test]
    fn a_record_counts_its_key_value_and_headers() {
        assert_eq!(record_bytes(&record(100, 10)), 3 + 100 + 1 + 10);
    }

    #[tokio::test]
    async fn the_byte_budget_refuses_a_record_that_would_exceed_it_until_the_worker_takes_one() {
        let (tx, mut rx) = partition_queue(100, 1_000);
        tx.try_send(record(600, 0)).expect("an empty queue takes a record");
        let big = match tx.try_send(record(600, 0)) {
            Err(TrySendError::Full(m)) => m,
            other => panic!("1,208 bytes > 1,000: refused as full, got {other:?}"),
        };
        tx.try_send(record(300, 0)).expect("907 bytes fit");
        assert_eq!(rx.recv().await.map(|m| m.payload().map_or(0, <[u8]>::len)), Some(600));
        tx.try_send(big).expect("room again once the worker took the first");
        assert_eq!(rx.try_recv().map(|m| m.payload().map_or(0, <[u8]>::len)), Ok(300));
        assert_eq!(rx.try_recv().map(|m| m.payload().map_or(0, <[u8]>::len)), Ok(600));
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_record_larger_than_the_budget_goes_alone() {
        let (tx, mut rx) = partition_queue(100, 1_000);
        tx.try_send(record(5_000, 0)).expect("an empty queue takes any one record");
        assert!(matches!(tx.try_send(record(1, 0)), Err(TrySendError::Full(_))), "nothing beside it");
        rx.recv().await.expect("the large record");
        tx.try_send(record(1, 0)).expect("the queue is empty again");
    }

    #[tokio::test]
    async fn the_record_bound_still_holds() {
        let (tx, _rx) = partition_queue(2, 1 << 20);
        tx.try_send(record(1, 0)).expect("first");
        tx.try_send(record(1, 0)).expect("second");
        assert!(matches!(tx.try_send(record(1, 0)), Err(TrySendError::Full(_))));
    }
}

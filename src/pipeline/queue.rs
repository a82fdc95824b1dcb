//! A partition's queue of records for its worker: librdkafka's own queue for the partition,
//! split from the consumer's (see `consumer`), and, for records that came through the
//! consumer's queue instead, a channel bounded in records and in bytes.
//!
//! Why the split: the worker takes records only when it has room, so librdkafka stops
//! fetching a partition by itself once its queue holds `queued.min.messages` records or
//! `queued.max.messages.kbytes` (dedupd sets both from `pipeline.batch_size` and
//! `pipeline.partition_buffer_bytes`). Pausing a partition for backpressure instead makes
//! librdkafka drop what it had prefetched for it and fetch it again on resume: a backlog
//! drain read every record from the broker about four times over
//! (docs/performance-notes.md, "Split partition queues").
//!
//! Why bytes too in the channel: a bound in records alone lets a partition of 1 MiB
//! commands buffer `batch_size × 4` of them (8,000 by default: 8 GiB). The channel counts
//! each record's key, value and header bytes while it waits; a record that would take it
//! past its byte budget is refused as if it were full, so the poll thread holds it and
//! pauses the partition (see `partitions`). An empty channel takes any one record, whatever
//! its size, so a record larger than the budget still goes through, alone.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::mpsc::error::{TryRecvError, TrySendError};
use tokio::sync::{Notify, mpsc};

use crate::envelope::header_bytes;

/// The bytes a record holds while it waits: its key, value and headers.
pub(super) fn record_bytes(m: &OwnedMessage) -> usize {
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len) + m.headers().map_or(0, header_bytes)
}

/// A queue of at most `records` records and, past its first, `bytes` bytes.
pub(super) fn partition_queue(records: usize, bytes: usize) -> (QueueSender, QueueReceiver) {
    let (tx, rx) = mpsc::channel(records.max(1));
    let buffered = Arc::new(AtomicUsize::new(0));
    (QueueSender { tx, buffered: Arc::clone(&buffered), budget: bytes }, QueueReceiver { rx, buffered, split: None })
}

/// How long a worker waiting on its split queue sleeps at most before looking again, in
/// case a wake-up was missed: librdkafka calls back only when the queue turns non-empty.
const SPLIT_RECHECK: Duration = Duration::from_millis(100);

/// Records librdkafka fetched into a partition's own queue.
pub(crate) trait Prefetched: Send + Sync {
    /// The next fetched record, without waiting.
    fn take(&self) -> Option<OwnedMessage>;
}

/// A partition's split queue and the wake-up librdkafka sends when it turns non-empty.
pub(crate) struct SplitQueue {
    pub(crate) records: Box<dyn Prefetched>,
    pub(crate) ready: Arc<Notify>,
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

/// The worker's end: the channel first (records that came through the consumer's queue
/// are older than any in the split queue), then the split queue.
pub(crate) struct QueueReceiver {
    rx: mpsc::Receiver<(OwnedMessage, usize)>,
    buffered: Arc<AtomicUsize>,
    split: Option<SplitQueue>,
}

impl fmt::Debug for QueueReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueReceiver").field("split", &self.split.is_some()).finish_non_exhaustive()
    }
}

impl QueueReceiver {
    /// Takes records from `split` too, once the channel has none.
    pub(super) fn with_split(mut self, split: Option<SplitQueue>) -> Self {
        self.split = split;
        self
    }

    /// The next record; `None` once the sender is gone and the channel is empty.
    pub(crate) async fn recv(&mut self) -> Option<OwnedMessage> {
        loop {
            match self.try_recv() {
                Ok(m) => return Some(m),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {}
            }
            let Some(ready) = self.split.as_ref().map(|s| Arc::clone(&s.ready)) else {
                return self.rx.recv().await.map(|taken| self.taken(taken));
            };
            let from_channel = tokio::select! {
                taken = self.rx.recv() => Some(taken),
                () = ready.notified() => None,
                () = tokio::time::sleep(SPLIT_RECHECK) => None,
            };
            if let Some(taken) = from_channel {
                return taken.map(|taken| self.taken(taken));
            }
        }
    }

    /// The next record if one is queued.
    pub(crate) fn try_recv(&mut self) -> Result<OwnedMessage, TryRecvError> {
        match self.rx.try_recv() {
            Ok(taken) => Ok(self.taken(taken)),
            Err(TryRecvError::Empty) => self.split.as_ref().and_then(|s| s.records.take()).ok_or(TryRecvError::Empty),
            Err(TryRecvError::Disconnected) => Err(TryRecvError::Disconnected),
        }
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

    /// A split queue that librdkafka fills: records pushed here, with its wake-up.
    #[derive(Default)]
    struct FakeSplit(parking_lot::Mutex<std::collections::VecDeque<OwnedMessage>>);

    impl Prefetched for Arc<FakeSplit> {
        fn take(&self) -> Option<OwnedMessage> {
            self.0.lock().pop_front()
        }
    }

    fn split_receiver(records: usize) -> (QueueSender, QueueReceiver, Arc<FakeSplit>, Arc<Notify>) {
        let (tx, rx) = partition_queue(records, 1 << 20);
        let fetched = Arc::new(FakeSplit::default());
        let ready = Arc::new(Notify::new());
        let split = SplitQueue { records: Box::new(Arc::clone(&fetched)), ready: Arc::clone(&ready) };
        (tx, rx.with_split(Some(split)), fetched, ready)
    }

    fn size_of(m: &OwnedMessage) -> usize {
        m.payload().map_or(0, <[u8]>::len)
    }

    #[tokio::test]
    async fn records_from_the_channel_come_before_the_split_queue() {
        let (tx, mut rx, fetched, _ready) = split_receiver(10);
        fetched.0.lock().push_back(record(2, 0));
        tx.try_send(record(1, 0)).expect("room");
        assert_eq!(rx.recv().await.map(|m| size_of(&m)), Some(1), "the channel's (older) record first");
        assert_eq!(rx.try_recv().map(|m| size_of(&m)), Ok(2));
        assert_eq!(rx.try_recv().map(|m| size_of(&m)), Err(TryRecvError::Empty));
    }

    #[tokio::test]
    async fn a_waiting_worker_wakes_when_the_split_queue_turns_non_empty() {
        let (_tx, mut rx, fetched, ready) = split_receiver(10);
        let waiting = tokio::spawn(async move { rx.recv().await.map(|m| size_of(&m)) });
        tokio::task::yield_now().await;
        fetched.0.lock().push_back(record(7, 0));
        ready.notify_one();
        let got = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("woken").expect("task");
        assert_eq!(got, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_missed_wake_up_costs_one_recheck_not_a_stall() {
        let (_tx, mut rx, fetched, _ready) = split_receiver(10);
        let waiting = tokio::spawn(async move { rx.recv().await.map(|m| size_of(&m)) });
        tokio::task::yield_now().await;
        // No notification: librdkafka's callback was missed.
        fetched.0.lock().push_back(record(3, 0));
        let got = tokio::time::timeout(SPLIT_RECHECK * 2, waiting).await.expect("found by the recheck").expect("task");
        assert_eq!(got, Some(3));
    }

    #[tokio::test]
    async fn a_stopped_worker_gets_none_even_with_records_split() {
        let (tx, mut rx, fetched, _ready) = split_receiver(10);
        fetched.0.lock().push_back(record(1, 0));
        drop(tx);
        assert_eq!(rx.recv().await.map(|m| size_of(&m)), None, "records not taken come again to the next owner");
    }
}

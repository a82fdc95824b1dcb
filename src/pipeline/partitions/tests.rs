//! Tests of `pipeline::partitions`.

use std::sync::Arc;

use rdkafka::Timestamp;
use rdkafka::message::Message;

use super::fake::FakeFetching;
use super::*;
use crate::pipeline::queue::{QueueReceiver, partition_queue};

fn tp(partition: i32) -> Tp {
    ("in".to_string(), partition)
}

fn record(tp: &Tp, offset: i64) -> OwnedMessage {
    OwnedMessage::new(None, None, tp.0.clone(), Timestamp::NotAvailable, tp.1, offset, None)
}

/// A worker whose queue takes `room` records; the test plays the worker through `rx`.
fn worker(room: usize) -> (WorkerHandle, QueueReceiver) {
    let (tx, rx) = partition_queue(room, usize::MAX);
    (
        WorkerHandle { tx, cancel: CancellationToken::new(), join: tokio::spawn(async {}), tenure: Default::default() },
        rx,
    )
}

/// Dispatches `offset` of `tp`, starting a worker with one record of room if needed.
fn dispatch(
    table: &PartitionTable,
    kafka: &FakeFetching,
    tp: &Tp,
    offset: i64,
    rx: &mut Option<QueueReceiver>,
) -> Dispatched {
    table.dispatch(kafka, tp, record(tp, offset), |_, _| {
        let (handle, r) = worker(1);
        *rx = Some(r);
        handle
    })
}

#[tokio::test]
async fn a_full_queue_holds_records_in_order_and_pauses_until_they_are_released() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    let mut rx = None;
    assert_eq!(dispatch(&table, &kafka, &a, 0, &mut rx), Dispatched::Queued);
    assert_eq!(dispatch(&table, &kafka, &a, 1, &mut rx), Dispatched::Held);
    assert_eq!(dispatch(&table, &kafka, &a, 2, &mut rx), Dispatched::Held);
    assert!(kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::HeldForFullQueue));
    let mut rx = rx.expect("the first record started a worker");

    assert!(table.release_held(&kafka), "the queue is still full");
    let mut seen = vec![rx.recv().await.expect("queued").offset()];
    assert!(table.release_held(&kafka), "room for one of two held records");
    assert!(kafka.is_paused(&a));
    seen.push(rx.recv().await.expect("released").offset());
    assert!(!table.release_held(&kafka), "the last held record fits");
    seen.push(rx.recv().await.expect("released").offset());
    assert_eq!(seen, [0, 1, 2]);
    assert!(!kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Ok(()));
}

/// A worker queue of room for 100 records but only 1,000 bytes: large records are held and
/// the partition paused long before the count bound.
#[tokio::test]
async fn records_past_the_byte_budget_are_held_and_the_partition_paused() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    let large =
        |offset| OwnedMessage::new(Some(vec![0; 600]), None, a.0.clone(), Timestamp::NotAvailable, a.1, offset, None);
    let mut rx = None;
    let start = |_: &Tp, _| {
        let (tx, r) = partition_queue(100, 1_000);
        rx = Some(r);
        WorkerHandle { tx, cancel: CancellationToken::new(), join: tokio::spawn(async {}), tenure: Default::default() }
    };
    assert_eq!(table.dispatch(&kafka, &a, large(0), start), Dispatched::Queued);
    assert_eq!(table.dispatch(&kafka, &a, large(1), |_, _| unreachable!("a worker runs")), Dispatched::Held);
    assert!(kafka.is_paused(&a), "1,200 bytes would exceed the budget: paused");
    let mut rx = rx.expect("worker");
    assert!(table.release_held(&kafka), "still no room");
    assert_eq!(rx.recv().await.map(|m| m.offset()), Some(0));
    assert!(!table.release_held(&kafka), "room once the worker took the first");
    assert!(!kafka.is_paused(&a));
    assert_eq!(rx.recv().await.map(|m| m.offset()), Some(1));
}

#[tokio::test]
async fn a_partition_resumes_only_when_neither_circuit_nor_held_records_stop_it() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    let mut rx = None;
    dispatch(&table, &kafka, &a, 0, &mut rx);
    dispatch(&table, &kafka, &a, 1, &mut rx);
    let mut rx = rx.expect("worker");
    table.pause_for_circuit(&kafka, &a, &["http"]);
    rx.recv().await.expect("queued");

    // Released while the circuit is open: still paused.
    assert!(!table.release_held(&kafka));
    assert!(kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::PausedForCircuit));
    table.resume_after_circuit(&kafka, &a);
    assert!(!kafka.is_paused(&a));

    // The circuit closes while records are held: resumed only once they are released.
    rx.recv().await.expect("released");
    dispatch(&table, &kafka, &a, 2, &mut None);
    dispatch(&table, &kafka, &a, 3, &mut None);
    table.pause_for_circuit(&kafka, &a, &["http"]);
    table.resume_after_circuit(&kafka, &a);
    assert!(kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::HeldForFullQueue));
    rx.recv().await.expect("queued");
    assert!(!table.release_held(&kafka));
    assert!(!kafka.is_paused(&a));
}

#[tokio::test]
async fn a_refused_partition_takes_no_records_and_is_never_resumed() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    table.refuse(&kafka, &a);
    assert_eq!(table.refused_count(), 1);
    assert_eq!(dispatch(&table, &kafka, &a, 0, &mut None), Dispatched::NotOurs);
    table.pause_for_circuit(&kafka, &a, &["http"]);
    table.resume_after_circuit(&kafka, &a);
    assert!(kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::Refused));
}

#[tokio::test]
async fn an_unchecked_partition_takes_no_records_until_checked() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    table.mark_unchecked(&kafka, std::slice::from_ref(&a));
    assert_eq!(table.unchecked(), std::slice::from_ref(&a));
    assert_eq!(dispatch(&table, &kafka, &a, 0, &mut None), Dispatched::NotOurs);
    table.pause_for_circuit(&kafka, &a, &["http"]);
    table.resume_after_circuit(&kafka, &a);
    assert!(kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::Unchecked));

    table.checked(&kafka, &a);
    assert!(table.unchecked().is_empty());
    assert!(!kafka.is_paused(&a));
    assert_eq!(dispatch(&table, &kafka, &a, 0, &mut None), Dispatched::Queued);
}

#[tokio::test]
async fn an_unassigned_partition_takes_no_records_and_no_circuit_pause() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    assert_eq!(dispatch(&table, &kafka, &a, 0, &mut None), Dispatched::NotOurs);
    table.pause_for_circuit(&kafka, &a, &["http"]);
    assert!(!kafka.is_paused(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::NotAssigned));
}

#[tokio::test]
async fn a_revoke_drops_held_records_takes_the_worker_and_forgets_the_partition() {
    let (table, kafka) = (PartitionTable::default(), FakeFetching::default());
    let (a, b) = (tp(0), tp(1));
    table.assign(&kafka, &[a.clone(), b.clone()], &[]);
    table.refuse(&kafka, &b);
    let mut rx = None;
    dispatch(&table, &kafka, &a, 0, &mut rx);
    dispatch(&table, &kafka, &a, 1, &mut rx);
    table.pause_for_circuit(&kafka, &a, &["http"]);

    let revoked = std::slice::from_ref(&a);
    table.drop_held_and_pauses(revoked);
    assert_eq!(table.may_run(&a), Ok(()), "nothing stops it but the revoke itself");
    assert!(kafka.is_paused(&a), "a revoked partition is not resumed");
    let workers = table.take_workers(revoked);
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].0, a);
    assert!(!table.release_held(&kafka));
    assert_eq!(table.forget(revoked), 1, "b stays refused");
    assert_eq!(table.may_run(&a), Err(Stopped::NotAssigned));
    assert_eq!(table.assigned(), HashSet::from([b]));
    assert_eq!(dispatch(&table, &kafka, &a, 2, &mut None), Dispatched::NotOurs);
}

#[tokio::test]
async fn a_record_for_a_stopped_worker_is_dropped() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    let mut rx = None;
    dispatch(&table, &kafka, &a, 0, &mut rx);
    drop(rx);
    assert_eq!(dispatch(&table, &kafka, &a, 1, &mut None), Dispatched::WorkerGone);
    assert_eq!(table.take_all_workers().len(), 1);
}

/// A split queue with nothing fetched; `alive` counts the table's copy while it keeps one.
struct EmptySplit(#[allow(dead_code)] Arc<()>);

impl crate::pipeline::queue::Prefetched for EmptySplit {
    fn take(&self) -> Option<OwnedMessage> {
        None
    }
}

fn split_of(alive: &Arc<()>) -> SplitQueue {
    SplitQueue { records: Box::new(EmptySplit(Arc::clone(alive))), ready: Arc::new(tokio::sync::Notify::new()) }
}

/// Starts the split workers of `table`, returning the partitions started and whether each
/// got its split queue; the test plays the workers through `running`.
fn start_split(table: &PartitionTable, running: &mut Vec<QueueReceiver>) -> Vec<(Tp, bool)> {
    let mut started = Vec::new();
    table.start_split_workers(|tp, split| {
        started.push((tp.clone(), split.is_some()));
        let (handle, rx) = worker(1);
        running.push(rx.with_split(split));
        handle
    });
    started
}

/// A table holding partition 0's split queue (kept `alive`), assigned and then refused.
fn refused_with_split(alive: &Arc<()>) -> (PartitionTable, Tp) {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    table.add_splits(vec![(a.clone(), split_of(alive))]);
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    table.refuse(&kafka, &a);
    (table, a)
}

#[tokio::test]
async fn a_split_partition_starts_its_worker_with_its_queue_once_it_may_run() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    let (alive, mut running) = (Arc::new(()), Vec::new());
    table.add_splits(vec![(a.clone(), split_of(&alive))]);
    assert!(start_split(&table, &mut running).is_empty(), "split before the assignment takes effect: not assigned yet");
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    table.mark_unchecked(&kafka, std::slice::from_ref(&a));
    assert!(start_split(&table, &mut running).is_empty(), "never read unchecked");
    table.checked(&kafka, &a);
    assert_eq!(start_split(&table, &mut running), vec![(a.clone(), true)]);
    assert_eq!(Arc::strong_count(&alive), 2, "the worker holds the split queue now");
    assert!(start_split(&table, &mut running).is_empty(), "one worker per partition");
}

#[tokio::test]
async fn a_refused_partition_never_reads_its_split_queue_and_forgetting_it_lets_go() {
    let (alive, mut running) = (Arc::new(()), Vec::new());
    let (table, a) = refused_with_split(&alive);
    assert!(start_split(&table, &mut running).is_empty());
    table.forget(std::slice::from_ref(&a));
    assert_eq!(Arc::strong_count(&alive), 1, "the split queue (which holds the consumer) is dropped");
}

#[tokio::test]
async fn shutdown_drops_split_queues_that_never_started_a_worker() {
    let alive = Arc::new(());
    let (table, _) = refused_with_split(&alive);
    assert!(table.take_all_workers().is_empty());
    assert_eq!(Arc::strong_count(&alive), 1, "else the consumer could never close");
}

#[tokio::test]
async fn a_record_from_the_consumer_queue_starts_the_worker_with_the_split_queue() {
    let (table, kafka, a) = (PartitionTable::default(), FakeFetching::default(), tp(0));
    let (alive, mut running) = (Arc::new(()), Vec::new());
    table.add_splits(vec![(a.clone(), split_of(&alive))]);
    table.assign(&kafka, std::slice::from_ref(&a), &[]);
    let mut got_split = None;
    let dispatched = table.dispatch(&kafka, &a, record(&a, 0), |_, split| {
        got_split = Some(split.is_some());
        let (handle, rx) = worker(1);
        running.push(rx.with_split(split));
        handle
    });
    assert_eq!(dispatched, Dispatched::Queued);
    assert_eq!(got_split, Some(true), "one worker reads both, the channel first");
    assert!(start_split(&table, &mut running).is_empty());
}

#[test]
fn the_status_view_names_each_partition_with_what_stops_it() {
    use crate::ops::PartitionsView;
    let (table, kafka) = (PartitionTable::default(), FakeFetching::default());
    let (a, b, c, d) = (tp(0), tp(1), tp(2), tp(3));
    table.assign(&kafka, &[a.clone(), b.clone(), c.clone(), d.clone()], &[]);
    table.refuse(&kafka, &b);
    table.pause_for_circuit(&kafka, &c, &["http"]);
    table.mark_unchecked(&kafka, std::slice::from_ref(&d));
    let mut view = table.partitions();
    view.sort();
    assert_eq!(
        view,
        vec![
            ("in/0".to_string(), None),
            ("in/1".to_string(), Some("refused")),
            ("in/2".to_string(), Some("paused_for_circuit")),
            ("in/3".to_string(), Some("unchecked")),
        ]
    );
}

#[tokio::test]
async fn a_restoring_partition_stays_paused_and_takes_no_record_until_restored() {
    let kafka = FakeFetching::default();
    let table = PartitionTable::default();
    let (a, b) = (tp(0), tp(1));
    table.assign(&kafka, &[a.clone(), b.clone()], std::slice::from_ref(&a));
    assert_eq!(table.may_run(&a), Err(Stopped::Restoring));
    assert!(kafka.is_paused(&a), "a restoring partition is not fetched");
    assert_eq!(table.may_run(&b), Ok(()), "the other runs meanwhile");
    let dispatched = table.dispatch(&kafka, &a, record(&a, 0), |_, _| unreachable!("no worker while restoring"));
    assert_eq!(dispatched, Dispatched::NotOurs);

    table.restored(&kafka, std::slice::from_ref(&a));
    assert_eq!(table.may_run(&a), Ok(()));
    assert!(!kafka.is_paused(&a), "fetched once restored");
    // A restore that ends after its partition was let go changes nothing.
    table.forget(std::slice::from_ref(&b));
    table.restored(&kafka, std::slice::from_ref(&b));
    assert_eq!(table.may_run(&b), Err(Stopped::NotAssigned));
}

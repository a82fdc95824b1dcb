//! Tests of `pipeline::consumer`.

use rdkafka::Timestamp;
use rdkafka::message::OwnedMessage;
use tokio_util::sync::CancellationToken;

use super::settings::bound_prefetch;
use super::*;
use crate::pipeline::KafkaConfig;
use crate::pipeline::partitions::Dispatched;
use crate::pipeline::partitions::fake::FakeFetching;
use crate::pipeline::queue::partition_queue;
use crate::store::{StoreBackend, SyncMode};

fn context(dir: &std::path::Path) -> PipelineContext {
    let store = KeyStore::open(StoreBackend::ALL[0], dir, SyncMode::Batch).expect("store");
    PipelineContext {
        partitions: std::sync::Arc::new(PartitionTable::default()),
        runtime: tokio::runtime::Handle::current(),
        store: Arc::new(store),
        metrics: Arc::new(Metrics::new().expect("metrics")),
        health: Arc::new(Health::default()),
        accept_empty_store: false,
        restorer: None,
        changes: None,
        restores: Default::default(),
        check_retry: Mutex::new(None),
        unfetched_lag_due: Mutex::new(Instant::now()),
        session: Mutex::new(Session::default()),
        consumer: OnceLock::new(),
        transactions: None,
        fatal: CancellationToken::new(),
    }
}

/// Dispatches a record of `tp` to a worker that is never run.
fn dispatch(ctx: &PipelineContext, fetch: &FakeFetching, tp: &Tp) -> Dispatched {
    let record = OwnedMessage::new(None, None, tp.0.clone(), Timestamp::NotAvailable, tp.1, 0, None);
    ctx.partitions.dispatch(fetch, tp, record, |_, _| {
        let (tx, _rx) = partition_queue(8, usize::MAX);
        WorkerHandle { tx, cancel: CancellationToken::new(), join: tokio::spawn(async {}), tenure: Default::default() }
    })
}

#[tokio::test]
async fn committed_offsets_that_cannot_be_read_keep_the_partition_paused_until_a_retry_reads_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ctx, kafka) = (context(dir.path()), FakeFetching::default());
    let tp: Tp = ("in".to_string(), 0);
    let parts = std::slice::from_ref(&tp);
    ctx.partitions.assign(&kafka, parts, &[]);
    ctx.health.set_joined(true);

    ctx.check_watermarks(
        &kafka,
        parts,
        Err(KafkaError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure)),
    );
    assert!(kafka.is_paused(&tp), "not fetched while unchecked");
    assert_eq!(dispatch(&ctx, &kafka, &tp), Dispatched::NotOurs, "never processed unchecked");
    assert!(!ctx.health.is_ready());
    assert_eq!(ctx.health.down().len(), 1);
    let due = ctx.check_retry.lock().as_ref().map(|r| r.due).expect("a retry is scheduled");
    assert!(due > Instant::now());

    // A second failure backs off further.
    ctx.check_watermarks(
        &kafka,
        parts,
        Err(KafkaError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure)),
    );
    let later = ctx.check_retry.lock().as_ref().map(|r| r.due).expect("still scheduled");
    assert!(later > due);

    // The retry reads them (nothing committed yet): the partition runs.
    ctx.check_watermarks(&kafka, parts, Ok(vec![(tp.clone(), Offset::Invalid)]));
    assert!(!kafka.is_paused(&tp));
    assert!(ctx.check_retry.lock().is_none());
    assert!(ctx.health.is_ready());
    // Handed to a worker (the test's worker is gone at once, hence not `Queued`).
    assert_ne!(dispatch(&ctx, &kafka, &tp), Dispatched::NotOurs);
}

#[tokio::test]
async fn a_retry_that_finds_the_store_behind_refuses_the_partition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ctx, kafka) = (context(dir.path()), FakeFetching::default());
    let tp: Tp = ("in".to_string(), 0);
    let parts = std::slice::from_ref(&tp);
    ctx.partitions.assign(&kafka, parts, &[]);
    ctx.check_watermarks(
        &kafka,
        parts,
        Err(KafkaError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::RequestTimedOut)),
    );
    ctx.check_watermarks(&kafka, parts, Ok(vec![(tp.clone(), Offset::Offset(42))]));
    assert!(kafka.is_paused(&tp), "a refused partition stays paused");
    assert_eq!(ctx.partitions.refused_count(), 1);
    assert_eq!(dispatch(&ctx, &kafka, &tp), Dispatched::NotOurs);
}

#[tokio::test(start_paused = true)]
async fn workers_drain_all_at_once_within_one_bound() {
    let bound = Duration::from_secs(30);
    let started = tokio::time::Instant::now();
    // Three partitions whose batches take 20 s each to settle: one after another they would
    // need 60 s, past the bound.
    let slow = |p: i32| (("in".to_string(), p), tokio::spawn(tokio::time::sleep(Duration::from_secs(20))));
    let late = drain_all((0..3).map(slow).collect(), bound).await;
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(20));
    // One that never settles costs the bound once, not once per partition.
    let started = tokio::time::Instant::now();
    let stuck = tokio::spawn(std::future::pending::<()>());
    let joins = vec![(("in".to_string(), 0), stuck), slow(1), slow(2)];
    let late = drain_all(joins, bound).await;
    assert_eq!(late, vec![("in".to_string(), 0)]);
    assert_eq!(started.elapsed(), bound);
}

#[test]
fn prefetch_is_bounded_per_partition_by_the_pipeline_unless_kafka_consumer_sets_it() {
    let mut kafka = KafkaConfig::default();
    let mut c = consumer_config(&kafka).expect("config");
    bound_prefetch(&mut c, &kafka, 2_000, 16 << 20);
    assert_eq!(c.get("queued.min.messages"), Some("2000"));
    assert_eq!(c.get("queued.max.messages.kbytes"), Some("16384"));

    kafka.consumer.insert("queued.min.messages".into(), "50".into());
    kafka.consumer.insert("queued.max.messages.kbytes".into(), "1024".into());
    let mut c = consumer_config(&kafka).expect("config");
    bound_prefetch(&mut c, &kafka, 2_000, 100);
    assert_eq!(c.get("queued.min.messages"), Some("50"), "the operator's value stands");
    assert_eq!(c.get("queued.max.messages.kbytes"), Some("1024"));

    let mut c = consumer_config(&KafkaConfig::default()).expect("config");
    bound_prefetch(&mut c, &KafkaConfig::default(), 1, 100);
    assert_eq!(c.get("queued.max.messages.kbytes"), Some("1"), "librdkafka's least, not 0");
}

//! Claims only for work that can start (src/engine/ticket.rs): a command's claim is written
//! once it holds what its first sink call needs (a `max_in_flight` permit, the sink's
//! circuit and limits). Six partitions backed up behind `max_in_flight = 4` and a sink whose
//! calls hang: four claims are out, one per running call, where each partition's round used
//! to claim its four keys before it waited for a permit (24 claims out, 20 of them for calls
//! that could not start: `indeterminate` keys after a crash, for a sink that does not forward
//! the key). The same holds with the slots left at their default of 4096 and the sink bounded
//! by its own `limits.max_concurrency = 4` instead, which is what lets the default be 4096
//! beside such a sink (docs/decisions.md, "Slots by sink").

use crate::common;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::engine::{ManualClock, poll_until, router, spawn_partition_batches, test_retry};
use dedupd::engine::{Engine, EngineParts, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::sinks::limit::SinkLimits;
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{KeyStore, StoreBackend, SyncMode};
use parking_lot::Mutex;
use tokio::sync::watch;

const PARTITIONS: usize = 6;
const KEYS_PER_PARTITION: usize = 12;
/// The calls that can run at once: the slots, or the sink's own `max_concurrency`.
const CALLS: usize = 4;

/// What bounds the calls at once.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// `max_in_flight = CALLS`, the sink without limits.
    Slots,
    /// `max_in_flight = 4096` (the default beside bounded sinks), the sink's own
    /// `max_concurrency = CALLS`.
    SinkConcurrency,
}

/// A sink whose calls wait until the gate opens; counts calls running and records keys
/// (`started` as calls begin, `keys` as they end).
struct GatedSink {
    gate: watch::Receiver<bool>,
    running: AtomicUsize,
    most_running: AtomicUsize,
    started: Mutex<Vec<String>>,
    keys: Mutex<Vec<String>>,
}

impl GatedSink {
    /// How many partitions (`p{p}-k{i}` keys) have a call running or done.
    fn partitions_called(&self) -> usize {
        let mut partitions: Vec<String> =
            self.started.lock().iter().filter_map(|k| k.split_once('-').map(|(p, _)| p.to_string())).collect();
        partitions.sort();
        partitions.dedup();
        partitions.len()
    }
}

#[async_trait::async_trait]
impl SinkEffect for GatedSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        self.started.lock().push(request.key().to_string());
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(now, Ordering::SeqCst);
        let mut gate = self.gate.clone();
        // The sender lives until the test ends: an error means the test is over anyway.
        let _ = gate.wait_for(|open| *open).await;
        self.keys.lock().push(request.key().to_string());
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(serde_json::json!({}))
    }
}

async fn claims_wait_for_the_calls_that_can_start(backend: StoreBackend, bound: Bound) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store"));
    let (open, gate) = watch::channel(false);
    let sink = Arc::new(GatedSink {
        gate,
        running: AtomicUsize::new(0),
        most_running: AtomicUsize::new(0),
        started: Mutex::new(Vec::new()),
        keys: Mutex::new(Vec::new()),
    });
    // Does not forward the key: the sink whose unstarted claims a crash turns indeterminate.
    let (max_in_flight, limits) = match bound {
        Bound::Slots => (CALLS, SinkLimits::default()),
        Bound::SinkConcurrency => {
            (4096, SinkLimits { max_concurrency: NonZeroUsize::new(CALLS), ..Default::default() })
        }
    };
    let sinks = HashMap::from([("s".to_string(), Arc::new(Sink::new("s", false, sink.clone()).with_limits(&limits)))]);
    let engine = Arc::new(
        Engine::new(EngineParts {
            store: Arc::clone(&store),
            router: Arc::new(router(Duration::from_secs(3600))),
            sinks,
            max_in_flight,
            retry: test_retry(),
            stale_guard: true,
            clock: Arc::new(ManualClock::new(1_000_000)),
        })
        .expect("engine"),
    );
    let batches = spawn_partition_batches(&engine, PARTITIONS, KEYS_PER_PARTITION);

    // Every permit is at a call, and every partition without one has started its first
    // round: it waits for a ticket with only the head it waits for marked in flight (a
    // round decides no head past the first that finds no ticket).
    assert!(poll_until(Duration::from_secs(10), || sink.running.load(Ordering::SeqCst) == CALLS).await);
    let waiting = || PARTITIONS - sink.partitions_called();
    let all_started = poll_until(Duration::from_secs(10), || engine.in_flight() == CALLS + waiting()).await;
    assert!(all_started, "{bound:?}: {} keys in flight, {} partitions waiting", engine.in_flight(), waiting());
    // Nothing more may be claimed while the calls hang. A claim made before its ticket would
    // be written within milliseconds of the marks; give it a whole second to show up.
    let more_claimed = poll_until(Duration::from_secs(1), || store.counts().in_progress > CALLS as i64).await;
    assert!(
        !more_claimed,
        "{bound:?}: {} claims out for {} calls that can run",
        store.counts().in_progress,
        sink.running.load(Ordering::SeqCst)
    );
    assert_eq!(store.counts().in_progress, CALLS as i64, "{bound:?}: one claim per running call");

    open.send_replace(true);
    for batch in batches {
        let results = batch.await.expect("batch task");
        for r in results {
            match r {
                ItemResult::Done(p) => assert_eq!(p.result.outcome, Outcome::Succeeded),
                ItemResult::Abandoned => panic!("abandoned"),
            }
        }
    }
    let mut keys = sink.keys.lock().clone();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), PARTITIONS * KEYS_PER_PARTITION, "every key ran once");
    assert_eq!(sink.keys.lock().len(), PARTITIONS * KEYS_PER_PARTITION, "and only once");
    assert!(sink.most_running.load(Ordering::SeqCst) <= CALLS, "{bound:?} holds");
    assert_eq!(store.counts().in_progress, 0, "no claim left out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_for_the_calls_that_can_start_on_every_backend() {
    for backend in StoreBackend::ALL {
        claims_wait_for_the_calls_that_can_start(*backend, Bound::Slots).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sinks_own_max_concurrency_bounds_its_claims_under_the_default_slots() {
    for backend in StoreBackend::ALL {
        claims_wait_for_the_calls_that_can_start(*backend, Bound::SinkConcurrency).await;
    }
}

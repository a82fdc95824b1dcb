//! Operator actions racing the engine: a key forgotten while its sink runs must not stop
//! the partition. The effect happened and its result is reported; the store keeps what the
//! operator asked for (the key gone), and the other keys of the round complete as usual.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::engine::{ManualClock, item, router, test_retry};
use dedupd::engine::{Engine, EngineParts, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{KeyStore, State};
use dedupd::store::{StoreBackend, SyncMode};
use tokio_util::sync::CancellationToken;

/// Succeeds, and forgets `victim` in the store while doing so (an operator's `forget --force`).
struct ForgettingSink {
    store: Arc<KeyStore>,
    victim: &'static str,
}

#[async_trait::async_trait]
impl SinkEffect for ForgettingSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        if request.key() == self.victim {
            self.store.forget(request.key()).expect("forget");
        }
        Ok(serde_json::json!({"done": request.key()}))
    }
}

#[tokio::test]
async fn a_key_forgotten_while_its_sink_runs_does_not_stop_the_batch() {
    for &backend in StoreBackend::ALL {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).unwrap());
        let clock = Arc::new(ManualClock::new(1_000_000));
        let mut sinks: HashMap<String, Arc<Sink>> = HashMap::new();
        let forgetting = Arc::new(ForgettingSink { store: store.clone(), victim: "b" });
        sinks.insert("s".into(), Arc::new(Sink::new("s", true, forgetting)));
        let engine = Engine::new(EngineParts {
            store: store.clone(),
            router: Arc::new(router(Duration::from_secs(3600))),
            sinks,
            max_in_flight: 8,
            retry: test_retry(),
            stale_guard: true,
            clock,
        })
        .unwrap();
        let ttl = Duration::from_secs(3600);
        let items =
            vec![item("a", 1, 1_000_000, ttl, 1), item("b", 1, 1_000_000, ttl, 2), item("c", 1, 1_000_000, ttl, 3)];
        let results = engine.process_batch(&items, &CancellationToken::new()).await.expect("the batch goes on");
        let outcomes: Vec<Outcome> = results
            .iter()
            .map(|r| match r {
                ItemResult::Done(p) => p.result.outcome,
                ItemResult::Abandoned => panic!("abandoned"),
            })
            .collect();
        assert_eq!(outcomes, [Outcome::Succeeded; 3], "{backend:?}");
        assert_eq!(store.get("a").unwrap().map(|r| r.state()), Some(State::Completed));
        assert_eq!(store.get("b").unwrap(), None, "{backend:?}: the operator's forget stands");
        assert_eq!(store.get("c").unwrap().map(|r| r.state()), Some(State::Completed));
        assert_eq!(store.counts().completed, 2);
        assert_eq!(store.counts().in_progress, 0);
    }
}

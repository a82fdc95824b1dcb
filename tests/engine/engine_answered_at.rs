//! A result's `completed_at` is when its own sink answered (docs/contract.md §5), and its
//! expiry counts from then (§3): not from when the slowest run of the same round ended.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{ManualClock, item, router, test_retry};
use dedupd::engine::{Engine, EngineParts, ItemResult};
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{KeyStore, Record, StoreBackend, SyncMode};
use dedupd::time::rfc3339_ms;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const START_MS: i64 = 1_000_000;
/// How long the slow call takes on the manual clock.
const SLOW_MS: i64 = 5_000;

/// Answers `quick` at once; answers `slow` only after `quick` has answered, moving the
/// clock on by [`SLOW_MS`] first, as a call that took that long would.
struct TwoSpeeds {
    clock: Arc<ManualClock>,
    quick_answered: Notify,
}

#[async_trait::async_trait]
impl SinkEffect for TwoSpeeds {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        if request.key() == "slow" {
            self.quick_answered.notified().await;
            self.clock.advance(SLOW_MS);
        } else {
            self.quick_answered.notify_one();
        }
        Ok(serde_json::json!({"done": request.key()}))
    }
}

fn completed_at(result: &ItemResult) -> Option<String> {
    match result {
        ItemResult::Done(p) => p.result.completed_at.clone(),
        ItemResult::Abandoned => None,
    }
}

#[tokio::test]
async fn each_result_is_completed_when_its_own_sink_answered() {
    for &backend in StoreBackend::ALL {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).unwrap());
        let clock = Arc::new(ManualClock::new(START_MS));
        let sink = Arc::new(TwoSpeeds { clock: clock.clone(), quick_answered: Notify::new() });
        let ttl = Duration::from_secs(3600);
        let engine = Engine::new(EngineParts {
            store: store.clone(),
            router: Arc::new(router(ttl)),
            sinks: [("s".to_string(), Arc::new(Sink::new("s", true, sink)))].into(),
            max_in_flight: 8,
            retry: test_retry(),
            stale_guard: true,
            clock,
        })
        .unwrap();
        // One round: both keys are claimed together and their calls run at once.
        let items = [item("slow", 1, START_MS, ttl, 1), item("quick", 1, START_MS, ttl, 2)];
        let results = engine.process_batch(&items, &CancellationToken::new()).await.expect("batch");

        let (quick_at, slow_at) = (START_MS, START_MS + SLOW_MS);
        assert_eq!(completed_at(&results[1]), Some(rfc3339_ms(quick_at)), "{backend}: quick's result");
        assert_eq!(completed_at(&results[0]), Some(rfc3339_ms(slow_at)), "{backend}: slow's result");
        for (key, at) in [("quick", quick_at), ("slow", slow_at)] {
            match store.get(key).unwrap() {
                Some(Record::Completed(c)) => {
                    assert_eq!(c.completed_at_ms, at, "{backend}: {key}'s stored record");
                    assert_eq!(c.expires_at_ms, at + ttl.as_millis() as i64, "{backend}: {key}'s expiry");
                }
                other => panic!("{backend}: {key} holds {other:?}"),
            }
        }
    }
}

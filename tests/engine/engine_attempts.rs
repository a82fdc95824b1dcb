//! `retry.max_attempts` bounds a command's sink calls in all (docs/contract.md §4): a run
//! that re-runs a claim a crash left (a key-forwarding sink) counts the calls made before.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{Behaviour, ScriptedSink, command, engine_with, item};
use dedupd::engine::ItemResult;
use dedupd::outcome::Outcome;
use dedupd::store::{InProgress, KeyStore, Record, SourcePos, StoreBackend, SyncMode};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_rerun_after_a_crash_spends_only_the_attempts_left() {
    for &backend in StoreBackend::ALL {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).unwrap());
        let ttl = Duration::from_secs(3600);
        // The claim a crash left after its first call: one of the two attempts the engine's
        // retry policy allows (`test_retry`) is spent.
        let left = InProgress {
            fingerprint: command("k", 1, 1_000_000, ttl).fingerprint,
            claimed_at_ms: 999_000,
            attempts: 1,
            source: SourcePos { topic: "in".into(), partition: 0, offset: 1 },
            held: None,
        };
        store.compare_and_swap("k", None, Some(&Record::InProgress(left))).unwrap().unwrap();
        let sink = Arc::new(ScriptedSink::new("s", true));
        sink.script(Behaviour::FailTransiently);
        let engine = engine_with(store.clone(), sink.as_sink(), 8);

        let results = engine.process_batch(&[item("k", 1, 1_000_000, ttl, 2)], &CancellationToken::new()).await;
        let result = match results.expect("batch").as_slice() {
            [ItemResult::Done(p)] => p.result.clone(),
            other => panic!("{backend}: {} results", other.len()),
        };
        assert_eq!(sink.calls(), 1, "{backend}: one call left after the crash");
        assert_eq!(result.outcome, Outcome::Failed, "{backend}");
        assert_eq!(result.attempts, 2, "{backend}: both calls, before and after the crash");
        let error = result.error.unwrap_or_default();
        assert!(error.starts_with("gave up after 2 attempts: "), "{backend}: {error}");
        match store.get("k").unwrap() {
            Some(Record::Completed(c)) => assert_eq!(c.attempts, 2, "{backend}: stored"),
            other => panic!("{backend}: {other:?}"),
        }
    }
}

//! The engine's durability points with a changelog (src/engine/changelog.rs): a round's
//! claims are committed before any of their sinks runs, and completions are queued in the
//! open transaction before the batch's results come back, without waiting for a commit.
//! A recording [`ChangeLog`] takes the store's captured changes at each call and logs them
//! in one sequence with the sink's calls. 12 fresh keys behind `max_in_flight = 4` (four
//! rounds) and a repeat. Every call is preceded by a proof that the instance still owns
//! its partitions, and an instance that cannot prove it (fenced) calls no sink.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{engine_with, item};
use dedupd::engine::{ChangeLog, Item, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::sinks::{Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::{CacheOf, KeyStore, Record, StoreConfig};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 12;
const MAX_IN_FLIGHT: usize = 4;

/// What happened, in order.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// Changes committed to the changelog: each key and whether its record is a claim.
    Committed(Vec<(String, Kind)>),
    /// Changes queued in the open transaction, not waited for.
    Queued(Vec<(String, Kind)>),
    /// The instance proved it still owns its state partitions.
    Proved,
    /// The sink called for a key.
    Call(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Claim,
    Completion,
    Other,
}

/// The store's changes as the changelog would get them, logged with `log`.
struct RecordingChangelog {
    store: Arc<KeyStore>,
    log: Arc<Mutex<Vec<Event>>>,
    /// Whether the instance still owns its partitions (else it was fenced).
    owned: bool,
}

impl RecordingChangelog {
    fn taken(&self) -> Vec<(String, Kind)> {
        let kind = |v: &Option<Vec<u8>>| match v.as_deref().map(Record::decode) {
            Some(Ok(Record::InProgress(_))) => Kind::Claim,
            Some(Ok(Record::Completed(_))) => Kind::Completion,
            _ => Kind::Other,
        };
        self.store.take_changes().into_iter().map(|c| (c.key.clone(), kind(&c.value))).collect()
    }
}

#[async_trait::async_trait]
impl ChangeLog for RecordingChangelog {
    async fn commit(&self) -> Result<(), String> {
        let changes = self.taken();
        self.log.lock().push(Event::Committed(changes));
        Ok(())
    }

    async fn queue(&self) -> Result<(), String> {
        let changes = self.taken();
        self.log.lock().push(Event::Queued(changes));
        Ok(())
    }

    async fn prove_owned(&self) -> Result<(), String> {
        if !self.owned {
            return Err("fenced".into());
        }
        self.log.lock().push(Event::Proved);
        Ok(())
    }
}

/// A sink that logs each call in the same sequence.
struct LoggingSink(Arc<Mutex<Vec<Event>>>);

#[async_trait::async_trait]
impl SinkEffect for LoggingSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        self.0.lock().push(Event::Call(request.key().to_string()));
        Ok(serde_json::json!({"done": request.key()}))
    }
}

/// A changelog of one partition: the store owns every key once it owns partition 0.
fn one_partition() -> CacheOf {
    CacheOf { topic: "log".into(), partitions: 1, partition_of: Box::new(|_| 0) }
}

#[tokio::test]
async fn claims_are_committed_before_their_sinks_and_completions_queued_before_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig { path: dir.path().join("store"), changelog: true, ..StoreConfig::default() };
    let (store, _) = KeyStore::open_as_cache(&config, one_partition()).expect("store");
    store.own_partitions(&[0]).expect("own");
    let store = Arc::new(store);
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::new(Sink::new("s", false, Arc::new(LoggingSink(Arc::clone(&log)))));
    let changelog = Arc::new(RecordingChangelog { store: Arc::clone(&store), log: Arc::clone(&log), owned: true });
    let engine = engine_with(Arc::clone(&store), sink, MAX_IN_FLIGHT).with_changelog(changelog);

    let ttl = Duration::from_secs(3600);
    let mut items: Vec<Item> = (0..KEYS).map(|i| item(&format!("k{i}"), 1, 1_000_000, ttl, i as i64)).collect();
    items.push(item("k0", 1, 1_000_000, ttl, KEYS as i64));
    let results = engine.process_batch(&items, &CancellationToken::new()).await.expect("batch");
    let outcomes: Vec<Outcome> = results
        .iter()
        .map(|r| match r {
            ItemResult::Done(p) => p.result.outcome,
            ItemResult::Abandoned => panic!("nothing is abandoned"),
        })
        .collect();
    let mut want = vec![Outcome::Succeeded; KEYS];
    want.push(Outcome::Duplicate);
    assert_eq!(outcomes, want);

    let log = log.lock().clone();
    let mut committed_claims = std::collections::HashSet::new();
    let mut completions_sent = std::collections::HashSet::new();
    // Proofs not yet followed by their call: each call is preceded by its own.
    let mut proofs = 0;
    for event in &log {
        match event {
            Event::Committed(changes) | Event::Queued(changes) => {
                for (key, kind) in changes {
                    match (kind, matches!(event, Event::Committed(_))) {
                        (Kind::Claim, true) => {
                            committed_claims.insert(key.clone());
                        }
                        (Kind::Claim, false) => panic!("claim of {key} only queued before its sink could run: {log:?}"),
                        (Kind::Completion, _) => {
                            completions_sent.insert(key.clone());
                        }
                        (Kind::Other, _) => panic!("unexpected change of {key}: {log:?}"),
                    }
                }
            }
            Event::Proved => proofs += 1,
            Event::Call(key) => {
                assert!(committed_claims.contains(key), "{key} called before its claim committed: {log:?}");
                assert!(proofs > 0, "{key} called without proving ownership first: {log:?}");
                proofs -= 1;
            }
        }
    }
    assert_eq!(completions_sent.len(), KEYS, "every completion went to the changelog before the results: {log:?}");
    let last_call = log.iter().rposition(|e| matches!(e, Event::Call(_))).expect("calls");
    assert!(
        log[last_call..].iter().all(|e| !matches!(e, Event::Committed(_))),
        "the last round's completions are queued, not waited for: {log:?}"
    );
    assert!(matches!(log.last(), Some(Event::Queued(c)) if !c.is_empty()), "{log:?}");
}

#[tokio::test]
async fn an_instance_that_cannot_prove_it_owns_its_partitions_calls_no_sink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig { path: dir.path().join("store"), changelog: true, ..StoreConfig::default() };
    let (store, _) = KeyStore::open_as_cache(&config, one_partition()).expect("store");
    store.own_partitions(&[0]).expect("own");
    let store = Arc::new(store);
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::new(Sink::new("s", false, Arc::new(LoggingSink(Arc::clone(&log)))));
    let changelog = Arc::new(RecordingChangelog { store: Arc::clone(&store), log: Arc::clone(&log), owned: false });
    let engine = engine_with(Arc::clone(&store), sink, MAX_IN_FLIGHT).with_changelog(changelog);

    let ttl = Duration::from_secs(3600);
    let items: Vec<Item> = (0..KEYS).map(|i| item(&format!("k{i}"), 1, 1_000_000, ttl, i as i64)).collect();
    let results = engine.process_batch(&items, &CancellationToken::new()).await;
    let log = log.lock().clone();
    assert!(log.iter().all(|e| !matches!(e, Event::Call(_))), "a fenced instance called the sink: {log:?}");
    let succeeded = results
        .iter()
        .flatten()
        .filter(|r| matches!(r, ItemResult::Done(p) if p.result.outcome == Outcome::Succeeded))
        .count();
    assert_eq!(succeeded, 0, "nothing succeeds without a call");
}

//! Driving a real sink through the engine, and the crash window (docs/contract.md §4): a claim that
//! reached the disk but was never completed, as a crash between claim and completion
//! leaves it. A "restarted" engine (fresh, over the same store) then gets the command
//! again, as Kafka would redeliver it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dedupd::engine::{Clock, Engine, EngineParts, Item, ItemResult, SystemClock};
use dedupd::envelope::{Command, Shape};
use dedupd::fingerprint::fingerprint;
use dedupd::outcome::Processed;
use dedupd::sinks::Sink;
use dedupd::store::{InProgress, KeyStore, Record, SettledBy, SourcePos};
use dedupd::store::{StoreBackend, SyncMode};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// TTL of every command here: long enough that nothing expires during a test.
pub const TTL: Duration = Duration::from_secs(3600);

/// A store in a temporary directory and an engine routing every type to `sink` (as "s").
pub struct EngineWithSink {
    pub store: Arc<KeyStore>,
    pub engine: Engine,
    _dir: tempfile::TempDir,
    offset: i64,
}

impl EngineWithSink {
    pub fn new(sink: Arc<Sink>) -> EngineWithSink {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(KeyStore::open(StoreBackend::Sled, dir.path(), SyncMode::Batch).unwrap());
        let mut sinks: HashMap<String, Arc<Sink>> = HashMap::new();
        sinks.insert("s".into(), sink);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let engine = Engine::new(EngineParts {
            store: store.clone(),
            router: Arc::new(super::engine::router(TTL)),
            sinks,
            max_in_flight: 4,
            retry: super::engine::test_retry(),
            stale_guard: true,
            clock,
        })
        .unwrap();
        EngineWithSink { store, engine, _dir: dir, offset: 0 }
    }

    /// A command of type `t` with `payload`, at the next offset of partition 0 of `in`.
    pub fn item(&mut self, key: &str, payload: Value) -> Item {
        self.offset += 1;
        let command = Command {
            key: key.into(),
            kind: "t".into(),
            fingerprint: fingerprint("t", &payload, &[]).unwrap(),
            payload,
            route: 0,
            ttl: TTL,
            created_at_ms: None,
            produced_at_ms: None,
            traceparent: None,
            tracestate: None,
            shape: Shape::Native,
            intake_client: None,
        };
        Item {
            source: SourcePos { topic: "in".into(), partition: 0, offset: self.offset },
            parsed: Ok(command),
            traceparent: None,
            tracestate: None,
            span: None,
            checked_absent: None,
        }
    }

    /// Processes one batch to the end (nothing cancels it).
    pub async fn deliver(&self, items: &[Item]) -> Vec<Processed> {
        let results =
            tokio::time::timeout(Duration::from_secs(60), self.engine.process_batch(items, &CancellationToken::new()))
                .await
                .expect("the batch finishes within the bound")
                .unwrap();
        results
            .into_iter()
            .map(|r| match r {
                ItemResult::Done(p) => *p,
                ItemResult::Abandoned => panic!("nothing cancelled the batch"),
            })
            .collect()
    }

    /// What a crash between claim and completion leaves for `item`: its claim, durable,
    /// never completed. The sink is not called.
    pub fn orphan_claim(&self, item: &Item) {
        let command = item.parsed.as_ref().unwrap();
        let claim = InProgress {
            fingerprint: command.fingerprint,
            claimed_at_ms: chrono::Utc::now().timestamp_millis(),
            attempts: 1,
            source: item.source.clone(),
            held: None,
        };
        let pending = self.store.claim(&command.key, None, claim).unwrap().expect("the key was free");
        let durable = self.store.flush_claims(vec![pending]).unwrap();
        assert_eq!(durable.len(), 1);
        assert!(matches!(self.store.get(&command.key).unwrap(), Some(Record::InProgress(_))));
    }

    /// The record the store holds for `key`.
    pub fn record(&self, key: &str) -> Option<Record> {
        self.store.get(key).unwrap()
    }

    /// What `key`'s completed record says settled it when it was in doubt (`None`: it
    /// never was), its time checked to lie between the key's claim and its completion.
    pub fn settled_by(&self, key: &str) -> Option<SettledBy> {
        let Some(Record::Completed(c)) = self.record(key) else {
            panic!("{key} is not completed: {:?}", self.record(key))
        };
        let settled = c.settled?;
        assert!(
            (c.first_seen_at_ms..=c.completed_at_ms).contains(&settled.at_ms),
            "settled at {} outside claim {} .. completion {}",
            settled.at_ms,
            c.first_seen_at_ms,
            c.completed_at_ms
        );
        Some(settled.by)
    }
}

//! Model test: the engine against a plain in-memory model of docs/contract.md §3–§4.
//!
//! For any sequence of arrivals (same key and payload, same key other payload, new keys),
//! sink successes and failures, crashes between steps, clock jumps past the TTL and
//! operator actions, every arrival ends with exactly the outcome the model predicts, and a
//! sink that does not forward the key performs at most one effect per key per TTL window.
//!
//! A crash is simulated where it can really happen: the test sink cancels the engine
//! (no further sink call can start) before or after doing its effect, or the batch's
//! result is thrown away after completion (crash before publish). The "restarted" process
//! is a fresh engine over the same store (its in-memory in-flight registry is gone), and
//! the unacknowledged input is delivered again, as Kafka would.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dedupd::engine::{Engine, EngineParts, Item, ItemResult};
use dedupd::outcome::Outcome;
use dedupd::store::{Completion, KeyStore, StoreBackend};
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

use common::engine::{Behaviour, ManualClock, ScriptedSink, test_retry};

const TTL_MS: i64 = 60_000;

#[derive(Debug, Clone)]
enum Op {
    /// One arrival in its own batch, the sink doing `behaviour` on its first call.
    Arrive { key: u8, payload: u8, old: bool, behaviour: Behaviour },
    /// Several arrivals in one batch, sinks answering normally.
    Batch(Vec<(u8, u8, bool)>),
    /// The clock moves on.
    Advance(i64),
    /// Operator `forget`.
    Forget(u8),
    /// Operator `resolve --as`.
    Resolve(u8, bool),
    /// Compaction runs.
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    let behaviour = prop_oneof![
        4 => Just(Behaviour::Succeed),
        1 => Just(Behaviour::FailPermanently),
        1 => Just(Behaviour::FailTransiently),
        1 => Just(Behaviour::CrashBeforeEffect),
        1 => Just(Behaviour::CrashAfterEffect),
        1 => Just(Behaviour::CrashAfterComplete),
    ];
    prop_oneof![
        8 => (0u8..4, 0u8..2, prop::bool::weighted(0.1), behaviour)
            .prop_map(|(key, payload, old, behaviour)| Op::Arrive { key, payload, old, behaviour }),
        3 => prop::collection::vec((0u8..4, 0u8..2, Just(false)), 1..6).prop_map(Op::Batch),
        2 => prop_oneof![Just(1_000i64), Just(TTL_MS + 1)].prop_map(Op::Advance),
        1 => (0u8..4).prop_map(Op::Forget),
        1 => (0u8..4, any::<bool>()).prop_map(|(k, s)| Op::Resolve(k, s)),
        1 => Just(Op::Compact),
    ]
}

/// What the model remembers per key.
#[derive(Debug, Clone, PartialEq)]
enum ModelRecord {
    Completed { payload: u8, expires_at: i64 },
    Indeterminate { payload: u8 },
}

#[derive(Default)]
struct Model {
    records: HashMap<u8, ModelRecord>,
    /// Effect times per key, to check the at-most-once window.
    effects: HashMap<u8, Vec<i64>>,
    /// Per key, the effect count at each operator `forget`: a forget is the operator
    /// saying "run it again", so TTL windows restart there.
    forgets: HashMap<u8, Vec<usize>>,
}

impl Model {
    fn live(&self, key: u8, now: i64) -> Option<&ModelRecord> {
        self.records.get(&key).filter(|r| !matches!(r, ModelRecord::Completed { expires_at, .. } if *expires_at <= now))
    }

    /// The outcome the model predicts for an arrival whose sink (if called) answers with
    /// `first`, after any crash and redelivery; updates the model.
    fn arrive(&mut self, key: u8, payload: u8, old: bool, first: Behaviour, forwards: bool, now: i64) -> Outcome {
        match self.live(key, now).cloned() {
            Some(ModelRecord::Completed { payload: p, .. }) if p == payload => Outcome::Duplicate,
            Some(ModelRecord::Indeterminate { payload: p }) if p == payload => Outcome::Indeterminate,
            Some(_) => Outcome::Conflict,
            None if old => Outcome::Stale,
            None => {
                let completed = |m: &mut Model| {
                    m.records.insert(key, ModelRecord::Completed { payload, expires_at: now + TTL_MS });
                };
                match first {
                    Behaviour::Succeed => {
                        self.effects.entry(key).or_default().push(now);
                        completed(self);
                        Outcome::Succeeded
                    }
                    Behaviour::FailPermanently | Behaviour::FailTransiently => {
                        completed(self);
                        Outcome::Failed
                    }
                    Behaviour::CrashAfterComplete => {
                        // Redelivered: the input that ran it is not a repeat of itself, so
                        // it publishes its own outcome again.
                        self.effects.entry(key).or_default().push(now);
                        completed(self);
                        Outcome::Succeeded
                    }
                    Behaviour::CrashBeforeEffect | Behaviour::CrashAfterEffect => {
                        if first == Behaviour::CrashAfterEffect {
                            self.effects.entry(key).or_default().push(now);
                        }
                        if forwards {
                            // Redelivered: re-run with the same key, and it succeeds.
                            self.effects.entry(key).or_default().push(now);
                            completed(self);
                            Outcome::Succeeded
                        } else {
                            self.records.insert(key, ModelRecord::Indeterminate { payload });
                            Outcome::Indeterminate
                        }
                    }
                }
            }
        }
    }
}

struct Harness {
    store: Arc<KeyStore>,
    sink: Arc<ScriptedSink>,
    clock: Arc<ManualClock>,
    engine: Engine,
    forwards: bool,
    offset: i64,
}

impl Harness {
    fn new(dir: &std::path::Path, backend: StoreBackend, forwards: bool) -> Harness {
        let store = Arc::new(KeyStore::open(backend, dir, dedupd::store::SyncMode::Batch).unwrap());
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let sink = Arc::new(ScriptedSink::new("s", forwards).with_clock(clock.clone()));
        let engine = Self::engine(&store, &sink, &clock);
        Harness { store, sink, clock, engine, forwards, offset: 0 }
    }

    fn engine(store: &Arc<KeyStore>, sink: &Arc<ScriptedSink>, clock: &Arc<ManualClock>) -> Engine {
        let mut sinks: HashMap<String, Arc<dedupd::sinks::Sink>> = HashMap::new();
        sinks.insert("s".into(), sink.as_sink());
        Engine::new(EngineParts {
            store: store.clone(),
            router: Arc::new(common::engine::router(Duration::from_millis(TTL_MS as u64))),
            sinks,
            max_in_flight: 8,
            retry: test_retry(),
            stale_guard: true,
            clock: clock.clone(),
        })
        .unwrap()
    }

    /// The process dies: all in-memory state goes, the store stays.
    fn restart(&mut self) {
        self.sink.script(Behaviour::Succeed);
        self.engine = Self::engine(&self.store, &self.sink, &self.clock);
    }

    fn item(&mut self, key: u8, payload: u8, old: bool) -> Item {
        self.offset += 1;
        let now = self.clock.now();
        let produced = if old { now - TTL_MS - 1 } else { now };
        common::engine::item(&format!("k{key}"), payload, produced, Duration::from_millis(TTL_MS as u64), self.offset)
    }

    /// Delivers `items` until every one has a published outcome, restarting after crashes.
    async fn deliver(&mut self, items: Vec<Item>) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; items.len()];
        for _round in 0..5 {
            let pending: Vec<usize> = (0..items.len()).filter(|i| outcomes[*i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let batch: Vec<Item> = pending.iter().map(|i| items[*i].clone()).collect();
            let cancel = CancellationToken::new();
            self.sink.set_cancel(cancel.clone());
            let results = self.engine.process_batch(&batch, &cancel).await.unwrap();
            let crashed = cancel.is_cancelled() || self.sink.take_crash_after_complete();
            if crashed {
                // Nothing of this batch was published: Kafka redelivers all of it.
                self.restart();
                continue;
            }
            for (i, r) in pending.iter().zip(results) {
                match r {
                    ItemResult::Done(p) => outcomes[*i] = Some(p.result.outcome),
                    ItemResult::Abandoned => {}
                }
            }
        }
        outcomes.into_iter().map(|o| o.expect("every arrival gets an outcome within 5 deliveries")).collect()
    }
}

fn run_case(ops: Vec<Op>, forwards: bool, backend: StoreBackend) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    rt.block_on(async {
        let mut h = Harness::new(dir.path(), backend, forwards);
        let mut model = Model::default();
        for op in ops {
            let now = h.clock.now();
            match op {
                Op::Arrive { key, payload, old, behaviour } => {
                    let expected = model.arrive(key, payload, old, behaviour, forwards, now);
                    h.sink.script(behaviour);
                    let item = h.item(key, payload, old);
                    let got = h.deliver(vec![item]).await;
                    prop_assert_eq!(got, vec![expected], "arrival k{} p{} {:?}", key, payload, behaviour);
                }
                Op::Batch(arrivals) => {
                    h.sink.script(Behaviour::Succeed);
                    let mut expected = Vec::new();
                    let mut items = Vec::new();
                    for (key, payload, old) in arrivals {
                        expected.push(model.arrive(key, payload, old, Behaviour::Succeed, forwards, now));
                        items.push(h.item(key, payload, old));
                    }
                    let got = h.deliver(items).await;
                    prop_assert_eq!(got, expected);
                }
                Op::Advance(ms) => h.clock.advance(ms),
                Op::Forget(key) => {
                    h.store.forget(&format!("k{key}")).unwrap();
                    model.records.remove(&key);
                    let count = model.effects.get(&key).map_or(0, Vec::len);
                    model.forgets.entry(key).or_default().push(count);
                }
                Op::Resolve(key, succeeded) => {
                    let outcome = if succeeded { Completion::Succeeded } else { Completion::Failed };
                    let r = h.store.resolve(&format!("k{key}"), outcome, now, TTL_MS);
                    match model.live(key, now).cloned() {
                        Some(ModelRecord::Indeterminate { payload }) => {
                            prop_assert!(r.is_ok(), "{:?}", r);
                            model.records.insert(key, ModelRecord::Completed { payload, expires_at: now + TTL_MS });
                        }
                        _ => prop_assert!(r.is_err(), "resolve of a non-indeterminate key must fail"),
                    }
                }
                Op::Compact => {
                    h.store.compact_expired(now, 3).unwrap();
                }
            }
        }
        // The sink saw exactly the effects the model predicts, and, for a sink that does
        // not forward the key, never two within one TTL window.
        let seen = h.sink.effects();
        for key in 0u8..4 {
            let want = model.effects.get(&key).cloned().unwrap_or_default();
            let got: Vec<i64> = seen.iter().filter(|(k, _)| *k == format!("k{key}")).map(|(_, t)| *t).collect();
            prop_assert_eq!(&got, &want, "effects of k{}", key);
            if !h.forwards {
                let forgets = model.forgets.get(&key).cloned().unwrap_or_default();
                for (i, pair) in got.windows(2).enumerate() {
                    let forgotten_between = forgets.contains(&(i + 1));
                    prop_assert!(
                        forgotten_between || pair[1] - pair[0] >= TTL_MS,
                        "k{} executed twice within the TTL: {:?}",
                        key,
                        got
                    );
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn non_forwarding_sink_on_each_backend(ops in prop::collection::vec(op(), 1..40)) {
        for &backend in StoreBackend::ALL {
            run_case(ops.clone(), false, backend).map_err(|e| naming(backend, e))?;
        }
    }

    #[test]
    fn forwarding_sink_on_each_backend(ops in prop::collection::vec(op(), 1..40)) {
        for &backend in StoreBackend::ALL {
            run_case(ops.clone(), true, backend).map_err(|e| naming(backend, e))?;
        }
    }
}

/// A failed case's message, prefixed with the backend it failed on.
fn naming(backend: StoreBackend, e: TestCaseError) -> TestCaseError {
    match e {
        TestCaseError::Fail(reason) => TestCaseError::fail(format!("[{backend}] {reason}")),
        other => other,
    }
}

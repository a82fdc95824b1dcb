//! The reconciler (docs/contract.md §4, "Keys in doubt"): every `check.interval` of a sink
//! with a check, each `indeterminate` key whose kept command went to that sink is taken up
//! again ([`Engine::reconcile`]) until its claim is `check.deadline` old: its check asks the
//! receiver, *found* settles it `succeeded`, *absent* runs the command, anything else
//! leaves it for the next pass. A settlement is published on the results topic as the
//! result of the input the key was in doubt for (`settled_by: "check"`), after the input's
//! own `indeterminate`.
//!
//! Only keys this instance owns are taken up: with `store.changelog`, those of the state
//! partitions it holds (and the engine proves the group generation before each check and
//! call); without, those whose input partition is assigned to it and not refused. The keys
//! come from the store's own index of its `indeterminate` records by sink, so a pass costs
//! one read per key in doubt, not a scan of the store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::partitions::CurrentTable;
use super::publish::Publisher;
use super::transactions::Transactions;
use crate::engine::{Engine, EngineError, Reconciled};
use crate::ops::{KeyOwner, Metrics};
use crate::sinks::CheckTiming;
use crate::store::{KeyStore, SourcePos};

/// Whose keys this instance may settle.
pub(super) enum Owner {
    /// With `store.changelog`: the holder of the key's state partition.
    State(Arc<dyn KeyOwner>),
    /// Without: the instance the input partition the key came from is assigned to.
    Input(Arc<CurrentTable>),
}

impl Owner {
    fn owns(&self, key: &str, source: &SourcePos) -> bool {
        match self {
            Owner::State(owner) => owner.check(key).is_ok(),
            Owner::Input(partitions) => partitions.runs(&(source.topic.clone(), source.partition)),
        }
    }

    /// Whether this instance's gauges count `key` in doubt: with `store.changelog`, when it
    /// holds the key's state partition (a standby copy, or a partition that moved away, is
    /// another instance's to count, and counted there); without, every key of its store,
    /// which no other instance sees.
    fn answers_for(&self, key: &str) -> bool {
        match self {
            Owner::State(owner) => owner.check(key).is_ok(),
            Owner::Input(_) => true,
        }
    }
}

/// The keys in doubt per sink that `owner`'s instance answers for ([`Owner::answers_for`]);
/// a sink whose last key was settled stays listed with 0.
fn in_doubt_answered_for(store: &KeyStore, owner: &Owner) -> BTreeMap<String, i64> {
    let mut counts = store.indeterminate_by_sink();
    if let Owner::State(_) = owner {
        for (sink, count) in &mut counts {
            let keys = store.indeterminate_keys(sink);
            *count = keys.iter().filter(|key| owner.answers_for(key)).count() as i64;
        }
    }
    counts
}

/// What the reconciler works with.
pub(super) struct Reconciler {
    pub(super) engine: Arc<Engine>,
    pub(super) publisher: Arc<Publisher>,
    /// Under `kafka.transactional_results`: a settlement goes out in the open transaction.
    pub(super) transactions: Option<Arc<Transactions>>,
    pub(super) owner: Owner,
    /// The sinks with a check, and their timing.
    pub(super) sinks: BTreeMap<String, CheckTiming>,
    /// `dedupd_indeterminate_keys_unattended`.
    pub(super) metrics: Arc<Metrics>,
    /// Each sink's unattended keys as its last pass found them.
    pub(super) unattended_by_sink: parking_lot::Mutex<BTreeMap<String, i64>>,
}

/// How a pass over one sink's keys went, for its log line.
#[derive(Debug, Default)]
struct Pass {
    settled: usize,
    unsettled: usize,
    skipped: usize,
    /// Keys no pass will take up again (`Skip::waits_for_an_operator`).
    unattended: i64,
}

/// What became of one key a pass took up.
enum TakenUp {
    Settled,
    Unsettled,
    /// Not taken up; `unattended` when no pass will take it up again.
    Skipped {
        unattended: bool,
    },
}

/// Keys a pass takes up at once. Each waits on its check's answer, a durable settlement and
/// its result's acknowledgement, one after the other; keys are independent (a key is never
/// taken up beside a batch's call of it), and the sink's own `limits` still bound its
/// checks and calls. One at a time, a pass over hundreds of keys a crash left in doubt took
/// minutes on a loaded machine.
const SETTLING_AT_ONCE: usize = 16;

/// How often `dedupd_indeterminate_keys_unattended` is refreshed between passes.
const GAUGE_EVERY: Duration = Duration::from_secs(5);

impl Reconciler {
    /// Runs until `stop`: a pass over each sink's keys in doubt every `check.interval`, and
    /// `dedupd_indeterminate_keys_unattended` kept up to date.
    pub(super) async fn run(self, stop: CancellationToken) {
        let this = Arc::new(self);
        // The gauges are refreshed beside the passes: a pass whose checks wait on a slow
        // receiver can take minutes.
        let gauges = tokio::spawn(Arc::clone(&this).report_every(stop.clone()));
        // The first pass comes one interval after the start: a key a crash left in doubt is
        // taken up by its next arrival's check first, if one comes.
        let start = Instant::now();
        let mut due: BTreeMap<&str, Instant> =
            this.sinks.iter().map(|(name, timing)| (name.as_str(), start + timing.interval)).collect();
        loop {
            let now = Instant::now();
            for (sink, at) in due.iter_mut().filter(|(_, at)| **at <= now) {
                let interval = this.sinks.get(*sink).map_or(GAUGE_EVERY, |t| t.interval);
                let unattended = this.pass(sink, &stop).await;
                this.unattended_by_sink.lock().insert((*sink).to_string(), unattended);
                this.report_doubts();
                *at = Instant::now() + interval;
            }
            let next = due.values().min().copied().unwrap_or(now + GAUGE_EVERY);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = stop.cancelled() => break,
            }
        }
        let _ = gauges.await;
    }

    /// Refreshes the gauges every [`GAUGE_EVERY`] until `stop`.
    async fn report_every(self: Arc<Self>, stop: CancellationToken) {
        loop {
            self.report_doubts();
            tokio::select! {
                () = tokio::time::sleep(GAUGE_EVERY) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Sets `dedupd_indeterminate_keys` and `dedupd_indeterminate_keys_unattended` of every
    /// sink with keys in doubt, counting the keys this instance answers for: the
    /// unattended are all of them for a sink without a check, those its last pass could not
    /// take up for one with.
    fn report_doubts(&self) {
        let unattended_by_sink = self.unattended_by_sink.lock().clone();
        for (sink, count) in in_doubt_answered_for(self.engine.store(), &self.owner) {
            self.metrics.indeterminate_keys(&sink, count);
            let unattended = match self.sinks.contains_key(&sink) {
                true => unattended_by_sink.get(&sink).copied().unwrap_or(0).min(count),
                false => count,
            };
            self.metrics.indeterminate_unattended(&sink, unattended);
        }
    }

    /// Takes up every key in doubt at `sink` this instance owns, [`SETTLING_AT_ONCE`] at a
    /// time; returns how many no pass will take up again.
    async fn pass(&self, sink: &str, stop: &CancellationToken) -> i64 {
        let keys = self.engine.store().indeterminate_keys(sink);
        if keys.is_empty() {
            return 0;
        }
        let mut pass = Pass::default();
        // A store or changelog failure ends the pass: the workers meet it too and stop the
        // process.
        let mut ended = false;
        let mut waiting = keys.iter();
        let mut settling = futures::stream::FuturesUnordered::new();
        loop {
            while settling.len() < SETTLING_AT_ONCE && !ended && !stop.is_cancelled() {
                let Some(key) = waiting.next() else { break };
                settling.push(self.settle(key, sink, stop));
            }
            let Some((key, taken_up)) = settling.next().await else { break };
            match taken_up {
                Ok(TakenUp::Settled) => pass.settled += 1,
                Ok(TakenUp::Unsettled) => pass.unsettled += 1,
                Ok(TakenUp::Skipped { unattended }) => {
                    pass.skipped += 1;
                    pass.unattended += i64::from(unattended);
                }
                Err(e) => {
                    tracing::error!(key, sink, error = %e, "reconciler: cannot settle the key; pass ended");
                    ended = true;
                }
            }
        }
        tracing::info!(
            sink,
            keys = keys.len(),
            settled = pass.settled,
            unsettled = pass.unsettled,
            skipped = pass.skipped,
            unattended = pass.unattended,
            "reconciler pass over keys in doubt"
        );
        pass.unattended
    }

    /// Takes up one key in doubt at `sink`: checked, and settled and published if the
    /// check answers.
    async fn settle<'k>(
        &self,
        key: &'k str,
        sink: &str,
        stop: &CancellationToken,
    ) -> (&'k str, Result<TakenUp, EngineError>) {
        let owns = |key: &str, source: &SourcePos| self.owner.owns(key, source);
        let taken_up = match self.engine.reconcile(key, &owns, stop).await {
            Ok(Reconciled::Settled(p)) => {
                tracing::info!(key, sink, outcome = p.result.outcome.as_str(), "key in doubt settled by its check");
                self.publish(key, &p).await;
                Ok(TakenUp::Settled)
            }
            Ok(Reconciled::Unsettled { answer, why }) => {
                tracing::debug!(key, sink, answer, why, "key still in doubt: checked again next pass");
                Ok(TakenUp::Unsettled)
            }
            Ok(Reconciled::Skipped(why)) => {
                tracing::trace!(key, sink, why = why.as_str(), "key in doubt not taken up");
                Ok(TakenUp::Skipped { unattended: why.waits_for_an_operator() && self.owner.answers_for(key) })
            }
            Err(e) if e.is_let_go() => {
                // The key's partition was let go during the pass: its new owner takes it up.
                tracing::debug!(key, sink, error = %e, "key in doubt let go with its partition");
                Ok(TakenUp::Skipped { unattended: false })
            }
            Err(e) => Err(e),
        };
        (key, taken_up)
    }

    /// Publishes a settlement; under transactional results in the open transaction. The
    /// store holds the settlement already: a result that cannot be published is logged, and
    /// the key's repeats replay it.
    async fn publish(&self, key: &str, p: &crate::outcome::Processed) {
        let member = match &self.transactions {
            Some(transactions) => match transactions.join().await {
                Ok(member) => Some(member),
                Err(e) => {
                    tracing::warn!(key, error = %e, "settlement not published: no transaction is open");
                    return;
                }
            },
            None => None,
        };
        let queued = self.publisher.queue_settlement(p).await;
        // Acknowledged once the member is let go: it is held while queueing only
        // (transactions, invariant 3).
        drop(member);
        let acked = match queued {
            Ok(ack) => tokio::time::timeout(Duration::from_secs(60), ack).await,
            Err(e) => Ok(Err(e)),
        };
        match acked {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(key, error = %e, "settlement not published; the store holds it"),
            Err(_) => tracing::warn!(key, "settlement not acknowledged within a minute; the store holds it"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::store::{Held, Indeterminate, Record, StoreBackend, SyncMode};

    /// Owns the keys that start with `mine-`.
    struct Mine;

    impl KeyOwner for Mine {
        fn check(&self, key: &str) -> Result<(), String> {
            if key.starts_with("mine-") { Ok(()) } else { Err(format!("{key} is another instance's")) }
        }
    }

    fn in_doubt(store: &KeyStore, key: &str, sink: &str) {
        let record = Record::Indeterminate(Indeterminate {
            fingerprint: Fingerprint([1; 32]),
            claimed_at_ms: 1,
            attempts: 1,
            why: "no answer".into(),
            held: Some(Box::new(Held {
                sink: sink.into(),
                route: "r".into(),
                kind: "t".into(),
                payload: b"{}".to_vec(),
                source: SourcePos::default(),
                intake_client: None,
            })),
        });
        store.compare_and_swap(key, None, Some(&record)).unwrap().unwrap();
    }

    #[test]
    fn with_the_store_on_kafka_only_the_keys_of_held_state_partitions_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(StoreBackend::Fjall, dir.path(), SyncMode::Batch).unwrap();
        for (key, sink) in [("mine-1", "pay"), ("mine-2", "pay"), ("theirs-1", "pay"), ("theirs-2", "mail")] {
            in_doubt(&store, key, sink);
        }
        let on_kafka = in_doubt_answered_for(&store, &Owner::State(Arc::new(Mine)));
        assert_eq!(
            on_kafka,
            BTreeMap::from([("mail".into(), 0), ("pay".into(), 2)]),
            "a standby copy's are its owner's"
        );
        let local = in_doubt_answered_for(&store, &Owner::Input(Arc::default()));
        assert_eq!(local, BTreeMap::from([("mail".into(), 1), ("pay".into(), 3)]), "every key of its own store");
    }
}

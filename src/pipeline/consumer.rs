//! The consumer: a `BaseConsumer` polled on a thread of its own, so that rebalance
//! callbacks (which run inside `poll`) may block until the revoked partitions' workers
//! have drained, published and stored their offsets, then commit, before letting go.
//!
//! Offsets: `enable.auto.offset.store=false`; a worker stores an offset only after the
//! results up to it are acknowledged, and auto-commit (plus a synchronous commit on revoke
//! and shutdown) commits only stored offsets.
//!
//! Records: each assigned partition's records go to a queue of its own that its worker
//! reads (see `split`); the poll thread (see `run`) serves rebalances, errors and
//! statistics, and dispatches any record that still comes through the consumer's queue.
//!
//! A consumer that librdkafka fenced after losing its own group session is replaced by a new
//! one in the same process; any other fatal consumer error stops the process (see `fence`).

use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use self::fence::Session;
use super::changelog::Restorer;
use super::control::{PartitionControl, Tp};
use super::partitions::{Fetching, PartitionTable, WorkerHandle};
use super::transactions::{BeforeCommit, Transactions};
use crate::ops::{Health, Metrics};
use crate::store::KeyStore;

mod fence;
mod lag;
mod restores;
mod run;
mod settings;
mod split;

pub(crate) use run::{ConsumerParts, spawn};

pub use settings::consumer_config;

/// How long a revoke or shutdown waits for a partition's in-flight batch.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long reading committed offsets for the store check may take.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait before the store check is retried, doubled after each failure up to
/// [`CHECK_RETRY_MAX`]: a broker that is briefly away is retried soon, one that stays away
/// costs a read and a log line at most twice a minute.
const CHECK_RETRY_FIRST: Duration = Duration::from_secs(1);
const CHECK_RETRY_MAX: Duration = Duration::from_secs(30);

/// When the store check of partitions whose committed offsets could not be read runs again.
#[derive(Debug)]
struct CheckRetry {
    due: Instant,
    wait: Duration,
    failures: u32,
}

/// State the rebalance callbacks need.
pub struct PipelineContext {
    /// Every partition's state and worker, and the rule for whether it is fetched.
    partitions: Arc<PartitionTable>,
    runtime: tokio::runtime::Handle,
    store: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    accept_empty_store: bool,
    /// Under `store.changelog`: restores each assigned state partition before it is
    /// processed, instead of refusing a partition the store does not know.
    restorer: Option<Arc<Restorer>>,
    /// Where the restores started on assignment say they ended (`restores`).
    restores: restores::Restores,
    /// Under `store.changelog`: sends the store's captured changes into the open
    /// transaction, so that a revoke's commit carries every change made up to it.
    changes: Option<Arc<dyn BeforeCommit>>,
    /// Set while some partitions await the store check (their committed offsets could not
    /// be read): they stay paused and it is retried with backoff from the poll loop.
    check_retry: Mutex<Option<CheckRetry>>,
    /// When the lag of partitions not fetched is next read (`lag`).
    unfetched_lag_due: Mutex<Instant>,
    /// Whether the group session was lost (and taken back), to judge a fence.
    session: Mutex<Session>,
    /// The consumer itself, to split partition queues from the rebalance callback (which
    /// gets only a reference); weak, as the consumer owns this context.
    consumer: OnceLock<Weak<BaseConsumer<PipelineContext>>>,
    /// Under `kafka.transactional_results`: where offsets are committed instead.
    transactions: Option<Arc<Transactions>>,
    /// Fired when the open transaction cannot commit (the process stops).
    fatal: CancellationToken,
}

impl ClientContext for PipelineContext {
    /// librdkafka's statistics (every `statistics.interval.ms`): the lag of each fetched
    /// partition (see `lag`).
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.report_fetched_lag(&statistics);
    }
}

impl ConsumerContext for PipelineContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Some(transactions) = &self.transactions
            && !matches!(rebalance, Rebalance::Error(_))
        {
            // Offsets from now on commit with the generation this callback belongs to
            // (transactions, invariant 5): the one about to end for an eager revoke,
            // the new one for an assignment and for a cooperative revoke, whose commit
            // (`end_transaction`) the broker would refuse with the one before.
            transactions.set_group(consumer.group_metadata());
        }
        // Every rebalance ends in an assignment (possibly empty) for every member, while a
        // revoke comes only before some of them: counting assignments counts rebalances
        // once each, not twice when partitions move.
        if let Rebalance::Assign(tpl) = rebalance {
            self.metrics.rebalance();
            // Before the assignment takes effect, so nothing is fetched into the consumer's
            // queue first (see `split`).
            if let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) {
                self.partitions.add_splits(split::split_queues(&consumer, &partitions_of(tpl)));
            }
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            self.revoke(consumer, &partitions_of(tpl));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let parts = partitions_of(tpl);
            tracing::info!(partitions = ?parts, "partitions assigned");
            // Nothing is held for a newly assigned partition: this undoes any backpressure
            // pause from before a revoke (the watermark check pauses refused ones again).
            // Their state restores in the background while they stay paused (`restores`).
            let restoring = self.start_restores(&parts);
            self.partitions.assign(consumer, &parts, &restoring);
            self.metrics.set_assigned_partitions(self.partitions.assigned_count());
            let committed = read_committed(consumer, &parts);
            if let Some(transactions) = &self.transactions {
                // Every commit carries the owned partitions' offsets (transactions,
                // invariant 6).
                if let Ok(committed) = &committed {
                    transactions.own(committed.iter().map(|(tp, offset)| match offset {
                        Offset::Offset(o) => (tp.clone(), Some(*o)),
                        _ => (tp.clone(), None),
                    }));
                }
            }
            self.check_watermarks(consumer, &parts, committed);
            self.health.set_joined(true);
            let mut session = self.session.lock();
            *session = session.assigned(Instant::now());
        }
    }
}

/// The committed offsets of `tps`, as the group coordinator has them.
fn read_committed(consumer: &BaseConsumer<PipelineContext>, tps: &[Tp]) -> Result<Vec<(Tp, Offset)>, KafkaError> {
    read_committed_within(consumer, tps, COMMITTED_TIMEOUT)
}

/// [`read_committed`], waiting at most `timeout`.
fn read_committed_within(
    consumer: &BaseConsumer<PipelineContext>,
    tps: &[Tp],
    timeout: Duration,
) -> Result<Vec<(Tp, Offset)>, KafkaError> {
    let committed = consumer.committed_offsets(list_of(tps), timeout)?;
    Ok(committed.elements().iter().map(|e| ((e.topic().to_string(), e.partition()), e.offset())).collect())
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()
}

/// The consumer switches fetching for the partition table.
impl Fetching for BaseConsumer<PipelineContext> {
    type Error = KafkaError;

    fn pause(&self, tps: &[Tp]) -> Result<(), KafkaError> {
        Consumer::pause(self, &list_of(tps))
    }

    fn resume(&self, tps: &[Tp]) -> Result<(), KafkaError> {
        Consumer::resume(self, &list_of(tps))
    }
}

fn list_of(tps: &[Tp]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (topic, partition) in tps {
        list.add_partition(topic, *partition);
    }
    list
}

/// What workers and circuits may ask of the consumer.
impl PartitionControl for BaseConsumer<PipelineContext> {
    fn pause_for_circuit(&self, tp: &Tp, open_sinks: &[&str]) {
        self.context().partitions.pause_for_circuit(self, tp, open_sinks);
    }

    fn resume_after_circuit(&self, tp: &Tp) {
        self.context().partitions.resume_after_circuit(self, tp);
    }

    fn store_offset(&self, topic: &str, partition: i32, offset: i64) -> Result<(), KafkaError> {
        Consumer::store_offset(self, topic, partition, offset)
    }
}

impl PipelineContext {
    /// Lets `revoked` go: drops what they hold, drains their workers (results published,
    /// offsets stored) and ends their tenures, stops owning their state, commits every
    /// change made for them, and only then forgets them.
    fn revoke(&self, consumer: &BaseConsumer<Self>, revoked: &[Tp]) {
        crate::crash::point("rebalance.revoke");
        tracing::info!(partitions = ?revoked, "partitions revoked: draining");
        if let Some(restorer) = &self.restorer {
            restorer.abandon(&restorer.state_partitions(revoked));
        }
        self.partitions.drop_held_and_pauses(revoked);
        self.stop_workers(self.partitions.take_workers(revoked));
        crate::crash::point("rebalance.revoke_drained");
        // Once their workers are stopped (a late one's writes are refused from here on), and
        // before the commit that ends their generation here: every write made for them up to
        // now is in that commit, none after it (store::ownership, invariant 8;
        // store::expiries, invariant 5).
        if let Some(restorer) = &self.restorer {
            let state = restorer.state_partitions(revoked);
            restorer.stop_owning(&state);
            tracing::info!(partitions = ?state, "revoked state partitions no longer written here; committing");
            crate::crash::point("rebalance.revoke_let_go");
        }
        for (topic, partition) in revoked {
            self.metrics.forget_lag(topic, *partition);
        }
        // Commit what the drained workers stored before the partitions move on; unless the
        // assignment was lost (the session expired, e.g. while the broker was away): its
        // generation is gone, and a static member's commit would be fenced, which librdkafka
        // makes fatal. What was stored comes again after the rejoin, each input saying again
        // what it said first.
        let lost = consumer.assignment_lost();
        {
            let mut session = self.session.lock();
            *session = session.revoked(lost);
        }
        if let Some(transactions) = &self.transactions {
            self.end_transaction(transactions, lost, "on revoke");
            transactions.let_go(revoked);
            self.let_go_state(revoked);
        } else if lost {
            tracing::warn!(partitions = ?revoked, "assignment lost (group session expired): nothing committed; uncommitted records come again");
        } else if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
            tracing::debug!(error = %e, "commit on revoke (nothing stored is fine)");
        }
        let still_refused = self.partitions.forget(revoked);
        for tp in revoked {
            let name = format!("{}/{}", tp.0, tp.1);
            self.health.set_refused(&name, false);
            self.health.set_down(&name, None);
        }
        self.metrics.set_refused_partitions(still_refused);
        self.metrics.set_assigned_partitions(self.partitions.assigned_count());
    }

    /// Commits the open results transaction with what the drained workers recorded, or, when
    /// the assignment was lost, aborts it: its generation can commit nothing more, and its
    /// other partitions' results go with it, so this instance is fenced and the pipeline
    /// starts again, reading them again (transactions, invariants 4 and 6).
    pub(super) fn end_transaction(&self, transactions: &Transactions, lost: bool, when: &str) {
        if lost {
            tracing::warn!(
                "assignment lost (group session expired): fenced; aborting the open transaction and starting again from the committed offsets"
            );
            self.runtime.block_on(transactions.abort_lost());
            self.fatal.cancel();
        } else if let Err(e) = self.runtime.block_on(self.send_changes_and_commit(transactions)) {
            if transactions.was_fenced() {
                tracing::warn!(error = %e, when, "fenced: the open transaction was aborted, nothing in it committed; starting again from the committed offsets");
            } else {
                tracing::error!(error = %e, when, "the results transaction did not commit and was aborted; stopping (a restart reads again from the committed offsets)");
            }
            self.fatal.cancel();
        }
    }

    /// Commits the open transaction, with every change the store captured so far (under
    /// `store.changelog`: the committer's commits carry them too, but this one must not
    /// leave out one made just before it, such as an operator's forget or an
    /// `indeterminate` record). Changes that cannot be sent abort it.
    async fn send_changes_and_commit(&self, transactions: &Transactions) -> Result<(), String> {
        if let Some(changes) = &self.changes
            && let Err(e) = changes.before_commit().await
        {
            transactions.fail();
            let _ = transactions.commit().await;
            return Err(e);
        }
        transactions.commit().await.map_err(|e| e.to_string())
    }

    /// Under `store.changelog`, once the revoke's transaction committed: the let-go state
    /// partitions are checkpointed at the changelog's end.
    fn let_go_state(&self, revoked: &[Tp]) {
        let Some(restorer) = &self.restorer else { return };
        if self.fatal.is_cancelled() {
            return;
        }
        restorer.let_go(&restorer.state_partitions(revoked));
    }

    /// Refuses partitions whose committed offset is beyond what the store recorded: the
    /// store was lost or replaced, and going on would re-run or skip history (docs/contract.md §3).
    /// When the committed offsets could not be read, `tps` are not processed unchecked:
    /// they stay paused and the check is retried (fail closed).
    fn check_watermarks<F: Fetching>(&self, fetch: &F, tps: &[Tp], committed: Result<Vec<(Tp, Offset)>, KafkaError>) {
        let committed = match committed {
            Ok(c) => c,
            Err(e) => return self.postpone_check(fetch, tps, &e),
        };
        for ((topic, partition), offset) in committed {
            let tp = (topic, partition);
            let name = format!("{}/{}", tp.0, tp.1);
            if let Offset::Offset(next) = offset {
                self.refuse_if_store_behind(fetch, &tp, next);
            }
            // After a refusal: a refused partition stays paused.
            self.partitions.checked(fetch, &tp);
            self.health.set_down(&name, None);
        }
        if self.partitions.unchecked().is_empty() {
            *self.check_retry.lock() = None;
        }
        self.metrics.set_refused_partitions(self.partitions.refused_count());
    }

    /// Refuses `tp` if `next`, its committed offset, is beyond the store's watermark.
    fn refuse_if_store_behind<F: Fetching>(&self, fetch: &F, tp: &Tp, next: i64) {
        let watermark = match self.store.watermark(&tp.0, tp.1) {
            Ok(w) => w,
            Err(err) => {
                tracing::error!(error = %err, "store failed reading a watermark");
                None
            }
        };
        if self.restorer.is_some() {
            // The changelog is the history: the partition was restored, not lost.
            return;
        }
        let expected_next = watermark.map_or(0, |w| w + 1);
        if next <= expected_next {
            return;
        }
        let name = format!("{}/{}", tp.0, tp.1);
        // "none" for a store that never recorded the partition, not Rust's `None`.
        let watermark = watermark.map_or_else(|| "none".to_string(), |w| w.to_string());
        if self.accept_empty_store {
            tracing::warn!(partition = %name, committed = next, watermark = %watermark,
                "committed offset is beyond the store's watermark; accepted (--accept-empty-store)");
            // The acceptance holds for the starts after this one (the flag is passed once):
            // the store answers for the partition from the committed offset on, as if it had
            // recorded what came before. A partition with nothing new to process would
            // otherwise be refused again at the next start.
            let accepted = [(tp.0.clone(), tp.1, next - 1)];
            if let Err(err) = self.store.raise_watermarks(&accepted).and_then(|()| self.store.flush_always()) {
                tracing::error!(partition = %name, error = %err,
                    "could not record the acceptance in the store: the next start without --accept-empty-store may refuse the partition again");
            }
            return;
        }
        tracing::error!(partition = %name, committed = next, watermark = %watermark,
            "REFUSING partition: its committed offset is beyond the store's watermark, so the store was lost or replaced; restore the store or restart with --accept-empty-store");
        self.partitions.refuse_behind(fetch, tp, next);
        self.health.set_refused(&name, true);
    }

    /// The committed offsets of `tps` could not be read: keeps them paused (never
    /// processed unchecked) and schedules a retry with backoff. Logs the first failure and
    /// then every power of two, so a broker that stays away does not flood the log.
    fn postpone_check<F: Fetching>(&self, fetch: &F, tps: &[Tp], error: &KafkaError) {
        self.partitions.mark_unchecked(fetch, tps);
        for tp in tps {
            self.health
                .set_down(&format!("{}/{}", tp.0, tp.1), Some("committed offset not read yet; store check pending"));
        }
        let mut retry = self.check_retry.lock();
        let now = Instant::now();
        let r = retry.get_or_insert(CheckRetry { due: now, wait: CHECK_RETRY_FIRST, failures: 0 });
        r.failures = r.failures.saturating_add(1);
        if r.failures.is_power_of_two() {
            tracing::error!(error = %error, partitions = ?tps, failures = r.failures, retry_in_ms = r.wait.as_millis() as u64,
                "could not read committed offsets for the store check: partitions stay paused until it runs");
        } else {
            tracing::debug!(error = %error, failures = r.failures, "store check failed again");
        }
        r.due = now + r.wait;
        r.wait = (r.wait * 2).min(CHECK_RETRY_MAX);
    }

    /// Runs the postponed store check once its retry is due.
    fn retry_check_if_due(&self, consumer: &BaseConsumer<Self>) {
        if self.check_retry.lock().as_ref().is_none_or(|r| Instant::now() < r.due) {
            return;
        }
        let tps = self.partitions.unchecked();
        if tps.is_empty() {
            *self.check_retry.lock() = None;
            return;
        }
        self.check_watermarks(consumer, &tps, read_committed(consumer, &tps));
    }

    /// Cancels every one of `workers` at once (no new sink calls: a call still waiting for a
    /// permit, a token or a circuit never starts), waits for all of them to finish
    /// publishing their current batch within one [`DRAIN_TIMEOUT`], ends their tenures, and
    /// drops them. Called
    /// outside the table's lock: a draining worker may still ask for a circuit pause.
    ///
    /// On a runtime thread it cannot wait, and does not: there the consumer is being closed
    /// by the drop of its last handle, held by a worker that did not drain in time (a split
    /// queue holds the consumer), after the consumer thread had stopped every worker. Waiting
    /// there would panic ("a runtime within a runtime") inside librdkafka's close, which then
    /// never returns.
    fn stop_workers(&self, workers: Vec<(Tp, WorkerHandle)>) {
        if workers.is_empty() {
            return;
        }
        let mut tenures = Vec::with_capacity(workers.len());
        let joins: Vec<_> = workers
            .into_iter()
            .map(|(tp, h)| {
                h.cancel.cancel();
                drop(h.tx);
                tenures.push(h.tenure);
                (tp, h.join)
            })
            .collect();
        if tokio::runtime::Handle::try_current().is_ok() {
            tracing::warn!(
                partitions = joins.len(),
                "workers cancelled while the consumer closes; not waiting for them"
            );
        } else {
            for tp in self.runtime.block_on(drain_all(joins, drain_bound())) {
                tracing::error!(topic = %tp.0, partition = tp.1, "worker did not drain in time; it publishes nothing more, and its uncommitted records will be redelivered");
            }
        }
        // Before the commit that follows: a worker still at its sink adds nothing to it or
        // to any later one (transactions, invariant 9).
        for tenure in tenures {
            tenure.end();
        }
    }
}

/// [`DRAIN_TIMEOUT`], or (feature `failpoints`) the milliseconds the failpoint
/// `consumer.drain_timeout` returns, `return(MS)`, so that a test of a call outlasting the
/// drain need not wait 30 s.
fn drain_bound() -> Duration {
    fail::fail_point!("consumer.drain_timeout", |ms: Option<String>| {
        ms.and_then(|ms| ms.parse().ok()).map_or(DRAIN_TIMEOUT, Duration::from_millis)
    });
    DRAIN_TIMEOUT
}

/// Waits for the cancelled workers behind `joins`, all at the same time, for at most
/// `bound` in all; returns the partitions whose worker had not finished by then.
async fn drain_all(joins: Vec<(Tp, tokio::task::JoinHandle<()>)>, bound: Duration) -> Vec<Tp> {
    let deadline = tokio::time::Instant::now() + bound;
    let waits = joins
        .into_iter()
        .map(|(tp, join)| async move { tokio::time::timeout_at(deadline, join).await.is_err().then_some(tp) });
    futures::future::join_all(waits).await.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests;

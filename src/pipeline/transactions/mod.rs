//! Transactional results (`kafka.transactional_results = true`): results and dead letters
//! go out in a Kafka transaction together with the input offsets they settle, so a
//! `read_committed` reader of the results topic sees a result only once its input offset is
//! committed, and a result a crash cut off (its offset uncommitted) never. The input comes
//! again after a restart and publishes its result in a later transaction.
//!
//! One transaction is open at a time for the whole process: one producer with one
//! `transactional.id`, made from the store's identity, so a restarted instance fences the
//! producer of the one it replaces (`init_transactions` aborts what that one left open).
//! A commit every `kafka.transaction_interval` (100 ms by default, Kafka Streams' default
//! under exactly-once) carries what every partition sent meanwhile; one is also made at once
//! for a caller of [`Transactions::commit_queued`] (the changelog's durability points), by
//! the same committer, so that commits run one at a time, back to back, each shared by
//! every caller that came during the one before. Invariants, cited where they are kept:
//! 1. A batch's results are queued and its offset recorded under one [`Member`]; a commit
//!    holds the gate alone, so a batch's results and its offset are in the same
//!    transaction, and nothing is queued while a commit is under way.
//! 2. The offset is recorded once the results are queued, not acknowledged: a commit first
//!    waits for every record of its transaction to be acknowledged and fails if one is not
//!    (librdkafka's `commit_transaction`), so an offset is still committed only after its
//!    results are acknowledged.
//! 3. A [`Member`] is held only while queueing, never while waiting for an acknowledgement,
//!    a sink or the gate, so a commit waits for the gate at most as long as a queueing.
//! 4. A transaction that cannot commit is aborted, and the process stops (exit non-zero):
//!    the aborted results are gone, and only reading again from the committed offsets brings
//!    them back, which a restart does. No [`Member`] is handed out after that.
//! 5. Offsets go with the consumer group metadata of the generation that owns them (set at
//!    the start of every rebalance callback), so a commit for a generation that is gone is
//!    fenced by the broker.
//! 6. Every commit that carries anything carries offsets, so the broker checks the
//!    generation of each one, including one that carries only changelog claims: besides
//!    the offsets its batches settled, it commits again the offset each owned partition
//!    already has ([`Transactions::own`], or the first offset read from it in this
//!    generation, [`Transactions::note_first_offset`]). A claim of an instance that lost
//!    its partitions (paused past its session, a frozen VM) therefore cannot commit, and no
//!    sink runs for it (docs/contract.md §12). Such a fence, and an assignment found lost with work in
//!    the open transaction, abort it and mark this instance fenced
//!    ([`Transactions::was_fenced`], `dedupd_fenced_total`): `run` then starts the pipeline
//!    again in process, from the committed offsets and the changelog.
//! 7. A sink call starts only within a lease of a commit that proved the generation (one
//!    that carried offsets and committed): half the group session, counted from when that
//!    commit started. Past it, [`Transactions::prove_owned`] makes such a commit first. A
//!    process paused between its claim's commit and its call (longer than the lease) so
//!    proves its ownership again on waking, and is fenced instead of calling.
//! 8. What this producer writes to dedupd's own topics names its `transactional.id` in a
//!    [`WRITER_HEADER`]: every forward to the by-key topic, the first record of each
//!    changelog partition in each transaction, and in a transaction with neither, a record
//!    of its own (`named`). So the first record of a transaction left open on either topic
//!    (its writer dead or frozen) says whose it is, and another instance fences that id
//!    once it has held the partition's last stable offset for longer than the group
//!    session or the transaction timeout, whichever is shorter (`changelog::stalled`): the
//!    coordinator aborts it then, not at its next check for timed-out transactions. A
//!    producer fenced so is a fence here too (invariant 6).
//! 9. A worker queues its results, forwards and offset only while its tenure holds
//!    (`control::Tenure`), checked inside its [`Member`]. A revoke ends the tenures of the
//!    partitions it lets go once their workers drained or the drain bound passed, and then
//!    commits (alone at the gate, invariant 1): a worker that joined before carries its
//!    batch whole into that commit; one that joins after finds its tenure ended and queues
//!    nothing. So a worker still at its sink when its partition moved never publishes a
//!    second result for an input, nor commits an offset of a partition it lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use tokio::sync::{Notify, OwnedRwLockReadGuard, RwLock, watch};
use tokio_util::sync::CancellationToken;

use super::control::Tp;
use crate::ops::Metrics;

mod commit;
mod error;
mod named;
use commit::commit_and_begin;
pub(crate) use error::TransactionError;
pub(crate) use named::{WRITER_HEADER, WRITER_KEY_PREFIX, writer_headers};

/// How long a commit waits for the gate: a queueing waits at most a minute for room in
/// the producer's queue (`publish`), after which the worker gives up.
const GATE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long each call to the transaction coordinator may take.
const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(30);

/// Leave to queue records in the open transaction and record their offset: a shared hold
/// on the gate, released when dropped (nothing reads the guard itself).
pub(crate) struct Member(#[allow(dead_code)] OwnedRwLockReadGuard<()>);

/// What the open transaction carries besides its records.
#[derive(Default)]
struct Pending {
    /// Next offset to commit (the last included offset + 1), per partition.
    offsets: HashMap<Tp, i64>,
    /// Whether any member joined since the last commit (records may have been sent).
    joined: bool,
}

/// The process's one transactional producer and its open transaction.
pub(crate) struct Transactions {
    producer: FutureProducer,
    /// The producer's `transactional.id`, named in what it writes to dedupd's own topics
    /// (invariant 8).
    id: String,
    naming: named::Naming,
    gate: Arc<RwLock<()>>,
    pending: Mutex<Pending>,
    group: Mutex<Option<Arc<ConsumerGroupMetadata>>>,
    /// The offset each owned partition's group holds as far as this process knows, sent
    /// again with every commit (invariant 6).
    owned: Mutex<HashMap<Tp, i64>>,
    failed: AtomicBool,
    /// The generation was found gone with work in the open transaction (invariant 6).
    fenced: AtomicBool,
    /// When the last commit that proved the generation started, and for how long after it
    /// a sink call may start without another (invariant 7).
    proven_at: Mutex<Option<std::time::Instant>>,
    lease: Duration,
    /// `transaction_commit_seconds`.
    metrics: Arc<Metrics>,
    /// Set once the open transaction was aborted (after a failure nothing opens another).
    aborted: AtomicBool,
    /// Commits started so far, each numbered as it takes the gate (see `commit_queued`).
    commits_started: AtomicU64,
    /// The number of the last commit that ended, or that one failed: what the callers of
    /// `commit_queued` wait for.
    done: watch::Sender<Done>,
    /// Wakes the committer for a caller of `commit_queued`.
    wake: Notify,
}

/// How far the commits are.
#[derive(Debug, Clone, Copy, Default)]
struct Done {
    /// The number of the last commit that ended with everything before it committed.
    number: u64,
    /// A commit failed: nothing commits any more (invariant 4).
    failed: bool,
}

/// Work the committer does before each of its commits (the changelog's captured changes).
#[async_trait::async_trait]
pub(crate) trait BeforeCommit: Send + Sync {
    /// Queues what must go in the commit about to be made.
    async fn before_commit(&self) -> Result<(), String>;
}

impl Transactions {
    /// Takes over `producer`'s `transactional.id` (fencing any earlier holder) and opens the
    /// first transaction. Blocking: call it before the consumer starts.
    /// `session_timeout` is the consumer's group session (invariant 7's lease is half).
    pub(crate) fn start(
        producer: FutureProducer,
        id: &str,
        metrics: Arc<Metrics>,
        session_timeout: Duration,
    ) -> Result<Transactions, KafkaError> {
        producer.init_transactions(COORDINATOR_TIMEOUT)?;
        producer.begin_transaction()?;
        Ok(Transactions {
            producer,
            id: id.to_string(),
            naming: named::Naming::default(),
            gate: Arc::new(RwLock::new(())),
            pending: Mutex::new(Pending::default()),
            group: Mutex::new(None),
            owned: Mutex::new(HashMap::new()),
            failed: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            proven_at: Mutex::new(None),
            lease: session_timeout / 2,
            metrics,
            aborted: AtomicBool::new(false),
            commits_started: AtomicU64::new(0),
            done: watch::channel(Done::default()).0,
            wake: Notify::new(),
        })
    }

    /// The producer's `transactional.id`.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// What was queued under `member` names the writer (invariant 8).
    pub(crate) fn named(&self, member: &Member) {
        self.naming.named(self.carrying_commit(member));
    }

    /// The key of the changelog record naming this writer in a commit that names it
    /// nowhere else (invariant 8).
    pub(crate) fn writer_key(&self) -> String {
        format!("{WRITER_KEY_PREFIX}{}", self.id)
    }

    /// Under `store.changelog`: a commit that names the writer nowhere else names it on
    /// partition `partition` of the changelog `topic` (invariant 8).
    pub(crate) fn name_on(&self, topic: &str, partition: i32) {
        self.naming.name_on(topic, partition, self.writer_key());
    }

    /// A [`Member`] once no commit holds the gate; drop it as soon as the batch's results
    /// are queued and its offset recorded (invariant 3).
    pub(crate) async fn join(&self) -> Result<Member, TransactionError> {
        let guard = Arc::clone(&self.gate).read_owned().await;
        self.member(guard)
    }

    fn member(&self, guard: OwnedRwLockReadGuard<()>) -> Result<Member, TransactionError> {
        // Invariant 4: after a failure, nothing more is sent.
        if self.has_failed() {
            return Err(TransactionError::Failed);
        }
        self.pending.lock().joined = true;
        Ok(Member(guard))
    }

    /// Records `offset` of `tp` for the next commit, under the member its results were
    /// queued with (invariants 1 and 2).
    pub(crate) fn include_offset(&self, _queued_with: &Member, tp: Tp, offset: i64) {
        self.pending.lock().offsets.insert(tp, offset + 1);
    }

    /// The consumer group generation that owns the partitions from now on (invariant 5).
    pub(crate) fn set_group(&self, group: Option<ConsumerGroupMetadata>) {
        *self.group.lock() = group.map(Arc::new);
    }

    /// The offsets the group holds for newly assigned partitions (invariant 6); `None` when
    /// it has none for one.
    pub(crate) fn own(&self, committed: impl IntoIterator<Item = (Tp, Option<i64>)>) {
        let mut owned = self.owned.lock();
        for (tp, offset) in committed {
            if let Some(offset) = offset {
                owned.insert(tp, offset);
            }
        }
    }

    /// The first offset a worker reads from `tp` in this generation: nothing before it is
    /// this generation's to do, so committing it again settles nothing (invariant 6). Kept
    /// only while nothing else is known for `tp`.
    pub(crate) fn note_first_offset(&self, tp: &Tp, offset: i64) {
        self.owned.lock().entry(tp.clone()).or_insert(offset);
    }

    /// The offset the group holds for `tp` as far as this process knows (what its
    /// transactions committed, or the group held when `tp` was assigned).
    pub(crate) fn committed(&self, tp: &Tp) -> Option<i64> {
        self.owned.lock().get(tp).copied()
    }

    /// `tps` are no longer owned: their offsets are another member's to commit.
    pub(crate) fn let_go(&self, tps: &[Tp]) {
        let mut owned = self.owned.lock();
        for tp in tps {
            owned.remove(tp);
        }
    }

    /// Whether this instance found its group generation gone with work in the open
    /// transaction (invariant 6): the transaction was aborted, and `run` starts again.
    pub(crate) fn was_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Marks this instance fenced, counted once per pipeline (invariant 6).
    fn mark_fenced(&self) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            self.metrics.fenced();
        }
    }

    /// Whether the open transaction failed (the process is stopping).
    fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The open transaction must not commit (a worker could not queue or publish all of a
    /// batch in it): the next commit aborts it instead (invariant 4).
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// [`Transactions::fail`] for a record Kafka did not take for `error`: a fence when it
    /// says this producer was fenced (invariant 8).
    pub(crate) fn fail_on(&self, error: &KafkaError) {
        if TransactionError::Kafka(error.clone()).is_fence() {
            self.mark_fenced();
        }
        self.fail();
    }

    /// Commits the open transaction with every offset included in it and opens the next;
    /// does nothing when nothing was queued or included. On failure the transaction is aborted
    /// and no member is handed out any more (invariant 4).
    pub(crate) async fn commit(&self) -> Result<(), TransactionError> {
        let started = std::time::Instant::now();
        // Invariant 1: alone at the gate, nothing is being sent.
        let _alone = tokio::time::timeout(GATE_TIMEOUT, self.gate.write())
            .await
            .map_err(|_| TransactionError::GateTimeout(GATE_TIMEOUT))?;
        if self.has_failed() {
            self.abort_open().await;
            self.done.send_modify(|d| d.failed = true);
            return Err(TransactionError::Failed);
        }
        let number = self.commits_started.fetch_add(1, Ordering::SeqCst) + 1;
        let pending = std::mem::take(&mut *self.pending.lock());
        if pending.offsets.is_empty() && !pending.joined {
            self.done.send_modify(|d| d.number = number);
            return Ok(());
        }
        if let Some(record) = self.naming.record_for(number, writer_headers(&self.id)) {
            // Invariant 8. Without it the transaction is only not named: commit anyway.
            if let Err((e, _)) = self.producer.send_result(record) {
                tracing::warn!(error = %e, "could not queue the record naming this writer in its transaction");
            }
        }
        let group = self.group.lock().clone();
        let producer = self.producer.clone();
        // Invariant 6: what this commit settles, over what the owned partitions hold.
        let mut offsets = self.owned.lock().clone();
        offsets.extend(pending.offsets.iter().map(|(tp, next)| (tp.clone(), *next)));
        let proves = !offsets.is_empty();
        let outcome = tokio::task::spawn_blocking(move || commit_and_begin(&producer, &offsets, group))
            .await
            .unwrap_or(Err(TransactionError::Kafka(KafkaError::Canceled)));
        if let Err(e) = &outcome {
            // `commit_and_begin` aborted it.
            if e.is_fence() {
                self.mark_fenced();
            }
            self.fail();
            self.aborted.store(true, Ordering::Release);
            self.done.send_modify(|d| d.failed = true);
        } else {
            self.owned.lock().extend(pending.offsets);
            if proves {
                *self.proven_at.lock() = Some(started);
            }
            self.done.send_modify(|d| d.number = number);
            self.metrics.transaction_committed(started.elapsed().as_secs_f64());
            tracing::debug!(number, ms = started.elapsed().as_secs_f64() * 1e3, "transaction committed");
        }
        outcome
    }

    /// The number of the first commit that carries what is queued under `member`: no
    /// commit holds the gate while a member does, and one that starts later takes the gate
    /// after `member` is dropped (invariant 1).
    pub(crate) fn carrying_commit(&self, _member: &Member) -> u64 {
        self.commits_started.load(Ordering::SeqCst) + 1
    }

    /// Returns once commit number `wanted` (see [`Transactions::carrying_commit`]) and every
    /// one before it are made. The committer ([`commit_every`]) makes it, woken by the call:
    /// one commit at a time, back to back while callers wait, so every caller that came
    /// during one commit shares the next (group commit, as the store's flushes).
    pub(crate) async fn commit_queued(&self, wanted: u64) -> Result<(), TransactionError> {
        let mut done = self.done.subscribe();
        self.wake.notify_one();
        let seen = done.wait_for(|d| d.failed || d.number >= wanted).await.map_err(|_| TransactionError::Failed)?;
        if seen.failed { Err(TransactionError::Failed) } else { Ok(()) }
    }

    /// Returns once a commit that proved this generation still owns its partitions started
    /// within the lease (invariant 7), making one first if the last is older; an error if
    /// the generation is gone (fenced) or commits failed.
    pub(crate) async fn prove_owned(&self) -> Result<(), TransactionError> {
        if self.proven_at.lock().is_some_and(|at| at.elapsed() < self.lease) {
            return Ok(());
        }
        // A member makes the next commit carry something, so it is made, with the owned
        // partitions' offsets (invariant 6).
        let member = self.join().await?;
        let wanted = self.carrying_commit(&member);
        drop(member);
        self.commit_queued(wanted).await
    }

    /// Asks the committer for a commit at once, without waiting for it.
    pub(crate) fn commit_soon(&self) {
        self.wake.notify_one();
    }

    /// Aborts the open transaction (a lost generation cannot commit it), marks this
    /// instance fenced (invariant 6) and hands out no member any more (invariant 4).
    pub(crate) async fn abort_lost(&self) {
        let _alone = tokio::time::timeout(GATE_TIMEOUT, self.gate.write()).await;
        self.mark_fenced();
        self.fail();
        self.abort_open().await;
    }

    /// Aborts the open transaction, once.
    async fn abort_open(&self) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        let producer = self.producer.clone();
        let aborted = tokio::task::spawn_blocking(move || producer.abort_transaction(COORDINATOR_TIMEOUT)).await;
        if let Ok(Err(e)) = aborted {
            tracing::warn!(error = %e, "aborting the open transaction failed; the broker aborts it when it times out");
        }
    }
}

/// Commits the open transaction every `interval`, and at once when a caller of
/// [`Transactions::commit_queued`] waits (with `before`, its work first), until `stop`; a
/// failed commit fires `fatal` (invariant 4). The last commit, after the workers drained,
/// is the consumer's (`consumer::run`).
pub(crate) async fn commit_every(
    transactions: Arc<Transactions>,
    before: Option<Arc<dyn BeforeCommit>>,
    interval: Duration,
    stop: CancellationToken,
    fatal: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = transactions.wake.notified() => {}
        }
        let prepared = match &before {
            Some(before) => before.before_commit().await,
            None => Ok(()),
        };
        let committed = match prepared {
            Ok(()) => transactions.commit().await.map_err(|e| e.to_string()),
            Err(e) => {
                transactions.fail();
                let _ = transactions.commit().await;
                Err(e)
            }
        };
        if let Err(e) = committed {
            if transactions.was_fenced() {
                tracing::warn!(error = %e, "fenced: this instance's group generation is gone (its partitions moved on); the open transaction was aborted, nothing in it committed");
            } else {
                tracing::error!(error = %e, "the results transaction did not commit and was aborted; stopping (a restart reads again from the committed offsets)");
            }
            fatal.cancel();
            return;
        }
    }
}

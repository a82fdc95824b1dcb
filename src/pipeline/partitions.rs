//! The consumer's partitions in one table behind one lock: which are assigned, which are
//! refused (committed offset beyond the store's watermark), which are paused because their
//! batch waits for an open circuit, which hold records their full worker queue could not
//! take, and each one's worker. One rule, [`State::may_run`], says whether a partition
//! may be fetched; every pause and resume is decided by it and applied to Kafka under the
//! same lock, so a worker resuming after a circuit cannot race the poll thread pausing for
//! a full queue.
//!
//! Each partition's records normally reach its worker through librdkafka's own queue for
//! it, split from the consumer's before the partition is assigned (see `queue`); the table
//! keeps that split queue until the partition may run and then starts its worker with it.
//! Records that come through the consumer's queue instead are dispatched here, and the poll
//! thread never blocks on a partition: a record whose worker queue is full is held here, in
//! offset order, and its partition paused until the queue has room again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Display;
use std::slice;

use parking_lot::Mutex;
use rdkafka::message::OwnedMessage;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::control::{Tenure, Tp};
use super::queue::{QueueSender, SplitQueue};

/// Switches the fetching of partitions off and on: the consumer, or a fake in tests.
pub(super) trait Fetching {
    /// Why a switch failed.
    type Error: Display;
    /// Stops fetching `tps`.
    fn pause(&self, tps: &[Tp]) -> Result<(), Self::Error>;
    /// Fetches `tps` again.
    fn resume(&self, tps: &[Tp]) -> Result<(), Self::Error>;
}

/// A running partition worker, as the consumer keeps it.
pub(super) struct WorkerHandle {
    /// The worker's queue of records.
    pub tx: QueueSender,
    /// Stops the worker from starting sink calls.
    pub cancel: CancellationToken,
    /// Resolves once the worker settled what it sent.
    pub join: JoinHandle<()>,
    /// Ended once the worker is stopped (drained, or past the drain bound).
    pub tenure: Tenure,
}

/// Why a partition may not be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopped {
    /// Not (or no longer) assigned to this consumer.
    NotAssigned,
    /// Its committed offset is beyond the store's watermark.
    Refused,
    /// Its committed offset could not be read yet, so the store check has not run: it
    /// stays stopped until a retry reads it (failing closed, never processed unchecked).
    Unchecked,
    /// Its state partition is being restored from the changelog (`store.changelog`).
    Restoring,
    /// Its in-flight batch waits for a sink whose circuit is open.
    PausedForCircuit,
    /// It holds records its full worker queue could not take.
    HeldForFullQueue,
}

impl Stopped {
    /// Its name in `/v1/status`.
    fn as_str(self) -> &'static str {
        match self {
            Stopped::NotAssigned => "not_assigned",
            Stopped::Refused => "refused",
            Stopped::Unchecked => "unchecked",
            Stopped::Restoring => "restoring",
            Stopped::PausedForCircuit => "paused_for_circuit",
            Stopped::HeldForFullQueue => "held_for_full_queue",
        }
    }
}

/// What became of a record handed to [`PartitionTable::dispatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dispatched {
    /// In its worker's queue.
    Queued,
    /// Held behind a full queue; the partition is paused.
    Held,
    /// Its partition is not assigned or is refused: dropped, nothing is stored, so it comes
    /// again to whoever runs the partition.
    NotOurs,
    /// Its worker stopped (fatal error): dropped, nothing is stored.
    WorkerGone,
}

/// One assigned partition.
#[derive(Default)]
struct Partition {
    refused: bool,
    /// The committed offset of a partition refused for a store behind it: its lag is
    /// reported from it (librdkafka's own figure stops with the fetching).
    refused_behind: Option<i64>,
    unchecked: bool,
    restoring: bool,
    paused_for_circuit: bool,
    worker: Option<WorkerHandle>,
}

/// Everything behind the table's lock.
#[derive(Default)]
struct State {
    assigned: HashMap<Tp, Partition>,
    /// Records polled for a partition whose worker queue was full, in offset order; a key
    /// is present only while it has records (so the poll loop's check is one `is_empty`).
    held: HashMap<Tp, VecDeque<OwnedMessage>>,
    /// Split queues of partitions whose worker has not started yet. Each holds the
    /// consumer, so the table must let go of them before the consumer can close.
    splits: HashMap<Tp, SplitQueue>,
}

impl State {
    /// The one rule for whether `tp` may be fetched, or what stops it.
    fn may_run(&self, tp: &Tp) -> Result<(), Stopped> {
        let Some(p) = self.assigned.get(tp) else { return Err(Stopped::NotAssigned) };
        if p.refused {
            Err(Stopped::Refused)
        } else if p.unchecked {
            Err(Stopped::Unchecked)
        } else if p.restoring {
            Err(Stopped::Restoring)
        } else if p.paused_for_circuit {
            Err(Stopped::PausedForCircuit)
        } else if self.held.contains_key(tp) {
            Err(Stopped::HeldForFullQueue)
        } else {
            Ok(())
        }
    }
}

/// What `/v1/status` shows of the table.
impl crate::ops::PartitionsView for PartitionTable {
    fn partitions(&self) -> Vec<(String, Option<&'static str>)> {
        let state = self.state.lock();
        let name = |tp: &Tp| format!("{}/{}", tp.0, tp.1);
        state.assigned.keys().map(|tp| (name(tp), state.may_run(tp).err().map(Stopped::as_str))).collect()
    }
}

/// The consumer's partitions; see the module docs.
#[derive(Default)]
pub(super) struct PartitionTable {
    state: Mutex<State>,
}

impl PartitionTable {
    /// Whether `tp` may be fetched, or what stops it.
    #[cfg(test)]
    pub(super) fn may_run(&self, tp: &Tp) -> Result<(), Stopped> {
        self.state.lock().may_run(tp)
    }

    /// The assigned partitions.
    #[cfg(test)]
    pub(super) fn assigned(&self) -> HashSet<Tp> {
        self.state.lock().assigned.keys().cloned().collect()
    }

    /// Whether `tp` is assigned and not refused: its keys are this instance's to settle.
    pub(super) fn runs(&self, tp: &Tp) -> bool {
        self.state.lock().assigned.get(tp).is_some_and(|p| !p.refused)
    }

    /// How many partitions are assigned.
    pub(super) fn assigned_count(&self) -> usize {
        self.state.lock().assigned.len()
    }

    /// The assigned partitions being fetched (whose lag librdkafka's statistics know).
    pub(super) fn fetched(&self) -> HashSet<Tp> {
        let state = self.state.lock();
        state.assigned.keys().filter(|tp| state.may_run(tp).is_ok()).cloned().collect()
    }

    /// The assigned partitions not fetched while a sink's circuit is open or their queue is
    /// full (their lag is asked of the broker).
    pub(super) fn stopped_fetching(&self) -> Vec<Tp> {
        let state = self.state.lock();
        let stopped =
            |tp: &&Tp| matches!(state.may_run(tp), Err(Stopped::PausedForCircuit | Stopped::HeldForFullQueue));
        state.assigned.keys().filter(stopped).cloned().collect()
    }

    /// The partitions refused for a store behind them, with their committed offsets.
    pub(super) fn refused_behind(&self) -> Vec<(Tp, i64)> {
        let state = self.state.lock();
        state.assigned.iter().filter_map(|(tp, p)| p.refused_behind.map(|next| (tp.clone(), next))).collect()
    }

    /// How many assigned partitions are refused.
    pub(super) fn refused_count(&self) -> usize {
        self.state.lock().assigned.values().filter(|p| p.refused).count()
    }

    /// Takes `parts` on and fetches those that may run: this undoes a backpressure pause
    /// left from before a revoke, which librdkafka keeps across assignments. Those among
    /// `restoring` stay paused until [`PartitionTable::restored`].
    pub(super) fn assign<F: Fetching>(&self, fetch: &F, parts: &[Tp], restoring: &[Tp]) {
        let mut state = self.state.lock();
        for tp in parts {
            state.assigned.entry(tp.clone()).or_default().restoring = restoring.contains(tp);
        }
        if !restoring.is_empty()
            && let Err(e) = fetch.pause(restoring)
        {
            tracing::error!(error = %e, partitions = ?restoring, "could not pause partitions whose state is restoring");
        }
        let resume: Vec<Tp> = parts.iter().filter(|tp| state.may_run(tp).is_ok()).cloned().collect();
        if !resume.is_empty()
            && let Err(e) = fetch.resume(&resume)
        {
            tracing::warn!(error = %e, "could not resume assigned partitions");
        }
    }

    /// The assigned partitions whose state is being restored.
    pub(super) fn restoring(&self) -> Vec<Tp> {
        let state = self.state.lock();
        state.assigned.iter().filter(|(_, p)| p.restoring).map(|(tp, _)| tp.clone()).collect()
    }

    /// The state of `tps` is restored: each is fetched if nothing else stops it (and its
    /// worker starts); one no longer assigned is left alone.
    pub(super) fn restored<F: Fetching>(&self, fetch: &F, tps: &[Tp]) {
        let mut state = self.state.lock();
        let mut resume = Vec::new();
        for tp in tps {
            let Some(p) = state.assigned.get_mut(tp).filter(|p| p.restoring) else { continue };
            p.restoring = false;
            if state.may_run(tp).is_ok() {
                resume.push(tp.clone());
            }
        }
        if !resume.is_empty()
            && let Err(e) = fetch.resume(&resume)
        {
            tracing::warn!(error = %e, "could not resume partitions after their restore");
        }
    }

    /// Refuses `tp` (the store was lost or replaced) and stops fetching it.
    pub(super) fn refuse<F: Fetching>(&self, fetch: &F, tp: &Tp) {
        let mut state = self.state.lock();
        if let Err(e) = fetch.pause(slice::from_ref(tp)) {
            tracing::error!(error = %e, topic = %tp.0, partition = tp.1, "could not pause refused partition");
        }
        if let Some(p) = state.assigned.get_mut(tp) {
            p.refused = true;
        }
    }

    /// Refuses `tp`, whose committed offset `next` is beyond the store's watermark.
    pub(super) fn refuse_behind<F: Fetching>(&self, fetch: &F, tp: &Tp, next: i64) {
        self.refuse(fetch, tp);
        if let Some(p) = self.state.lock().assigned.get_mut(tp) {
            p.refused_behind = Some(next);
        }
    }

    /// Stops fetching `tps` until [`PartitionTable::checked`]: their committed offsets could
    /// not be read, so the store check could not run.
    pub(super) fn mark_unchecked<F: Fetching>(&self, fetch: &F, tps: &[Tp]) {
        let mut state = self.state.lock();
        if let Err(e) = fetch.pause(tps) {
            tracing::error!(error = %e, partitions = ?tps, "could not pause partitions awaiting the store check");
        }
        for tp in tps {
            if let Some(p) = state.assigned.get_mut(tp) {
                p.unchecked = true;
            }
        }
    }

    /// The assigned partitions awaiting the store check.
    pub(super) fn unchecked(&self) -> Vec<Tp> {
        let state = self.state.lock();
        state.assigned.iter().filter(|(_, p)| p.unchecked).map(|(tp, _)| tp.clone()).collect()
    }

    /// The store check of `tp` ran: it is fetched again if nothing else stops it.
    pub(super) fn checked<F: Fetching>(&self, fetch: &F, tp: &Tp) {
        let mut state = self.state.lock();
        let Some(p) = state.assigned.get_mut(tp).filter(|p| p.unchecked) else { return };
        p.unchecked = false;
        if state.may_run(tp).is_ok()
            && let Err(e) = fetch.resume(slice::from_ref(tp))
        {
            tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not resume a partition after its store check");
        }
    }

    /// First step of a revoke: drops what `parts` hold and their circuit pauses, without
    /// resuming them (they are going), so nothing is released to a worker that is draining.
    pub(super) fn drop_held_and_pauses(&self, parts: &[Tp]) {
        let mut state = self.state.lock();
        for tp in parts {
            state.held.remove(tp);
            if let Some(p) = state.assigned.get_mut(tp) {
                p.paused_for_circuit = false;
            }
        }
    }

    /// Takes the workers of `parts` out of the table, to be stopped outside its lock (a
    /// draining worker may still ask for a circuit pause).
    pub(super) fn take_workers(&self, parts: &[Tp]) -> Vec<(Tp, WorkerHandle)> {
        let mut state = self.state.lock();
        parts
            .iter()
            .filter_map(|tp| state.assigned.get_mut(tp).and_then(|p| p.worker.take()).map(|w| (tp.clone(), w)))
            .collect()
    }

    /// Keeps the split queues of partitions about to be assigned until their workers start.
    pub(super) fn add_splits(&self, splits: Vec<(Tp, SplitQueue)>) {
        self.state.lock().splits.extend(splits);
    }

    /// Starts, with `start_worker`, the worker of every assigned partition that has a split
    /// queue waiting and may run (a refused or unchecked one waits).
    pub(super) fn start_split_workers(&self, mut start_worker: impl FnMut(&Tp, Option<SplitQueue>) -> WorkerHandle) {
        let mut state = self.state.lock();
        let state = &mut *state;
        if state.splits.is_empty() {
            return;
        }
        let ready: Vec<Tp> = state
            .splits
            .keys()
            .filter(|tp| state.may_run(tp).is_ok() && state.assigned.get(*tp).is_some_and(|p| p.worker.is_none()))
            .cloned()
            .collect();
        for tp in &ready {
            let split = state.splits.remove(tp);
            if let Some(p) = state.assigned.get_mut(tp) {
                p.worker = Some(start_worker(tp, split));
            }
        }
    }

    /// Takes every worker out of the table (shutdown), and drops the split queues of
    /// partitions that never started one (they hold the consumer).
    pub(super) fn take_all_workers(&self) -> Vec<(Tp, WorkerHandle)> {
        let mut state = self.state.lock();
        state.splits.clear();
        state.assigned.iter_mut().filter_map(|(tp, p)| p.worker.take().map(|w| (tp.clone(), w))).collect()
    }

    /// Last step of a revoke: forgets `parts`. Returns how many partitions stay refused.
    pub(super) fn forget(&self, parts: &[Tp]) -> usize {
        let mut state = self.state.lock();
        for tp in parts {
            state.assigned.remove(tp);
            state.held.remove(tp);
            state.splits.remove(tp);
        }
        state.assigned.values().filter(|p| p.refused).count()
    }

    /// Hands `msg`, a record of `tp`, to the partition's worker (started by `start_worker` if
    /// it has none yet) without blocking: behind records already held for the partition,
    /// else into the queue, else (queue full) held, and the partition paused.
    pub(super) fn dispatch<F: Fetching>(
        &self,
        fetch: &F,
        tp: &Tp,
        msg: OwnedMessage,
        start_worker: impl FnOnce(&Tp, Option<SplitQueue>) -> WorkerHandle,
    ) -> Dispatched {
        let mut state = self.state.lock();
        let state = &mut *state;
        let Some(p) = state.assigned.get_mut(tp).filter(|p| !p.refused && !p.unchecked && !p.restoring) else {
            return Dispatched::NotOurs;
        };
        if let Some(q) = state.held.get_mut(tp) {
            q.push_back(msg);
            return Dispatched::Held;
        }
        let worker = p.worker.get_or_insert_with(|| start_worker(tp, state.splits.remove(tp)));
        match worker.tx.try_send(msg) {
            Ok(()) => Dispatched::Queued,
            Err(TrySendError::Full(m)) => {
                if let Err(e) = fetch.pause(slice::from_ref(tp)) {
                    tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not pause a partition for backpressure");
                }
                state.held.insert(tp.clone(), VecDeque::from([m]));
                Dispatched::Held
            }
            Err(TrySendError::Closed(_)) => Dispatched::WorkerGone,
        }
    }

    /// Moves held records into queues with room, and fetches again the partitions left
    /// with none that may run. Returns whether any records are still held.
    pub(super) fn release_held<F: Fetching>(&self, fetch: &F) -> bool {
        let mut state = self.state.lock();
        if state.held.is_empty() {
            return false;
        }
        let state = &mut *state;
        let mut emptied = Vec::new();
        state.held.retain(|tp, q| {
            // No worker: revoked or stopped; the records are dropped and come again.
            let Some(tx) = state.assigned.get(tp).and_then(|p| p.worker.as_ref()).map(|w| &w.tx) else {
                return false;
            };
            while let Some(m) = q.pop_front() {
                match tx.try_send(m) {
                    Ok(()) => {}
                    Err(TrySendError::Full(m)) => {
                        q.push_front(m);
                        return true;
                    }
                    Err(TrySendError::Closed(_)) => return false,
                }
            }
            emptied.push(tp.clone());
            false
        });
        let resume: Vec<Tp> = emptied.into_iter().filter(|tp| state.may_run(tp).is_ok()).collect();
        if !resume.is_empty()
            && let Err(e) = fetch.resume(&resume)
        {
            tracing::warn!(error = %e, "could not resume partitions after backpressure");
        }
        !state.held.is_empty()
    }

    /// Stops fetching `tp` because its batch waits for the open circuits of `sinks`.
    pub(super) fn pause_for_circuit<F: Fetching>(&self, fetch: &F, tp: &Tp, sinks: &[&str]) {
        let mut state = self.state.lock();
        let Some(p) = state.assigned.get_mut(tp) else { return };
        if p.paused_for_circuit {
            return;
        }
        p.paused_for_circuit = true;
        match fetch.pause(slice::from_ref(tp)) {
            Ok(()) => {
                tracing::info!(topic = %tp.0, partition = tp.1, sinks = ?sinks, "partition paused: its batch waits for a sink whose circuit is open")
            }
            Err(e) => {
                tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not pause a partition for an open circuit")
            }
        }
    }

    /// Undoes [`PartitionTable::pause_for_circuit`]; the partition is fetched again only if
    /// nothing else stops it (held records are resumed by `release_held`).
    pub(super) fn resume_after_circuit<F: Fetching>(&self, fetch: &F, tp: &Tp) {
        let mut state = self.state.lock();
        let Some(p) = state.assigned.get_mut(tp) else { return };
        if !p.paused_for_circuit {
            return;
        }
        p.paused_for_circuit = false;
        if state.may_run(tp).is_err() {
            return;
        }
        match fetch.resume(slice::from_ref(tp)) {
            Ok(()) => {
                tracing::info!(topic = %tp.0, partition = tp.1, "partition resumed: its sinks' circuits are closed or its batch ended")
            }
            Err(e) => {
                tracing::warn!(error = %e, topic = %tp.0, partition = tp.1, "could not resume a partition after an open circuit")
            }
        }
    }
}

/// A stand-in for the consumer's pause and resume, for the tests of this module and of
/// `consumer`.
#[cfg(test)]
pub(super) mod fake;

mod current;
pub(crate) use current::CurrentTable;

#[cfg(test)]
mod tests;

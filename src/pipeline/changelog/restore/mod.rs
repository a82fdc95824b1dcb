//! Restore before work: on assignment, each state partition's records are read from the
//! changelog (`read_committed`, so an aborted transaction is never restored) from the
//! store's checkpoint to its end at assignment (past any transaction still open there: see
//! `read_to_end`), and applied to the store, before any record of the partition is
//! processed. A restore runs on a thread of its own ([`Restorer::start`]), off the
//! rebalance callback: the partitions stay paused meanwhile while the group consumer goes on
//! polling (so its session and `max.poll.interval.ms` hold however long the restore takes),
//! and the consumer resumes them once it is told the restore ended. A partition let go
//! while it restores is abandoned there ([`Restorer::abandon`]), its checkpoint where its
//! last applied chunk left it, so the next restore of it goes on from there. `/readyz` is
//! 503 and `dedupd_state_restoring{partition}` is 1 until it is done.

mod read;

use crate::connection::check::client_error;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;

use super::ends::end_offsets;
use crate::ops::{Health, Metrics};
use crate::pipeline::control::Tp;
use crate::pipeline::{KafkaConfig, PipelineError};
use crate::store::KeyStore;

/// How long reading a partition's end offsets may take.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(30);

/// The restore consumer's context: reaching the end of a partition is what a restore waits
/// for, not an error to log (librdkafka reports it as one).
pub(super) struct RestoreContext;

impl ClientContext for RestoreContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let end_of_partition = matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF);
        if !end_of_partition {
            tracing::warn!(%error, reason, "changelog restore consumer");
        }
    }
}

impl ConsumerContext for RestoreContext {}

/// How a restore started by [`Restorer::start`] ended.
pub(crate) struct RestoreEnded {
    /// The state partitions it restored.
    pub(crate) partitions: Vec<i32>,
    /// Those of them owned now (the others were let go meanwhile), or why it failed.
    pub(crate) owned: Result<Vec<i32>, String>,
}

/// Restores state partitions from the changelog and checkpoints them when let go.
pub(crate) struct Restorer {
    store: Arc<KeyStore>,
    topic: String,
    consumer: Mutex<BaseConsumer<RestoreContext>>,
    /// A `read_uncommitted` client, for the end a restore must reach: its high watermark,
    /// beyond any transaction still open at assignment (see `read_to_end`).
    end_reader: Mutex<BaseConsumer<RestoreContext>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// The state partitions restored and not let go since, and those being restored.
    held: Mutex<Held>,
    /// The number of the next restore started.
    next_restore: AtomicU64,
    /// The restore threads started, joined by [`Restorer::abandon_all`].
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Under the by-key hop: the by-key topic, the one whose partitions are state
    /// partitions (an input partition is not one).
    by_key: Option<String>,
}

/// The client config of a reader of the changelog (`role`: `restore`, `standby`): assigned
/// by hand under its own group id, `read_committed`, told when it reaches a partition's end,
/// committing nothing; `extra` on top.
pub(super) fn reader_config(
    kafka: &KafkaConfig,
    role: &str,
    extra: &[(&str, &str)],
) -> Result<rdkafka::ClientConfig, PipelineError> {
    let group = format!("{}.dedupd-{role}", kafka.group_id);
    let mut defaults = vec![
        ("group.id", group.as_str()),
        ("enable.auto.commit", "false"),
        ("isolation.level", "read_committed"),
        ("enable.partition.eof", "true"),
        ("auto.offset.reset", "earliest"),
    ];
    defaults.extend_from_slice(extra);
    Ok(kafka.client_config(&defaults, &Default::default())?)
}

impl Restorer {
    pub(crate) fn new(
        kafka: &KafkaConfig,
        topic: &super::ChangelogTopic,
        store: Arc<KeyStore>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Result<Restorer, PipelineError> {
        // The end of a partition is seen when a fetch there comes back empty, which the broker
        // holds for this long: a catch-up read wants to know at once.
        let config = reader_config(kafka, "restore", &[("fetch.wait.max.ms", "10")])?;
        let consumer = config.create_with_context(RestoreContext).map_err(|e| {
            PipelineError::Changelog(format!("creating the changelog restore consumer: {}", client_error(&config, &e)))
        })?;
        let mut end_config = config.clone();
        end_config.set("isolation.level", "read_uncommitted");
        let end_reader = end_config.create_with_context(RestoreContext).map_err(|e| {
            PipelineError::Changelog(format!("creating the changelog end reader: {}", client_error(&end_config, &e)))
        })?;
        Ok(Restorer {
            store,
            topic: topic.name.clone(),
            consumer: Mutex::new(consumer),
            end_reader: Mutex::new(end_reader),
            metrics,
            health,
            held: Mutex::new(Held::default()),
            next_restore: AtomicU64::new(1),
            threads: Mutex::new(Vec::new()),
            by_key: topic.by_key.clone(),
        })
    }

    /// The state partitions among the consumer's partitions `tps`, each once: with
    /// `kafka.copartitioned` every input partition's number; under the hop, the by-key
    /// topic's partitions.
    pub(crate) fn state_partitions(&self, tps: &[Tp]) -> Vec<i32> {
        let mut partitions: Vec<i32> = tps.iter().filter(|tp| self.is_state(tp)).map(|(_, p)| *p).collect();
        partitions.sort_unstable();
        partitions.dedup();
        partitions
    }

    /// Whether `tp` is a state partition (see [`Restorer::state_partitions`]).
    pub(crate) fn is_state(&self, tp: &Tp) -> bool {
        self.by_key.as_ref().is_none_or(|by_key| *by_key == tp.0)
    }

    /// Starts restoring, on a thread of its own, each of `partitions` not owned (restored
    /// and not let go since), all at once (one consumer fetching them together); `ended` is
    /// told when the restore ends (see [`RestoreEnded`]). Returns the partitions it
    /// restores: until `ended` is told, none of them is owned.
    pub(crate) fn start(self: &Arc<Self>, partitions: &[i32], ended: mpsc::Sender<RestoreEnded>) -> Vec<i32> {
        let id = self.next_restore.fetch_add(1, Ordering::Relaxed);
        let todo: Vec<i32> = {
            let mut held = self.held.lock();
            let todo: Vec<i32> = partitions.iter().copied().filter(|p| !held.owned.contains(p)).collect();
            // From here on no standby write follows the checkpoint it reads (standby.rs,
            // invariant 1); a restore of one of them still running (it was let go and is
            // assigned again) gives it up to this one.
            held.restoring.extend(todo.iter().map(|&p| (p, id)));
            todo
        };
        if todo.is_empty() {
            return todo;
        }
        for &p in &todo {
            self.metrics.set_restoring(p, true);
            self.health.set_down(&self.name(p), Some(crate::ops::RESTORING));
        }
        let (restorer, asked, failed) = (Arc::clone(self), todo.clone(), ended.clone());
        let spawned = std::thread::Builder::new().name("dedupd-restore".into()).spawn(move || {
            let result = restorer.restore(id, &asked);
            let _ = ended.send(RestoreEnded { partitions: asked, owned: result });
        });
        match spawned {
            Ok(thread) => {
                let mut threads = self.threads.lock();
                threads.retain(|t| !t.is_finished());
                threads.push(thread);
            }
            Err(e) => self.failed_to_start(id, &todo, &e, &failed),
        }
        todo
    }

    /// A restore thread could not be started: its partitions fail (refused, the process
    /// stops) rather than stay paused.
    fn failed_to_start(&self, id: u64, todo: &[i32], e: &std::io::Error, failed: &mpsc::Sender<RestoreEnded>) {
        self.held.lock().restoring.retain(|_, by| *by != id);
        self.end_progress(todo);
        let owned = Err(format!("could not start a restore thread: {e}"));
        let _ = failed.send(RestoreEnded { partitions: todo.to_vec(), owned });
    }

    /// A restore of `partitions`, numbered `id`, to their ends; then those still its own
    /// (not let go meanwhile) become owned, their expiries this store's to write with the
    /// tombstones of keys the restore found expired (`store::expiries`, invariants 5 to 7).
    /// Returns them. Blocking.
    fn restore(&self, id: u64, partitions: &[i32]) -> Result<Vec<i32>, String> {
        let started = Instant::now();
        let restored = {
            let _restoring = self.store.restoring();
            self.restore_all(id, partitions)
        };
        let mut owned = Vec::with_capacity(partitions.len());
        let restored = match restored {
            Ok(restored) => restored,
            Err(e) => {
                self.held.lock().restoring.retain(|_, by| *by != id);
                self.end_progress(partitions);
                return Err(format!("restoring {}: {e}", self.topic));
            }
        };
        for (p, r) in restored {
            // Under the lock a let-go takes: owned now, or abandoned (`abandon`).
            let mut held = self.held.lock();
            if held.restoring.get(&p) != Some(&id) {
                continue;
            }
            if let Err(e) = self.store.own_partitions(&[p]) {
                held.restoring.retain(|_, by| *by != id);
                drop(held);
                self.end_progress(partitions);
                return Err(format!("owning state partition {p}: {e}"));
            }
            let expired = self.store.write_restored_expiries(r.expired).map_err(|e| e.to_string())?;
            held.restoring.remove(&p);
            held.owned.insert(p);
            tracing::info!(partition = %self.name(p), records = r.applied, expired, ms = started.elapsed().as_millis() as u64, "state partition restored");
            owned.push(p);
        }
        self.end_progress(partitions);
        Ok(owned)
    }

    /// The progress shown for `partitions` ends, unless a later restore took one over.
    fn end_progress(&self, partitions: &[i32]) {
        let held = self.held.lock();
        for &p in partitions.iter().filter(|p| !held.restoring.contains_key(p)) {
            self.metrics.set_restoring(p, false);
            self.health.set_down(&self.name(p), None);
        }
    }

    /// `partitions` are let go: a restore of any of them stops reading and applying it, and
    /// does not own it at its end; its checkpoint stays where its last applied chunk left it,
    /// for the next restore to go on from.
    pub(crate) fn abandon(&self, partitions: &[i32]) {
        let mut held = self.held.lock();
        for p in partitions {
            held.restoring.remove(p);
        }
    }

    /// Every restore running stops (the consumer that asked for them is gone; see
    /// [`Restorer::abandon`]), and this returns once their threads ended: none of them
    /// applies anything after it, nor keeps the store open for a run started after it.
    /// Blocking: at most a poll, or a read of a partition's ends.
    pub(crate) fn abandon_all(&self) {
        self.held.lock().restoring.clear();
        let threads = std::mem::take(&mut *self.threads.lock());
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a restore thread panicked");
            }
        }
    }

    /// Before `partitions` are let go (their workers drained, ahead of the commit that ends
    /// their generation here): this store writes no more of their keys' records nor
    /// expiries (`store::ownership`, invariant 8; `store::expiries`, invariant 5).
    pub(crate) fn stop_owning(&self, partitions: &[i32]) {
        let dropped = self.store.let_go_partitions(partitions);
        if dropped > 0 {
            tracing::debug!(
                ?partitions,
                dropped,
                "expiry tombstones of partitions being let go dropped: their next owner writes them"
            );
        }
    }

    fn name(&self, p: i32) -> String {
        format!("{}/{p}", self.topic)
    }

    /// Lets `partitions` go once every change of theirs is committed: their checkpoint
    /// becomes the changelog's end, which this store has applied (its own writes), written
    /// before a standby may tail them from it (standby.rs, invariant 1); then the store is
    /// flushed and a crash no longer empties them (`store::writing`, invariant 9). Returns
    /// the checkpoints. Blocking.
    pub(crate) fn let_go(&self, partitions: &[i32]) -> Vec<(String, i32, i64)> {
        let mut checkpoints = Vec::with_capacity(partitions.len());
        let mut let_go = Vec::with_capacity(partitions.len());
        for &p in partitions {
            if !self.held.lock().owned.contains(&p) {
                continue;
            }
            let_go.push(p);
            // Not the restore consumer, which a restore running meanwhile holds.
            let end = end_offsets(&self.end_reader.lock(), &self.topic, p, WATERMARKS_TIMEOUT);
            let mut held = self.held.lock();
            match end {
                Ok((_, high)) => {
                    let checkpoint = (self.topic.clone(), p, high);
                    match self.store.set_checkpoints(std::slice::from_ref(&checkpoint)) {
                        Ok(()) => checkpoints.push(checkpoint),
                        Err(e) => {
                            tracing::warn!(partition = p, error = %e, "could not write the let-go partition's checkpoint; the next restore reads more")
                        }
                    }
                }
                // Without one the next restore reads from the older checkpoint: slower, as right.
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "could not read the changelog's end; keeping the older checkpoint")
                }
            }
            held.owned.remove(&p);
        }
        if let Err(e) = self.store.written_out(&let_go) {
            tracing::warn!(partitions = ?let_go, error = %e, "could not flush the store after letting partitions go; a crash empties them");
        }
        checkpoints
    }

    /// Whether state partition `p` is owned: assigned and restored.
    pub(crate) fn owns(&self, p: i32) -> bool {
        self.held.lock().owned.contains(&p)
    }

    /// Every state partition restored and not let go.
    pub(crate) fn owned(&self) -> Vec<i32> {
        self.held.lock().owned.iter().copied().collect()
    }

    /// The partitions held, locked: a standby applies a chunk of a partition only while
    /// this lock says it is not held, and holds it through the write (standby.rs).
    pub(super) fn held(&self) -> parking_lot::MutexGuard<'_, Held> {
        self.held.lock()
    }

    pub(super) fn store(&self) -> &Arc<KeyStore> {
        &self.store
    }

    pub(super) fn topic(&self) -> &str {
        &self.topic
    }
}

/// The state partitions an instance holds: restored and not let go (`owned`), or being
/// restored.
#[derive(Debug, Default)]
pub(crate) struct Held {
    owned: BTreeSet<i32>,
    /// Each partition being restored, with the number of the restore that has it.
    restoring: BTreeMap<i32, u64>,
}

impl Held {
    /// Whether `p` is owned or being restored.
    pub(crate) fn holds(&self, p: i32) -> bool {
        self.owned.contains(&p) || self.restoring.contains_key(&p)
    }
}

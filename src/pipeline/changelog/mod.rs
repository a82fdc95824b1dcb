//! `store.changelog = true` (docs/decisions.md, "State on Kafka"): the store is the cache
//! of a compacted changelog topic, partition *p* of which holds the keys of state
//! partition *p* (the key's murmur2 partition: `partition`). With `kafka.copartitioned`
//! an input partition is a state partition; otherwise the by-key topic's partition is
//! (`super::hop`).
//! - `topic`: the changelog topic, found or created compacted, one partition per state
//!   partition (and the by-key topic under the hop);
//! - `writer`: the store's captured changes go out in the process's open transaction, and
//!   the engine's durability points wait for their commit (a claim is committed there
//!   before its sink runs; a completion before its result and offset);
//! - `ends`: a partition's end offsets, read again while a client's metadata does not know
//!   the partition yet (a topic just created);
//! - `restore`: on assignment, each state partition is read back from its checkpoint before
//!   any of its records is processed; when let go, its checkpoint moves to the end;
//! - `standby`: with `store.standby`, the partitions not held are tailed into the store, so
//!   that a restore of one finds its checkpoint near the end;
//! - `stalled`: a transaction another instance left open on the changelog or by-key topic
//!   (killed, frozen) is aborted by fencing its writer, once it has held a partition's last
//!   stable offset for the group session or the transaction timeout.

mod ends;
mod partition;
mod restore;
mod stalled;
mod standby;
mod topic;
mod writer;

pub use partition::state_partition;
pub(crate) use restore::{RestoreEnded, Restorer};
pub(crate) use topic::{ChangelogTopic, ensure_topic};
pub(crate) use writer::ChangelogWriter;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use tokio_util::sync::CancellationToken;

use super::transactions::Transactions;
use super::{KafkaConfig, PipelineError};
use crate::ops::{Health, Metrics};
use crate::store::{CacheOf, CacheOpened, KeyStore, StoreConfig, SyncMode};

/// What `run` keeps of the changelog.
pub(crate) struct Changelog {
    /// The changelog topic.
    pub(crate) topic: String,
    /// Sends and commits the store's changes.
    pub(crate) writer: Arc<ChangelogWriter>,
    /// Restores state partitions on assignment.
    pub(crate) restorer: Arc<Restorer>,
    /// The number of state partitions.
    pub(crate) partitions: i32,
    /// Under the by-key hop: the by-key topic.
    pub(crate) by_key: Option<String>,
    /// The group session the broker enforces (`pipeline::session`): a transaction another
    /// instance left open is aborted once it is this old (`stalled`).
    pub(crate) session: Duration,
}

impl Changelog {
    /// Who may change a key through the admin API: the holder of its state partition.
    pub(crate) fn key_owner(&self) -> Arc<dyn crate::ops::KeyOwner> {
        Arc::new(StateOwner { restorer: Arc::clone(&self.restorer), partitions: self.partitions })
    }
}

/// A key's state partition must be one this instance holds, restored, for an operator's
/// write to it (docs/decisions.md, "State on Kafka": operator writes go to the owner).
struct StateOwner {
    restorer: Arc<Restorer>,
    partitions: i32,
}

impl crate::ops::KeyOwner for StateOwner {
    fn check(&self, key: &str) -> Result<(), String> {
        let p = state_partition(key, self.partitions);
        if self.restorer.owns(p) {
            return Ok(());
        }
        Err(format!(
            "key {key:?} belongs to state partition {p}, which this instance does not hold (restored) now: \
             send the request to the instance that does (`dedupd status --admin URL` lists an instance's partitions)"
        ))
    }
}

/// Opens the store as the cache of `topic`'s changelog. Its own writes need no fsync: what
/// is durable is what the changelog committed, and what a crash may have left uncommitted
/// in it (the partitions it owned) is emptied and rebuilt from the changelog.
pub(crate) fn open_store(config: &StoreConfig, topic: &ChangelogTopic) -> Result<KeyStore, PipelineError> {
    let config = StoreConfig { sync: SyncMode::None, ..config.clone() };
    let partitions = topic.partitions;
    let of = CacheOf {
        topic: topic.name.clone(),
        partitions,
        partition_of: Box::new(move |key| state_partition(key, partitions)),
    };
    let (store, opened) = KeyStore::open_as_cache(&config, of)?;
    match opened {
        CacheOpened::Clean => tracing::info!("store stopped cleanly: restoring only what the changelog has beyond it"),
        CacheOpened::AfterCrash { emptied, records } => tracing::info!(
            ?emptied,
            records,
            "store not stopped cleanly: the state partitions it owned emptied, to be restored from the changelog; \
             the others kept, their restores going on from their checkpoints"
        ),
        CacheOpened::Emptied => {
            tracing::info!(
                "store new, or not stopped cleanly by a version that said what it owned: emptied, to be restored from the changelog"
            )
        }
    }
    Ok(store)
}

impl Changelog {
    pub(crate) fn new(
        kafka: &KafkaConfig,
        topic: &ChangelogTopic,
        store: &Arc<KeyStore>,
        transactions: &Arc<Transactions>,
        (producer, session): (FutureProducer, Duration),
        (metrics, health): (&Arc<Metrics>, &Arc<Health>),
    ) -> Result<Changelog, PipelineError> {
        let partitions = topic.partitions;
        // A commit with nothing else on the changelog or by-key topic names its writer here.
        transactions.name_on(&topic.name, state_partition(&transactions.writer_key(), partitions));
        let writer = ChangelogWriter::new(Arc::clone(store), Arc::clone(transactions), producer, topic);
        let restorer = Restorer::new(kafka, topic, Arc::clone(store), Arc::clone(metrics), Arc::clone(health))?;
        Ok(Changelog {
            topic: topic.name.clone(),
            writer: Arc::new(writer),
            restorer: Arc::new(restorer),
            partitions: topic.partitions,
            by_key: topic.by_key.clone(),
            session,
        })
    }

    /// At a clean stop, after the consumer's last commit: commits what is left (an
    /// operator's write, expiry tombstones), checkpoints the partitions held at their end,
    /// and marks the store clean. When any step fails the mark is not made, and the next
    /// start rebuilds the store from the changelog.
    pub(crate) async fn stop_cleanly(&self, store: &Arc<KeyStore>, path: &Path) {
        if let Err(e) = self.writer.commit_now().await {
            tracing::error!(error = %e, "the last changes did not commit; the next start rebuilds the store from the changelog");
            return;
        }
        let restorer = Arc::clone(&self.restorer);
        let store = Arc::clone(store);
        let path = path.to_path_buf();
        let marked = tokio::task::spawn_blocking(move || {
            let checkpoints = restorer.let_go(&restorer.owned());
            store.mark_clean(&path, &checkpoints)
        })
        .await;
        match marked {
            Ok(Ok(())) => tracing::info!("store marked clean: the next start restores only the changelog's tail"),
            Ok(Err(e)) => tracing::error!(error = %e, "could not mark the store clean; the next start rebuilds it"),
            Err(e) => tracing::error!(error = %e, "could not mark the store clean; the next start rebuilds it"),
        }
    }
}

/// The threads of this module that run beside the pipeline: with `store.standby` the
/// standby copies, and the stalled-transaction thread.
pub(crate) struct Threads {
    standby: Option<ThreadRunning>,
    stalled: Option<ThreadRunning>,
}

impl Threads {
    /// Starts them (none without `store.changelog`); `own_id` is this instance's
    /// `transactional.id`.
    pub(crate) fn start(
        changelog: Option<&Changelog>,
        own_id: Option<&str>,
        config: &crate::config::Config,
        metrics: &Arc<Metrics>,
    ) -> Result<Threads, PipelineError> {
        let standby = start_standby(changelog, config, metrics)?;
        let stalled = start_stalled(changelog, own_id, &config.kafka, metrics)?;
        Ok(Threads { standby, stalled })
    }

    /// Stops them and waits until they have (the standby thread before the clean stop's
    /// checkpoints: `standby`, invariant 3).
    pub(crate) async fn stop(self) {
        for running in [self.standby, self.stalled].into_iter().flatten() {
            running.stop.cancel();
            let thread = running.thread;
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// With `store.changelog` and `store.standby`: the standby thread, tailing what this
/// instance does not hold.
fn start_standby(
    changelog: Option<&Changelog>,
    config: &crate::config::Config,
    metrics: &Arc<Metrics>,
) -> Result<Option<ThreadRunning>, PipelineError> {
    let Some(changelog) = changelog.filter(|_| config.store.standby) else { return Ok(None) };
    let standby = standby::Standby::new(
        &config.kafka,
        Arc::clone(&changelog.restorer),
        changelog.partitions,
        Arc::clone(metrics),
    )?;
    let stop = CancellationToken::new();
    let thread = standby
        .spawn(stop.clone())
        .map_err(|e| PipelineError::Changelog(format!("starting the standby thread: {e}")))?;
    Ok(Some(ThreadRunning { stop, thread }))
}

/// With `store.changelog`: the thread that aborts the transactions other instances left
/// open on the changelog and by-key topics (`stalled`), this instance's own
/// `transactional.id` being `own_id`.
fn start_stalled(
    changelog: Option<&Changelog>,
    own_id: Option<&str>,
    kafka: &KafkaConfig,
    metrics: &Arc<Metrics>,
) -> Result<Option<ThreadRunning>, PipelineError> {
    let (Some(changelog), Some(own_id)) = (changelog, own_id) else { return Ok(None) };
    let mut topics = vec![(changelog.topic.as_str(), changelog.partitions)];
    if let Some(by_key) = &changelog.by_key {
        topics.push((by_key.as_str(), changelog.partitions));
    }
    let stalled = stalled::StalledTransactions::new(kafka, (&topics, changelog.session), own_id, Arc::clone(metrics))?;
    let stop = CancellationToken::new();
    let thread = stalled
        .spawn(stop.clone())
        .map_err(|e| PipelineError::Changelog(format!("starting the stalled-transaction thread: {e}")))?;
    Ok(Some(ThreadRunning { stop, thread }))
}

/// A thread of this module while it runs.
struct ThreadRunning {
    stop: CancellationToken,
    thread: std::thread::JoinHandle<()>,
}

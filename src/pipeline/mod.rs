//! `dedupd run`: wires the store, sinks and engine to Kafka, serves HTTP, purges expired
//! keys, and shuts down in order when `shutdown` resolves or a fatal error fires:
//! stop taking records → drain workers (publish, store offsets) → commit (the consumer's
//! offsets, or the results transaction) → leave the group.
//!
//! Map (imports run down it, never up):
//! - this file: [`run`], built in named steps (core, background tasks, consumer, shutdown).
//! - `consumer`: the `BaseConsumer` on a thread of its own; rebalance callbacks drain,
//!   end the workers' tenures, commit and only then let partitions go; refuses a partition
//!   whose committed offset is beyond the store's watermark; keeps a partition whose state
//!   restores paused until the restore ends. Offsets are stored only after results are
//!   acknowledged.
//! - `partitions`: every partition's state behind one lock (assigned, refused, restoring,
//!   paused for a circuit, held for a full queue, its worker) and the one rule for whether
//!   it is fetched.
//!   Backpressure pauses one partition; the poll thread never blocks.
//! - `queue`: a partition's queue of records for its worker, bounded in records and bytes.
//! - `worker`: one partition's batches through the engine, results to the producer, the
//!   offset stored once they and every earlier batch's are acknowledged.
//! - `circuits`: pauses a partition while its batch waits for an open sink circuit; the
//!   circuit gauges.
//! - `control`: `PartitionControl`, all that workers and circuits may ask of the consumer
//!   (circuit pause and resume, store an offset), so they never import it.
//! - `connect`: at start, the consumer's and the producer's settings connect within
//!   `kafka.connect_timeout`, or `run` stops naming why.
//! - `publish`: the idempotent producer of results and dead letters; what Kafka did not
//!   take is named, so that only it is sent again.
//! - `transactions`: under `kafka.transactional_results`, the producer's one open
//!   transaction, which carries the results and the offsets they settle, committed every
//!   `kafka.transaction_interval` and on revoke and shutdown.
//! - `changelog`: under `store.changelog`, the changelog topic, the store's changes sent in
//!   the open transaction, and the restore of a state partition (on a thread of its own)
//!   before it is processed.
//! - `hop`: under `store.changelog` without `kafka.copartitioned`, the by-key topic's
//!   records (a forward and the input it was made of) and its purge.
//! - `background`: what serves beside the consumer until `run` stops (HTTP, the intake,
//!   purge, the reconciler, the circuit gauges). `door`: the intake's Kafka clients and its
//!   serving for a run. `error`: `PipelineError`.
//! - `reconcile`: every `check.interval`, the `indeterminate` keys of sinks with a check
//!   taken up again (their check asked), and their settlements published.
//! - `metered`: sinks wrapped to report call metrics. `purge`: TTL compaction and store
//!   gauges. `restart`: what carries over when a fenced run starts again. `starting`: the
//!   HTTP listener's server until `background` takes it.
//!
//! Among them: `consumer` uses `partitions`, `queue`, `worker`, `control`, `changelog` and
//! `transactions`; `worker` uses `circuits`, `publish`, `queue`, `control`, `changelog`,
//! `hop` and `transactions`; `reconcile` uses `partitions`, `publish` and `transactions`; `hop` uses none of them; `changelog` uses `publish` and `transactions`; `partitions` uses
//! `control` and `queue`, `circuits` and `transactions` only `control`.

mod background;
mod changelog;
mod circuits;
pub mod config;
mod connect;
mod consumer;
mod control;
mod describe;
mod door;
mod error;
mod hop;
mod metered;
mod partitions;
mod publish;
mod purge;
mod queue;
mod reconcile;
mod restart;
mod session;
mod starting;
mod transactions;
mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::{Clock, Engine, EngineParts, SystemClock};
use crate::ops::{Health, Metrics};
use crate::sinks::{self, Sink};
use crate::store::KeyStore;
use background::{Background, Listeners};
use connect::ClusterSetup;
use restart::{Ended, Kept, restart_after_fence};

pub use changelog::state_partition;
pub use config::{KafkaConfig, PipelineConfig};
pub use consumer::consumer_config;
pub use error::PipelineError;
pub(crate) use publish::producer_config_with;
pub use publish::{Publisher, producer_config};

/// Options of `dedupd run` that are not config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Process partitions whose committed offset is beyond the store's watermark.
    pub accept_empty_store: bool,
    /// With traces on (`[telemetry]`): makes the spans of commands and sink calls.
    pub tracer: Option<crate::telemetry::CommandTracer>,
}

/// A running pipeline's handles, for the demo and tests.
pub struct Running {
    /// Where `/metrics` is served.
    pub http_addr: SocketAddr,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The store.
    pub store: Arc<KeyStore>,
    /// Health for `/readyz`.
    pub health: Arc<Health>,
}

/// Runs until `shutdown` resolves. `on_start` is told where things are once serving.
///
/// Under `kafka.transactional_results`, an instance that finds its group generation gone
/// with work in the open transaction (fenced: paused past its session, its partitions
/// moved; transactions, invariant 6) aborts that transaction and starts the pipeline
/// again in process, as a restart would: from the committed offsets, with its store
/// rebuilt from the changelog under `store.changelog`. The metrics and the HTTP address
/// carry over, so `dedupd_fenced_total` counts every fence.
pub async fn run(
    config: Config,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_start: impl FnOnce(&Running) + Send,
) -> Result<(), PipelineError> {
    let shutdown_requested = CancellationToken::new();
    let watch_shutdown = {
        let requested = shutdown_requested.clone();
        tokio::spawn(async move {
            shutdown.await;
            requested.cancel();
        })
    };
    for sink in config.sinks_unbounded_by_default() {
        tracing::warn!(
            sink,
            max_in_flight = config.max_in_flight().get(),
            "with store.changelog and pipeline.max_in_flight unset, this many calls of the sink may run at once, \
             each with its connection or process; set [sinks.NAME.limits] max_concurrency to bound them \
             (docs/decisions.md, \"Slots with the store on Kafka\")"
        );
    }
    let holding_down = config.sinks_holding_the_default_down();
    if !holding_down.is_empty() {
        tracing::info!(
            sinks = ?holding_down,
            max_in_flight = config.max_in_flight().get(),
            "pipeline.max_in_flight unset: these sinks hold a connection or a process per call without \
             [sinks.NAME.limits] max_concurrency, so at most this many calls run at once rather than 4096 \
             (docs/decisions.md, \"Slots by sink\")"
        );
    }
    let listener = crate::ops::bind(config.http.listen).map_err(|e| PipelineError::Ops(e.to_string()))?;
    let intake_listener = config.intake.as_ref().map(|i| crate::intake::bind(i.listen)).transpose()?;
    let listeners = Listeners { http: &listener, intake: intake_listener.as_ref() };
    let mut on_start = Some(on_start);
    let mut kept = Kept::default();
    let ended = loop {
        match run_once(&config, &options, &shutdown_requested, (listeners, &mut kept), &mut on_start).await {
            Ok(Ended::Fenced(store)) if !shutdown_requested.is_cancelled() => {
                if !kept.fences.allows(std::time::Instant::now()) {
                    tracing::error!(
                        "fenced again and again: another process may take this store's transactional.id each time \
                         (a copied store?); stopping"
                    );
                    break Err(PipelineError::Fatal);
                }
                if let Err(e) = restart_after_fence(store, &shutdown_requested).await {
                    break Err(e);
                }
            }
            Ok(_) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    watch_shutdown.abort();
    ended
}

/// Why the pipeline drains on `fatal`: a fence (it starts again in process, as the runbook
/// says) or a stop.
fn log_fatal(core: &Core) {
    if core.transactions.as_ref().is_some_and(|t| t.was_fenced()) {
        tracing::warn!("fenced: draining, then starting again from the committed offsets");
    } else {
        tracing::error!("fatal error: draining and stopping");
    }
}

/// One run of the pipeline, until `shutdown`, a fatal error or a fence.
async fn run_once<F: FnOnce(&Running) + Send>(
    config: &Config,
    options: &RunOptions,
    shutdown: &CancellationToken,
    (listeners, kept): (Listeners<'_>, &mut Kept),
    on_start: &mut Option<F>,
) -> Result<Ended, PipelineError> {
    let starting = starting::StartingServer::start(listeners.http)?;
    let setup = ClusterSetup::read(config).await?;
    let (core, sinks) = Core::build(config, setup.found(), kept.metrics.clone())?;
    kept.metrics = Some(Arc::clone(&core.metrics));
    let purger = hop::Purger::of_by_key(&config.kafka, setup.changelog_topic.as_ref())?.map(Arc::new);
    // `stop` ends the HTTP listener, purge, the reconciler and gauges; `fatal` is fired by
    // a worker; `consumer_stop` ends the consumer.
    let (stop, fatal, consumer_stop) = (CancellationToken::new(), CancellationToken::new(), CancellationToken::new());
    starting.hand_over().await;
    let background = Background::start(config, listeners, &core, sinks, &stop).await?;
    // Under the by-key hop: what the group committed leaves the by-key topic.
    let purge = purger.clone().map(|p| tokio::spawn(hop::purge_every(p, stop.clone())));
    let own_id = core.transactions.as_ref().map(|t| t.id());
    let changelog_threads = changelog::Threads::start(core.changelog.as_ref(), own_id, config, &core.metrics)?;
    let consumer_thread =
        start_consumer(config, &core, options, (setup.forward_limit, &background), (&fatal, &consumer_stop))?;
    let committer_stop = CancellationToken::new();
    let committer = core.transactions.clone().map(|t| {
        let interval = config.kafka.transaction_interval;
        let changes = core.changelog.as_ref().map(|c| Arc::clone(&c.writer) as Arc<dyn transactions::BeforeCommit>);
        tokio::spawn(transactions::commit_every(t, changes, interval, committer_stop.clone(), fatal.clone()))
    });
    if let Some(on_start) = on_start.take() {
        on_start(&core.running(background.http_addr));
    }
    tracing::info!(http_addr = %background.http_addr, intake_addr = background.intake_addr.map(|a| a.to_string()), backend = core.store.backend_name(), "dedupd running");

    tokio::select! {
        () = shutdown.cancelled() => tracing::info!("shutdown requested: draining"),
        () = fatal.cancelled() => log_fatal(&core),
    }
    // In order: stop taking records and drain the workers (the consumer thread commits),
    // flush the producer, then stop the rest, and make the store durable last.
    consumer_stop.cancel();
    // The consumer thread blocks on the runtime while draining: wait for it off the runtime.
    let _ = tokio::task::spawn_blocking(move || consumer_thread.join()).await;
    // The consumer thread made the last commit, after its workers drained.
    committer_stop.cancel();
    if let Some(committer) = committer {
        let _ = committer.await;
    }
    if let Some(purger) = &purger {
        // The last commit is made: what it settled need not stay on the by-key topic.
        purger.purge().await;
    }
    if let Err(e) = core.publisher.flush(Duration::from_secs(10)) {
        tracing::warn!(error = %e, "producer flush at shutdown");
    }
    stop.cancel();
    background.join().await;
    if let Some(purge) = purge {
        let _ = purge.await;
    }
    changelog_threads.stop().await;
    if let Some(changelog) = &core.changelog
        && !fatal.is_cancelled()
    {
        changelog.stop_cleanly(&core.store, &config.store.path).await;
    }
    core.store.flush_always()?;
    if fatal.is_cancelled() {
        if core.transactions.as_ref().is_some_and(|t| t.was_fenced()) {
            return Ok(Ended::Fenced(Arc::downgrade(&core.store)));
        }
        return Err(PipelineError::Fatal);
    }
    save_presence(&core.store);
    log_stopped(core.engine.in_flight());
    Ok(Ended::Stopped)
}

/// The last line of a stop, with `under_way` commands still at their sinks.
fn log_stopped(under_way: usize) {
    match under_way {
        0 => tracing::info!("dedupd stopped cleanly"),
        // Their workers did not drain in time (logged above): what the calls did is never
        // recorded, so their claims stay `in_progress` (docs/sinks.md, "Shutdown and revoke").
        n => tracing::warn!(
            commands = n,
            "dedupd stopped with commands still at their sinks: their keys stay in_progress, to be re-run or made indeterminate when they come again"
        ),
    }
}

/// At a clean stop, once nothing more is written: the next open reads the presence filter
/// back instead of scanning the store (`store::scan::saved`). A failure costs that open its
/// speed, no more.
fn save_presence(store: &KeyStore) {
    let started = std::time::Instant::now();
    match store.save_presence() {
        Ok(true) => {
            tracing::info!(ms = started.elapsed().as_millis() as u64, "presence filter saved for the next start")
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "could not save the presence filter: the next start scans the store"),
    }
}

/// The configured sinks, metered, by name.
type SinksByName = HashMap<String, Arc<Sink>>;

/// The store, the engine and what they report to, built from the config.
struct Core {
    store: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    engine: Arc<Engine>,
    publisher: Arc<Publisher>,
    clock: Arc<dyn Clock>,
    /// Under `kafka.transactional_results`: the results producer's transactions.
    transactions: Option<Arc<transactions::Transactions>>,
    /// Under `store.changelog`: its writer and restorer.
    changelog: Option<changelog::Changelog>,
}

/// What `run` found in the cluster before it builds its core (`connect`).
struct Found<'a> {
    dead_letter_limit: Option<publish::DeadLetterLimit>,
    changelog_topic: Option<&'a changelog::ChangelogTopic>,
    /// The group session the broker enforces (`session`).
    session: Duration,
}

impl Core {
    /// What `on_start` is told, with the HTTP listener at `http_addr`.
    fn running(&self, http_addr: SocketAddr) -> Running {
        Running {
            http_addr,
            metrics: Arc::clone(&self.metrics),
            store: Arc::clone(&self.store),
            health: Arc::clone(&self.health),
        }
    }

    /// Opens the store and builds the metered sinks, the engine and the producer. Returns
    /// the sinks by name too, for the circuit gauges.
    fn build(
        config: &Config,
        Found { dead_letter_limit, changelog_topic, session }: Found<'_>,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<(Core, SinksByName), PipelineError> {
        let store = Arc::new(match changelog_topic {
            Some(topic) => changelog::open_store(&config.store, topic)?,
            None => KeyStore::open_configured(&config.store)?,
        });
        let metrics = match metrics {
            Some(kept) => kept,
            None => Arc::new(Metrics::new().map_err(|e| PipelineError::Ops(e.to_string()))?),
        };
        let router = Arc::new(config.router()?);
        {
            let routes: Vec<&str> = router.routes().iter().map(|r| r.name.as_str()).collect();
            let sinks: Vec<&str> = config.sinks.keys().map(String::as_str).collect();
            metrics.init_known(&routes, &sinks);
        }
        let metered_sinks: SinksByName = sinks::build_all(&config.sinks)?
            .into_iter()
            .map(|(name, sink)| (name, Arc::new(metered::MeteredEffect::wrap(sink, Arc::clone(&metrics)))))
            .collect();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let engine = Engine::new(EngineParts {
            store: Arc::clone(&store),
            router,
            sinks: metered_sinks.clone(),
            max_in_flight: config.max_in_flight().get(),
            retry: config.retry.clone(),
            stale_guard: config.envelope.stale_guard,
            clock: Arc::clone(&clock),
        })?;
        let (publisher, transactions) =
            Self::publisher(config, &store, (dead_letter_limit, session), Arc::clone(&metrics))?;
        let health = Arc::new(Health::default());
        let changelog = match (changelog_topic, &transactions) {
            (Some(topic), Some(transactions)) => Some(changelog::Changelog::new(
                &config.kafka,
                topic,
                &store,
                transactions,
                (publisher.producer(), session),
                (&metrics, &health),
            )?),
            _ => None,
        };
        let engine = Arc::new(match &changelog {
            Some(c) => engine.with_changelog(Arc::clone(&c.writer) as Arc<dyn crate::engine::ChangeLog>),
            None => engine,
        });
        Ok((Core { store, metrics, health, engine, publisher, clock, transactions, changelog }, metered_sinks))
    }

    /// The producer of results, and its transactions under `kafka.transactional_results`:
    /// one `transactional.id` per store, so that a restart on the same store fences the
    /// producer it replaces. Opening the first transaction waits for the coordinator (within
    /// `kafka.connect_timeout`'s order of time), before the consumer starts.
    fn publisher(
        config: &Config,
        store: &KeyStore,
        (dead_letter_limit, session): (Option<publish::DeadLetterLimit>, Duration),
        metrics: Arc<Metrics>,
    ) -> Result<(Arc<Publisher>, Option<Arc<transactions::Transactions>>), PipelineError> {
        if !config.kafka.transactional_results {
            return Ok((Arc::new(Publisher::new(&config.kafka)?), None));
        }
        let id = format!("dedupd-{}", store.identity()?);
        let publisher = Publisher::with(&config.kafka, Some(&id), dead_letter_limit)?;
        let transactions =
            transactions::Transactions::start(publisher.producer(), &id, metrics, session).map_err(|e| {
                PipelineError::Transactions(format!(
                    "could not open a transaction as `{id}` (kafka.transactional_results): {e}; the cluster must \
                 support transactions (its transaction state log needs enough brokers)"
                ))
            })?;
        tracing::info!(transactional_id = %id, "results are published in transactions");
        Ok((Arc::new(publisher), Some(Arc::new(transactions))))
    }
}

/// Starts the consumer thread, whose workers fire `fatal` on a store or engine failure.
fn start_consumer(
    config: &Config,
    core: &Core,
    options: &RunOptions,
    (forward_limit, background): (usize, &Background),
    (fatal, stop): (&CancellationToken, &CancellationToken),
) -> Result<std::thread::JoinHandle<()>, PipelineError> {
    let shared = Arc::new(worker::WorkerShared {
        engine: Arc::clone(&core.engine),
        publisher: Arc::clone(&core.publisher),
        metrics: Arc::clone(&core.metrics),
        envelope: config.envelope.clone(),
        limits: config.limits.clone(),
        batch_size: config.pipeline.batch_size.get(),
        batch_linger: config.pipeline.batch_linger,
        fatal: fatal.clone(),
        health: Arc::clone(&core.health),
        transactions: core.transactions.clone(),
        state: core.changelog.as_ref().map(|c| worker::StatePartitions {
            count: c.partitions,
            by_key: c.by_key.clone(),
            forward_limit,
        }),
        tracer: options.tracer.clone(),
        group: config.kafka.group_id.clone(),
    });
    consumer::spawn(consumer::ConsumerParts {
        kafka: config.kafka.clone(),
        shared,
        health: Arc::clone(&core.health),
        accept_empty_store: options.accept_empty_store,
        restorer: core.changelog.as_ref().map(|c| Arc::clone(&c.restorer)),
        changes: core.changelog.as_ref().map(|c| Arc::clone(&c.writer) as Arc<dyn transactions::BeforeCommit>),
        stop: stop.clone(),
        // Room for the batch at the engine and those behind it: a full queue pauses the
        // partition, and a paused partition's prefetched records are fetched again.
        queue_per_partition: config.pipeline.batch_size.get() * 4,
        queue_bytes_per_partition: config.pipeline.partition_buffer_bytes.get(),
        current_table: Arc::clone(&background.current_table),
    })
}

//! The engine: one batch of parsed records through decide → claim → one flush → sinks →
//! complete, in rounds whose durability points overlap. No Kafka here: the pipeline feeds
//! batches in and publishes what comes out; tests drive it directly.
//!
//! A batch, step by step, one file per step:
//! - `batch`: the entry points and the round loop, which runs the steps below in order;
//!   a round's completions are made durable by the next round's claim flush (one
//!   durability point for both, the two files synced at the same time), or by the batch's
//!   last flush, and only then are its keys released;
//! - `queue`: queue by key (each key's records in arrival order, rejections done at once);
//! - `start`: start the heads (read their records in one blocking-pool call, then decide
//!   each key's oldest record: done without a sink, to claim, or wait for another batch);
//! - `ticket`: take what each claim's first sink call needs to start at once (a
//!   `max_in_flight` permit, the sink's circuit and limits) before the claim is written;
//! - `claim`: write the round's claims and make them durable in one flush, with the
//!   previous round's completions;
//! - `run`: run the sinks of the durable claims (with `retry`: backoff, circuits, limits);
//! - `complete`: turn each run's end into its result and completion, and write the round's
//!   completions at once;
//! - `processed`: the result record of every outcome;
//! - `changelog`: with `store.changelog`, a round's claims are also committed to the
//!   changelog topic, and completions queued in its open transaction ([`ChangeLog`]).
//!
//! Two rules hold throughout: no sink is called before its claim is durable (a sink request
//! can only be built from a durable claim), and a round's completions are durable (with a
//! changelog: queued ahead of everything that depends on them, see `changelog`) before
//! its keys are released and before the batch's results are returned for publishing. A
//! round that carries completions takes no ticket it would have to wait for (another
//! partition's sink calls must not hold up their durability): without one at once it
//! flushes them alone.
//!
//! Ordering and waiting. Records of one key run one at a time in arrival order: a batch is
//! worked in rounds, each round taking the oldest unfinished record of every key. A key
//! being executed by another batch (another partition) makes its record *wait*; waits are
//! only awaited after the batch's completions are durable and its keys released, so two
//! batches can never wait on each other.
//!
//! Letting go. When `cancel` fires, no sink call is started any more (also none waiting for
//! a permit, a token or a circuit). A claim none of whose calls can have reached the sink
//! (never called, or every call refused before its request left, as the sink tells through
//! [`crate::sinks::CallWatch`]) is released (its previous record restored), so the next
//! owner runs it as if nothing happened; a claim whose request may have arrived without an
//! answer stays `in_progress` for the crash rules of docs/contract.md §4. Such records come back as
//! [`ItemResult::Abandoned`]: the pipeline must not commit past them.

mod batch;
mod changelog;
mod claim;
mod complete;
mod in_doubt;
mod processed;
mod queue;
mod retry;
mod run;
mod start;
mod ticket;
pub use changelog::ChangeLog;
pub use in_doubt::{Reconciled, Skip};
pub use processed::rejected;
pub use retry::RetryConfig;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Semaphore, watch};

use crate::envelope::{Command, Rejection};
use crate::routes::Router;
use crate::sinks::Sink;
use crate::store::{KeyStore, Settled, SourcePos, StoreError};
use crate::telemetry::CommandSpan;

pub use crate::outcome::Processed;

pub use crate::time::{Clock, SystemClock};

/// One input record, parsed.
#[derive(Debug, Clone)]
pub struct Item {
    /// Where it came from.
    pub source: SourcePos,
    /// The command, or why it is not one.
    pub parsed: Result<Command, Rejection>,
    /// `traceparent` of the input (also inside a parsed command).
    pub traceparent: Option<String>,
    /// `tracestate` of the input.
    pub tracestate: Option<String>,
    /// With traces on: the command's span, the parent of its sink calls' spans.
    pub span: Option<CommandSpan>,
    /// Not read from Kafka: the reconciler takes up an `indeterminate` key whose check just
    /// said the effect is absent (when, kept with the completion), to run the command it
    /// keeps (decide's `RunChecked`).
    pub checked_absent: Option<Settled>,
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemResult {
    /// Decided and, where needed, executed and stored: publish it.
    Done(Box<Processed>),
    /// Let go because of `cancel`: do not publish, do not commit past it.
    Abandoned,
}

/// What a batch came to.
#[derive(Debug)]
pub struct BatchReport {
    /// One result per item, in the items' order.
    pub results: Vec<ItemResult>,
    /// Whether the engine flushed the store at least once: then every write made before
    /// the batch started is durable too (e.g. a watermark).
    pub flushed: bool,
}

/// An engine failure: the batch cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store failed; nothing after this is safe.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A route names a sink that was not built.
    #[error("route {route} names sink {sink}, which does not exist")]
    MissingSink { route: String, sink: String },
    /// A blocking store task panicked or was cancelled.
    #[error("store task failed: {0}")]
    Join(String),
    /// The changelog did not commit the store's changes.
    #[error("changelog: {0}")]
    ChangeLog(String),
}

impl EngineError {
    /// Whether the store refused a write because the key's partition was let go in a
    /// rebalance (`store::ownership`): the batch of a worker that outlived its partition,
    /// not a failure of the process.
    pub fn is_let_go(&self) -> bool {
        matches!(self, EngineError::Store(StoreError::NotOwned { .. }))
    }
}

/// The dedup engine shared by all partitions' workers.
pub struct Engine {
    store: Arc<KeyStore>,
    router: Arc<Router>,
    /// One per route index, resolved once.
    route_sinks: Vec<Arc<Sink>>,
    /// Keys being executed by this process, each with the sender its waiters subscribe to,
    /// dropped (waking them) when the key is let go. The sender is made only when a first
    /// waiter comes: most keys never have one, and a watch channel is an allocation of
    /// eight `Notify`s, all notified on drop.
    inflight: Mutex<foldhash::HashMap<String, Option<watch::Sender<()>>>>,
    limiter: Arc<Semaphore>,
    max_in_flight: usize,
    retry: RetryConfig,
    stale_guard: bool,
    clock: Arc<dyn Clock>,
    /// With `store.changelog`: part of every durability point (see `changelog`).
    changelog: Option<Arc<dyn ChangeLog>>,
}

/// How an [`Engine`] is put together.
pub struct EngineParts {
    /// The store.
    pub store: Arc<KeyStore>,
    /// The routes.
    pub router: Arc<Router>,
    /// Sinks by name.
    pub sinks: HashMap<String, Arc<Sink>>,
    /// `pipeline.max_in_flight`.
    pub max_in_flight: usize,
    /// `[retry]`.
    pub retry: RetryConfig,
    /// `envelope.stale_guard`.
    pub stale_guard: bool,
    /// The clock.
    pub clock: Arc<dyn Clock>,
}

impl Engine {
    /// Builds the engine; fails when a route names a missing sink.
    pub fn new(parts: EngineParts) -> Result<Engine, EngineError> {
        let mut route_sinks = Vec::with_capacity(parts.router.routes().len());
        for route in parts.router.routes() {
            let sink = parts
                .sinks
                .get(&route.sink)
                .ok_or_else(|| EngineError::MissingSink { route: route.name.clone(), sink: route.sink.clone() })?;
            route_sinks.push(Arc::clone(sink));
        }
        Ok(Engine {
            store: parts.store,
            router: parts.router,
            route_sinks,
            inflight: Mutex::new(foldhash::HashMap::default()),
            limiter: Arc::new(Semaphore::new(parts.max_in_flight.max(1))),
            max_in_flight: parts.max_in_flight.max(1),
            retry: parts.retry,
            stale_guard: parts.stale_guard,
            clock: parts.clock,
            changelog: None,
        })
    }

    /// The store it writes to.
    pub fn store(&self) -> &Arc<KeyStore> {
        &self.store
    }

    /// The routes it uses.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// The sink of route `route` (an index into the router's routes), if there is one.
    pub fn route_sink(&self, route: usize) -> Option<&Arc<Sink>> {
        self.route_sinks.get(route)
    }

    /// Number of keys executing right now.
    pub fn in_flight(&self) -> usize {
        self.inflight.lock().len()
    }
}

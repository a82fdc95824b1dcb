//! What serves beside the consumer until `run` stops: the HTTP listener (metrics, health,
//! the admin API), the intake (`[intake]`), TTL compaction (`purge`), the reconciler of keys in doubt (`reconcile`)
//! and the circuit gauges.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::partitions::CurrentTable;
use super::reconcile::{Owner, Reconciler};
use super::{Core, PipelineError, SinksByName, changelog, circuits, door, purge};
use crate::config::Config;

/// The listeners `run` binds once, so that their addresses outlive a restart after a fence.
#[derive(Clone, Copy)]
pub(super) struct Listeners<'a> {
    /// Metrics, health and the admin API.
    pub(super) http: &'a std::net::TcpListener,
    /// The intake's, when `[intake]` is on.
    pub(super) intake: Option<&'a std::net::TcpListener>,
}

/// What serves beside the consumer until `stop`: HTTP, the intake, purge and the circuit
/// gauges.
pub(super) struct Background {
    pub(super) http_addr: SocketAddr,
    pub(super) intake_addr: Option<SocketAddr>,
    http: JoinHandle<()>,
    intake: Option<JoinHandle<()>>,
    purge: JoinHandle<()>,
    reconcile: JoinHandle<()>,
    /// The running consumer's partition table, which the reconciler asks whose keys are
    /// here (the consumer is told it).
    pub(super) current_table: Arc<CurrentTable>,
    circuit_gauges: Vec<JoinHandle<()>>,
}

impl Background {
    pub(super) async fn start(
        config: &Config,
        listeners: Listeners<'_>,
        core: &Core,
        sinks: SinksByName,
        stop: &CancellationToken,
    ) -> Result<Background, PipelineError> {
        let circuit_gauges = circuits::spawn_gauges(&sinks, &core.metrics, stop);
        let current_table = Arc::new(CurrentTable::default());
        let reconciler = Reconciler {
            unattended_by_sink: Default::default(),
            engine: Arc::clone(&core.engine),
            publisher: Arc::clone(&core.publisher),
            transactions: core.transactions.clone(),
            owner: match &core.changelog {
                Some(changelog) => Owner::State(changelog.key_owner()),
                None => Owner::Input(Arc::clone(&current_table)),
            },
            sinks: sinks.iter().filter_map(|(name, sink)| sink.check_timing().map(|t| (name.clone(), *t))).collect(),
            metrics: Arc::clone(&core.metrics),
        };
        let reconcile = tokio::spawn(reconciler.run(stop.clone()));
        // From here on the engine alone keeps the sinks; the admin API asks their checks
        // through weak references (`resolve --check`).
        let weak_sinks = sinks.iter().map(|(name, sink)| (name.clone(), Arc::downgrade(sink))).collect();
        drop(sinks);
        let admin = config.http.admin_token.clone().map(|token| crate::ops::AdminApi {
            store: Arc::clone(&core.store),
            token,
            resolve_ttl: config.store.default_ttl,
            compaction_chunk: config.store.compaction_chunk.get(),
            status: Some(crate::ops::StatusSources {
                health: Arc::clone(&core.health),
                metrics: Arc::clone(&core.metrics),
            }),
            owner: core.changelog.as_ref().map(changelog::Changelog::key_owner),
            sinks: weak_sinks,
        });
        let metrics = Arc::clone(&core.metrics);
        let stopped = stop.clone().cancelled_owned();
        let (http_addr, http) =
            crate::ops::serve_with_admin(listeners.http, metrics, Arc::clone(&core.health), admin, stopped)
                .await
                .map_err(|e| PipelineError::Ops(e.to_string()))?;
        // The listener's own errors end it; `run` goes on draining regardless.
        let http = tokio::spawn(async move {
            let _ = http.await;
        });
        let (intake_addr, intake) = match (&config.intake, listeners.intake) {
            (Some(intake), Some(listener)) => {
                let (addr, task) = door::serve(config, intake, listener, core, stop).await?;
                (Some(addr), Some(task))
            }
            _ => (None, None),
        };
        let purge = tokio::spawn(purge::run(
            Arc::clone(&core.store),
            Arc::clone(&core.metrics),
            Arc::clone(&core.engine),
            Arc::clone(&core.clock),
            config.store.clone(),
            stop.clone(),
        ));
        Ok(Background { http_addr, intake_addr, http, intake, purge, reconcile, current_table, circuit_gauges })
    }

    /// Waits for every task once `stop` is cancelled.
    pub(super) async fn join(self) {
        let _ = self.purge.await;
        let _ = self.reconcile.await;
        let _ = self.http.await;
        if let Some(intake) = self.intake {
            let _ = intake.await;
        }
        for gauge in self.circuit_gauges {
            let _ = gauge.await;
        }
    }
}

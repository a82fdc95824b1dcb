//! `GET /v1/status` (docs/admin.md): one instance at a glance, in the spirit of `vector top`:
//! whether it is ready and alive (and why not), each partition it holds with its state and
//! lag, the commands claimed and not completed, each sink's circuit, and the store's records, bytes and
//! volume. `dedupd status --admin URL [--watch]` prints it as a table.
//!
//! The partitions come from the running pipeline through [`PartitionsView`] (the consumer's
//! partition table, registered on [`Health`] when a consumer starts); the rest from
//! [`Health`] and the metrics, so the view and a scrape agree.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Health, Metrics};

/// Where the status comes from.
#[derive(Clone)]
pub struct StatusSources {
    /// Readiness, liveness, the partitions down or restoring, and the partition view.
    pub health: Arc<Health>,
    /// Lag, in-flight commands, circuits, the store's figures.
    pub metrics: Arc<Metrics>,
}

/// The answer of `GET /v1/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// dedupd's version.
    pub version: String,
    /// Whether `/readyz` answers 200, and why not.
    pub ready: bool,
    pub not_ready: Option<String>,
    /// Whether `/healthz` answers 200, and why not.
    pub alive: bool,
    pub not_alive: Option<String>,
    /// The partitions held, in name order.
    pub partitions: Vec<PartitionStatus>,
    /// Commands at their sinks now.
    pub in_flight: i64,
    /// Each sink's circuit: `closed` or `open` (open or half-open).
    pub circuits: BTreeMap<String, String>,
    /// The store.
    pub store: StoreStatus,
}

/// One partition.
#[derive(Debug, Serialize, Deserialize)]
pub struct PartitionStatus {
    /// `topic/partition`.
    pub partition: String,
    /// `running`, `restoring`, `down`, `refused`, `unchecked`, `paused_for_circuit` or
    /// `held_for_full_queue`.
    pub state: String,
    /// Why it is not running (a restore's progress, a panic's offsets), when known.
    pub detail: Option<String>,
    /// Records behind the partition's end, once it has a committed offset.
    pub lag: Option<i64>,
}

/// The store's figures (as of the last refresh, every ≤ 5 s).
#[derive(Debug, Serialize, Deserialize)]
pub struct StoreStatus {
    /// Records by state.
    pub records: BTreeMap<String, i64>,
    pub disk_bytes: i64,
    pub volume_size_bytes: i64,
    pub volume_free_bytes: i64,
}

impl StatusSources {
    /// The status now.
    pub fn status(&self) -> Status {
        let figures = self.metrics.figures();
        let down: BTreeMap<String, String> = self.health.down().into_iter().collect();
        let mut partitions: Vec<PartitionStatus> = self
            .health
            .held_partitions()
            .into_iter()
            .map(|(name, stopped)| {
                // A partition whose state restores is shown with its state partition's
                // progress (the changelog's partition of the same number).
                let number = name.rsplit('/').next();
                let restore =
                    || down.iter().find(|(n, d)| d.starts_with(super::RESTORING) && n.rsplit('/').next() == number);
                let detail = down.get(&name).cloned().or_else(|| match stopped {
                    Some("restoring") => restore().map(|(_, d)| d.clone()),
                    _ => None,
                });
                let state = match (&detail, stopped) {
                    (Some(d), _) if d.starts_with(super::RESTORING) => "restoring",
                    (Some(_), None) => "down",
                    (_, Some(why)) => why,
                    (None, None) => "running",
                };
                PartitionStatus {
                    lag: figures.lag.get(&name).copied(),
                    state: state.to_string(),
                    detail,
                    partition: name,
                }
            })
            .collect();
        partitions.sort_by(|a, b| a.partition.cmp(&b.partition));
        let alive = self.health.liveness_at(Instant::now());
        let circuits =
            figures.circuits.into_iter().map(|(sink, open)| (sink, if open { "open" } else { "closed" }.to_string()));
        Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ready: self.health.is_ready(),
            not_ready: self.health.why_not_ready(),
            alive: alive.is_ok(),
            not_alive: alive.err(),
            partitions,
            in_flight: figures.in_flight,
            circuits: circuits.collect(),
            store: StoreStatus {
                records: figures.records.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                disk_bytes: figures.disk_bytes,
                volume_size_bytes: figures.volume_size_bytes,
                volume_free_bytes: figures.volume_free_bytes,
            },
        }
    }
}

/// The partitions a running pipeline holds.
pub trait PartitionsView: Send + Sync {
    /// Every assigned partition (`topic/partition`), with what keeps it from being fetched,
    /// if anything (`refused`, `unchecked`, `paused_for_circuit`, `held_for_full_queue`).
    fn partitions(&self) -> Vec<(String, Option<&'static str>)>;
}

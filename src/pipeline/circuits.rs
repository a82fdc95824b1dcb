//! Sink circuit breakers seen from the pipeline (docs/sinks.md, "Circuit breaker and
//! backpressure"): a gauge and a log line per sink, and backpressure on Kafka: while a
//! partition's in-flight batch has a command for a sink whose circuit is open, the
//! partition is paused, so librdkafka stops fetching records that could not run anyway and
//! the worker queue does not grow; it is resumed when the circuit closes or the batch ends.
//!
//! The engine does the waiting (no retries spent while the circuit is open); this module
//! only decides what Kafka should fetch meanwhile. Offsets are untouched: a paused
//! partition's offset is stored, as always, only once the batch's results are acknowledged.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::control::{PartitionControl, Tp};
use crate::engine::Engine;
use crate::engine::Item;
use crate::ops::Metrics;
use crate::sinks::Sink;

/// Keeps `dedupd_sink_circuit_open{sink}` equal to each breaker's state until `stop`.
pub(super) fn spawn_gauges(
    sinks: &HashMap<String, Arc<Sink>>,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    sinks
        .values()
        .filter(|s| s.circuit().is_some())
        .map(|sink| {
            let (sink, metrics, stop) = (Arc::clone(sink), Arc::clone(metrics), stop.clone());
            tokio::spawn(async move {
                let Some(circuit) = sink.circuit() else { return };
                let mut rx = circuit.subscribe();
                loop {
                    let open = *rx.borrow_and_update();
                    metrics.set_sink_circuit_open(sink.name(), open);
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { return },
                        () = stop.cancelled() => return,
                    }
                }
            })
        })
        .collect()
}

/// The sinks with a breaker that the commands of `items` route to, by name.
pub(super) fn sinks_of(engine: &Engine, items: &[Item]) -> Vec<Arc<Sink>> {
    let mut by_name: BTreeMap<&str, Arc<Sink>> = BTreeMap::new();
    for cmd in items.iter().filter_map(|i| i.parsed.as_ref().ok()) {
        if let Some(sink) = engine.route_sink(cmd.route)
            && sink.circuit().is_some()
        {
            by_name.entry(sink.name()).or_insert_with(|| Arc::clone(sink));
        }
    }
    by_name.into_values().collect()
}

/// Runs `batch` (the engine working on one partition's batch), pausing the partition while
/// any of `sinks` has its circuit open, and resuming it when they are all closed again or
/// the batch ends.
pub(super) async fn pausing_while_open<T>(
    control: &dyn PartitionControl,
    tp: Tp,
    sinks: &[Arc<Sink>],
    batch: impl Future<Output = T>,
) -> T {
    let circuits: Vec<_> = sinks.iter().filter_map(|s| s.circuit()).collect();
    if circuits.is_empty() {
        return batch.await;
    }
    let mut changes: Vec<_> = circuits.iter().map(|c| c.subscribe()).collect();
    let mut batch = pin!(batch);
    let mut paused = false;
    let out = loop {
        let open: Vec<&str> = circuits.iter().filter(|c| !c.is_closed()).map(|c| c.sink()).collect();
        if open.is_empty() == paused {
            paused = !open.is_empty();
            if paused {
                control.pause_for_circuit(&tp, &open);
            } else {
                control.resume_after_circuit(&tp);
            }
        }
        // The senders live in the circuits, which `sinks` keeps alive: `changed` cannot fail.
        let changed = futures::future::select_all(changes.iter_mut().map(|rx| Box::pin(rx.changed())));
        tokio::select! {
            out = &mut batch => break out,
            _ = changed => {}
        }
    };
    if paused {
        control.resume_after_circuit(&tp);
    }
    out
}

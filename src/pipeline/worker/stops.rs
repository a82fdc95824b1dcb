//! How a worker's batch stops short: a store failure stops the process (logged naming
//! what failed, counted, `/readyz` 503); a write the store refused because the partition
//! was let go, or a worker whose tenure ended, ends only the batch (`Stop::Drain`).

use super::{PartitionWorker, Stop};

impl PartitionWorker {
    /// Runs `write` on the store, on the blocking pool (a store write can wait for another
    /// thread's flush); a failure stops the process, saying it failed `doing` that.
    pub(super) async fn on_store(
        &self,
        doing: &str,
        write: impl FnOnce() -> Result<(), crate::store::StoreError> + Send + 'static,
    ) -> Result<(), Stop> {
        let done = tokio::task::spawn_blocking(write)
            .await
            .map_err(|e| crate::store::StoreError::Backend { backend: "join", message: e.to_string() });
        if let Ok(Err(e)) | Err(e) = done {
            self.store_failed(&e, doing);
            return Err(Stop::Fatal);
        }
        Ok(())
    }

    /// `Err(Stop::Drain)` once the worker's tenure ended: its partition was let go while this
    /// batch was at its sinks, past the drain bound, and its new owner publishes what this
    /// batch would have (reading the inputs again, it finds the records as this store left
    /// them in the changelog: writes after the let-go are refused, `store::ownership`).
    pub(super) fn still_held(&self) -> Result<(), Stop> {
        if self.tenure.holds() {
            return Ok(());
        }
        tracing::warn!(topic = %self.topic, partition = self.partition,
            "the partition was let go while this batch was at its sinks (past the drain bound): its results are not published; its new owner publishes them");
        Err(Stop::Drain)
    }

    /// The engine failed `doing` something: a store failure is reported as such
    /// ([`PartitionWorker::store_failed`]); either stops the process, unless the store
    /// refused a write because the partition was let go.
    pub(super) fn engine_failed(&self, e: crate::engine::EngineError, doing: &str) -> Stop {
        if e.is_let_go() {
            // Not a failure of the process: this worker outlived its partition.
            tracing::warn!(error = %e, doing, topic = %self.topic, partition = self.partition,
                "the partition was let go while this batch was at its sinks (past the drain bound): the batch ends here; its new owner settles it");
            return Stop::Drain;
        }
        match e {
            crate::engine::EngineError::Store(e) => self.store_failed(&e, doing),
            e => {
                tracing::error!(error = %e, doing, topic = %self.topic, partition = self.partition, "engine failed; stopping")
            }
        }
        Stop::Fatal
    }

    /// A store failure, which stops the process: logged saying what failed (a full disk
    /// names its path), counted in `dedupd_store_write_errors_total{kind}`, and `/readyz` 503.
    pub(super) fn store_failed(&self, e: &crate::store::StoreError, doing: &str) {
        tracing::error!(error = %e, disk_full = e.is_disk_full(), topic = %self.topic, partition = self.partition,
            "store failed {doing}; stopping (exit non-zero: restart once the cause is fixed)");
        if let Some(kind) = e.write_error_kind() {
            self.shared.metrics.store_write_failed(kind);
        }
        self.shared.health.set_store_failed(&e.to_string());
    }
}

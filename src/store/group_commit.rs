//! Group commit across callers: partitions flushing at the same time share fsyncs. A
//! caller is done as soon as a flush that *started after its writes* has finished; flushes
//! are numbered as they start and run one at a time, so waiting callers find most of their
//! work already done by the one ahead of them. Its lock is a leaf of `locks`' order: taken
//! with no other lock of the store held.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Backend, StoreError, fault};

/// The flushes started and the last one finished.
#[derive(Default)]
pub(super) struct GroupCommit {
    /// Flushes started so far.
    started: AtomicU64,
    /// The number of the last flush that finished; held while a flush runs.
    done: Mutex<u64>,
}

impl GroupCommit {
    /// Returns once a flush of `backend` that started after this call's writes finished.
    pub(super) fn flush(&self, backend: &dyn Backend) -> Result<(), StoreError> {
        // Every write of this caller happened before this load.
        let wanted = self.started.load(Ordering::SeqCst) + 1;
        // Before the lock: a test holds and counts every caller here (engine_group_commit).
        fault::failpoint("store.flush")
            .map_err(|e| StoreError::Backend { backend: backend.name(), message: e.to_string() })?;
        let mut last_done = self.done.lock();
        if *last_done >= wanted {
            return Ok(());
        }
        let number = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        backend.flush()?;
        *last_done = number;
        Ok(())
    }

    /// Flushes started so far.
    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

//! The partition table of the consumer running now, for the reconciler.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{PartitionTable, Tp};

/// The partition table of the consumer running now (each new consumer, after a fence or a
/// lost session, has its own): for the reconciler, which asks whether a partition runs here.
#[derive(Default)]
pub(crate) struct CurrentTable(Mutex<Option<Arc<PartitionTable>>>);

impl CurrentTable {
    /// `table` is the running consumer's from now on.
    pub(crate) fn set(&self, table: &Arc<PartitionTable>) {
        *self.0.lock() = Some(Arc::clone(table));
    }

    /// Whether `tp` runs here now (see [`PartitionTable::runs`]).
    pub(crate) fn runs(&self, tp: &Tp) -> bool {
        self.0.lock().as_ref().is_some_and(|table| table.runs(tp))
    }
}

//! Records per state, kept up to date by every mutation (without a lock: each count is an
//! atomic, read as a snapshot that may be a moment behind a mutation under way).

use std::sync::atomic::{AtomicI64, Ordering};

use super::{State, StateCounts};

/// The position of `state`'s count in `[in_progress, completed, indeterminate]`.
pub(super) fn state_index(state: State) -> usize {
    match state {
        State::InProgress => 0,
        State::Completed => 1,
        State::Indeterminate => 2,
    }
}

/// The counts, in [`state_index`] order.
#[derive(Default)]
pub(super) struct Counts([AtomicI64; 3]);

impl Counts {
    /// `n` more records of `state` (fewer when negative).
    pub(super) fn add(&self, state: State, n: i64) {
        self.0[state_index(state)].fetch_add(n, Ordering::Relaxed);
    }

    /// The counts as a scan of the store found them, in [`state_index`] order.
    pub(super) fn set(&self, counts: [i64; 3]) {
        for (count, c) in self.0.iter().zip(counts) {
            count.store(c, Ordering::Relaxed);
        }
    }

    pub(super) fn snapshot(&self) -> StateCounts {
        StateCounts {
            in_progress: self.0[0].load(Ordering::Relaxed),
            completed: self.0[1].load(Ordering::Relaxed),
            indeterminate: self.0[2].load(Ordering::Relaxed),
        }
    }
}

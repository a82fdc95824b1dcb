//! What the store keeps for its changelog (`store.changelog`): whether it captures changes
//! at all, the changes captured and not yet taken together with the partitions it owns
//! (`ownership`), both under one lock, and how many restores are running. That lock is a
//! leaf of `locks`' order: taken inside a stripe or the exclusive gate, nothing inside it.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::expiries::Captured;

/// The capture part of a `KeyStore`.
#[derive(Default)]
pub(super) struct Capture {
    /// Whether changes are captured: only a changelog's cache captures them.
    on: bool,
    captured: Mutex<Captured>,
    /// Restores running (`expiries`, invariant 6).
    restores: AtomicUsize,
}

impl Capture {
    /// From now on changes are captured (a store opened as a changelog's cache).
    pub(super) fn turn_on(&mut self) {
        self.on = true;
    }

    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// The capture lock: the changes not yet taken and the partitions owned.
    pub(super) fn lock(&self) -> MutexGuard<'_, Captured> {
        self.captured.lock()
    }

    pub(super) fn restore_began(&self) {
        self.restores.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn restore_ended(&self) {
        self.restores.fetch_sub(1, Ordering::AcqRel);
    }

    pub(super) fn restore_running(&self) -> bool {
        self.restores.load(Ordering::Acquire) > 0
    }
}

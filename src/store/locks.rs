//! The store's locks and the one order they are taken in; every lock of [`super::KeyStore`]
//! is taken through this file's methods, so the order below can be read in one place.
//!
//! **Lock order.** A thread holding one of these takes only those listed after it:
//! 1. the **gate** ([`Locks::shared`], [`Locks::exclusive`]): every mutation and every
//!    stamped read holds it shared; a compaction chunk, a turn of the slices, a change of
//!    the partitions owned, the saved filter and the open's scan hold it exclusively, so
//!    that the index and the records cannot change under them;
//! 2. **stripes** ([`Locks::stripe`], [`Locks::stripe_at`], [`Locks::stripes_in_order`]),
//!    one per range of key hashes, holding the claims and the presence filter of their keys:
//!    several at once only in ascending order (a claim batch), so batches cannot deadlock;
//!    a completion batch's backend write is made with none held (`claims::completions`);
//! 3. leaves, inside which no lock of 1–3 is taken: the **index entry** lock
//!    ([`Locks::index_entry`], inside a stripe while an expiry-index entry shared by several
//!    keys is rewritten), the **capture** lock (`capture`: the changes captured for the
//!    changelog and the partitions owned; inside a stripe or the exclusive gate) and the
//!    **group commit**'s (`group_commit`, held while the backend flushes);
//! 4. the parts' own locks, with no lock of 1–3 taken inside them: the keys in doubt
//!    (`doubts`), the live slices (`slices`, held through a turn of the slices) and the
//!    claim journal's (`journal`).
//!
//! Waiting for a stripe's completions to land ([`Locks::wait_settled`]) releases that stripe
//! meanwhile and takes it back, as a condition variable does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::claims::Stripe;
use super::presence;

/// How many stripes the key hashes are spread over (also the saved filter's count).
pub(super) const STRIPES: usize = 1024;

/// The gate, the stripes with their condition variables, and the index entry lock.
pub(super) struct Locks {
    gate: RwLock<()>,
    stripes: Box<[Mutex<Stripe>]>,
    /// One per stripe: notified when completions written there land (see
    /// `claims::completions`), for the writes waiting for them.
    settled: Box<[Condvar]>,
    /// Held (inside a stripe lock) while an index entry shared by several keys is rewritten.
    index_entry: Mutex<()>,
    /// Bumped by every compaction chunk (which removes records without stripe locks), so a
    /// `ReadStamp` taken before one is never trusted after it.
    compactions: AtomicU64,
}

impl Locks {
    pub(super) fn new() -> Locks {
        Locks {
            gate: RwLock::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(Stripe::default())).collect(),
            settled: (0..STRIPES).map(|_| Condvar::new()).collect(),
            index_entry: Mutex::new(()),
            compactions: AtomicU64::new(0),
        }
    }

    /// Order 1: the gate, shared: a mutation or a stamped read.
    pub(super) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// Order 1: the gate, exclusive: nothing else changes the store meanwhile.
    pub(super) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write()
    }

    /// The stripe of `key`.
    pub(super) fn stripe_of(key: &str) -> usize {
        presence::key_hash(key).0
    }

    /// Order 2: the stripe of `key`, locked.
    pub(super) fn stripe(&self, key: &str) -> MutexGuard<'_, Stripe> {
        self.stripes[Self::stripe_of(key)].lock()
    }

    /// Order 2: stripe `at`, locked.
    pub(super) fn stripe_at(&self, at: usize) -> MutexGuard<'_, Stripe> {
        self.stripes[at].lock()
    }

    /// Order 2: stripe `at`, if no one holds it.
    pub(super) fn try_stripe_at(&self, at: usize) -> Option<MutexGuard<'_, Stripe>> {
        self.stripes[at].try_lock()
    }

    /// Order 2: every stripe in ascending order, each locked as the iteration reaches it; a
    /// caller that keeps the guards holds them in the order that cannot deadlock.
    pub(super) fn stripes_in_order(&self) -> impl Iterator<Item = MutexGuard<'_, Stripe>> {
        self.stripes.iter().map(|s| s.lock())
    }

    /// Waits, at most `bound`, for completions of stripe `at` to land; `stripe` (its guard)
    /// is released meanwhile.
    pub(super) fn wait_settled(&self, at: usize, stripe: &mut MutexGuard<'_, Stripe>, bound: Duration) {
        self.settled[at].wait_for(stripe, bound);
    }

    /// Wakes those waiting for completions of stripe `at`.
    pub(super) fn notify_settled(&self, at: usize) {
        self.settled[at].notify_all();
    }

    /// Order 3: the index entry lock, inside a stripe.
    pub(super) fn index_entry(&self) -> MutexGuard<'_, ()> {
        self.index_entry.lock()
    }

    /// Compaction chunks run so far (read with a stripe held, for a `ReadStamp`).
    pub(super) fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Acquire)
    }

    /// A compaction chunk ran; called under the exclusive gate.
    pub(super) fn count_compaction(&self) {
        self.compactions.fetch_add(1, Ordering::AcqRel);
    }
}

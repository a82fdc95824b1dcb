//! Completions: a round's claims replaced by their completed records in one backend write,
//! made with no stripe held.
//!
//! Why not under the stripe locks, as a claim is written: a backend write can wait long
//! (fjall holds its journal's lock while another thread's flush fsyncs), and a round's keys
//! lock a good part of the stripes, so every other partition's reads and claims waited
//! behind that write (docs/performance-notes.md, "Completions written with no stripe held"). So a batch
//! of completions goes in three steps:
//! 1. the batch takes a number and joins the batches under way ([`UnderWay`]); with its
//!    stripes locked, each claim (checked by its token) is marked with that number, which
//!    makes it no longer out; the change is captured for the changelog; the stripes are
//!    let go;
//! 2. the backend write, holding only the gate, shared (no compaction chunk meanwhile);
//! 3. the batch leaves the batches under way: its completions have landed, all at once,
//!    with no stripe locked. Then each stripe it can lock without waiting drops its marked
//!    claims; whoever next locks one of the others for a write drops them there
//!    (`Stripe::settle`). If the write failed, each stripe is locked instead, to make the
//!    claims out again, before the batch leaves.
//!
//! Kept while a completion may be under way (its batch is not older than the oldest under
//! way: a batch that landed after an older one still under way counts as under way too):
//! 1. a read under a stripe lock (`KeyStore::get_locked`) answers the key's record before
//!    the completion: its claim in the journal, or the backend's (which holds the claim
//!    until the write lands, atomically); once the batch landed, the backend's, the
//!    completion. So a key's reads never go back in time;
//! 2. no other write of the key starts: `compare_and_swap` and restores wait
//!    (`KeyStore::lock_settled`) and a claim is refused as a lost race, so no write of the
//!    key lands before this one to be overwritten by it (a forgotten key coming back);
//! 3. a claim never trusts a read made before the completion landed ([`super::ReadStamp`]):
//!    dropping a marked claim moves its stripe's version, and a batch of claims settles its
//!    stripes before it checks its stamps;
//! 4. scans, which read the backend and the journal's claims without the stripes, hold the
//!    gate exclusively, so they never see a record between its two homes.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::{DurableClaim, LockedStripes, Stripe};
use crate::store::locks::Locks;
use crate::store::{Completed, KeyStore, Op, Record, State, StoreError, Tree, index, presence};

/// The completion batches whose writes are under way, by number.
#[derive(Debug)]
pub(in crate::store) struct UnderWay {
    /// The next number, and the batches under way.
    batches: Mutex<(u64, Vec<u64>)>,
    /// The oldest batch under way (`u64::MAX`: none). Every completion of an older batch
    /// has landed.
    oldest: AtomicU64,
}

impl Default for UnderWay {
    fn default() -> UnderWay {
        UnderWay { batches: Mutex::new((0, Vec::new())), oldest: AtomicU64::new(u64::MAX) }
    }
}

impl UnderWay {
    /// The oldest batch under way: completions of older batches have landed.
    pub(in crate::store) fn oldest(&self) -> u64 {
        self.oldest.load(Ordering::Acquire)
    }

    /// A new batch, under way until [`UnderWay::end`].
    fn begin(&self) -> u64 {
        let mut batches = self.batches.lock();
        let batch = batches.0;
        batches.0 += 1;
        batches.1.push(batch);
        if batches.1.len() == 1 {
            self.oldest.store(batch, Ordering::Release);
        }
        batch
    }

    /// `batch` has landed (or was taken back).
    fn end(&self, batch: u64) {
        let mut batches = self.batches.lock();
        batches.1.retain(|&b| b != batch);
        let oldest = batches.1.iter().copied().min().unwrap_or(u64::MAX);
        // Release: a reader that sees the batch retired sees its write applied.
        self.oldest.store(oldest, Ordering::Release);
    }
}

/// A claim marked in step 1.
struct Taken {
    /// Its stripe.
    at: usize,
    key: String,
    /// Whether the journal held the claim.
    journaled: bool,
    /// The sink the claim's kept command went to, when it keeps one (the reconciler's run
    /// of a key in doubt): the key leaves that sink's keys in doubt (`doubts`).
    in_doubt_at: Option<String>,
}

/// What step 1 leaves to the write.
struct Begun {
    batch: u64,
    taken: Vec<Taken>,
    ops: Vec<Op>,
    /// A key whose claim was replaced meanwhile (an operator forgot it).
    lost: Option<String>,
}

impl KeyStore {
    /// Replaces the durable claim with its completion. Durable after the next [`KeyStore::flush`].
    pub fn complete(&self, claim: DurableClaim, completed: Completed) -> Result<Record, StoreError> {
        let record = Record::Completed(completed.clone());
        self.complete_batch(vec![(claim, completed)])?;
        Ok(record)
    }

    /// Replaces each durable claim with its completion, all in one atomic write with one
    /// expiry-index entry per second of expiry. Durable after the next [`KeyStore::flush`].
    /// Claims that were replaced meanwhile (an operator forgot the key) are left alone and
    /// reported as [`StoreError::ClaimLost`] once the others are written; so are, as
    /// [`StoreError::NotOwned`], claims of keys whose partition this store let go meanwhile
    /// (`ownership`, invariant 8). Returns how many were written.
    pub fn complete_batch(&self, items: Vec<(DurableClaim, Completed)>) -> Result<usize, StoreError> {
        let _gate = self.locks.shared();
        let (items, refused) = self.owned_only(items, |(claim, _)| claim.key.as_str());
        let Begun { batch, mut taken, ops, lost } = self.begin_completions(items)?;
        let written = if ops.is_empty() { Ok(()) } else { self.backend.apply(ops) };
        match written {
            Ok(()) => self.end_completions(batch, &mut taken),
            Err(e) => {
                self.take_back(batch, taken);
                return Err(e);
            }
        }
        match (lost, refused) {
            (Some(key), _) => Err(StoreError::ClaimLost(key)),
            (None, Some(refused)) => Err(refused),
            (None, None) => Ok(taken.len()),
        }
    }

    /// The stripe of `key`, locked once no completion of `key` is being written (invariant
    /// 2 above): a write made under it lands after that completion.
    pub(in crate::store) fn lock_settled(&self, key: &str) -> MutexGuard<'_, Stripe> {
        let at = Locks::stripe_of(key);
        let mut stripe = self.locks.stripe_at(at);
        while stripe.completing(key, self.under_way.oldest()) {
            // Bounded: a completion retires without the stripe lock, so its notification
            // can pass this thread by just before it waits.
            self.locks.wait_settled(at, &mut stripe, std::time::Duration::from_millis(1));
        }
        stripe.settle(self.under_way.oldest());
        stripe
    }

    /// Step 1: with the stripes locked, marks the claims with the batch's number and builds the
    /// write. On failure nothing is left changed.
    fn begin_completions(&self, items: Vec<(DurableClaim, Completed)>) -> Result<Begun, StoreError> {
        let stripes: Vec<usize> = items.iter().map(|(c, _)| Locks::stripe_of(&c.key)).collect();
        let mut begun = Begun {
            batch: self.under_way.begin(),
            taken: Vec::with_capacity(items.len()),
            ops: Vec::with_capacity(items.len() + 1),
            lost: None,
        };
        let mut locks = self.lock_stripes(stripes.iter().copied());
        if let Err(e) = self.mark_claims(&mut locks, items, stripes, &mut begun) {
            for t in &begun.taken {
                if let Ok((_, stripe)) = locks.get(t.at) {
                    make_out_again(stripe, &t.key);
                }
            }
            drop(locks);
            self.under_way.end(begun.batch);
            return Err(e);
        }
        // Invariant 1 of `changelog`: captured with the stripes still locked.
        self.capture_ops(&begun.ops);
        Ok(begun)
    }

    fn mark_claims(
        &self,
        locks: &mut LockedStripes<'_>,
        items: Vec<(DurableClaim, Completed)>,
        stripes: Vec<usize>,
        begun: &mut Begun,
    ) -> Result<(), StoreError> {
        // Expiries, by position in `taken`.
        let mut indexed: Vec<(usize, i64)> = Vec::with_capacity(items.len());
        for ((claim, completed), at) in items.into_iter().zip(stripes) {
            let (_, stripe) = locks.get(at)?;
            // The claim is still the key's record exactly when its token is still out.
            let journaled = match stripe.claims.get(&claim.key) {
                Some(o) if o.token == claim.token && o.completion.is_none() => o.journaled.is_some(),
                _ => {
                    begun.lost.get_or_insert(claim.key);
                    continue;
                }
            };
            // A claim the backend holds is completed in its slice; one the journal holds
            // goes to the current slice (`slices`, invariant 4).
            let held = if journaled { None } else { self.slice_holding(stripe, &claim.key)? };
            let slice = held.unwrap_or_else(|| self.current_slice());
            let new = Record::Completed(completed);
            begun.ops.push(Op::Put(Tree::Records(slice), claim.key.as_bytes().to_vec(), new.encode()));
            if let Some(expiry) = new.expires_at_ms() {
                indexed.push((begun.taken.len(), expiry));
            }
            if let Some(out) = stripe.claims.get_mut(&claim.key) {
                out.completion = Some(begun.batch);
            }
            stripe.oldest_completion =
                if stripe.completions == 0 { begun.batch } else { stripe.oldest_completion.min(begun.batch) };
            stripe.completions += 1;
            stripe.version = stripe.version.wrapping_add(1);
            if held.is_none() {
                // Not in the backend yet: into the presence filter before the write.
                stripe.present.add(presence::key_hash(&claim.key).1, slice);
            }
            let in_doubt_at = claim.record().held.as_ref().map(|held| held.sink.clone());
            begun.taken.push(Taken { at, key: claim.key, journaled, in_doubt_at });
        }
        let pairs: Vec<(&str, i64)> =
            indexed.iter().map(|&(i, expiry)| (begun.taken[i].key.as_str(), expiry)).collect();
        let index_ops = index::entry_ops(&pairs, self.backend.index_entry_keys())?;
        begun.ops.extend(index_ops);
        Ok(())
    }

    /// Step 3, the write landed: the batch retires, the journal's claims are released, the
    /// counts move, the marked claims are dropped where their stripes are free, and writes
    /// waiting on the stripes are woken.
    fn end_completions(&self, batch: u64, taken: &mut [Taken]) {
        self.under_way.end(batch);
        if let Some(journal) = &self.journal {
            // Invariant 2 of `journal`: released only now that the completions are applied.
            journal.release_all(taken.iter().filter(|t| t.journaled).map(|t| t.key.as_str()));
        }
        self.counts.add(State::InProgress, -(taken.len() as i64));
        self.counts.add(State::Completed, taken.len() as i64);
        for t in taken.iter() {
            if let Some(sink) = &t.in_doubt_at {
                self.doubts.completed(sink, &t.key);
            }
        }
        taken.sort_unstable_by_key(|t| t.at);
        for same_stripe in taken.chunk_by(|a, b| a.at == b.at) {
            let at = same_stripe[0].at;
            // A stripe another thread holds is left to settle: waiting here for it would
            // bring back the wait this module exists to avoid.
            if let Some(mut stripe) = self.locks.try_stripe_at(at) {
                for t in same_stripe {
                    // One lookup. The entry is this batch's mark unless a writer settled the
                    // stripe since the write landed and claimed the key anew: that claim stays.
                    match stripe.claims.remove(&t.key) {
                        Some(c) if c.completion == Some(batch) => {
                            stripe.completions = stripe.completions.saturating_sub(1);
                        }
                        Some(other) => {
                            stripe.claims.insert(t.key.clone(), other);
                        }
                        None => {}
                    }
                }
                // A read of a dropped claim (journaled) is stale now.
                stripe.version = stripe.version.wrapping_add(1);
            }
            self.locks.notify_settled(at);
        }
    }

    /// Step 3, the write failed: each stripe locked in turn, the claims are out again; then
    /// the batch leaves the batches under way.
    fn take_back(&self, batch: u64, mut taken: Vec<Taken>) {
        taken.sort_unstable_by_key(|t| t.at);
        for same_stripe in taken.chunk_by(|a, b| a.at == b.at) {
            let at = same_stripe[0].at;
            let mut stripe = self.locks.stripe_at(at);
            for t in same_stripe {
                make_out_again(&mut stripe, &t.key);
            }
        }
        self.under_way.end(batch);
        for same_stripe in taken.chunk_by(|a, b| a.at == b.at) {
            self.locks.notify_settled(same_stripe[0].at);
        }
    }
}

/// Undoes step 1 for `key`: its claim is out again (a key whose sink ran never looks absent),
/// and the stripe's version moves (a read of the completion is stale).
fn make_out_again(stripe: &mut Stripe, key: &str) {
    if let Some(out) = stripe.claims.get_mut(key)
        && out.completion.take().is_some()
    {
        stripe.completions = stripe.completions.saturating_sub(1);
    }
    stripe.version = stripe.version.wrapping_add(1);
}

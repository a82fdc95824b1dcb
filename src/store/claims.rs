//! Claims and completions: the hot path, two writes per command and as few reads as the
//! compare-and-swap semantics allow.
//!
//! Each stripe lock guards a small [`Stripe`]: a version bumped by every mutation of a key
//! in the stripe, and the claims of the stripe that are out (made by this process and not
//! yet completed or replaced). Both let a caller skip a store read that could only confirm
//! what it already knows:
//! - [`KeyStore::get_stamped`] returns a [`ReadStamp`]; [`KeyStore::claim_batch`] trusts
//!   the record read with it when nothing in the stripe changed since (and no compaction
//!   ran), instead of reading it again under the lock;
//! - [`KeyStore::complete_batch`] checks a claim is still the key's current record by its
//!   token in the stripe, not by reading the record back;
//! - reads under a stripe lock ask the stripe's presence filter first (see `presence`): a key
//!   it does not know is absent, without a store read.
//!
//! Every write to a record goes through these or `compare_and_swap`, decided under the
//! stripe lock, and the store directory is locked to one process, so the stripe's view is
//! exact. A completion's backend write itself runs after its stripes are let go, its claim
//! marked meanwhile (`completions` says why and what that keeps).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

mod completions;

pub(super) use completions::UnderWay;

use super::SyncMode;
use super::{InProgress, KeyStore, Op, Record, State, StoreError, Tree, doubts, presence};

/// What a stripe lock guards.
#[derive(Debug, Default)]
pub(super) struct Stripe {
    /// Bumped by every mutation of a key in this stripe.
    version: u64,
    /// Claims out: key → its token and, for a claim held by the journal, its record; also
    /// the claims whose completion is being written, or landed and not yet dropped.
    claims: foldhash::HashMap<String, OutClaim>,
    /// The keys of this stripe that hold a record *in the backend* (see `presence`).
    pub(super) present: super::presence::Presence,
    /// How many of `claims` carry a completion's batch (at least: one a claim replaced is
    /// counted until the next settle), and the oldest such batch (at most).
    completions: usize,
    oldest_completion: u64,
}

/// A claim made by this process and not yet completed or replaced.
#[derive(Debug)]
struct OutClaim {
    /// The token of its [`DurableClaim`].
    token: u64,
    /// The record, when the claim is held by the journal (not the backend): then this is
    /// the key's only record.
    journaled: Option<InProgress>,
    /// The batch writing its completion (see `completions`): the claim is no longer out.
    completion: Option<u64>,
}

impl Stripe {
    /// Whether this process holds a claim of `key` (out, or being completed).
    pub(super) fn has_claim(&self, key: &str) -> bool {
        self.claims.contains_key(key)
    }

    /// A key of this stripe was written outside a claim (`bulk`): reads made before are stale.
    pub(super) fn bump(&mut self) {
        self.version = self.version.wrapping_add(1);
    }

    /// `key` was written: any claim of it that was out is no longer current. Returns
    /// whether that claim was held by the journal (then it must be released there once the
    /// write that replaced it is applied). Called on a settled stripe (`settle`).
    pub(super) fn changed(&mut self, key: &str) -> bool {
        self.version = self.version.wrapping_add(1);
        self.claims.remove(key).is_some_and(|c| c.journaled.is_some() && c.completion.is_none())
    }

    /// The claims of this stripe held by the journal (none being completed: scans run when
    /// no completion is under way, and a landed one is the backend's).
    pub(super) fn journaled_claims(&self) -> impl Iterator<Item = (&str, &InProgress)> {
        self.claims
            .iter()
            .filter(|(_, c)| c.completion.is_none())
            .filter_map(|(k, c)| Some((k.as_str(), c.journaled.as_ref()?)))
    }

    /// The record of `key` if its current record is a claim held by the journal (not one
    /// being completed).
    pub(super) fn journaled(&self, key: &str) -> Option<&InProgress> {
        self.claims.get(key).filter(|c| c.completion.is_none()).and_then(|c| c.journaled.as_ref())
    }

    /// The claim of `key` held by the journal, as the key's record for a read: also while
    /// its completion is under way (its batch is not older than `under_way`, the oldest
    /// batch under way), not once the completion landed. One lookup.
    pub(super) fn held(&self, key: &str, under_way: u64) -> Option<Record> {
        let out = self.claims.get(key)?;
        match out.completion {
            Some(batch) if batch < under_way => None,
            _ => out.journaled.clone().map(Record::InProgress),
        }
    }

    /// Whether `key` carries a completion's batch. Right after [`Stripe::settle`], with the
    /// lock still held, that batch may still be under way.
    pub(super) fn marked(&self, key: &str) -> bool {
        self.completing(key, 0)
    }

    /// Whether the completion of `key` may still be under way.
    pub(super) fn completing(&self, key: &str, under_way: u64) -> bool {
        self.completions > 0 && self.claims.get(key).and_then(|c| c.completion).is_some_and(|b| b >= under_way)
    }

    /// Drops the claims whose completions landed (batches older than `under_way`): their
    /// records are the backend's now. Only when one may have landed since the last time.
    pub(super) fn settle(&mut self, under_way: u64) {
        if self.completions == 0 || self.oldest_completion >= under_way {
            return;
        }
        let (mut kept, mut oldest) = (0, u64::MAX);
        self.claims.retain(|_, c| match c.completion {
            Some(batch) if batch < under_way => false,
            Some(batch) => {
                kept += 1;
                oldest = oldest.min(batch);
                true
            }
            None => true,
        });
        (self.completions, self.oldest_completion) = (kept, oldest);
        // A read of a dropped claim (journaled) is stale now.
        self.version = self.version.wrapping_add(1);
    }
}

/// What a batch of claims writes once every request is decided.
struct BatchWrites {
    /// Backend writes: the claims that replace a record there.
    ops: Vec<Op>,
    /// Claims of absent keys, for the journal: (key, encoded record).
    journaled: Vec<(String, Vec<u8>)>,
    /// Journal claims that claims written to the backend replace (see `journal`).
    to_release: Vec<String>,
    /// States the batched claims replace (None = absent), for the counts.
    replaced: Vec<Option<State>>,
    /// Per claim made: its stripe, and whether the journal holds it.
    claimed_at: Vec<(usize, bool)>,
}

impl BatchWrites {
    fn with_capacity(requests: usize) -> BatchWrites {
        BatchWrites {
            ops: Vec::with_capacity(requests),
            journaled: Vec::new(),
            to_release: Vec::new(),
            replaced: Vec::with_capacity(requests),
            claimed_at: Vec::with_capacity(requests),
        }
    }
}

/// The stripes a batch holds: (index, version before the batch wrote anything, guard),
/// ascending by index.
struct LockedStripes<'a>(Vec<(usize, u64, parking_lot::MutexGuard<'a, Stripe>)>);

impl LockedStripes<'_> {
    /// The stripe `at` and its version when locked.
    fn get(&mut self, at: usize) -> Result<(u64, &mut Stripe), StoreError> {
        match self.0.binary_search_by_key(&at, |(i, _, _)| *i) {
            Ok(pos) => {
                let (_, version, guard) = &mut self.0[pos];
                Ok((*version, &mut **guard))
            }
            Err(_) => {
                Err(StoreError::Backend { backend: "store", message: "stripe of a batch not locked (a bug)".into() })
            }
        }
    }
}

/// Claim tokens: unique within the process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// When a record was read: lets [`KeyStore::claim_batch`] skip reading it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadStamp {
    stripe_version: u64,
    compactions: u64,
}

impl ReadStamp {
    /// A stamp that is never trusted: the record is read again under the lock.
    const NEVER: ReadStamp = ReadStamp { stripe_version: u64::MAX, compactions: u64::MAX };
}

/// One claim of a [`KeyStore::claim_batch`]: the key, the record read with its stamp
/// (what the claim replaces: `None` = absent), and the claim to write.
#[derive(Debug)]
pub struct ClaimRequest {
    /// The key.
    pub key: String,
    /// What [`KeyStore::get_stamped`] returned for it.
    pub expected: Option<Record>,
    /// The stamp of that read.
    pub stamp: ReadStamp,
    /// The claim to write.
    pub claim: InProgress,
}

/// A claim written but not yet durable. It cannot be handed to a sink.
#[derive(Debug)]
#[must_use = "a claim must be flushed with KeyStore::flush_claims before its sink runs"]
pub struct PendingClaim {
    key: String,
    record: InProgress,
    token: u64,
    /// The journal position to sync, for a claim held by the journal; `None` for a claim
    /// written to the backend.
    journal_position: Option<u64>,
}

impl PendingClaim {
    /// The claimed key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// A claim that has reached the disk: the only thing a sink request can be built from.
/// Only [`KeyStore::flush_claims`] makes one.
#[derive(Debug)]
pub struct DurableClaim {
    key: String,
    record: InProgress,
    token: u64,
}

impl DurableClaim {
    /// The claimed key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The in-progress record as written (attempt number, first sighting).
    pub fn record(&self) -> &InProgress {
        &self.record
    }
}

impl KeyStore {
    /// Locks the given stripes, in ascending order so that batches cannot deadlock.
    fn lock_stripes(&self, stripes: impl Iterator<Item = usize>) -> LockedStripes<'_> {
        let mut order: Vec<usize> = stripes.collect();
        order.sort_unstable();
        order.dedup();
        LockedStripes(
            order
                .into_iter()
                .map(|i| {
                    let mut guard = self.locks.stripe_at(i);
                    guard.settle(self.under_way.oldest());
                    (i, guard.version, guard)
                })
                .collect(),
        )
    }

    /// The record of `key` and a stamp of when it was read.
    pub fn get_stamped(&self, key: &str) -> Result<(Option<Record>, ReadStamp), StoreError> {
        let _gate = self.locks.shared();
        let stripe = self.locks.stripe(key);
        let stamp = ReadStamp { stripe_version: stripe.version, compactions: self.locks.compactions() };
        Ok((self.get_locked(&stripe, key)?, stamp))
    }

    /// Claims `key` (absent → in_progress, or expired/orphaned `expected` → in_progress).
    /// The claim is not durable until [`KeyStore::flush_claims`]. Returns `Err(current)`
    /// when the stored record is not `expected`.
    pub fn claim(
        &self,
        key: &str,
        expected: Option<&Record>,
        claim: InProgress,
    ) -> Result<Result<PendingClaim, Option<Record>>, StoreError> {
        let request =
            ClaimRequest { key: key.to_string(), expected: expected.cloned(), stamp: ReadStamp::NEVER, claim };
        let mut out = self.claim_batch(vec![request])?;
        out.pop().ok_or_else(|| StoreError::Backend { backend: self.backend.name(), message: "empty claim".into() })
    }

    /// Claims of records read with [`KeyStore::get_stamped`], in one atomic write: per
    /// request, the pending claim, or `Err(current)` when the key no longer holds what was
    /// read (then nothing is written for it). A read is trusted, not repeated, when nothing
    /// in its key's stripe changed since and no compaction ran.
    pub fn claim_batch(
        &self,
        requests: Vec<ClaimRequest>,
    ) -> Result<Vec<Result<PendingClaim, Option<Record>>>, StoreError> {
        let _gate = self.locks.shared();
        self.check_owned(requests.iter().map(|r| r.key.as_str()))?;
        let compactions = self.locks.compactions();
        let hashes: Vec<(usize, u32)> = requests.iter().map(|r| presence::key_hash(&r.key)).collect();
        let mut locks = self.lock_stripes(hashes.iter().map(|&(at, _)| at));
        // A key's second request in one batch is refused: its first claim is not written
        // yet, so there is nothing to compare with.
        let repeated: Vec<bool> = {
            let mut seen = HashSet::with_capacity(requests.len());
            requests.iter().map(|r| !seen.insert(r.key.as_str())).collect()
        };
        let mut out = Vec::with_capacity(requests.len());
        let mut writes = BatchWrites::with_capacity(requests.len());
        for ((req, (at, fp)), repeated) in requests.into_iter().zip(hashes).zip(repeated) {
            if repeated {
                out.push(Err(req.expected));
                continue;
            }
            // Stamps are checked against the stripes as they were before this batch wrote
            // anything, so claims of two keys of one stripe in one batch both trust their reads.
            let (version, stripe) = locks.get(at)?;
            let trusted = version == req.stamp.stripe_version && req.stamp.compactions == compactions;
            let current = if trusted { req.expected.clone() } else { self.get_locked(stripe, &req.key)? };
            // A claim written now over a key whose completion may be under way could land
            // in the backend before it: refused as a lost race, to be decided again
            // (invariant 2 of `completions`). The stripe was settled when locked, so a mark
            // left on it is such a completion: the batch under way then, even if it landed
            // since (a fresh look could find it landed and trust a read made before).
            if current != req.expected || (current.is_some() && stripe.marked(&req.key)) {
                out.push(Err(current));
                continue;
            }
            let new = Record::InProgress(req.claim);
            // Replacing a completed record rewrites its shared index entry, and a claim that
            // replaces a key in doubt or keeps a command moves the key in its sink's
            // (`doubts`): alone, now.
            let alone = current.as_ref().is_some_and(|c| c.expires_at_ms().is_some() || doubts::sink_of(c).is_some())
                || doubts::sink_of(&new).is_some();
            let in_journal = current.is_none() && self.journal.is_some() && !alone;
            if in_journal {
                // A key with no record anywhere: the journal holds the claim (invariant 1).
                writes.journaled.push((req.key.clone(), new.encode()));
                writes.replaced.push(None);
            } else if alone {
                self.swap_locked(stripe, &req.key, current, Some(&new), true)?;
            } else {
                let replaces_journaled = stripe.journaled(&req.key).is_some();
                // A record the backend holds is rewritten in its slice, any other goes to
                // the current one (`slices`, invariant 4).
                let held = match current.is_some() && !replaces_journaled {
                    true => self.slice_holding(stripe, &req.key)?,
                    false => None,
                };
                let slice = held.unwrap_or_else(|| self.current_slice());
                if held.is_none() {
                    // Into the presence filter before the write (see `presence`).
                    stripe.present.add(fp, slice);
                }
                if replaces_journaled {
                    writes.to_release.push(req.key.clone());
                }
                writes.ops.push(Op::Put(Tree::Records(slice), req.key.as_bytes().to_vec(), new.encode()));
                writes.replaced.push(current.as_ref().map(Record::state));
            }
            let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
            let Record::InProgress(record) = new else { unreachable!("constructed above") };
            out.push(Ok(PendingClaim { key: req.key, record, token, journal_position: None }));
            writes.claimed_at.push((at, in_journal));
        }
        self.write_claim_batch(&mut locks, writes, &mut out)?;
        Ok(out)
    }

    /// Writes what [`KeyStore::claim_batch`] decided, with its stripes still locked: the
    /// backend ops, the journal's claims, the releases, the counts, and the claims out in
    /// their stripes.
    fn write_claim_batch(
        &self,
        locks: &mut LockedStripes<'_>,
        writes: BatchWrites,
        out: &mut [Result<PendingClaim, Option<Record>>],
    ) -> Result<(), StoreError> {
        let BatchWrites { ops, journaled, to_release, replaced, claimed_at } = writes;
        // Invariant 1 of `changelog`: with the stripes still locked.
        self.capture_ops(&ops);
        for (key, value) in &journaled {
            self.capture(key, Some(value.clone()));
        }
        if !ops.is_empty() {
            self.backend.apply(ops)?;
        }
        let position = match (&self.journal, journaled.is_empty()) {
            (Some(journal), false) => Some(journal.append(journaled, &|| self.backend.flush())?),
            _ => None,
        };
        if let Some(journal) = &self.journal {
            // Invariant 2: released only now that the writes replacing them are applied.
            journal.release_all(to_release.iter().map(String::as_str));
        }
        for state in replaced {
            if let Some(state) = state {
                self.counts.add(state, -1);
            }
            self.counts.add(State::InProgress, 1);
        }
        for (claim, (at, in_journal)) in out.iter_mut().filter_map(|r| r.as_mut().ok()).zip(claimed_at) {
            let (_, stripe) = locks.get(at)?;
            // What `Stripe::changed` does, with the new claim replacing any old one in a
            // single map operation.
            stripe.version = stripe.version.wrapping_add(1);
            let journaled = in_journal.then(|| claim.record.clone());
            stripe.claims.insert(claim.key.clone(), OutClaim { token: claim.token, journaled, completion: None });
            if in_journal {
                claim.journal_position = position;
            }
        }
        Ok(())
    }

    /// Makes a batch of claims durable: one fsync of the journal for the claims it holds,
    /// one flush of the backend for the others (neither with `sync = "none"`).
    pub fn flush_claims(&self, claims: Vec<PendingClaim>) -> Result<Vec<DurableClaim>, StoreError> {
        self.flush_claims_and_backend(claims, false)
    }

    /// The durability point of an engine round: makes `claims` durable and, with
    /// `backend`, everything written to the backend before the call too (e.g. the previous
    /// round's completions). The journal's fsync and the backend's flush then run at the
    /// same time, so the two files cost one fsync's wait rather than two in a row; each is
    /// shared with the other callers syncing that file at the same moment (group commit).
    pub fn flush_claims_and_backend(
        &self,
        claims: Vec<PendingClaim>,
        backend: bool,
    ) -> Result<Vec<DurableClaim>, StoreError> {
        let position = claims.iter().filter_map(|c| c.journal_position).max();
        let journal = match (&self.journal, position, self.sync) {
            (Some(journal), Some(position), SyncMode::Batch) => Some((journal, position)),
            _ => None,
        };
        let backend = backend || claims.iter().any(|c| c.journal_position.is_none());
        match (journal, backend) {
            (Some((journal, position)), true) => std::thread::scope(|s| {
                let synced = s.spawn(|| journal.sync(position));
                let flushed = self.flush();
                let synced = synced.join().unwrap_or_else(|_| {
                    Err(StoreError::Backend { backend: "journal", message: "fsync thread panicked".into() })
                });
                flushed.and(synced)
            })?,
            (Some((journal, position)), false) => journal.sync(position)?,
            (None, true) => self.flush()?,
            (None, false) => {}
        }
        Ok(claims.into_iter().map(|c| DurableClaim { key: c.key, record: c.record, token: c.token }).collect())
    }
}

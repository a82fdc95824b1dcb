//! An in-memory filter of the keys present in the store, so that a claim of a fresh key
//! (the common case of a dedup store) skips the store read that could only say "absent".
//!
//! Each stripe keeps the 32-bit fingerprints of the keys of that stripe that hold a record
//! (any state). The filter is a *superset* of the present keys: a fingerprint may stand for
//! another key too (a collision) and then a read is done as before, but a key that holds a
//! record always has its fingerprint in its stripe. That is the one property the store
//! relies on (a miss means absent), and it holds because:
//! - the filter is filled at open from the full scan the store already does (counts);
//! - every write of a record happens under its stripe lock, and a key that goes from absent
//!   to present is added *before* its write is applied (a failed write leaves a harmless
//!   extra fingerprint);
//! - a key is removed only after its delete was applied (`forget`, a compare-and-swap to
//!   nothing, compaction), and each removal takes away one count: two present keys with
//!   the same fingerprint are counted twice, so deleting one leaves the other found.
//!
//! Each entry also names the slice that holds the key (see `slices`), so that a read
//! probes that slice alone: a fingerprint of 27 bits and a slice of 5 in 32 bits. A key
//! that holds a record in slice S has the entry (its fingerprint, S), kept the same way: a
//! key moved from one slice to another gains the new entry before the write and loses the
//! old one after it. The filter counts its keys per slice, so the store knows when a
//! slice holds none (`slices`).
//!
//! Readers consult it under the stripe lock, so they see exactly the writes applied before.
//! Memory: a table of 32-bit entries per stripe (4 bytes per slot, 1 control byte, 44–88%
//! load: 5–10 bytes per key), plus a map of the entries held by more than one key (about
//! 3 pairs per million keys per live slice at 100M keys).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;

use super::Slice;

/// Bits of an entry that name the slice: enough for [`Slice::MAX`].
const SLICE_BITS: u32 = Slice::MAX.trailing_zeros();

/// Bits of a fingerprint: the rest of an entry's 32.
const FP_BITS: u32 = 32 - SLICE_BITS;

/// The stripe and fingerprint of a key, from one 64-bit hash of its bytes (in memory only,
/// so it may change between versions). Eight bytes at a time: it runs for every key of every
/// claim, completion and compacted record.
pub(super) fn key_hash(key: &str) -> (usize, u32) {
    key_bytes_hash(key.as_bytes())
}

/// [`key_hash`] of a key as the backend holds it (the UTF-8 bytes of a `&str`).
pub(super) fn key_bytes_hash(bytes: &[u8]) -> (usize, u32) {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h: u64 = 0x243f_6a88_85a3_08d3 ^ bytes.len() as u64;
    let mut mix = |chunk: &[u8]| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(K);
        h ^= h >> 29;
    };
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        mix(w);
    }
    if !words.remainder().is_empty() {
        mix(words.remainder());
    }
    // splitmix64's finalizer: the stripe takes the low bits, the fingerprint the high ones.
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z as usize) % super::STRIPES, (z >> (64 - FP_BITS)) as u32)
}

/// The entry of a key with fingerprint `fp` held by `slice`.
pub(super) fn entry(fp: u32, slice: Slice) -> u32 {
    (fp << SLICE_BITS) | slice.number() as u32
}

/// The slice an entry names.
fn slice_of(entry: u32) -> Slice {
    Slice::new((entry & ((1 << SLICE_BITS) - 1)) as usize).unwrap_or(Slice::FIRST)
}

/// Slices, as a set of their numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Slices(u32);

impl Slices {
    #[cfg(test)]
    pub(super) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The one slice in the set, if it holds exactly one.
    pub(super) fn only(self) -> Option<Slice> {
        (self.0.count_ones() == 1).then(|| Slice::new(self.0.trailing_zeros() as usize)).flatten()
    }

    pub(super) fn iter(self) -> impl Iterator<Item = Slice> {
        (0..Slice::MAX).filter(move |n| self.0 & (1 << n) != 0).filter_map(Slice::new)
    }

    fn insert(&mut self, slice: Slice) {
        self.0 |= 1 << slice.number();
    }
}

/// Hashes fingerprints for the sets below: they are already uniform, so one multiply
/// suffices, and a random seed per set keeps keys chosen by an outsider (who can compute
/// fingerprints) from piling into one bucket.
#[derive(Debug, Clone)]
pub(super) struct SeededFp(u64);

impl Default for SeededFp {
    fn default() -> Self {
        SeededFp(rand::random())
    }
}

impl BuildHasher for SeededFp {
    type Hasher = FpHasher;
    fn build_hasher(&self) -> FpHasher {
        FpHasher(self.0)
    }
}

/// See [`SeededFp`].
pub(super) struct FpHasher(u64);

impl Hasher for FpHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

/// The entries of one stripe's present keys, counted.
#[derive(Debug, Default)]
pub(super) struct Presence {
    /// Every entry held by at least one present key, hashed by its fingerprint alone.
    once: HashTable<u32>,
    /// Entries held by more than one present key: how many more.
    more: HashMap<u32, u32, SeededFp>,
    seed: SeededFp,
    /// Present keys per slice.
    per_slice: [u32; Slice::MAX],
}

impl Presence {
    fn hash(&self, entry: u32) -> u64 {
        self.seed.hash_one(entry >> SLICE_BITS)
    }

    /// The slices that may hold a key with this fingerprint (none: it is absent).
    pub(super) fn slices(&self, fp: u32) -> Slices {
        let mut slices = Slices::default();
        for &e in self.once.iter_hash(self.seed.hash_one(fp)) {
            if e >> SLICE_BITS == fp {
                slices.insert(slice_of(e));
            }
        }
        slices
    }

    /// Whether a key with this fingerprint may be present (`false`: it is absent).
    #[cfg(test)]
    pub(super) fn may_contain(&self, fp: u32) -> bool {
        !self.slices(fp).is_empty()
    }

    /// A key with this fingerprint became present in `slice`.
    pub(super) fn add(&mut self, fp: u32, slice: Slice) {
        self.add_entry(entry(fp, slice));
    }

    fn add_entry(&mut self, e: u32) {
        let hash = self.hash(e);
        if self.once.find(hash, |&x| x == e).is_some() {
            *self.more.entry(e).or_insert(0) += 1;
        } else {
            let seed = &self.seed;
            self.once.insert_unique(hash, e, |&x| seed.hash_one(x >> SLICE_BITS));
        }
        self.per_slice[slice_of(e).number()] += 1;
    }

    /// Keys with these fingerprints became present in `slice`, all at once: the table grows
    /// once, and while it is in cache.
    pub(super) fn add_all(&mut self, fps: &[u32], slice: Slice) {
        let seed = &self.seed;
        self.once.reserve(fps.len(), |&x| seed.hash_one(x >> SLICE_BITS));
        for &fp in fps {
            self.add(fp, slice);
        }
    }

    /// A key with this fingerprint, present in `slice` until now, was deleted from it.
    pub(super) fn remove(&mut self, fp: u32, slice: Slice) {
        let e = entry(fp, slice);
        match self.more.get_mut(&e) {
            Some(extra) if *extra > 1 => *extra -= 1,
            Some(_) => {
                self.more.remove(&e);
            }
            None => {
                let hash = self.hash(e);
                match self.once.find_entry(hash, |&x| x == e) {
                    Ok(found) => {
                        found.remove();
                    }
                    // Not counted: nothing to take away.
                    Err(_) => return,
                }
            }
        }
        let count = &mut self.per_slice[slice.number()];
        *count = count.saturating_sub(1);
    }

    /// Present keys per slice, as this filter counts them.
    pub(super) fn per_slice(&self) -> &[u32; Slice::MAX] {
        &self.per_slice
    }

    /// Its entries, and those held by more than one key with how many more: what
    /// [`Presence::from_parts`] builds it again from (`scan::saved`).
    pub(super) fn parts(
        &self,
    ) -> (impl ExactSizeIterator<Item = u32> + '_, impl ExactSizeIterator<Item = (u32, u32)> + '_) {
        (self.once.iter().copied(), self.more.iter().map(|(&e, &extra)| (e, extra)))
    }

    /// The filter whose [`Presence::parts`] these are; `None` when they cannot be one (an
    /// entry twice in `once`, or one in `more` that is not in `once` or counts no other
    /// key).
    pub(super) fn from_parts(once: &[u32], more: &[(u32, u32)]) -> Option<Presence> {
        let mut p = Presence::default();
        let seed = &p.seed;
        p.once.reserve(once.len(), |&x| seed.hash_one(x >> SLICE_BITS));
        for &e in once {
            let hash = p.hash(e);
            if p.once.find(hash, |&x| x == e).is_some() {
                return None;
            }
            let seed = &p.seed;
            p.once.insert_unique(hash, e, |&x| seed.hash_one(x >> SLICE_BITS));
            p.per_slice[slice_of(e).number()] += 1;
        }
        for &(e, extra) in more {
            let hash = p.hash(e);
            if extra == 0 || p.once.find(hash, |&x| x == e).is_none() || p.more.insert(e, extra).is_some() {
                return None;
            }
            p.per_slice[slice_of(e).number()] += extra;
        }
        Some(p)
    }

    /// Fingerprints counted (present keys, as far as the filter knows).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.once.len() + self.more.values().map(|&n| n as usize).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_fingerprints_are_counted() {
        let first = Slice::FIRST;
        let mut p = Presence::default();
        assert!(!p.may_contain(7));
        p.add(7, first);
        p.add(7, first);
        p.add(9, first);
        assert_eq!(p.len(), 3);
        p.remove(7, first);
        assert!(p.may_contain(7), "the other key with fingerprint 7 is still present");
        p.remove(7, first);
        assert!(!p.may_contain(7));
        assert!(p.may_contain(9));
        assert_eq!(p.len(), 1);
        assert_eq!(p.per_slice()[0], 1);
    }

    #[test]
    fn entries_name_their_slice_and_are_counted_per_slice() {
        let (first, third) = (Slice::FIRST, Slice::new(3).unwrap());
        let mut p = Presence::default();
        p.add(7, first);
        p.add(7, third);
        p.add(7, third);
        p.add(8, third);
        assert_eq!(p.slices(7).iter().collect::<Vec<_>>(), vec![first, third]);
        assert_eq!(p.slices(7).only(), None);
        assert_eq!(p.slices(8).only(), Some(third));
        assert!(p.slices(9).is_empty());
        assert_eq!((p.per_slice()[0], p.per_slice()[3]), (1, 3));
        // A key of fingerprint 7 moved from the first slice to the third.
        p.remove(7, first);
        assert_eq!(p.slices(7).only(), Some(third));
        assert_eq!((p.per_slice()[0], p.per_slice()[3]), (0, 3));
        // Removing what was never added changes nothing.
        p.remove(8, first);
        assert_eq!(p.per_slice()[3], 3);
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn parts_build_the_same_filter_and_nothing_else() {
        let (first, second) = (Slice::FIRST, Slice::new(1).unwrap());
        let mut p = Presence::default();
        for fp in [7, 7, 7, 9, 11] {
            p.add(fp, first);
        }
        p.add(7, second);
        let (once, more) = p.parts();
        let (once, more): (Vec<u32>, Vec<(u32, u32)>) = (once.collect(), more.collect());
        let mut q = Presence::from_parts(&once, &more).expect("its own parts");
        assert_eq!(q.len(), 6);
        assert_eq!(q.per_slice()[..2], [5, 1]);
        q.remove(7, first);
        q.remove(7, first);
        assert_eq!(q.slices(7).iter().collect::<Vec<_>>(), vec![first, second], "the third key with fingerprint 7");
        // Parts no filter has: a fingerprint twice, an extra count of an absent one, a zero.
        assert!(Presence::from_parts(&[7, 7], &[]).is_none());
        assert!(Presence::from_parts(&[7], &[(9, 1)]).is_none());
        assert!(Presence::from_parts(&[7], &[(7, 0)]).is_none());
    }

    #[test]
    fn stripe_matches_and_fingerprints_spread() {
        let fps: std::collections::HashSet<u32> = (0..10_000).map(|i| key_hash(&format!("key-{i}")).1).collect();
        assert!(fps.len() > 9_990, "fingerprints collide too often: {}", fps.len());
        let stripes: std::collections::HashSet<usize> = (0..10_000).map(|i| key_hash(&format!("key-{i}")).0).collect();
        assert_eq!(stripes.len(), super::super::STRIPES);
    }
}

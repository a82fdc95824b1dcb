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
//! Readers consult it under the stripe lock, so they see exactly the writes applied before.
//! Memory: a `HashSet<u32>` per stripe (4 bytes per slot, 1 control byte, 44–88% load:
//! 5–10 bytes per key), plus a map of the fingerprints held by more than one key (empty in
//! practice: ~0.1 such pairs per million keys).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

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
    ((z as usize) % super::STRIPES, (z >> 32) as u32)
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

/// The fingerprints of one stripe's present keys, counted.
#[derive(Debug, Default)]
pub(super) struct Presence {
    /// Every fingerprint held by at least one present key.
    once: HashSet<u32, SeededFp>,
    /// Fingerprints held by more than one present key: how many more.
    more: HashMap<u32, u32, SeededFp>,
}

impl Presence {
    /// Whether a key with this fingerprint may be present (`false`: it is absent).
    pub(super) fn may_contain(&self, fp: u32) -> bool {
        self.once.contains(&fp)
    }

    /// A key with this fingerprint became present.
    pub(super) fn add(&mut self, fp: u32) {
        if !self.once.insert(fp) {
            *self.more.entry(fp).or_insert(0) += 1;
        }
    }

    /// Keys with these fingerprints became present, all at once: the set grows once, and
    /// while it is in cache.
    pub(super) fn add_all(&mut self, fps: &[u32]) {
        self.once.reserve(fps.len());
        for &fp in fps {
            self.add(fp);
        }
    }

    /// A key with this fingerprint, present until now, was deleted.
    pub(super) fn remove(&mut self, fp: u32) {
        match self.more.get_mut(&fp) {
            Some(extra) if *extra > 1 => *extra -= 1,
            Some(_) => {
                self.more.remove(&fp);
            }
            None => {
                self.once.remove(&fp);
            }
        }
    }

    /// Its fingerprints, and those held by more than one key with how many more: what
    /// [`Presence::from_parts`] builds it again from (`scan::saved`).
    pub(super) fn parts(
        &self,
    ) -> (impl ExactSizeIterator<Item = u32> + '_, impl ExactSizeIterator<Item = (u32, u32)> + '_) {
        (self.once.iter().copied(), self.more.iter().map(|(&fp, &extra)| (fp, extra)))
    }

    /// The filter whose [`Presence::parts`] these are; `None` when they cannot be one (a
    /// fingerprint twice in `once`, or one in `more` that is not in `once` or counts no
    /// other key).
    pub(super) fn from_parts(once: &[u32], more: &[(u32, u32)]) -> Option<Presence> {
        let mut p = Presence::default();
        p.once.reserve(once.len());
        p.once.extend(once.iter().copied());
        p.more.reserve(more.len());
        p.more.extend(more.iter().copied());
        let consistent = p.once.len() == once.len()
            && p.more.len() == more.len()
            && more.iter().all(|(fp, extra)| *extra > 0 && p.once.contains(fp));
        consistent.then_some(p)
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
        let mut p = Presence::default();
        assert!(!p.may_contain(7));
        p.add(7);
        p.add(7);
        p.add(9);
        assert_eq!(p.len(), 3);
        p.remove(7);
        assert!(p.may_contain(7), "the other key with fingerprint 7 is still present");
        p.remove(7);
        assert!(!p.may_contain(7));
        assert!(p.may_contain(9));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn parts_build_the_same_filter_and_nothing_else() {
        let mut p = Presence::default();
        for fp in [7, 7, 7, 9, 11] {
            p.add(fp);
        }
        let (once, more) = p.parts();
        let (once, more): (Vec<u32>, Vec<(u32, u32)>) = (once.collect(), more.collect());
        let mut q = Presence::from_parts(&once, &more).expect("its own parts");
        assert_eq!(q.len(), 5);
        q.remove(7);
        q.remove(7);
        assert!(q.may_contain(7), "the third key with fingerprint 7");
        // Parts no filter has: a fingerprint twice, an extra count of an absent one, a zero.
        assert!(Presence::from_parts(&[7, 7], &[]).is_none());
        assert!(Presence::from_parts(&[7], &[(9, 1)]).is_none());
        assert!(Presence::from_parts(&[7], &[(7, 0)]).is_none());
    }

    #[test]
    fn stripe_matches_and_fingerprints_spread() {
        let fps: HashSet<u32> = (0..10_000).map(|i| key_hash(&format!("key-{i}")).1).collect();
        assert!(fps.len() > 9_990, "fingerprints collide too often: {}", fps.len());
        let stripes: HashSet<usize> = (0..10_000).map(|i| key_hash(&format!("key-{i}")).0).collect();
        assert_eq!(stripes.len(), super::super::STRIPES);
    }
}

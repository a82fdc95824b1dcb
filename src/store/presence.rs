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

/// The stripe and fingerprint of a key: both from one FNV-1a hash of its bytes.
pub(super) fn key_hash(key: &str) -> (usize, u32) {
    // FNV-1a: cheap, stable, good enough to spread keys over stripes.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.as_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
    }
    // The stripe takes the low bits; the fingerprint takes the high bits of a remix, so that
    // keys of one stripe still differ in it.
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^= z >> 31;
    ((h as usize) % super::STRIPES, (z >> 32) as u32)
}

/// The fingerprints of one stripe's present keys, counted.
#[derive(Debug, Default)]
pub(super) struct Presence {
    /// Every fingerprint held by at least one present key.
    once: HashSet<u32>,
    /// Fingerprints held by more than one present key: how many more.
    more: HashMap<u32, u32>,
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
    fn stripe_matches_and_fingerprints_spread() {
        let fps: HashSet<u32> = (0..10_000).map(|i| key_hash(&format!("key-{i}")).1).collect();
        assert!(fps.len() > 9_990, "fingerprints collide too often: {}", fps.len());
        let stripes: HashSet<usize> = (0..10_000).map(|i| key_hash(&format!("key-{i}")).0).collect();
        assert_eq!(stripes.len(), super::super::STRIPES);
    }
}

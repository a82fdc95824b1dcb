//! The open's scan: counts the records per state and enters every key in the presence
//! filter (see `presence`). A restart waits for it, so it grows with the store (at 9M
//! records, 11.7 s as pages of decoded records added key by key; docs/performance-notes.md,
//! "Reopening a store"). So it:
//! - reads each record's two header bytes only (`Record::state_of`), from entries the
//!   backend lends rather than copies (`Backend::for_each`);
//! - adds a stripe's fingerprints a buffer at a time, into a set grown once while it is in
//!   cache, where adding them one by one across all stripes missed the cache nearly every
//!   time once the filter outgrew it;
//! - splits each slice's keys into ranges between its first key and its last (when the
//!   backend can tell it, `Backend::last_key`), read by the opening thread and a helper per
//!   further core (up to 4 in all).
//!
//! The claim journal holds nothing yet (its recovery wrote what it held to the backend) and
//! nothing else uses the store, so no lock is held across the scan; fingerprints are added
//! under their stripe's lock as everywhere else.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::super::doubts::KeysBySink;
use super::super::{
    KeyStore, Record, STRIPES, Slice, State, StoreError, Tree, corrupt_record, decode, doubts, presence, state_index,
};

/// Fingerprints gathered per stripe before they are added to its filter at once (16 MiB per
/// thread, whatever the store's size). Tests fill buffers of 4, so that a store of a few
/// thousand keys adds them mid-scan too.
const FILL_BUFFER: usize = if cfg!(test) { 4 } else { 4096 };

/// Ranges the scan is split into, taken by the threads in turn: more than there are
/// threads, so that a range dense with keys does not leave the others idle.
const RANGES: usize = 16;

/// Threads at most: each holds its buffers.
const MAX_THREADS: usize = 4;

/// A range of keys, `start <= key < end`.
type Range = (Vec<u8>, Option<Vec<u8>>);

/// What a scan counted: records per state, and the `indeterminate` ones' keys per sink.
type Counted = ([i64; 3], KeysBySink);

/// A range of one slice's keys.
type SliceRange = (Slice, Range);

impl KeyStore {
    /// Counts the records per state and fills the presence filter (see the module doc).
    pub(in crate::store) fn fill_at_open(&self) -> Result<(), StoreError> {
        let ranges = self.open_ranges()?;
        let next = AtomicUsize::new(0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let helpers = cores.min(MAX_THREADS).min(ranges.len()).saturating_sub(1);
        let mut counts = [0i64; 3];
        let mut doubts = KeysBySink::new();
        std::thread::scope(|scope| {
            // The caller's thread reads ranges too, so a helper the OS refuses to start only
            // leaves more to it.
            let workers: Vec<_> = (0..helpers)
                .filter_map(|_| {
                    let read = || self.fill_ranges(&ranges, &next);
                    std::thread::Builder::new().name("dedupd-open-scan".into()).spawn_scoped(scope, read).ok()
                })
                .collect();
            let mut add = |(counted, sinks): Counted| {
                counts.iter_mut().zip(counted).for_each(|(total, n)| *total += n);
                doubts::merge(&mut doubts, sinks);
            };
            add(self.fill_ranges(&ranges, &next)?);
            for worker in workers {
                // A panic in a helper is one in the open, as when it all ran on the caller's.
                add(worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?);
            }
            Ok::<_, StoreError>(())
        })?;
        self.set_counts(counts);
        self.doubts.set(doubts);
        Ok(())
    }

    /// Takes ranges from `ranges` until none is left; returns the records counted per state,
    /// and the keys in doubt per sink.
    fn fill_ranges(&self, ranges: &[SliceRange], next: &AtomicUsize) -> Result<Counted, StoreError> {
        let mut counts = [0i64; 3];
        let mut doubts = KeysBySink::new();
        let mut buffers = vec![Vec::new(); STRIPES];
        while let Some((slice, (start, end))) = ranges.get(next.fetch_add(1, Ordering::Relaxed)) {
            self.backend.for_each(Tree::Records(*slice), start, end.as_deref(), &mut |key, value| {
                let state = Record::state_of(value).map_err(|source| corrupt_record(key, source))?;
                counts[state_index(state)] += 1;
                if state != State::Completed {
                    // Rare: only these are decoded, for the sink of a key in doubt (and their
                    // keys copied); a claim is in doubt when it keeps its command.
                    doubts::tally(&mut doubts, &String::from_utf8_lossy(key), &decode(key, value)?);
                }
                let (stripe, fp) = presence::key_bytes_hash(key);
                let buffer = &mut buffers[stripe];
                buffer.push(fp);
                if buffer.len() == FILL_BUFFER {
                    self.locks.stripe_at(stripe).present.add_all(buffer, *slice);
                    buffer.clear();
                }
                Ok(())
            })?;
            // The buffers hold this range's slice only.
            for (mut stripe, buffer) in self.locks.stripes_in_order().zip(&mut buffers) {
                stripe.present.add_all(buffer, *slice);
                buffer.clear();
            }
        }
        Ok((counts, doubts))
    }

    /// The ranges that together hold every key of every slice (`ranges_split_at`): one
    /// per slice when the backend cannot tell a slice's last key.
    fn open_ranges(&self) -> Result<Vec<SliceRange>, StoreError> {
        let mut ranges = Vec::new();
        for slice in self.slices.live() {
            let tree = Tree::Records(slice);
            let first = self.backend.scan(tree, &[], None, 1)?.into_iter().next().map(|(key, _)| key);
            let splits = match (first, self.backend.last_key(tree)?) {
                (Some(first), Some(last)) => split_keys(&first, &last, RANGES),
                _ => Vec::new(),
            };
            ranges.extend(ranges_split_at(splits).into_iter().map(|range| (slice, range)));
        }
        Ok(ranges)
    }
}

/// The ranges that strictly increasing `splits` cut the keys into: from nothing to the
/// first, from each to the next, from the last to the end.
fn ranges_split_at(splits: Vec<Vec<u8>>) -> Vec<Range> {
    let mut ranges = Vec::with_capacity(splits.len() + 1);
    let mut start = Vec::new();
    for split in splits {
        let from = std::mem::replace(&mut start, split.clone());
        ranges.push((from, Some(split)));
    }
    ranges.push((start, None));
    ranges
}

/// Up to `parts - 1` strictly increasing keys that split `[first, last]` into `parts`
/// ranges about equally wide, reading the eight bytes after the two keys' common prefix as
/// a number. Keys spread unevenly make uneven ranges (the threads then take more of the
/// small ones), never a key left out: the ranges built on them cover every key whatever
/// they are.
fn split_keys(first: &[u8], last: &[u8], parts: usize) -> Vec<Vec<u8>> {
    let common = first.iter().zip(last).take_while(|(a, b)| a == b).count();
    let word = |key: &[u8]| {
        let mut word = [0u8; 8];
        for (to, from) in word.iter_mut().zip(key.iter().skip(common)) {
            *to = *from;
        }
        u64::from_be_bytes(word)
    };
    let (low, high) = (word(first), word(last));
    let width = u128::from(high.saturating_sub(low));
    let mut splits: Vec<Vec<u8>> = Vec::with_capacity(parts);
    for part in 1..parts {
        let offset = u64::try_from(width * part as u128 / parts as u128).unwrap_or(u64::MAX);
        let mut key = first[..common].to_vec();
        key.extend_from_slice(&low.saturating_add(offset).to_be_bytes());
        if splits.last().is_none_or(|previous| *previous < key) {
            splits.push(key);
        }
    }
    splits
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_with_a_common_prefix_split_after_it() {
        let splits = split_keys(b"order-0000", b"order-9999", 4);
        assert_eq!(splits.len(), 3);
        assert!(splits.iter().all(|s| s.starts_with(b"order-")));
        assert!(splits.windows(2).all(|w| w[0] < w[1]));
        assert!(splits[0].as_slice() > b"order-0000".as_slice() && splits[2].as_slice() < b"order-9999".as_slice());
    }

    #[test]
    fn one_key_or_close_keys_make_few_ranges() {
        assert_eq!(split_keys(b"k", b"k", 16).len(), 1);
        assert!(split_keys(b"a", b"a\x00", 16).len() <= 1);
    }

    proptest! {
        /// Whatever the keys, every key is in exactly one range.
        #[test]
        fn the_ranges_hold_every_key_once(mut keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 1..60)) {
            keys.sort();
            keys.dedup();
            let (first, last) = (keys[0].clone(), keys[keys.len() - 1].clone());
            let ranges = ranges_split_at(split_keys(&first, &last, RANGES));
            for key in &keys {
                let holding = ranges
                    .iter()
                    .filter(|(start, end)| key >= start && end.as_ref().is_none_or(|end| key < end))
                    .count();
                prop_assert_eq!(holding, 1, "{:?} in {} ranges", key, holding);
            }
        }
    }
}

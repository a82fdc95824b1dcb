//! The expiry index: which completed records expire when, so that compaction reads only
//! what has expired.
//!
//! One entry per *group of completions*, not per key. [`KeyStore::complete_batch`] groups
//! the records it completes by the second their expiry falls in, and writes each group (up
//! to 64 keys on sled, 1,024 on fjall) as one entry: key = the group's latest expiry (order-preserving big-endian) ++ a random
//! 8-byte id; value = the group's `(key, expires_at)` pairs. A batch of 1,000 completions
//! thus costs 1–16 index writes instead of 1,000, and compaction deletes one entry per group
//! plus the records it lists, without reading a single record.
//!
//! Invariant (checked by the store tests and the crash test): the pairs of all entries are
//! exactly the `(key, expires_at)` of the completed records, each once. Entries are written
//! in the same atomic batch as their records; a mutation that replaces or deletes one
//! completed record outside compaction (a re-claim after expiry, `forget`) rewrites its
//! entry without it, under `KeyStore::index_lock`.
//!
//! An entry is due when its time (the latest expiry in it) has passed, so a record may
//! outlive its `expires_at` by less than [`GROUP_MS`]; lookups compare `expires_at` with
//! the clock themselves, so this only delays the disk space, never a decision.

use std::collections::BTreeMap;

use super::{KeyStore, Op, StoreError, Tree, expiry_key, split_expiry_key};

/// An index entry's key and the `(key, expires_at)` pairs it lists.
pub(super) type DueEntry = (Vec<u8>, Vec<(String, i64)>);

/// Completions whose expiries fall in the same span of this many ms share an entry.
pub const GROUP_MS: i64 = 1_000;

/// At most this many keys per entry (~3 KiB) on sled. sled writes a tree node holding
/// values of tens of KiB as a separate blob file, and a SIGKILL during such a write left a
/// sled store that would not open again ("Read corrupted data", tests/kafka/kafka_kill.rs); small
/// entries keep sled on its ordinary log path. The cost is one more index write per 64
/// completions. An LSM tree (fjall) has no such limit: see [`super::Backend::index_entry_keys`].
pub(super) const SMALL_ENTRY_KEYS: usize = 64;

/// Meta key of the index format; absent in stores written before grouped entries.
const FORMAT_MARK: &[u8] = b"index-format";
const FORMAT: &[u8] = b"3";

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt { key: "(expiry index)".into(), source: super::record::DecodeError(what.into()) }
}

/// The span an expiry belongs to.
fn group_of(at_ms: i64) -> i64 {
    at_ms.div_euclid(GROUP_MS)
}

/// Encodes an entry's pairs: `[u16 key length][key][expiry delta]`, repeated, where the
/// delta is the expiry minus the previous pair's (0 for the first), a zigzag LEB128 varint.
/// The expiries of one entry lie within a second of each other, so each pair pays 1–2
/// bytes for its expiry instead of 8 (format 3; format 2 stored the full i64).
fn encode_pairs(pairs: &[(&str, i64)]) -> Result<Vec<u8>, StoreError> {
    let mut v = Vec::with_capacity(pairs.iter().map(|(k, _)| k.len() + 4).sum::<usize>() + 8);
    let mut previous = 0i64;
    for &(key, at) in pairs {
        let len = u16::try_from(key.len())
            .map_err(|_| corrupt(format!("key of {} bytes is too long to index", key.len())))?;
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(key.as_bytes());
        let delta = at.wrapping_sub(previous);
        super::record::put_varint(&mut v, ((delta << 1) ^ (delta >> 63)) as u64);
        previous = at;
    }
    Ok(v)
}

/// Reads a zigzag LEB128 varint off the front of `rest`.
fn take_zigzag(rest: &mut &[u8]) -> Result<i64, StoreError> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, tail) = rest.split_first().ok_or_else(|| corrupt("truncated expiry"))?;
        *rest = tail;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
    }
    Err(corrupt("expiry varint longer than 10 bytes"))
}

/// Decodes an entry's value into its `(key, expires_at)` pairs.
pub fn decode_pairs(value: &[u8]) -> Result<Vec<(String, i64)>, StoreError> {
    let mut out = Vec::new();
    let mut rest = value;
    let mut previous = 0i64;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<2>().ok_or_else(|| corrupt("truncated key length"))?;
        let len = usize::from(u16::from_be_bytes(*len));
        if tail.len() < len + 1 {
            return Err(corrupt("truncated pair"));
        }
        let (key, tail) = tail.split_at(len);
        rest = tail;
        let at = previous.wrapping_add(take_zigzag(&mut rest)?);
        let key = std::str::from_utf8(key).map_err(|e| corrupt(format!("key is not UTF-8: {e}")))?;
        out.push((key.to_string(), at));
        previous = at;
    }
    Ok(out)
}

/// The ops that index `completions` (key, expires_at): one new entry per span and up to
/// `max_keys` keys.
pub(super) fn entry_ops(completions: &[(&str, i64)], max_keys: usize) -> Result<Vec<Op>, StoreError> {
    let mut groups: BTreeMap<i64, Vec<(&str, i64)>> = BTreeMap::new();
    for &(key, at) in completions {
        groups.entry(group_of(at)).or_default().push((key, at));
    }
    let mut ops = Vec::with_capacity(groups.len());
    for pairs in groups.values().flat_map(|g| g.chunks(max_keys.max(1))) {
        let latest = pairs.iter().map(|&(_, at)| at).max().unwrap_or(i64::MIN);
        // A random id keeps entries of the same time apart without any shared counter,
        // across restarts too (a collision needs ~2^32 entries of the same ms).
        let id: [u8; 8] = rand::random();
        ops.push(Op::Put(Tree::Expiry, expiry_key(latest, &id), encode_pairs(pairs)?));
    }
    Ok(ops)
}

impl KeyStore {
    /// The op that removes `key` (expiring at `at_ms`) from its entry: a rewrite of the
    /// entry without it, or its delete when it was the last. The caller holds
    /// `index_lock` until the op is applied, so two removals from one entry cannot race.
    pub(super) fn unindex_op(&self, key: &str, at_ms: i64) -> Result<Op, StoreError> {
        // The entry's time is the latest expiry of its span: between `at_ms` and the span's end.
        let span_end = (group_of(at_ms) + 1).saturating_mul(GROUP_MS);
        let start = expiry_key(at_ms, b"");
        let end = expiry_key(span_end, b"");
        for (entry_key, value) in self.backend.scan(Tree::Expiry, &start, Some(&end), usize::MAX)? {
            let mut pairs = decode_pairs(&value)?;
            let Some(pos) = pairs.iter().position(|(k, at)| k == key && *at == at_ms) else { continue };
            pairs.swap_remove(pos);
            if pairs.is_empty() {
                return Ok(Op::Delete(Tree::Expiry, entry_key));
            }
            let borrowed: Vec<(&str, i64)> = pairs.iter().map(|(k, at)| (k.as_str(), *at)).collect();
            return Ok(Op::Put(Tree::Expiry, entry_key, encode_pairs(&borrowed)?));
        }
        Err(StoreError::Corrupt {
            key: key.to_string(),
            source: super::record::DecodeError(format!(
                "completed record expiring at {at_ms} is missing from the expiry index"
            )),
        })
    }

    /// Up to `max_keys` records due at `now_ms` (whole entries; at least one entry), from
    /// index keys `>= from`: the entry keys and the records they list.
    pub(super) fn due_entries(&self, now_ms: i64, max_keys: usize, from: &[u8]) -> Result<Vec<DueEntry>, StoreError> {
        let end = expiry_key(now_ms.saturating_add(1), b"");
        let mut out = Vec::new();
        let mut keys = 0;
        let mut start = from.to_vec();
        while keys < max_keys {
            // Entries hold up to a batch of keys each: a few at a time is enough.
            let page = self.backend.scan(Tree::Expiry, &start, Some(&end), 16)?;
            let Some((last, _)) = page.last() else { break };
            start = last.clone();
            start.push(0);
            for (entry_key, value) in page {
                if keys >= max_keys {
                    break;
                }
                let pairs = decode_pairs(&value)?;
                keys += pairs.len();
                out.push((entry_key, pairs));
            }
        }
        Ok(out)
    }

    /// Brings the index of a store written in an older format (format 1: one empty entry
    /// per key, no mark; format 2: full i64 expiries) to this one: drops the old entries
    /// and indexes the completed records anew, once.
    /// A store that carries the format mark is left alone; a new one just gets the mark.
    pub(super) fn upgrade_index(&self) -> Result<(), StoreError> {
        if self.backend.get(Tree::Meta, FORMAT_MARK)?.as_deref() == Some(FORMAT) {
            return Ok(());
        }
        loop {
            let old = self.backend.scan(Tree::Expiry, &[], None, 10_000)?;
            if old.is_empty() {
                break;
            }
            self.backend.apply(old.into_iter().map(|(k, _)| Op::Delete(Tree::Expiry, k)).collect())?;
        }
        self.for_each_record_page(10_000, |page| {
            let pairs: Vec<(&str, i64)> =
                page.iter().filter_map(|(k, r)| r.expires_at_ms().map(|at| (k.as_str(), at))).collect();
            let ops = entry_ops(&pairs, self.backend.index_entry_keys())?;
            if ops.is_empty() { Ok(()) } else { self.backend.apply(ops) }
        })?;
        self.backend.apply(vec![Op::Put(Tree::Meta, FORMAT_MARK.to_vec(), FORMAT.to_vec())])?;
        self.flush_always()
    }

    /// The time of the first entry: when the next records fall due.
    pub fn next_expiry(&self) -> Result<Option<i64>, StoreError> {
        let first = self.backend.scan(Tree::Expiry, &[], None, 1)?;
        Ok(first.first().and_then(|(k, _)| split_expiry_key(k)).map(|(at, _)| at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let pairs = [("a", 5), ("", -3), ("ключ", i64::MAX)];
        let v = encode_pairs(&pairs).unwrap();
        let back = decode_pairs(&v).unwrap();
        assert_eq!(back, pairs.iter().map(|(k, a)| (k.to_string(), *a)).collect::<Vec<_>>());
        assert!(decode_pairs(&[]).unwrap().is_empty());
    }

    #[test]
    fn large_groups_are_split_into_small_entries() {
        let keys: Vec<String> = (0..130).map(|i| format!("k{i:03}")).collect();
        let pairs: Vec<(&str, i64)> = keys.iter().map(|k| (k.as_str(), 5_000)).collect();
        let sizes: Vec<usize> = entry_ops(&pairs, SMALL_ENTRY_KEYS)
            .unwrap()
            .into_iter()
            .map(|op| match op {
                Op::Put(Tree::Expiry, _, v) => decode_pairs(&v).unwrap().len(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(sizes, [64, 64, 2]);
    }

    #[test]
    fn truncated_values_are_errors_not_panics() {
        let v = encode_pairs(&[("key", 7)]).unwrap();
        for cut in 1..v.len() {
            assert!(decode_pairs(&v[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_pairs(&[0, 1, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(), "not UTF-8");
    }

    #[test]
    fn one_entry_per_span_at_its_latest_expiry() {
        let ops = entry_ops(&[("a", 1_500), ("b", 1_999), ("c", 2_000), ("d", 1_000)], SMALL_ENTRY_KEYS).unwrap();
        let mut entries: Vec<(i64, Vec<(String, i64)>)> = ops
            .into_iter()
            .map(|op| match op {
                Op::Put(Tree::Expiry, k, v) => (split_expiry_key(&k).unwrap().0, decode_pairs(&v).unwrap()),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        entries.sort();
        assert_eq!(
            entries,
            vec![
                (1_999, vec![("a".into(), 1_500), ("b".into(), 1_999), ("d".into(), 1_000)]),
                (2_000, vec![("c".into(), 2_000)]),
            ]
        );
    }
}

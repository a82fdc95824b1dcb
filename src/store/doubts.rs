//! The keys in doubt per sink (the sink their command went to): those of the
//! `indeterminate` records, and of the `in_progress` claims that keep their command (the
//! reconciler running a key in doubt again, which stays in doubt until that run ends). Kept
//! up to date by every mutation as the counts per state are. Two readers:
//! - `dedupd_indeterminate_keys{sink}` shows how many, so that a page names the sink whose
//!   receiver an operator must ask;
//! - the reconciler of indeterminate keys whose sink has a check asks, every minute, for a
//!   sink's keys ([`KeyStore::indeterminate_keys`]): a store holds up to 100M keys, too many
//!   to scan for the few in doubt.
//!
//! Keys, not counts, then; bounded by the records in doubt, small next to the store. Cost
//! per key: the key's bytes in one heap allocation, plus about 50–80 bytes (its `String`,
//! 24 bytes, and its share of a B-tree node, nodes being at least half full). A sink whose
//! last key was settled keeps its empty set, so the gauge shows 0 for it rather than its
//! last value.
//!
//! Every write that makes or unmakes a record in doubt goes through `swap_locked`: the
//! engine's (`compare_and_swap`), an operator's (`resolve`, `settle`, `forget`), an
//! import's, a changelog restore's, and a claim replacing one or keeping a command
//! (`claims`). A completion replaces only its own `in_progress` claim, and takes the key out
//! of its sink's when that claim kept a command ([`Doubts::completed`]); a compaction removes
//! only completed records (by the expiry index), and the journal's recovery writes (claims
//! that keep no command) before the open fills these by its scan. The open fills them by
//! its scan, or reads them back with the saved filter.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use super::{KeyStore, Record};

/// The keys of the `indeterminate` records, by sink.
pub(super) type KeysBySink = BTreeMap<String, BTreeSet<String>>;

/// The sink of a key in doubt: of an `indeterminate` record, the one its kept command went
/// to, `""` for a record that keeps none (written before records kept it); of an
/// `in_progress` claim that keeps its command (the reconciler's run of a key in doubt), its
/// command's. `None` for any other record.
pub(super) fn sink_of(record: &Record) -> Option<&str> {
    match record {
        Record::Indeterminate(i) => Some(i.held.as_ref().map_or("", |held| held.sink.as_str())),
        Record::InProgress(p) => p.held.as_ref().map(|held| held.sink.as_str()),
        Record::Completed(_) => None,
    }
}

/// The keys of the `indeterminate` records by sink.
#[derive(Debug, Default)]
pub(super) struct Doubts(Mutex<KeysBySink>);

impl Doubts {
    /// `key`'s record `old` was replaced by `new` (either absent).
    pub(super) fn changed(&self, key: &str, old: Option<&Record>, new: Option<&Record>) {
        let (old, new) = (old.and_then(sink_of), new.and_then(sink_of));
        if old == new {
            return;
        }
        let mut keys = self.0.lock();
        if let Some(sink) = old
            && let Some(in_sink) = keys.get_mut(sink)
        {
            // The set stays, empty or not: the gauge then reads 0 for the sink.
            in_sink.remove(key);
        }
        if let Some(sink) = new {
            keys.entry(sink.to_string()).or_default().insert(key.to_string());
        }
    }

    /// `key`, in doubt at `sink`, was completed: a completion replaces its own claim
    /// without `changed` (`completions`).
    pub(super) fn completed(&self, sink: &str, key: &str) {
        if let Some(in_sink) = self.0.lock().get_mut(sink) {
            in_sink.remove(key);
        }
    }

    /// Replaces them all (a scan, a saved filter read back).
    pub(super) fn set(&self, keys: KeysBySink) {
        *self.0.lock() = keys;
    }
}

/// Adds `key` to its sink's keys in `keys` when its `record` is in doubt (a scan's tally).
pub(super) fn tally(keys: &mut KeysBySink, key: &str, record: &Record) {
    if let Some(sink) = sink_of(record) {
        keys.entry(sink.to_string()).or_default().insert(key.to_string());
    }
}

/// Merges the keys another scan thread found into `keys`.
pub(super) fn merge(keys: &mut KeysBySink, more: KeysBySink) {
    for (sink, more) in more {
        keys.entry(sink).or_default().extend(more);
    }
}

impl KeyStore {
    /// The keys in doubt per sink (`""`: `indeterminate` records that keep no command); a
    /// sink whose last one was settled stays listed with 0.
    pub fn indeterminate_by_sink(&self) -> BTreeMap<String, i64> {
        let keys = self.doubts.0.lock();
        keys.iter().map(|(sink, keys)| (sink.clone(), keys.len() as i64)).collect()
    }

    /// The keys in doubt whose kept command went to `sink` (`""`: `indeterminate` records
    /// that keep none), sorted: a snapshot, which writes may change right after.
    pub fn indeterminate_keys(&self, sink: &str) -> Vec<String> {
        self.doubts.0.lock().get(sink).map(|keys| keys.iter().cloned().collect()).unwrap_or_default()
    }

    /// Every sink's keys, for the saved filter.
    pub(super) fn indeterminate_keys_by_sink(&self) -> KeysBySink {
        self.doubts.0.lock().clone()
    }
}

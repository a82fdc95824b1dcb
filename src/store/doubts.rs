//! The `indeterminate` records per sink (the sink their command went to), kept up to date
//! by every mutation as the counts per state are: what `dedupd_indeterminate_keys{sink}`
//! shows, so that a page names the sink whose receiver an operator must ask. Counts only:
//! bounded by the number of sinks, however many keys an outage leaves in doubt.
//!
//! Every write that makes or unmakes an `indeterminate` record goes through `swap_locked`
//! (the engine's, an operator's, an import's, a changelog restore's); a claim never
//! replaces one (the decision table reports an `indeterminate` key, never claims it), and a
//! completion or a compaction only replaces or removes other states. The open fills them by
//! its scan, or reads them back with the saved filter.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::{KeyStore, Record};

/// The sink of an `indeterminate` record: the one its kept command went to, `""` for a
/// record that keeps none (written before records kept it). `None` for any other state.
pub(super) fn sink_of(record: &Record) -> Option<&str> {
    match record {
        Record::Indeterminate(i) => Some(i.held.as_ref().map_or("", |held| held.sink.as_str())),
        _ => None,
    }
}

/// `indeterminate` records by sink.
#[derive(Debug, Default)]
pub(super) struct Doubts(Mutex<BTreeMap<String, i64>>);

impl Doubts {
    /// `old` was replaced by `new` (either absent).
    pub(super) fn changed(&self, old: Option<&Record>, new: Option<&Record>) {
        let (old, new) = (old.and_then(sink_of), new.and_then(sink_of));
        if old == new {
            return;
        }
        let mut counts = self.0.lock();
        if let Some(sink) = old {
            *counts.entry(sink.to_string()).or_default() -= 1;
        }
        if let Some(sink) = new {
            *counts.entry(sink.to_string()).or_default() += 1;
        }
    }

    /// Replaces them all (a scan, a saved filter read back).
    pub(super) fn set(&self, counts: BTreeMap<String, i64>) {
        *self.0.lock() = counts;
    }
}

/// Adds `record`'s sink to `counts` when it is `indeterminate` (a scan's tally).
pub(super) fn tally(counts: &mut BTreeMap<String, i64>, record: &Record) {
    if let Some(sink) = sink_of(record) {
        *counts.entry(sink.to_string()).or_default() += 1;
    }
}

impl KeyStore {
    /// The `indeterminate` records per sink (`""`: records that keep no command); a sink
    /// whose last one was settled stays listed with 0.
    pub fn indeterminate_by_sink(&self) -> BTreeMap<String, i64> {
        self.doubts.0.lock().clone()
    }
}

impl KeyStore {
    /// TEMPORARY (replaced by the index of keys per sink): the keys of `sink`'s
    /// `indeterminate` records, by a scan.
    pub fn indeterminate_keys(&self, sink: &str) -> Vec<String> {
        let filter = super::KeyFilter {
            state: Some(super::State::Indeterminate),
            sink: Some(sink.to_string()),
            ..Default::default()
        };
        self.matching_keys(&filter).unwrap_or_default()
    }
}

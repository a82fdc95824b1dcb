//! The figures `/v1/status` shows, read from the metrics themselves, so that the status
//! view and a scrape never disagree. Reading a labelled family collects it: reading never
//! creates a series (a partition's lag appears only once it has a committed offset).

use std::collections::BTreeMap;

use prometheus::core::Collector;

use super::Metrics;
use crate::store::State;

/// What the metrics say now.
#[derive(Debug, Default)]
pub struct Figures {
    /// Lag by `topic/partition`.
    pub lag: BTreeMap<String, i64>,
    /// Whether each sink's circuit is open (or half-open).
    pub circuits: BTreeMap<String, bool>,
    /// Commands at their sink now.
    pub in_flight: i64,
    /// Stored records by state.
    pub records: BTreeMap<&'static str, i64>,
    /// Bytes the store occupies.
    pub disk_bytes: i64,
    /// The store volume's size and free bytes (0 until read).
    pub volume_size_bytes: i64,
    pub volume_free_bytes: i64,
}

impl Metrics {
    /// The figures of the status view.
    pub fn figures(&self) -> Figures {
        let mut lag = BTreeMap::new();
        for (labels, value) in gauges(&self.consumer_lag) {
            if let (Some(topic), Some(partition)) = (labels.get("topic"), labels.get("partition")) {
                lag.insert(format!("{topic}/{partition}"), value);
            }
        }
        let mut circuits = BTreeMap::new();
        for (labels, value) in gauges(&self.sink_circuit_open) {
            if let Some(sink) = labels.get("sink") {
                circuits.insert(sink.clone(), value != 0);
            }
        }
        let records = State::ALL
            .into_iter()
            .map(|s| (s.as_str(), self.store_records.with_label_values(&[s.as_str()]).get()))
            .collect();
        let (volume_size_bytes, volume_free_bytes) = self.host.volume();
        Figures {
            lag,
            circuits,
            in_flight: self.in_flight.get(),
            records,
            disk_bytes: self.store_disk_bytes.get(),
            volume_size_bytes,
            volume_free_bytes,
        }
    }
}

/// Every series of a gauge family: its labels and value.
fn gauges(family: &prometheus::IntGaugeVec) -> Vec<(BTreeMap<String, String>, i64)> {
    let mut out = Vec::new();
    for f in family.collect() {
        for m in f.get_metric() {
            let labels = m.get_label().iter().map(|l| (l.name().to_string(), l.value().to_string())).collect();
            out.push((labels, m.get_gauge().value() as i64));
        }
    }
    out
}

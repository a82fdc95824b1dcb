//! The metrics of calls without an answer (docs/contract.md §4): what each sink call and
//! check ended as, and the keys left in doubt.

use prometheus::{IntCounterVec, IntGaugeVec};

use super::catalogue;

/// What sink calls and checks ended as, and the keys left in doubt, by sink.
pub(super) struct DoubtMetrics {
    /// [`catalogue::SINK_CALLS`].
    pub(super) sink_calls: IntCounterVec,
    /// [`catalogue::CHECKS`].
    pub(super) checks: IntCounterVec,
    /// [`catalogue::INDETERMINATE_KEYS`].
    pub(super) indeterminate_keys: IntGaugeVec,
    /// [`catalogue::INDETERMINATE_KEYS_UNATTENDED`].
    pub(super) unattended: IntGaugeVec,
}

/// Makes them (registered with the others by `Metrics::new`).
pub(super) fn doubt_metrics() -> Result<DoubtMetrics, prometheus::Error> {
    Ok(DoubtMetrics {
        sink_calls: catalogue::SINK_CALLS.int_counter_vec()?,
        checks: catalogue::CHECKS.int_counter_vec()?,
        indeterminate_keys: catalogue::INDETERMINATE_KEYS.int_gauge_vec()?,
        unattended: catalogue::INDETERMINATE_KEYS_UNATTENDED.int_gauge_vec()?,
    })
}

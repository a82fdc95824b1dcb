//! The metrics of the HTTP and MCP intake (docs/intake.md): requests answered, by door,
//! client and status, and how long each took to answer.

use prometheus::{HistogramVec, IntCounterVec};

use super::catalogue;

/// The intake's requests.
pub(super) struct IntakeMetrics {
    /// [`catalogue::INTAKE_REQUESTS`].
    pub(super) requests: IntCounterVec,
    /// [`catalogue::INTAKE_DURATION`].
    pub(super) duration: HistogramVec,
}

/// Makes them (registered with the others by `Metrics::new`).
pub(super) fn intake_metrics() -> Result<IntakeMetrics, prometheus::Error> {
    Ok(IntakeMetrics {
        requests: catalogue::INTAKE_REQUESTS.int_counter_vec()?,
        duration: catalogue::INTAKE_DURATION.histogram_vec()?,
    })
}

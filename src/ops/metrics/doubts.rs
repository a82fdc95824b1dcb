//! The metrics of calls without an answer (docs/contract.md §4): what each sink call and
//! check ended as, and the keys left in doubt.

use prometheus::{IntCounterVec, IntGaugeVec, Opts};

/// What sink calls and checks ended as, and the keys left in doubt, by sink.
pub(super) struct DoubtMetrics {
    /// `sink_calls_total{sink,answer}`.
    pub(super) sink_calls: IntCounterVec,
    /// `checks_total{sink,answer}`.
    pub(super) checks: IntCounterVec,
    /// `indeterminate_keys{sink}`.
    pub(super) indeterminate_keys: IntGaugeVec,
    /// `indeterminate_keys_unattended{sink}`.
    pub(super) unattended: IntGaugeVec,
}

/// Makes them (registered with the others by `Metrics::new`).
pub(super) fn doubt_metrics() -> Result<DoubtMetrics, prometheus::Error> {
    let (sink_calls, checks, indeterminate_keys) = (
        super::counter_vec(
            "sink_calls_total",
            "Sink calls by sink and what the receiver made of them: answered, never_sent (refused before the request left) or maybe (sent without an answer).",
            &["sink", "answer"],
        )?,
        super::counter_vec(
            "checks_total",
            "Checks asking a sink's receiver whether a command's effect exists, by answer: found, absent, unknown, error (could not ask).",
            &["sink", "answer"],
        )?,
        IntGaugeVec::new(
            Opts::new(
                "indeterminate_keys",
                "Keys in doubt (indeterminate, or being run again by the reconciler), by the sink their command went to (\"(unknown)\" for records that keep no command); with the store on Kafka, of the state partitions this instance holds: each waits for a check or an operator.",
            ),
            &["sink"],
        )?,
    );
    let unattended = IntGaugeVec::new(
        Opts::new(
            "indeterminate_keys_unattended",
            "Indeterminate keys no check settles any more, by sink: those of a sink without a check (or that keep no command), and those past their sink's check.deadline. Each waits for an operator.",
        ),
        &["sink"],
    )?;
    Ok(DoubtMetrics { sink_calls, checks, indeterminate_keys, unattended })
}

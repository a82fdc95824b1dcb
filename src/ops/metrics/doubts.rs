//! The metrics of calls without an answer (docs/contract.md §4): what each sink call and
//! check ended as, and the keys left in doubt.

use prometheus::{IntCounterVec, IntGaugeVec, Opts};

/// What sink calls and checks ended as, and the keys left in doubt, by sink:
/// `sink_calls_total`, `checks_total` and `indeterminate_keys`.
pub(super) fn doubt_metrics() -> Result<(IntCounterVec, IntCounterVec, IntGaugeVec), prometheus::Error> {
    Ok((
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
                "Keys the store holds as indeterminate, by the sink their command went to (\"(unknown)\" for records that keep no command): each waits for a check or an operator.",
            ),
            &["sink"],
        )?,
    ))
}

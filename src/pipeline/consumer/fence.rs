//! What to do when librdkafka says the consumer is fenced: replace it in process, or stop.
//!
//! librdkafka makes one consumer error fatal: `FENCED_INSTANCE_ID`, the broker telling a
//! static member that another consumer now holds its `group.instance.id`. A fatal error ends
//! that consumer for good; only a new one can go on. There are two causes:
//! 1. **another process** with the same id (a copied store, two pods with one name). The
//!    older one must stop, or the two take the id from each other for ever;
//! 2. **this consumer itself**. When its group session is lost on its side (no answer from the
//!    coordinator for `session.timeout.ms`, e.g. a broker outage), librdkafka forgets its
//!    member id and joins again as a new member of the same instance, which fences the old
//!    member id; a request still carrying the old id (an offset commit made meanwhile) is
//!    then answered `FENCED_INSTANCE_ID` (confluentinc/librdkafka#3437).
//!
//! A fence while this consumer is rejoining after a lost session, or soon after it got its
//! partitions back ([`REJOINED_GRACE`]), is taken as cause 2: the consumer is replaced by a
//! new one with the same id, which is what a restart by a supervisor would do, without
//! losing the process. Any other fence is cause 1 and stops the process (exit non-zero).
//! So does a fifth fence within [`RESTART_WINDOW`], whatever it looks like, so that a
//! misjudged cause 1 cannot make two processes fence each other for ever.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long after getting its partitions back a rejoined consumer's fence is still taken as
/// its own: a request sent with the old member id can be answered a little after the rejoin.
pub(super) const REJOINED_GRACE: Duration = Duration::from_secs(60);
/// At most this many replacements within [`RESTART_WINDOW`].
pub(super) const MAX_RESTARTS: usize = 4;
pub(super) const RESTART_WINDOW: Duration = Duration::from_secs(600);

/// Where the consumer's group session stands, as its rebalance callbacks saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Session {
    /// No session lost since this consumer was created.
    #[default]
    Kept,
    /// The session was lost (a revoke with the assignment lost); not assigned since.
    Rejoining,
    /// Assigned again at this instant after a lost session.
    Rejoined(Instant),
}

impl Session {
    /// A revoke arrived; `lost` is librdkafka's `assignment_lost()`.
    pub(super) fn revoked(self, lost: bool) -> Session {
        if lost { Session::Rejoining } else { self }
    }

    /// Partitions were assigned at `now`.
    pub(super) fn assigned(self, now: Instant) -> Session {
        match self {
            Session::Rejoining => Session::Rejoined(now),
            other => other,
        }
    }

    /// Whether a fence at `now` is this consumer's own (cause 2 in the module doc).
    fn fenced_itself(self, now: Instant) -> bool {
        match self {
            Session::Kept => false,
            Session::Rejoining => true,
            Session::Rejoined(at) => now.saturating_duration_since(at) <= REJOINED_GRACE,
        }
    }
}

/// What to do with a fenced consumer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Replace it with a new consumer of the same id.
    Replace,
    /// Stop the process, for this reason.
    Stop(&'static str),
}

/// The replacements made recently, to bound them.
#[derive(Debug, Default)]
pub(super) struct RestartBudget {
    restarts: VecDeque<Instant>,
}

impl RestartBudget {
    /// Decides for a consumer fenced at `now` whose session stood at `session`; counts the
    /// replacement when it is one.
    pub(super) fn judge(&mut self, session: Session, now: Instant) -> Verdict {
        if !session.fenced_itself(now) {
            return Verdict::Stop("fenced by another consumer with the same group.instance.id");
        }
        while self.restarts.front().is_some_and(|&t| now.saturating_duration_since(t) > RESTART_WINDOW) {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= MAX_RESTARTS {
            return Verdict::Stop("fenced again and again: another consumer may share its group.instance.id");
        }
        self.restarts.push_back(now);
        Verdict::Replace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn a_fence_with_the_session_kept_is_another_process() {
        let now = Instant::now();
        assert!(matches!(RestartBudget::default().judge(Session::Kept, now), Verdict::Stop(_)));
        // A revoke without a lost assignment is an ordinary rebalance: still kept.
        assert_eq!(Session::Kept.revoked(false), Session::Kept);
    }

    #[test]
    fn a_fence_while_rejoining_after_a_lost_session_replaces_the_consumer() {
        let session = Session::Kept.revoked(true);
        assert_eq!(session, Session::Rejoining);
        assert_eq!(RestartBudget::default().judge(session, Instant::now()), Verdict::Replace);
    }

    #[test]
    fn a_fence_soon_after_the_rejoin_replaces_it_a_late_one_stops() {
        let base = Instant::now();
        let session = Session::Rejoining.assigned(base);
        assert_eq!(session, Session::Rejoined(base));
        let grace = REJOINED_GRACE.as_secs();
        assert_eq!(RestartBudget::default().judge(session, at(base, grace)), Verdict::Replace);
        assert!(matches!(RestartBudget::default().judge(session, at(base, grace + 1)), Verdict::Stop(_)));
    }

    #[test]
    fn an_assignment_without_a_lost_session_changes_nothing() {
        assert_eq!(Session::Kept.assigned(Instant::now()), Session::Kept);
    }

    #[test]
    fn replacements_are_bounded_within_the_window() {
        let base = Instant::now();
        let mut budget = RestartBudget::default();
        for n in 0..MAX_RESTARTS as u64 {
            assert_eq!(budget.judge(Session::Rejoining, at(base, n)), Verdict::Replace);
        }
        assert!(matches!(budget.judge(Session::Rejoining, at(base, 10)), Verdict::Stop(_)));
        // Once the first ones are older than the window, the consumer may be replaced again.
        let later = at(base, RESTART_WINDOW.as_secs() + 1);
        assert_eq!(budget.judge(Session::Rejoining, later), Verdict::Replace);
    }
}

//! A backlog on demand, for an incarnation meant to die at `claim.appended_with_completions`.
//!
//! A round's claims carry the previous round's completions only when a batch needs a second
//! round of claims and that round finds a `max_in_flight` permit free at once (src/engine/
//! ticket.rs: a carrying round waits for none). The incarnation starts with a chunk six
//! times the others on the broker, which most of the time makes such a round; but while
//! the six partitions compete for the permits, a second round can find none free every
//! time, and the whole chunk is done without the point being reached (seen in CI, once in
//! some hundred incarnations).
//!
//! So, once every record produced so far has a result and the incarnation is still alive,
//! the suite produces a burst: `3 × max_in_flight + 1` fodder commands of distinct keys to
//! one partition. With the other partitions idle, the burst's batch makes at least three
//! rounds after the first, each finding the permits the previous one let go, so the point
//! is reached (twice for a `skip` of one) whatever the timing.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use rdkafka::message::Message;

use dedupd::outcome::ResultRecord;

use super::{Go, Positions};
use crate::common::kill_workload::{self as workload, MAX_IN_FLIGHT, PARTITIONS};
use crate::common::process::TopicTail;

/// Commands in one burst.
const BURST: usize = 3 * MAX_IN_FLIGHT + 1;
/// Fodder numbers of bursts start here, far above those of the chunks' fodder.
const FIRST_BURST_FODDER: usize = 1_000_000;

/// The burst for incarnation `incarnation`: records as the producer sends them.
pub(super) fn burst(incarnation: usize) -> Vec<crate::common::kafka::OutgoingTo> {
    let partition = (incarnation % PARTITIONS as usize) as i32;
    (0..BURST)
        .map(|n| {
            let (key, value) = workload::fodder_command(FIRST_BURST_FODDER + incarnation * BURST + n);
            (key, value, Vec::new(), Some(partition))
        })
        .collect()
}

/// Watches one incarnation for "every record produced so far has a result", and then asks
/// the producer for a burst.
pub(super) struct Backlog {
    go: tokio::sync::mpsc::UnboundedSender<Go>,
    /// Every record the producer has sent, inputs and fodder, in the order sent.
    produced: Arc<Mutex<Positions>>,
    /// Source positions with a result on the results tail, read up to `read`.
    covered: HashSet<(i32, i64)>,
    read: usize,
    /// `produced[..with_result]` all have a result (a result is never taken back).
    with_result: usize,
    /// `produced.len()` when the last burst was asked for: the next one waits for more.
    asked_at: Option<usize>,
}

impl Backlog {
    pub(super) fn new(go: tokio::sync::mpsc::UnboundedSender<Go>, produced: Arc<Mutex<Positions>>) -> Backlog {
        Backlog { go, produced, covered: HashSet::new(), read: 0, with_result: 0, asked_at: None }
    }

    /// Asks for a burst for `incarnation` when every record produced so far has a result on
    /// `tail` and the last burst (if any) was produced since; returns whether it asked.
    pub(super) fn nudge(&mut self, tail: &TopicTail, incarnation: usize) -> bool {
        for m in tail.since(self.read) {
            self.read += 1;
            if let Ok(r) = serde_json::from_slice::<ResultRecord>(m.payload().unwrap_or_default()) {
                self.covered.insert((r.source.partition, r.source.offset));
            }
        }
        let produced = self.produced.lock();
        if self.asked_at.is_some_and(|at| produced.len() <= at) {
            return false;
        }
        while self.with_result < produced.len() && self.covered.contains(&produced[self.with_result]) {
            self.with_result += 1;
        }
        if self.with_result < produced.len() {
            return false;
        }
        self.asked_at = Some(produced.len());
        self.go.send(Go::Burst(incarnation)).is_ok()
    }
}

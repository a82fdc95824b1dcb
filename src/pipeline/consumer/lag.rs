//! `dedupd_consumer_lag`: per assigned partition, the records at the partition's end not yet
//! settled (end offset minus the group's committed offset).
//!
//! - A fetched partition: librdkafka's statistics (every `statistics.interval.ms`) give
//!   the end; the committed offset is librdkafka's own, except under
//!   `kafka.transactional_results`, where offsets are committed by the results producer and
//!   librdkafka's figure stands at what it read at the assignment: the transactions' own
//!   record of what they committed is used instead. A partition caught up (everything
//!   handed over committed, nothing left to fetch) is 0, though a transaction's commit
//!   marker after its last record keeps the end one past the committed offset.
//! - A partition not fetched (refused for a store behind it, paused for an open circuit,
//!   held behind a full queue): librdkafka's figures stand still with the fetching, so
//!   every [`UNFETCHED_EVERY`] its end is asked of the broker, and its committed offset of
//!   the group, so that a backlog behind an outage shows as a growing lag.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{PipelineContext, read_committed_within};
use crate::pipeline::control::Tp;

/// How often the lag of partitions not fetched is read: as often as librdkafka's statistics
/// report the others' (`statistics.interval.ms`, consumer/settings.rs).
const UNFETCHED_EVERY: Duration = Duration::from_secs(5);
/// How long the poll loop may spend on it each time, all partitions together: it blocks the
/// loop, whose turns `/healthz` watches (bound 10 s). What is not read by then (a slow
/// broker, many partitions paused at once) keeps its last figure until the next time.
const UNFETCHED_BUDGET: Duration = Duration::from_secs(1);

impl PipelineContext {
    /// The lags of the fetched partitions in `statistics`.
    pub(super) fn report_fetched_lag(&self, statistics: &rdkafka::Statistics) {
        let fetched = self.partitions.fetched();
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                let tp = (topic.clone(), *partition);
                if fetched.contains(&tp)
                    && let Some(lag) = self.fetched_lag(&tp, p)
                {
                    self.metrics.lag(topic, *partition, lag);
                }
            }
        }
    }

    /// One fetched partition's lag; `None` while a figure is not known yet (no fetch, no
    /// committed offset): better no series than a zero.
    fn fetched_lag(&self, tp: &Tp, p: &rdkafka::statistics::Partition) -> Option<i64> {
        let Some(transactions) = &self.transactions else {
            return (p.consumer_lag >= 0).then_some(p.consumer_lag);
        };
        // As librdkafka: the last stable offset under read_committed, else the high mark.
        let end = if p.ls_offset >= 0 { p.ls_offset } else { p.hi_offset };
        let committed = transactions.committed(tp)?;
        if end < 0 {
            return None;
        }
        if committed >= p.app_offset && p.next_offset >= end {
            return Some(0);
        }
        Some((end - committed).max(0))
    }

    /// Every [`UNFETCHED_EVERY`], the lag of each partition not fetched (see the module doc).
    pub(super) fn report_unfetched_lag_if_due(&self, consumer: &BaseConsumer<Self>) {
        {
            let mut due = self.unfetched_lag_due.lock();
            if Instant::now() < *due {
                return;
            }
            *due = Instant::now() + UNFETCHED_EVERY;
        }
        let deadline = Instant::now() + UNFETCHED_BUDGET;
        let left = || deadline.saturating_duration_since(Instant::now());
        let refused = self.partitions.refused_behind();
        let stopped = self.partitions.stopped_fetching();
        let committed = match stopped.is_empty() {
            true => Vec::new(),
            false => read_committed_within(consumer, &stopped, left()).unwrap_or_else(|e| {
                tracing::debug!(error = %e, "could not read the committed offsets of paused partitions");
                Vec::new()
            }),
        };
        // A partition with no committed offset has no lag to report.
        let stopped_at = committed.into_iter().filter_map(|(tp, offset)| match offset {
            rdkafka::Offset::Offset(o) => Some((tp, o)),
            _ => None,
        });
        for ((topic, partition), next) in refused.into_iter().chain(stopped_at) {
            if left().is_zero() {
                break;
            }
            match consumer.fetch_watermarks(&topic, partition, left()) {
                Ok((_, end)) => self.metrics.lag(&topic, partition, (end - next).max(0)),
                Err(e) => tracing::debug!(error = %e, %topic, partition, "could not read a partition's end"),
            }
        }
    }
}

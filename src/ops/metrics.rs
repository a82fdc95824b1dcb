//! Every metric of docs/contract.md §10 (prefix `dedupd_`), each updated through a named method so
//! that label values cannot drift between call sites.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

mod doubts;
mod figures;
mod host;

pub use figures::Figures;

use crate::envelope::RejectReason;
use crate::outcome::Outcome;
use crate::sinks::CallAnswer;
use crate::store::{Fsyncs, State, StateCounts, WRITE_ERROR_KINDS};

/// The `status` values of `sink_requests_total`.
pub const SINK_STATUSES: [&str; 3] = ["ok", "transient", "permanent"];

/// The `answer` values of `checks_total`: each [`crate::sinks::CheckAnswer`]'s label.
pub const CHECK_ANSWERS: [&str; 4] = ["found", "absent", "unknown", "error"];

/// The metrics of one dedupd process, in their own registry.
pub struct Metrics {
    registry: Registry,
    commands: IntCounterVec,
    sink_requests: IntCounterVec,
    /// `sink_calls_total`, `checks_total`, `indeterminate_keys` and
    /// `indeterminate_keys_unattended`.
    doubts: doubts::DoubtMetrics,
    sink_duration: HistogramVec,
    process_duration: Histogram,
    store_records: IntGaugeVec,
    store_disk_bytes: IntGauge,
    compaction_removed: IntCounter,
    consumer_lag: IntGaugeVec,
    in_flight: IntGauge,
    dead_letter: IntCounterVec,
    rebalances: IntCounter,
    consumer_restarts: IntCounter,
    duplicate_age: HistogramVec,
    refused_partitions: IntGauge,
    assigned_partitions: IntGauge,
    sink_circuit_open: IntGaugeVec,
    worker_panics: IntCounterVec,
    store_write_errors: IntCounterVec,
    store_fsyncs: IntCounterVec,
    transaction_commit: Histogram,
    state: StateMetrics,
    host: host::HostMetrics,
}

/// The metrics of `store.changelog`'s restores.
struct StateMetrics {
    restoring: IntGaugeVec,
    restore_records: IntCounter,
    standby_records: IntCounter,
    standby_partitions: IntGauge,
    fenced: IntCounter,
    stalled_aborted: IntCounter,
}

impl StateMetrics {
    fn new() -> Result<StateMetrics, MetricsError> {
        Ok(StateMetrics {
            restoring: IntGaugeVec::new(
                Opts::new("state_restoring", "1 while the state partition is being restored from the changelog."),
                &["partition"],
            )?,
            restore_records: IntCounter::new(
                "state_restore_records_total",
                "Changelog records applied to the store by restores.",
            )?,
            standby_records: IntCounter::new(
                "state_standby_records_total",
                "Changelog records applied to the store by its standby copies of partitions it does not own.",
            )?,
            standby_partitions: IntGauge::new(
                "state_standby_partitions",
                "State partitions this instance keeps a standby copy of (tails without owning).",
            )?,
            fenced: IntCounter::new(
                "fenced_total",
                "Times this instance found its group generation gone with work in the open transaction: the transaction was aborted (no claim in it committed, no sink called for it) and the pipeline restarted in process.",
            )?,
            stalled_aborted: IntCounter::new(
                "stalled_transactions_aborted_total",
                "Transactions of another instance that held a partition of dedupd's own topics past the session or transaction timeout, aborted by taking over their transactional.id.",
            )?,
        })
    }
}

/// A metric could not be registered (a programming error, reported, not panicked).
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// One sink call: sub-millisecond (log, a local receiver) to the http sink's request
/// timeout (10 s by default).
const LATENCY_BUCKETS: [f64; 15] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// One batch takes the sink call's buckets and these: minutes when a transient failure is
/// retried with backoff (up to `retry.max_backoff`, 30 s, per attempt).
const BATCH_EXTRA_BUCKETS: [f64; 3] = [60.0, 120.0, 300.0];
/// Repeats come from within the same batch or an agent's quick retry (well under a second)
/// to days later, and never later than `store.max_ttl` (7 d by default): 0.1 s to 7 d.
const AGE_BUCKETS: [f64; 11] =
    [0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 6.0 * 3600.0, 86400.0, 3.0 * 86400.0, 7.0 * 86400.0];

/// The help of `transaction_commit_seconds`.
const COMMIT_HELP: &str = "One commit of the results transaction (kafka.transactional_results), its wait for the gate \
                           included; nothing is queued meanwhile.";

/// A histogram without labels (registered with the others by [`Metrics::new`]).
fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Result<Histogram, prometheus::Error> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
}

/// A counter with labels (registered with the others by [`Metrics::new`]).
fn counter_vec(name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

impl Metrics {
    /// Creates and registers every metric.
    // The metric catalogue: one definition per metric with its name, help text and labels,
    // read top to bottom against docs/metrics.md.
    pub fn new() -> Result<Metrics, MetricsError> {
        let (refused_partitions, assigned_partitions) = partition_gauges()?;
        let m = Metrics {
            commands: IntCounterVec::new(
                Opts::new("commands_total", "Input records by outcome and route."),
                &["outcome", "route"],
            )?,
            sink_requests: IntCounterVec::new(
                Opts::new("sink_requests_total", "Sink calls by sink and status (ok, transient, permanent)."),
                &["sink", "status"],
            )?,
            doubts: doubts::doubt_metrics()?,
            sink_duration: HistogramVec::new(
                HistogramOpts::new("sink_duration_seconds", "Duration of one sink call.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
                &["sink"],
            )?,
            process_duration: histogram(
                "process_duration_seconds",
                "Time from batch start to results acknowledged.",
                [&LATENCY_BUCKETS[..], &BATCH_EXTRA_BUCKETS[..]].concat(),
            )?,
            store_records: IntGaugeVec::new(Opts::new("store_records", "Stored records by state."), &["state"])?,
            store_disk_bytes: IntGauge::new("store_disk_bytes", "Bytes the store occupies on disk.")?,
            compaction_removed: IntCounter::new("compaction_removed_total", "Expired records removed by compaction.")?,
            consumer_lag: IntGaugeVec::new(
                Opts::new(
                    "consumer_lag",
                    "Records at the partition's end not yet committed: end offset minus the group's committed offset.",
                ),
                &["topic", "partition"],
            )?,
            in_flight: IntGauge::new("in_flight", "Commands claimed, not completed: at or waiting for their sink.")?,
            dead_letter: IntCounterVec::new(
                Opts::new("dead_letter_total", "Records sent to the dead-letter topic, by reason."),
                &["reason"],
            )?,
            rebalances: IntCounter::new("rebalances_total", "Consumer group rebalances seen.")?,
            consumer_restarts: IntCounter::new(
                "consumer_restarts_total",
                "Kafka consumers replaced in process after librdkafka fenced them following their own lost group session.",
            )?,
            duplicate_age: duplicate_age()?,
            refused_partitions,
            assigned_partitions,
            sink_circuit_open: IntGaugeVec::new(
                Opts::new(
                    "sink_circuit_open",
                    "1 while the sink's circuit breaker is open or half-open (commands wait for it), else 0.",
                ),
                &["sink"],
            )?,
            worker_panics: counter_vec(
                "worker_panics_total",
                "Partition workers that panicked (the process then stops, exiting non-zero).",
                &["topic", "partition"],
            )?,
            store_write_errors: counter_vec(
                "store_write_errors_total",
                "Store writes that failed, by kind (disk_full, io); each one stops the process (exit non-zero).",
                &["kind"],
            )?,
            store_fsyncs: counter_vec(
                "store_fsyncs_total",
                "Group commits by file (journal: the claim journal, store: the backend); each covers every partition waiting at that moment.",
                &["file"],
            )?,
            state: StateMetrics::new()?,
            transaction_commit: histogram("transaction_commit_seconds", COMMIT_HELP, LATENCY_BUCKETS.to_vec())?,
            host: host::HostMetrics::new()?,
            registry: Registry::new_custom(Some("dedupd".into()), None)?,
        };
        m.register_all()?;
        m.zero_fixed_series();
        Ok(m)
    }

    /// Registers every metric with the registry.
    fn register_all(&self) -> Result<(), MetricsError> {
        for c in [
            Box::new(self.commands.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(self.sink_requests.clone()),
            Box::new(self.doubts.sink_calls.clone()),
            Box::new(self.doubts.checks.clone()),
            Box::new(self.doubts.indeterminate_keys.clone()),
            Box::new(self.doubts.unattended.clone()),
            Box::new(self.sink_duration.clone()),
            Box::new(self.process_duration.clone()),
            Box::new(self.store_records.clone()),
            Box::new(self.store_disk_bytes.clone()),
            Box::new(self.compaction_removed.clone()),
            Box::new(self.consumer_lag.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.dead_letter.clone()),
            Box::new(self.rebalances.clone()),
            Box::new(self.consumer_restarts.clone()),
            Box::new(self.duplicate_age.clone()),
            Box::new(self.refused_partitions.clone()),
            Box::new(self.assigned_partitions.clone()),
            Box::new(self.sink_circuit_open.clone()),
            Box::new(self.worker_panics.clone()),
            Box::new(self.store_write_errors.clone()),
            Box::new(self.store_fsyncs.clone()),
            Box::new(self.transaction_commit.clone()),
            Box::new(self.state.restoring.clone()),
            Box::new(self.state.restore_records.clone()),
            Box::new(self.state.standby_records.clone()),
            Box::new(self.state.standby_partitions.clone()),
            Box::new(self.state.fenced.clone()),
            Box::new(self.state.stalled_aborted.clone()),
        ] {
            self.registry.register(c)?;
        }
        self.host.register(&self.registry)?;
        Ok(())
    }

    /// Creates, at 0, the series whose labels are known without the config: every store
    /// state, every rejection reason, every kind of store write error.
    fn zero_fixed_series(&self) {
        for s in State::ALL {
            self.store_records.with_label_values(&[s.as_str()]).set(0);
        }
        for r in RejectReason::ALL {
            self.dead_letter.with_label_values(&[r.as_str()]);
        }
        for kind in WRITE_ERROR_KINDS {
            self.store_write_errors.with_label_values(&[kind]);
        }
        for file in ["journal", "store"] {
            self.store_fsyncs.with_label_values(&[file]);
        }
    }

    /// Creates, at 0, every series that the configured `routes` and `sinks` can have, so
    /// that a scrape shows them before their first event: an absent series is not a 0 to
    /// PromQL, and `increase()` misses a counter's first step from absent to 1 (the first
    /// conflict on a route would not fire an alert on `increase(...conflict...)`).
    pub fn init_known(&self, routes: &[&str], sinks: &[&str]) {
        for route in routes {
            // `rejected` has no route: its records never reached the router's answer.
            for outcome in Outcome::ALL.into_iter().filter(|o| *o != Outcome::Rejected) {
                self.commands.with_label_values(&[outcome.as_str(), route]);
            }
            self.duplicate_age.with_label_values(&[*route]);
        }
        self.commands.with_label_values(&[Outcome::Rejected.as_str(), "-"]);
        for sink in sinks {
            for status in SINK_STATUSES {
                self.sink_requests.with_label_values(&[*sink, status]);
            }
            for answer in CallAnswer::ALL {
                self.doubts.sink_calls.with_label_values(&[*sink, answer.as_str()]);
            }
            for answer in CHECK_ANSWERS {
                self.doubts.checks.with_label_values(&[*sink, answer]);
            }
            self.doubts.indeterminate_keys.with_label_values(&[*sink]).set(0);
            self.doubts.unattended.with_label_values(&[*sink]).set(0);
            self.sink_duration.with_label_values(&[*sink]);
        }
    }

    /// One input record ended with `outcome` on `route` (`-` when it had none).
    pub fn command(&self, outcome: Outcome, route: Option<&str>) {
        self.commands.with_label_values(&[outcome.as_str(), route.unwrap_or("-")]).inc();
    }

    /// One sink call ended.
    pub fn sink_request(&self, sink: &str, status: &str, seconds: f64) {
        self.sink_requests.with_label_values(&[sink, status]).inc();
        self.sink_duration.with_label_values(&[sink]).observe(seconds);
    }

    /// One sink call ended with `answer` from the receiver.
    pub fn sink_call(&self, sink: &str, answer: CallAnswer) {
        self.doubts.sink_calls.with_label_values(&[sink, answer.as_str()]).inc();
    }

    /// One check ended with `answer` (one of [`CHECK_ANSWERS`]).
    pub fn check(&self, sink: &str, answer: &str) {
        self.doubts.checks.with_label_values(&[sink, answer]).inc();
    }

    /// A commit of the results transaction took `seconds`.
    pub fn transaction_committed(&self, seconds: f64) {
        self.transaction_commit.observe(seconds);
    }

    /// A batch went from first record to results acknowledged in `seconds`.
    pub fn batch_processed(&self, seconds: f64) {
        self.process_duration.observe(seconds);
    }

    /// The store's state counts, size and group commits so far.
    pub fn store(&self, counts: StateCounts, disk_bytes: u64, fsyncs: Fsyncs) {
        for (file, total) in [("journal", fsyncs.journal), ("store", fsyncs.store)] {
            // The store counts; the counter follows it (never backwards).
            let counter = self.store_fsyncs.with_label_values(&[file]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.store_records.with_label_values(&[State::InProgress.as_str()]).set(counts.in_progress);
        self.store_records.with_label_values(&[State::Completed.as_str()]).set(counts.completed);
        self.store_records.with_label_values(&[State::Indeterminate.as_str()]).set(counts.indeterminate);
        self.store_disk_bytes.set(i64::try_from(disk_bytes).unwrap_or(i64::MAX));
    }

    /// The keys in doubt of `sink` (`""`: records that keep no command) this instance
    /// answers for (with `store.changelog`, those of the state partitions it holds).
    pub fn indeterminate_keys(&self, sink: &str, count: i64) {
        let sink = if sink.is_empty() { "(unknown)" } else { sink };
        self.doubts.indeterminate_keys.with_label_values(&[sink]).set(count);
    }

    /// The `indeterminate` keys of `sink` (`""`: records that keep no command) that no check
    /// settles any more.
    pub fn indeterminate_unattended(&self, sink: &str, count: i64) {
        let sink = if sink.is_empty() { "(unknown)" } else { sink };
        self.doubts.unattended.with_label_values(&[sink]).set(count);
    }

    /// Reads the size and free bytes of the volume holding the store at `path`.
    pub fn store_volume(&self, path: &std::path::Path) {
        if let Err(e) = self.host.read_volume(path) {
            tracing::debug!(error = %e, path = %path.display(), "could not read the store volume's size");
        }
    }

    /// Compaction removed `n` records.
    pub fn compacted(&self, n: usize) {
        self.compaction_removed.inc_by(n as u64);
    }

    /// Lag of one partition.
    pub fn lag(&self, topic: &str, partition: i32, lag: i64) {
        self.consumer_lag.with_label_values(&[topic, &partition.to_string()]).set(lag);
    }

    /// A partition left this instance: its lag is another member's to report.
    pub fn forget_lag(&self, topic: &str, partition: i32) {
        // Err = never reported: nothing to remove.
        let _ = self.consumer_lag.remove_label_values(&[topic, &partition.to_string()]);
    }

    /// Commands executing now.
    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A record went to the dead-letter topic.
    pub fn dead_lettered(&self, reason: &str) {
        self.dead_letter.with_label_values(&[reason]).inc();
    }

    /// State partition `partition` is being restored (or no longer is).
    pub fn set_restoring(&self, partition: i32, restoring: bool) {
        self.state.restoring.with_label_values(&[&partition.to_string()]).set(i64::from(restoring));
    }

    /// A restore applied `n` changelog records.
    pub fn restored_records(&self, n: u64) {
        self.state.restore_records.inc_by(n);
    }

    /// A standby applied `n` changelog records.
    pub fn standby_records(&self, n: u64) {
        self.state.standby_records.inc_by(n);
    }

    /// The standby tails `n` partitions.
    pub fn set_standby_partitions(&self, n: usize) {
        self.state.standby_partitions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The group generation was found gone with work in the open transaction (see
    /// `pipeline::transactions`, invariant 6).
    pub fn fenced(&self) {
        self.state.fenced.inc();
    }

    /// Another instance's stalled transaction was aborted (see `pipeline::transactions`,
    /// invariant 8).
    pub fn stalled_transaction_aborted(&self) {
        self.state.stalled_aborted.inc();
    }

    /// A rebalance happened.
    pub fn rebalance(&self) {
        self.rebalances.inc();
    }

    /// The Kafka consumer was replaced after it fenced itself (see `pipeline::consumer`).
    pub fn consumer_restarted(&self) {
        self.consumer_restarts.inc();
    }

    /// A repeat arrived `seconds` after the first sighting.
    pub fn duplicate_age(&self, route: Option<&str>, seconds: f64) {
        self.duplicate_age.with_label_values(&[route.unwrap_or("-")]).observe(seconds);
    }

    /// How many partitions are refused now.
    pub fn set_refused_partitions(&self, n: usize) {
        self.refused_partitions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The consumer holds `n` partitions.
    pub fn set_assigned_partitions(&self, n: usize) {
        self.assigned_partitions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The worker of `topic`/`partition` panicked.
    pub fn worker_panicked(&self, topic: &str, partition: i32) {
        self.worker_panics.with_label_values(&[topic, &partition.to_string()]).inc();
    }

    /// A store write failed with an error of `kind` (one of `store::WRITE_ERROR_KINDS`).
    pub fn store_write_failed(&self, kind: &str) {
        self.store_write_errors.with_label_values(&[kind]).inc();
    }

    /// Whether `sink`'s circuit breaker is open (or half-open) now.
    pub fn set_sink_circuit_open(&self, sink: &str, open: bool) {
        self.sink_circuit_open.with_label_values(&[sink]).set(i64::from(open));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        let mut families = self.registry.gather();
        families.extend(self.host.process.gather());
        if let Err(e) = encoder.encode(&families, &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// `duplicate_age_seconds{route}`.
fn duplicate_age() -> Result<HistogramVec, MetricsError> {
    let help = "How long after the first sighting a repeat arrived (evidence for choosing a TTL).";
    Ok(HistogramVec::new(HistogramOpts::new("duplicate_age_seconds", help).buckets(AGE_BUCKETS.to_vec()), &["route"])?)
}

/// `refused_partitions` and `assigned_partitions`.
fn partition_gauges() -> Result<(IntGauge, IntGauge), MetricsError> {
    let refused = "Partitions refused because their committed offset is beyond the store's watermark.";
    let assigned = "Partitions the consumer group assigned to this instance (0: it consumes nothing).";
    Ok((IntGauge::new("refused_partitions", refused)?, IntGauge::new("assigned_partitions", assigned)?))
}

#[cfg(test)]
mod tests;

//! Every metric of docs/contract.md §10 (prefix `dedupd_`), each built from its definition in
//! [`catalogue`] and updated through a named method so that label values cannot drift between
//! call sites.

use prometheus::{
    Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};

pub mod catalogue;
mod doubts;
mod figures;
mod host;
mod intake;

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
    /// Sink calls and checks by answer, and the keys in doubt (see [`doubts`]).
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
    intake: intake::IntakeMetrics,
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
            restoring: catalogue::STATE_RESTORING.int_gauge_vec()?,
            restore_records: catalogue::STATE_RESTORE_RECORDS.int_counter()?,
            standby_records: catalogue::STATE_STANDBY_RECORDS.int_counter()?,
            standby_partitions: catalogue::STATE_STANDBY_PARTITIONS.int_gauge()?,
            fenced: catalogue::FENCED.int_counter()?,
            stalled_aborted: catalogue::STALLED_TRANSACTIONS_ABORTED.int_counter()?,
        })
    }
}

/// A metric could not be registered (a programming error, reported, not panicked).
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    /// Creates and registers every metric, each from its definition in [`catalogue`].
    pub fn new() -> Result<Metrics, MetricsError> {
        use catalogue as c;
        let m = Metrics {
            commands: c::COMMANDS.int_counter_vec()?,
            sink_requests: c::SINK_REQUESTS.int_counter_vec()?,
            doubts: doubts::doubt_metrics()?,
            sink_duration: c::SINK_DURATION.histogram_vec()?,
            process_duration: c::PROCESS_DURATION.histogram()?,
            store_records: c::STORE_RECORDS.int_gauge_vec()?,
            store_disk_bytes: c::STORE_DISK_BYTES.int_gauge()?,
            compaction_removed: c::COMPACTION_REMOVED.int_counter()?,
            consumer_lag: c::CONSUMER_LAG.int_gauge_vec()?,
            in_flight: c::IN_FLIGHT.int_gauge()?,
            dead_letter: c::DEAD_LETTER.int_counter_vec()?,
            rebalances: c::REBALANCES.int_counter()?,
            consumer_restarts: c::CONSUMER_RESTARTS.int_counter()?,
            duplicate_age: c::DUPLICATE_AGE.histogram_vec()?,
            refused_partitions: c::REFUSED_PARTITIONS.int_gauge()?,
            assigned_partitions: c::ASSIGNED_PARTITIONS.int_gauge()?,
            sink_circuit_open: c::SINK_CIRCUIT_OPEN.int_gauge_vec()?,
            worker_panics: c::WORKER_PANICS.int_counter_vec()?,
            store_write_errors: c::STORE_WRITE_ERRORS.int_counter_vec()?,
            store_fsyncs: c::STORE_FSYNCS.int_counter_vec()?,
            state: StateMetrics::new()?,
            intake: intake::intake_metrics()?,
            transaction_commit: c::TRANSACTION_COMMIT.histogram()?,
            host: host::HostMetrics::new()?,
            registry: Registry::new_custom(Some(c::PREFIX.into()), None)?,
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
            Box::new(self.intake.requests.clone()),
            Box::new(self.intake.duration.clone()),
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

    /// The intake answered a request at `door` (`http`, `mcp`) of `client` (`-`: none
    /// known) with `status`, `seconds` after it came.
    pub fn intake_answered(&self, door: &str, client: &str, status: u16, seconds: f64) {
        self.intake.requests.with_label_values(&[door, client, &status.to_string()]).inc();
        self.intake.duration.with_label_values(&[door]).observe(seconds);
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

#[cfg(test)]
mod tests;

//! The metric catalogue: every `dedupd_` metric's name, type, labels, buckets and help,
//! written once. `Metrics::new` builds each metric from its definition here; the metrics
//! tests compare the registry with [`CATALOGUE`], tests/ops/metrics_run.rs takes the families a
//! run must expose from it, and tests/docs/metrics_docs.rs checks docs/metrics.md and
//! docs/contract.md §10 against it. The process collector's `process_*` metrics are not
//! dedupd's and are not here.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

/// The registry's prefix: a definition's `name` is exposed as `dedupd_<name>`.
pub const PREFIX: &str = "dedupd";

/// A metric's Prometheus type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As `# TYPE` (and docs/metrics.md's type column) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric: everything about it but when it is updated.
#[derive(Debug)]
pub struct MetricDef {
    /// Without the registry's [`PREFIX`].
    pub name: &'static str,
    pub kind: Kind,
    /// Its label names, in order (empty: a single series).
    pub labels: &'static [&'static str],
    /// A histogram's bucket upper bounds (`None` for the other kinds).
    pub buckets: Option<&'static [f64]>,
    pub help: &'static str,
}

impl MetricDef {
    /// The name a scrape shows: `dedupd_<name>`.
    pub fn exposed_name(&self) -> String {
        format!("{PREFIX}_{}", self.name)
    }

    /// The definition fits the metric built from it: its kind, labels or none, buckets for
    /// a histogram only (a programming error, reported as an error, not panicked).
    fn fits(&self, kind: Kind, labelled: bool) -> Result<Opts, prometheus::Error> {
        if self.kind != kind
            || self.labels.is_empty() == labelled
            || self.buckets.is_some() != (kind == Kind::Histogram)
        {
            let shape = if labelled { "labelled" } else { "unlabelled" };
            return Err(prometheus::Error::Msg(format!(
                "metric {} is defined as a {} with labels {:?} and buckets {:?}, built as a {shape} {}",
                self.name,
                self.kind.as_str(),
                self.labels,
                self.buckets,
                kind.as_str()
            )));
        }
        Ok(Opts::new(self.name, self.help))
    }

    pub fn int_counter(&self) -> Result<IntCounter, prometheus::Error> {
        IntCounter::with_opts(self.fits(Kind::Counter, false)?)
    }

    pub fn int_counter_vec(&self) -> Result<IntCounterVec, prometheus::Error> {
        IntCounterVec::new(self.fits(Kind::Counter, true)?, self.labels)
    }

    pub fn int_gauge(&self) -> Result<IntGauge, prometheus::Error> {
        IntGauge::with_opts(self.fits(Kind::Gauge, false)?)
    }

    pub fn int_gauge_vec(&self) -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(self.fits(Kind::Gauge, true)?, self.labels)
    }

    pub fn histogram(&self) -> Result<Histogram, prometheus::Error> {
        Histogram::with_opts(self.histogram_opts(false)?)
    }

    pub fn histogram_vec(&self) -> Result<HistogramVec, prometheus::Error> {
        HistogramVec::new(self.histogram_opts(true)?, self.labels)
    }

    fn histogram_opts(&self, labelled: bool) -> Result<HistogramOpts, prometheus::Error> {
        let opts = HistogramOpts::from(self.fits(Kind::Histogram, labelled)?);
        Ok(opts.buckets(self.buckets.unwrap_or_default().to_vec()))
    }
}

/// One sink call: sub-millisecond (log, a local receiver) to the http sink's request
/// timeout (10 s by default).
const LATENCY_BUCKETS: [f64; 15] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// One batch takes the sink call's buckets and minutes beyond: minutes when a transient
/// failure is retried with backoff (up to `retry.max_backoff`, 30 s, per attempt).
const BATCH_BUCKETS: [f64; 18] = concat(LATENCY_BUCKETS, [60.0, 120.0, 300.0]);
/// Repeats come from within the same batch or an agent's quick retry (well under a second)
/// to days later, and never later than `store.max_ttl` (7 d by default): 0.1 s to 7 d.
const AGE_BUCKETS: [f64; 11] =
    [0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 6.0 * 3600.0, 86400.0, 3.0 * 86400.0, 7.0 * 86400.0];

/// `a` then `b` (`N` must be their lengths' sum: checked when the constant is evaluated).
const fn concat<const A: usize, const B: usize, const N: usize>(a: [f64; A], b: [f64; B]) -> [f64; N] {
    assert!(A + B == N, "concat: N is not A + B");
    let mut out = [0.0; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

/// A counter, gauge or histogram definition, without buckets or with.
macro_rules! def {
    ($name:literal, Histogram, [$($label:literal),*], $buckets:expr, $help:expr) => {
        MetricDef { name: $name, kind: Kind::Histogram, labels: &[$($label),*], buckets: Some(&$buckets), help: $help }
    };
    ($name:literal, $kind:ident, [$($label:literal),*], $help:expr) => {
        MetricDef { name: $name, kind: Kind::$kind, labels: &[$($label),*], buckets: None, help: $help }
    };
}

pub const COMMANDS: MetricDef =
    def!("commands_total", Counter, ["outcome", "route"], "Input records by outcome and route.");
pub const SINK_REQUESTS: MetricDef = def!(
    "sink_requests_total",
    Counter,
    ["sink", "status"],
    "Sink calls by sink and status (ok, transient, permanent)."
);
pub const SINK_CALLS: MetricDef = def!(
    "sink_calls_total",
    Counter,
    ["sink", "answer"],
    "Sink calls by sink and what the receiver made of them: answered, never_sent (refused before the request left) or maybe (sent without an answer)."
);
pub const CHECKS: MetricDef = def!(
    "checks_total",
    Counter,
    ["sink", "answer"],
    "Checks asking a sink's receiver whether a command's effect exists, by answer: found, absent, unknown, error (could not ask)."
);
pub const INDETERMINATE_KEYS: MetricDef = def!(
    "indeterminate_keys",
    Gauge,
    ["sink"],
    "Keys in doubt (indeterminate, or being run again by the reconciler), by the sink their command went to (\"(unknown)\" for records that keep no command); with the store on Kafka, of the state partitions this instance holds: each waits for a check or an operator."
);
pub const INDETERMINATE_KEYS_UNATTENDED: MetricDef = def!(
    "indeterminate_keys_unattended",
    Gauge,
    ["sink"],
    "Indeterminate keys no check settles any more, by sink: those of a sink without a check (or that keep no command), and those past their sink's check.deadline. Each waits for an operator."
);
pub const SINK_DURATION: MetricDef =
    def!("sink_duration_seconds", Histogram, ["sink"], LATENCY_BUCKETS, "Duration of one sink call.");
pub const PROCESS_DURATION: MetricDef =
    def!("process_duration_seconds", Histogram, [], BATCH_BUCKETS, "Time from batch start to results acknowledged.");
pub const STORE_RECORDS: MetricDef = def!("store_records", Gauge, ["state"], "Stored records by state.");
pub const STORE_DISK_BYTES: MetricDef = def!("store_disk_bytes", Gauge, [], "Bytes the store occupies on disk.");
pub const COMPACTION_REMOVED: MetricDef =
    def!("compaction_removed_total", Counter, [], "Expired records removed by compaction.");
pub const CONSUMER_LAG: MetricDef = def!(
    "consumer_lag",
    Gauge,
    ["topic", "partition"],
    "Records at the partition's end not yet committed: end offset minus the group's committed offset."
);
pub const IN_FLIGHT: MetricDef =
    def!("in_flight", Gauge, [], "Commands claimed, not completed: at or waiting for their sink.");
pub const DEAD_LETTER: MetricDef =
    def!("dead_letter_total", Counter, ["reason"], "Records sent to the dead-letter topic, by reason.");
pub const REBALANCES: MetricDef = def!("rebalances_total", Counter, [], "Consumer group rebalances seen.");
pub const CONSUMER_RESTARTS: MetricDef = def!(
    "consumer_restarts_total",
    Counter,
    [],
    "Kafka consumers replaced in process after librdkafka fenced them following their own lost group session."
);
pub const DUPLICATE_AGE: MetricDef = def!(
    "duplicate_age_seconds",
    Histogram,
    ["route"],
    AGE_BUCKETS,
    "How long after the first sighting a repeat arrived (evidence for choosing a TTL)."
);
pub const REFUSED_PARTITIONS: MetricDef = def!(
    "refused_partitions",
    Gauge,
    [],
    "Partitions refused because their committed offset is beyond the store's watermark."
);
pub const ASSIGNED_PARTITIONS: MetricDef = def!(
    "assigned_partitions",
    Gauge,
    [],
    "Partitions the consumer group assigned to this instance (0: it consumes nothing)."
);
pub const SINK_CIRCUIT_OPEN: MetricDef = def!(
    "sink_circuit_open",
    Gauge,
    ["sink"],
    "1 while the sink's circuit breaker is open or half-open (commands wait for it), else 0."
);
pub const WORKER_PANICS: MetricDef = def!(
    "worker_panics_total",
    Counter,
    ["topic", "partition"],
    "Partition workers that panicked (the process then stops, exiting non-zero)."
);
pub const STORE_WRITE_ERRORS: MetricDef = def!(
    "store_write_errors_total",
    Counter,
    ["kind"],
    "Store writes that failed, by kind (disk_full, io); each one stops the process (exit non-zero)."
);
pub const STORE_FSYNCS: MetricDef = def!(
    "store_fsyncs_total",
    Counter,
    ["file"],
    "Group commits by file (journal: the claim journal, store: the backend); each covers every partition waiting at that moment."
);
pub const TRANSACTION_COMMIT: MetricDef = def!(
    "transaction_commit_seconds",
    Histogram,
    [],
    LATENCY_BUCKETS,
    "One commit of the results transaction (kafka.transactional_results), its wait for the gate included; nothing is queued meanwhile."
);
pub const STATE_RESTORING: MetricDef =
    def!("state_restoring", Gauge, ["partition"], "1 while the state partition is being restored from the changelog.");
pub const STATE_RESTORE_RECORDS: MetricDef =
    def!("state_restore_records_total", Counter, [], "Changelog records applied to the store by restores.");
pub const STATE_STANDBY_RECORDS: MetricDef = def!(
    "state_standby_records_total",
    Counter,
    [],
    "Changelog records applied to the store by its standby copies of partitions it does not own."
);
pub const STATE_STANDBY_PARTITIONS: MetricDef = def!(
    "state_standby_partitions",
    Gauge,
    [],
    "State partitions this instance keeps a standby copy of (tails without owning)."
);
pub const FENCED: MetricDef = def!(
    "fenced_total",
    Counter,
    [],
    "Times this instance found its group generation gone with work in the open transaction: the transaction was aborted (no claim in it committed, no sink called for it) and the pipeline restarted in process."
);
pub const STALLED_TRANSACTIONS_ABORTED: MetricDef = def!(
    "stalled_transactions_aborted_total",
    Counter,
    [],
    "Transactions of another instance that held a partition of dedupd's own topics past the session or transaction timeout, aborted by taking over their transactional.id."
);
pub const INTAKE_REQUESTS: MetricDef = def!(
    "intake_requests_total",
    Counter,
    ["door", "client", "status"],
    "Requests the intake answered, by door (http, mcp), client (- for no or an unknown API key) and HTTP status."
);
pub const INTAKE_DURATION: MetricDef = def!(
    "intake_request_duration_seconds",
    Histogram,
    ["door"],
    LATENCY_BUCKETS,
    "How long the intake took to answer a request, by door (http, mcp); a 202 ends the wait at intake.wait."
);
pub const BUILD_INFO: MetricDef = def!("build_info", Gauge, ["version"], "Always 1; its labels say which build runs.");
pub const STORE_VOLUME_SIZE: MetricDef =
    def!("store_volume_size_bytes", Gauge, [], "Size of the filesystem that holds the store (0 until first read).");
pub const STORE_VOLUME_FREE: MetricDef = def!(
    "store_volume_free_bytes",
    Gauge,
    [],
    "Bytes of the store's filesystem that dedupd may still write (0 until first read)."
);

/// Every `dedupd_` metric, in the order of docs/contract.md §10.
pub const CATALOGUE: &[&MetricDef] = &[
    &COMMANDS,
    &SINK_REQUESTS,
    &SINK_CALLS,
    &CHECKS,
    &INDETERMINATE_KEYS,
    &INDETERMINATE_KEYS_UNATTENDED,
    &SINK_DURATION,
    &PROCESS_DURATION,
    &STORE_RECORDS,
    &STORE_DISK_BYTES,
    &COMPACTION_REMOVED,
    &CONSUMER_LAG,
    &IN_FLIGHT,
    &DEAD_LETTER,
    &REBALANCES,
    &CONSUMER_RESTARTS,
    &DUPLICATE_AGE,
    &REFUSED_PARTITIONS,
    &ASSIGNED_PARTITIONS,
    &SINK_CIRCUIT_OPEN,
    &WORKER_PANICS,
    &STORE_WRITE_ERRORS,
    &STORE_FSYNCS,
    &TRANSACTION_COMMIT,
    &STATE_RESTORING,
    &STATE_RESTORE_RECORDS,
    &FENCED,
    &STALLED_TRANSACTIONS_ABORTED,
    &STATE_STANDBY_RECORDS,
    &STATE_STANDBY_PARTITIONS,
    &INTAKE_REQUESTS,
    &INTAKE_DURATION,
    &BUILD_INFO,
    &STORE_VOLUME_SIZE,
    &STORE_VOLUME_FREE,
];

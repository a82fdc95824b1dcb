//! What an operator reads beside the pipeline's metrics: which build runs
//! (`dedupd_build_info`), what the process uses (Prometheus' standard `process_*` metrics:
//! CPU, resident memory, file descriptors, threads, start time), and how full the store's
//! volume is (`dedupd_store_volume_size_bytes`, `dedupd_store_volume_free_bytes`), so that
//! an alert predicts a full disk from the volume's own capacity, whatever its size.

use std::path::Path;

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::{Counter, MetricFamily};
use prometheus::{IntGauge, IntGaugeVec, Registry};

use super::{MetricsError, catalogue};

/// The build and volume gauges, in dedupd's registry, and the process collector in a
/// registry of its own.
pub(super) struct HostMetrics {
    build_info: IntGaugeVec,
    volume_size: IntGauge,
    volume_free: IntGauge,
    /// The process collector's `process_*` metrics, without dedupd's prefix: their names
    /// are the Prometheus client libraries' convention, which dashboards expect.
    pub(super) process: Registry,
}

impl HostMetrics {
    pub(super) fn new() -> Result<HostMetrics, MetricsError> {
        let host = HostMetrics {
            build_info: catalogue::BUILD_INFO.int_gauge_vec()?,
            volume_size: catalogue::STORE_VOLUME_SIZE.int_gauge()?,
            volume_free: catalogue::STORE_VOLUME_FREE.int_gauge()?,
            process: Registry::new(),
        };
        host.process.register(Box::new(ProcessMetrics(ProcessCollector::for_self())))?;
        host.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        Ok(host)
    }

    pub(super) fn register(&self, registry: &Registry) -> Result<(), MetricsError> {
        registry.register(Box::new(self.build_info.clone()))?;
        registry.register(Box::new(self.volume_size.clone()))?;
        registry.register(Box::new(self.volume_free.clone()))?;
        Ok(())
    }

    /// The volume's size and free bytes as last read.
    pub(super) fn volume(&self) -> (i64, i64) {
        (self.volume_size.get(), self.volume_free.get())
    }

    /// Reads the size and free space of the filesystem holding `path`; an error leaves the
    /// gauges as they were (a volume that cannot be read is not a volume that is empty).
    pub(super) fn read_volume(&self, path: &Path) -> std::io::Result<()> {
        let stat = rustix::fs::statvfs(path)?;
        let block = stat.f_frsize;
        self.volume_size.set(gauge(stat.f_blocks.saturating_mul(block)));
        self.volume_free.set(gauge(stat.f_bavail.saturating_mul(block)));
        Ok(())
    }
}

fn gauge(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Prometheus' process collector, with `process_cpu_seconds_total` to the clock tick: the
/// crate keeps it in an integer counter of whole seconds, so `rate()` over it reads 0 or a
/// step for a process using a fraction of a core, unlike every other client library's.
struct ProcessMetrics(ProcessCollector);

/// The name the collector gives the CPU counter.
const CPU_SECONDS: &str = "process_cpu_seconds_total";

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.0.collect();
        let Some(seconds) = cpu_seconds() else { return families };
        for family in families.iter_mut().filter(|f| f.name() == CPU_SECONDS) {
            for metric in family.mut_metric() {
                let mut counter = Counter::new();
                counter.set_value(seconds);
                metric.set_counter(counter);
            }
        }
        families
    }
}

/// User and system CPU time of this process so far, in seconds (`None` if /proc cannot
/// be read: the collector's own figure stays).
fn cpu_seconds() -> Option<f64> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second();
    (ticks > 0).then(|| (stat.utime + stat.stime) as f64 / ticks as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_are_not_whole_seconds() {
        let registry = Registry::new();
        registry.register(Box::new(ProcessMetrics(ProcessCollector::for_self()))).unwrap();
        // Spin until the process has used a little CPU that is not a whole number of
        // seconds (ticks are 10 ms): bounded, a few hundred ms at most.
        let started = std::time::Instant::now();
        let value = loop {
            let families = registry.gather();
            let cpu = families.iter().find(|f| f.name() == CPU_SECONDS).expect("the CPU counter");
            let value = cpu.get_metric()[0].get_counter().value();
            if value.fract() != 0.0 || started.elapsed() > std::time::Duration::from_secs(5) {
                break value;
            }
            std::hint::black_box((0..100_000u64).sum::<u64>());
        };
        assert!(value.fract() != 0.0 && value > 0.0, "process_cpu_seconds_total {value}");
        assert!((value - cpu_seconds().unwrap()).abs() < 0.5, "{value}");
    }
}

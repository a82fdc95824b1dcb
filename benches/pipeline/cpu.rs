//! CPU a phase of the bench costs per record, read from /proc: this process (the relay, or
//! `dedupd run` in process), the broker (the JVM running `kafka.Kafka`) and the whole
//! machine (every core's busy time, neighbours included). On a machine whose cores the
//! broker shares, a phase's rate can be at most `cores / machine CPU per record`, so these
//! figures say how far apart two rates must stay whatever either does with its time.
//!
//! The broker's figure also names what its JIT compilers took (HotSpot's `C1`/`C2
//! CompilerThread`s): a broker started for the bench goes on compiling through its first
//! couple of million records, and that CPU lands on the same cores as the phase measured
//! (docs/performance-notes.md, "A broker still compiling"); `--warm-broker` drains it past that.
//!
//! The broker is the one `scripts/kafka/kafka.sh` started for this run (its pid file in
//! `DEDUPD_TEST_KAFKA_DIR`), else the first `kafka.Kafka` process found: another broker on
//! the machine (a test suite's, another session's) must not be counted as this one.

use std::time::Instant;

/// Clock ticks per second of /proc's CPU times (`getconf CLK_TCK`, 100 on Linux).
const TICKS_PER_S: f64 = 100.0;

/// CPU times at one moment, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    at: Instant,
    process: u64,
    broker: Option<u64>,
    /// The broker's JIT compiler threads, within `broker`.
    broker_jit: Option<u64>,
    machine_busy: u64,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        let pid = broker_pid();
        Snapshot {
            at: Instant::now(),
            process: process_ticks("self").unwrap_or(0),
            broker: pid.as_deref().and_then(process_ticks),
            broker_jit: pid.as_deref().and_then(jit_ticks),
            machine_busy: machine_busy_ticks().unwrap_or(0),
        }
    }

    /// The share of the broker's CPU from this snapshot to `end` that its JIT compilers
    /// took, when the broker was found and worked at all.
    pub fn broker_jit_share(&self, end: &Snapshot) -> Option<f64> {
        let busy = end.broker?.checked_sub(self.broker?).filter(|&t| t > 0)?;
        let jit = end.broker_jit?.saturating_sub(self.broker_jit?);
        Some(jit as f64 / busy as f64)
    }

    /// `what`'s CPU per record from this snapshot to `end`, printed on one line.
    pub fn print_per_record(&self, end: &Snapshot, records: usize, what: &str) {
        let per = |ticks: u64| ticks as f64 / TICKS_PER_S / records.max(1) as f64 * 1e6;
        let machine = per(end.machine_busy.saturating_sub(self.machine_busy));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let broker = match (self.broker, end.broker, self.broker_jit, end.broker_jit) {
            (Some(a), Some(b), Some(ja), Some(jb)) => {
                format!("{:.1} µs (JIT compilers {:.1} µs)", per(b.saturating_sub(a)), per(jb.saturating_sub(ja)))
            }
            (Some(a), Some(b), ..) => format!("{:.1} µs", per(b.saturating_sub(a))),
            _ => "– (no kafka.Kafka process found)".into(),
        };
        println!(
            "  CPU per record, {what}: this process {:.1} µs, broker {broker}, machine {machine:.1} µs over {:.1} s \
             ({cores} cores: at most {:.0} records/s at this cost)",
            per(end.process.saturating_sub(self.process)),
            end.at.duration_since(self.at).as_secs_f64(),
            cores as f64 / (machine / 1e6),
        );
    }
}

/// utime + stime of `/proc/<pid>/stat` (fields 14 and 15; the command name, field 2, is in
/// parentheses and may hold spaces, so fields are counted after its closing one).
fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// utime + stime of the threads of `pid` that HotSpot's JIT compilers run on (their names
/// start `C1 CompilerThre` or `C2 CompilerThre`, cut to 15 bytes by the kernel).
fn jit_ticks(pid: &str) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let ticks = tasks
        .flatten()
        .filter(|task| std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.contains("CompilerThre")))
        .filter_map(|task| process_ticks(&format!("{pid}/task/{}", task.file_name().to_str()?)))
        .sum();
    Some(ticks)
}

/// Every core's busy ticks: the first line of /proc/stat without idle and iowait.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    Some(ticks.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum())
}

/// The broker's pid: the one in the pid file of the broker `kafka.sh` started for this run,
/// else a process whose command line runs `kafka.Kafka`.
fn broker_pid() -> Option<String> {
    let started = std::env::var_os("DEDUPD_TEST_KAFKA_DIR")
        .and_then(|dir| std::fs::read_to_string(std::path::Path::new(&dir).join("kafka.pid")).ok())
        .map(|pid| pid.trim().to_string())
        .filter(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    if started.is_some() {
        return started;
    }
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid = entry.file_name().to_str()?.to_string();
        pid.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        cmdline.split(|&b| b == 0).any(|arg| arg == b"kafka.Kafka").then_some(pid)
    })
}

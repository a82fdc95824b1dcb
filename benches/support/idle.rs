//! Waiting for a bench child to go idle: the engine's background threads (flushes,
//! compaction) finished with what the bench just wrote.

use std::time::{Duration, Instant};

/// Waits until the process used less than 5% of a core over 5 s, or `max`; returns how
/// long it waited.
pub fn wait_until_idle(max: Duration) -> Duration {
    const WINDOW: Duration = Duration::from_secs(5);
    let start = Instant::now();
    let mut cpu = process_cpu();
    while start.elapsed() < max {
        std::thread::sleep(WINDOW);
        let now = process_cpu();
        if now.saturating_sub(cpu) * 20 < WINDOW {
            break;
        }
        cpu = now;
    }
    start.elapsed()
}

/// User + system CPU time of this process so far (`/proc/self/stat`, clock ticks of 10 ms).
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3;
    // utime and stime are fields 14 and 15.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name.split_whitespace().skip(11).take(2).filter_map(|f| f.parse::<u64>().ok()).sum();
    Duration::from_millis(ticks * 10)
}

//! `dedupd status --admin URL [--watch]`: a running instance's `/v1/status` as a table,
//! refreshed every two seconds with `--watch` until Ctrl-C, in the spirit of `vector top`.

use std::fmt::Write as _;
use std::time::Duration;

use reqwest::Method;

use super::CliError;
use super::output::print_line;
use super::remote::Remote;
use crate::ops::Status;

/// How often `--watch` asks again.
const REFRESH: Duration = Duration::from_secs(2);
/// Clears the terminal and puts the cursor at the top (ANSI), before each `--watch` frame.
const CLEAR: &str = "\x1b[2J\x1b[H";

impl Remote {
    /// The instance's `/v1/status`.
    pub async fn status(&self) -> Result<Status, CliError> {
        let answer = self.call(Method::GET, self.url(&["status"])?, None).await?;
        serde_json::from_value(answer).map_err(|e| CliError::Remote(format!("unexpected /v1/status answer: {e}")))
    }
}

/// Prints the status once, or every [`REFRESH`] with `watch` until Ctrl-C.
pub(super) async fn show(remote: &Remote, watch: bool) -> Result<(), CliError> {
    if !watch {
        return print_line(table(&remote.status().await?).trim_end());
    }
    loop {
        let frame = match remote.status().await {
            Ok(status) => table(&status),
            // The instance restarting is what one watches for: say so and go on.
            Err(e) => format!("{e}\n"),
        };
        print_line(format_args!("{CLEAR}{}", frame.trim_end()))?;
        tokio::select! {
            () = tokio::time::sleep(REFRESH) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// The status as text: a summary line, the partitions, the circuits, the store.
pub fn table(s: &Status) -> String {
    let mut out = String::new();
    let ready =
        if s.ready { "ready".to_string() } else { format!("NOT READY: {}", s.not_ready.as_deref().unwrap_or("?")) };
    let alive =
        if s.alive { "alive".to_string() } else { format!("NOT ALIVE: {}", s.not_alive.as_deref().unwrap_or("?")) };
    let _ = writeln!(out, "dedupd {}  {ready}  {alive}  in flight {}", s.version, s.in_flight);
    let width = s.partitions.iter().map(|p| p.partition.len()).max().unwrap_or(0).max("PARTITION".len());
    let _ = writeln!(out, "\n{:<width$}  {:<20}  {:>10}  DETAIL", "PARTITION", "STATE", "LAG");
    if s.partitions.is_empty() {
        let _ = writeln!(out, "(none assigned)");
    }
    for p in &s.partitions {
        let lag = p.lag.map_or("-".to_string(), |l| l.to_string());
        let detail = p.detail.as_deref().unwrap_or("");
        let _ = writeln!(out, "{:<width$}  {:<20}  {lag:>10}  {detail}", p.partition, p.state);
    }
    if !s.circuits.is_empty() {
        let _ = writeln!(out, "\nSINK CIRCUITS");
        for (sink, state) in &s.circuits {
            let _ = writeln!(out, "{sink:<20}  {state}");
        }
    }
    let records: Vec<String> = s.store.records.iter().map(|(state, n)| format!("{state} {n}")).collect();
    let _ = writeln!(out, "\nSTORE  {}  disk {}", records.join("  "), bytes(s.store.disk_bytes));
    if s.store.volume_size_bytes > 0 {
        let free = s.store.volume_free_bytes as f64 / s.store.volume_size_bytes as f64 * 100.0;
        let _ = writeln!(
            out,
            "VOLUME {} free of {} ({free:.0}%)",
            bytes(s.store.volume_free_bytes),
            bytes(s.store.volume_size_bytes)
        );
    }
    out
}

/// `n` bytes in the largest binary unit that keeps it at 1 or more.
fn bytes(n: i64) -> String {
    let mut v = n as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if v < 1024.0 {
            return format!("{v:.1} {unit}");
        }
        v /= 1024.0;
    }
    format!("{v:.1} TiB")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ops::status::{PartitionStatus, StoreStatus};

    #[test]
    fn the_table_shows_every_partition_circuit_and_store_figure() {
        let status = Status {
            version: "1.2.3".into(),
            ready: false,
            not_ready: Some("partitions down: by-key/1 (restoring its state from the changelog)".into()),
            alive: true,
            not_alive: None,
            partitions: vec![
                PartitionStatus {
                    partition: "commands/0".into(),
                    state: "running".into(),
                    detail: None,
                    lag: Some(12),
                },
                PartitionStatus {
                    partition: "by-key/1".into(),
                    state: "restoring".into(),
                    detail: Some("restoring its state from the changelog".into()),
                    lag: None,
                },
            ],
            in_flight: 3,
            circuits: BTreeMap::from([("mail".into(), "open".into())]),
            store: StoreStatus {
                records: BTreeMap::from([("completed".into(), 200), ("in_progress".into(), 1)]),
                disk_bytes: 3 * 1024 * 1024,
                volume_size_bytes: 100 << 30,
                volume_free_bytes: 40 << 30,
            },
        };
        let text = table(&status);
        for line in [
            "dedupd 1.2.3  NOT READY: partitions down: by-key/1",
            "commands/0  running                       12",
            "by-key/1    restoring                      -  restoring its state from the changelog",
            "mail                  open",
            "STORE  completed 200  in_progress 1  disk 3.0 MiB",
            "VOLUME 40.0 GiB free of 100.0 GiB (40%)",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}

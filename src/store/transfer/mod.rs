//! Export and import of a whole store as JSON Lines, format version 1 (`dedupd export` /
//! `dedupd import`, `GET /v1/export` / `POST /v1/import`; docs/admin.md).
//!
//! One JSON object per line, each with `"v": 1` and a `"type"`:
//! - `header` first: when, from which backend, about how many records follow;
//! - `watermark` lines: the per-partition watermarks (docs/contract.md §3), written *before* the
//!   records: a watermark is raised only after the records of the offsets below it were
//!   written, so every record an exported watermark vouches for is in the records that
//!   follow (in this or a newer version), even though the export is not a snapshot;
//! - `record` lines: everything needed to restore a record exactly (timestamps in Unix
//!   ms, the fingerprint, the stored result bytes);
//! - `end` last, with the counts, so a cut-off export is refused instead of half-imported.
//!
//! Import validates each line (errors name the line number), skips expired records, keeps
//! a stored record that is newer than the imported one unless told to overwrite, and only
//! ever raises watermarks.

mod lines;

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use super::{KeyStore, StoreError, Tree};
use crate::store::record::Record;
pub use lines::{Entry, end_line, header_line, parse_line, record_line, watermark_line};

/// The export format's version (`"v"` of every line).
pub const FORMAT_VERSION: u32 = 1;

/// An export or import failure.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading or writing the stream failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a valid v1 export line.
    #[error("line {line}: {reason}")]
    Line { line: u64, reason: String },
    /// The stream ended before its end line (after `lines` lines, 0 for an empty file).
    #[error("{}: the export is incomplete (no end line)", match lines { 0 => "empty".to_string(), n => format!("ends after line {n}") })]
    Incomplete { lines: u64 },
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportCounts {
    /// Record lines.
    pub records: u64,
    /// Watermark lines.
    pub watermarks: u64,
}

/// What an import did, line by line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportReport {
    /// Records written (absent before, or older than the imported one).
    pub imported: u64,
    /// Records already stored exactly as imported.
    pub unchanged: u64,
    /// Records not written because the store holds a newer (or as new) different record.
    pub kept_newer: u64,
    /// Records not written because the stored one is `in_progress`: an instance may be
    /// executing it (replaced only with `force`).
    pub kept_in_progress: u64,
    /// Completed records already expired at import time, skipped.
    pub expired: u64,
    /// Watermarks raised (a watermark is never lowered).
    pub watermarks_raised: u64,
}

/// Import options.
#[derive(Debug, Clone, Copy)]
pub struct ImportOptions {
    /// Replace stored records even when they are newer than the imported ones.
    pub overwrite: bool,
    /// Replace stored `in_progress` claims too (only when no instance is executing them).
    pub force: bool,
    /// "Now", for skipping expired records.
    pub now_ms: i64,
}

/// What became of one imported record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Written.
    Written,
    /// Already stored as imported.
    Unchanged,
    /// The stored record is newer (or as new) and different; kept.
    KeptNewer,
    /// The stored record is an `in_progress` claim and `force` was not given; kept.
    KeptInProgress,
    /// Expired already; skipped.
    Expired,
}

/// The shape every stream must have: header first, end last with matching counts.
#[derive(Default)]
struct Shape {
    seen: ExportCounts,
    ended: bool,
}

impl Shape {
    fn check(&mut self, line_no: u64, entry: &Entry) -> Result<(), String> {
        if self.ended {
            return Err("content after the end line".into());
        }
        match entry {
            Entry::Header { .. } if line_no == 1 => {}
            Entry::Header { .. } => {
                return Err("a second header (or a header not on line 1)".into());
            }
            _ if line_no == 1 => return Err("the first line must be the export header".into()),
            Entry::Watermark { .. } => self.seen.watermarks += 1,
            Entry::Record { .. } => self.seen.records += 1,
            Entry::End { records, watermarks } => {
                if *records != self.seen.records || *watermarks != self.seen.watermarks {
                    return Err(format!(
                        "end line counts {records} record(s) and {watermarks} watermark(s), the stream had {} and {}",
                        self.seen.records, self.seen.watermarks
                    ));
                }
                self.ended = true;
            }
        }
        Ok(())
    }
}

/// The longest line an import reads: more than any record makes. A record's variable parts
/// are bounded by dedupd's own limits (a sink's result by [`crate::store::MAX_RESULT_BYTES`],
/// a command by `limits.max_command_bytes`, at most the same), and written as JSON (at
/// worst 6 bytes a character, a control character in a string) they stay under this. A longer line is refused with its number after reading at most
/// this much of it, so a stream that is not an export (or has no newlines) cannot make an
/// import hold it all.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

// A result kept as a JSON string escapes each control character in 6 bytes.
const _: () = assert!(MAX_LINE_BYTES >= 6 * crate::store::MAX_RESULT_BYTES + (1 << 20));

/// Reads every line, checks it and its place, and hands the entry to `apply`.
fn each_entry(
    reader: impl BufRead,
    progress: impl FnMut(u64),
    apply: impl FnMut(Entry) -> Result<(), TransferError>,
) -> Result<ExportCounts, TransferError> {
    each_entry_within(reader, MAX_LINE_BYTES, progress, apply)
}

/// [`each_entry`], with lines of at most `max_line` bytes.
fn each_entry_within(
    mut reader: impl BufRead,
    max_line: usize,
    mut progress: impl FnMut(u64),
    mut apply: impl FnMut(Entry) -> Result<(), TransferError>,
) -> Result<ExportCounts, TransferError> {
    let mut shape = Shape::default();
    let mut line_no = 0u64;
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        let limit = u64::try_from(max_line).unwrap_or(u64::MAX).saturating_add(1);
        let read = std::io::Read::take(&mut reader, limit).read_until(b'\n', &mut bytes)?;
        if read == 0 {
            break;
        }
        line_no += 1;
        progress(read as u64);
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        } else if bytes.len() > max_line {
            let reason = format!("longer than {max_line} bytes, more than any record makes: not an export line");
            return Err(TransferError::Line { line: line_no, reason });
        }
        let line = std::str::from_utf8(&bytes)
            .map_err(|e| TransferError::Line { line: line_no, reason: format!("not UTF-8: {e}") })?;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| TransferError::Line { line: line_no, reason };
        let entry = parse_line(line).map_err(bad)?;
        shape.check(line_no, &entry).map_err(bad)?;
        apply(entry)?;
    }
    if !shape.ended {
        return Err(TransferError::Incomplete { lines: line_no });
    }
    Ok(shape.seen)
}

/// Checks a whole export stream without touching any store: every line parses, the header
/// comes first and the end line last with matching counts. Returns the counts.
pub fn validate(reader: impl BufRead, progress: impl FnMut(u64)) -> Result<ExportCounts, TransferError> {
    each_entry(reader, progress, |_| Ok(()))
}

impl KeyStore {
    /// Every partition watermark: (topic, partition, offset).
    pub fn watermarks(&self) -> Result<Vec<(String, i32, i64)>, StoreError> {
        let rows = self.backend.scan(Tree::Meta, b"wm/", Some(b"wm0"), usize::MAX)?;
        let mut out = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            let name = String::from_utf8_lossy(&k).into_owned();
            let corrupt = || StoreError::Corrupt {
                key: name.clone(),
                source: super::record::DecodeError("bad watermark entry".into()),
            };
            let rest = name.strip_prefix("wm/").ok_or_else(corrupt)?;
            let (topic, partition) = rest.rsplit_once('/').ok_or_else(corrupt)?;
            let partition: i32 = partition.parse().map_err(|_| corrupt())?;
            let arr: [u8; 8] = v.as_slice().try_into().map_err(|_| corrupt())?;
            out.push((topic.to_string(), partition, i64::from_le_bytes(arr)));
        }
        Ok(out)
    }

    /// Writes the whole store as export lines to `out`: header, watermarks, records, end.
    /// Not a snapshot: records changing meanwhile appear in one of their versions.
    pub fn export_to(&self, exported_at_ms: i64, out: &mut dyn Write) -> Result<ExportCounts, TransferError> {
        let c = self.counts();
        let estimate = c.in_progress + c.completed + c.indeterminate;
        writeln!(out, "{}", header_line(exported_at_ms, self.backend_name(), estimate))?;
        let mut counts = ExportCounts::default();
        for (topic, partition, offset) in self.watermarks()? {
            writeln!(out, "{}", watermark_line(&topic, partition, offset))?;
            counts.watermarks += 1;
        }
        let mut after: Option<String> = None;
        loop {
            let page = self.scan_records(after.as_deref(), 1000)?;
            let Some((last, _)) = page.last() else { break };
            let last = last.clone();
            for (key, record) in &page {
                writeln!(out, "{}", record_line(key, record))?;
                counts.records += 1;
            }
            after = Some(last);
        }
        writeln!(out, "{}", end_line(counts.records, counts.watermarks))?;
        out.flush()?;
        Ok(counts)
    }

    /// Stores one imported record under `options` (see [`Imported`]).
    pub fn import_record(&self, key: &str, record: &Record, options: ImportOptions) -> Result<Imported, StoreError> {
        if record.is_expired(options.now_ms) {
            return Ok(Imported::Expired);
        }
        loop {
            let current = self.get(key)?;
            match &current {
                Some(c) if c == record => return Ok(Imported::Unchanged),
                // A claim may be executing right now: replacing it could run its effect twice.
                Some(Record::InProgress(_)) if !options.force => return Ok(Imported::KeptInProgress),
                Some(c) if !options.overwrite && c.changed_at_ms() >= record.changed_at_ms() => {
                    return Ok(Imported::KeptNewer);
                }
                _ => {}
            }
            if self.compare_and_swap(key, current.as_ref(), Some(record))?.is_ok() {
                return Ok(Imported::Written);
            }
        }
    }

    /// Sets one watermark to `offset` if that raises it. Returns whether it did.
    fn import_watermark(&self, topic: &str, partition: i32, offset: i64) -> Result<bool, StoreError> {
        let raise = self.watermark(topic, partition)?.is_none_or(|c| c < offset);
        if raise {
            self.raise_watermarks(&[(topic.to_string(), partition, offset)])?;
        }
        Ok(raise)
    }

    /// Imports an export stream line by line, flushing at the end. A bad line stops the
    /// import with its line number; lines before it stay applied (validate a file first
    /// with [`validate`] to get all or nothing).
    pub fn import_from(
        &self,
        reader: impl BufRead,
        options: ImportOptions,
        progress: impl FnMut(u64),
    ) -> Result<ImportReport, TransferError> {
        let mut report = ImportReport::default();
        let result = each_entry(reader, progress, |entry| {
            match entry {
                Entry::Watermark { topic, partition, offset } => {
                    if self.import_watermark(&topic, partition, offset)? {
                        report.watermarks_raised += 1;
                    }
                }
                Entry::Record { key, record } => match self.import_record(&key, &record, options)? {
                    Imported::Written => report.imported += 1,
                    Imported::Unchanged => report.unchanged += 1,
                    Imported::KeptNewer => report.kept_newer += 1,
                    Imported::KeptInProgress => report.kept_in_progress += 1,
                    Imported::Expired => report.expired += 1,
                },
                Entry::Header { .. } | Entry::End { .. } => {}
            }
            Ok(())
        });
        // What was applied is made durable whether or not the stream was good to the end.
        self.flush_always()?;
        result.map(|_| report)
    }
}

#[cfg(test)]
mod tests;

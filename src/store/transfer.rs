//! Export and import of a whole store as JSON Lines, format version 1 (`dedupd export` /
//! `dedupd import`, `GET /v1/export` / `POST /v1/import`; docs/admin.md).
//!
//! One JSON object per line, each with `"v": 1` and a `"type"`:
//! - `header` first: when, from which backend, about how many records follow;
//! - `watermark` lines: the per-partition watermarks (SPEC §3), written *before* the
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

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{KeyStore, StoreError, Tree};
use crate::fingerprint::Fingerprint;
use crate::store::record::{Completed, Completion, InProgress, Indeterminate, Record, SourcePos};

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
}

/// The first line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    exported_at_ms: i64,
    backend: String,
    records_estimate: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatermarkLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    topic: String,
    partition: i32,
    offset: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    records: u64,
    watermarks: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InProgressLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    state: String,
    fingerprint: String,
    claimed_at_ms: i64,
    attempts: u32,
    source: SourcePos,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletedLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    state: String,
    fingerprint: String,
    outcome: Completion,
    /// The stored result verbatim when it is one-line JSON (`null` when absent) ...
    result: Option<Box<RawValue>>,
    /// ... else its text, so that the bytes come back exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result_text: Option<String>,
    error: Option<String>,
    first_seen_at_ms: i64,
    completed_at_ms: i64,
    expires_at_ms: i64,
    attempts: u32,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndeterminateLine {
    v: u32,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    state: String,
    fingerprint: String,
    claimed_at_ms: i64,
    attempts: u32,
    why: String,
}

/// Just enough of a line to pick its full shape.
#[derive(Deserialize)]
struct Probe {
    v: Option<u32>,
    #[serde(rename = "type")]
    kind: Option<String>,
    state: Option<String>,
}

/// One parsed export line.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// The first line.
    Header { exported_at_ms: i64, records_estimate: i64 },
    /// A partition watermark.
    Watermark { topic: String, partition: i32, offset: i64 },
    /// A record.
    Record { key: String, record: Record },
    /// The last line.
    End { records: u64, watermarks: u64 },
}

fn s(kind: &str) -> String {
    kind.to_string()
}

/// The header line (no newline).
pub fn header_line(exported_at_ms: i64, backend: &str, records_estimate: i64) -> String {
    let h =
        HeaderLine { v: FORMAT_VERSION, kind: s("header"), exported_at_ms, backend: backend.into(), records_estimate };
    serde_json::to_string(&h).unwrap_or_default()
}

/// A watermark line (no newline).
pub fn watermark_line(topic: &str, partition: i32, offset: i64) -> String {
    let w = WatermarkLine { v: FORMAT_VERSION, kind: s("watermark"), topic: topic.into(), partition, offset };
    serde_json::to_string(&w).unwrap_or_default()
}

/// The end line (no newline).
pub fn end_line(records: u64, watermarks: u64) -> String {
    serde_json::to_string(&EndLine { v: FORMAT_VERSION, kind: s("end"), records, watermarks }).unwrap_or_default()
}

/// A record line (no newline).
pub fn record_line(key: &str, record: &Record) -> String {
    let (v, kind, key) = (FORMAT_VERSION, s("record"), key.to_string());
    let out = match record {
        Record::InProgress(r) => serde_json::to_string(&InProgressLine {
            v,
            kind,
            key,
            state: s("in_progress"),
            fingerprint: r.fingerprint.to_string(),
            claimed_at_ms: r.claimed_at_ms,
            attempts: r.attempts,
            source: r.source.clone(),
        }),
        Record::Completed(r) => {
            let text = String::from_utf8(r.result.clone());
            let raw = match &text {
                Ok(t) if !t.contains(['\n', '\r']) => RawValue::from_string(t.clone()).ok(),
                _ => None,
            };
            let result_text = match (&raw, text) {
                (Some(_), _) => None,
                (None, Ok(t)) => Some(t),
                // Not UTF-8: cannot come from a sink (results are JSON); keep what survives.
                (None, Err(e)) => Some(String::from_utf8_lossy(e.as_bytes()).into_owned()),
            };
            serde_json::to_string(&CompletedLine {
                v,
                kind,
                key,
                state: s("completed"),
                fingerprint: r.fingerprint.to_string(),
                outcome: r.outcome,
                result: raw,
                result_text,
                error: r.error.clone(),
                first_seen_at_ms: r.first_seen_at_ms,
                completed_at_ms: r.completed_at_ms,
                expires_at_ms: r.expires_at_ms,
                attempts: r.attempts,
            })
        }
        Record::Indeterminate(r) => serde_json::to_string(&IndeterminateLine {
            v,
            kind,
            key,
            state: s("indeterminate"),
            fingerprint: r.fingerprint.to_string(),
            claimed_at_ms: r.claimed_at_ms,
            attempts: r.attempts,
            why: r.why.clone(),
        }),
    };
    out.unwrap_or_default()
}

/// Parses one line (without its newline).
pub fn parse_line(line: &str) -> Result<Entry, String> {
    let probe: Probe = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    match probe.v {
        Some(FORMAT_VERSION) => {}
        Some(other) => {
            return Err(format!("format version {other} is not supported (this dedupd reads {FORMAT_VERSION})"));
        }
        None => return Err("no \"v\" (format version)".into()),
    }
    let fp = |f: &str| f.parse::<Fingerprint>();
    let err = |e: serde_json::Error| e.to_string();
    match (probe.kind.as_deref(), probe.state.as_deref()) {
        (Some("header"), _) => {
            let h: HeaderLine = serde_json::from_str(line).map_err(err)?;
            Ok(Entry::Header { exported_at_ms: h.exported_at_ms, records_estimate: h.records_estimate })
        }
        (Some("watermark"), _) => {
            let w: WatermarkLine = serde_json::from_str(line).map_err(err)?;
            if w.topic.is_empty() || w.partition < 0 || w.offset < 0 {
                return Err("watermark needs a topic, a partition >= 0 and an offset >= 0".into());
            }
            Ok(Entry::Watermark { topic: w.topic, partition: w.partition, offset: w.offset })
        }
        (Some("end"), _) => {
            let e: EndLine = serde_json::from_str(line).map_err(err)?;
            Ok(Entry::End { records: e.records, watermarks: e.watermarks })
        }
        (Some("record"), Some("in_progress")) => {
            let r: InProgressLine = serde_json::from_str(line).map_err(err)?;
            let record = Record::InProgress(InProgress {
                fingerprint: fp(&r.fingerprint)?,
                claimed_at_ms: r.claimed_at_ms,
                attempts: r.attempts,
                source: r.source,
            });
            Ok(Entry::Record { key: checked_key(r.key)?, record })
        }
        (Some("record"), Some("completed")) => {
            let r: CompletedLine = serde_json::from_str(line).map_err(err)?;
            let result = match (r.result_text, r.result) {
                (Some(t), None) => t.into_bytes(),
                (None, Some(raw)) => raw.get().as_bytes().to_vec(),
                (None, None) => b"null".to_vec(),
                (Some(_), Some(_)) => return Err("has both result and result_text".into()),
            };
            let record = Record::Completed(Completed {
                fingerprint: fp(&r.fingerprint)?,
                outcome: r.outcome,
                result,
                error: r.error,
                first_seen_at_ms: r.first_seen_at_ms,
                completed_at_ms: r.completed_at_ms,
                expires_at_ms: r.expires_at_ms,
                attempts: r.attempts,
            });
            Ok(Entry::Record { key: checked_key(r.key)?, record })
        }
        (Some("record"), Some("indeterminate")) => {
            let r: IndeterminateLine = serde_json::from_str(line).map_err(err)?;
            let record = Record::Indeterminate(Indeterminate {
                fingerprint: fp(&r.fingerprint)?,
                claimed_at_ms: r.claimed_at_ms,
                attempts: r.attempts,
                why: r.why,
            });
            Ok(Entry::Record { key: checked_key(r.key)?, record })
        }
        (Some("record"), other) => Err(format!("unknown record state {other:?}")),
        (other, _) => Err(format!("unknown line type {other:?}")),
    }
}

fn checked_key(key: String) -> Result<String, String> {
    if key.is_empty() { Err("empty key".into()) } else { Ok(key) }
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
    /// Expired already; skipped.
    Expired,
}

/// The time a record last changed: completion, else claim.
fn changed_at_ms(r: &Record) -> i64 {
    match r {
        Record::Completed(c) => c.completed_at_ms,
        Record::InProgress(p) => p.claimed_at_ms,
        Record::Indeterminate(i) => i.claimed_at_ms,
    }
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

/// Reads every line, checks it and its place, and hands the entry to `apply`.
fn each_entry(
    reader: impl BufRead,
    mut progress: impl FnMut(u64),
    mut apply: impl FnMut(Entry) -> Result<(), TransferError>,
) -> Result<ExportCounts, TransferError> {
    let mut shape = Shape::default();
    let mut line_no = 0u64;
    for line in reader.lines() {
        let line = line?;
        line_no += 1;
        progress(line.len() as u64 + 1);
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| TransferError::Line { line: line_no, reason };
        let entry = parse_line(&line).map_err(bad)?;
        shape.check(line_no, &entry).map_err(bad)?;
        apply(entry)?;
    }
    if !shape.ended {
        return Err(TransferError::Line { line: line_no, reason: "no end line: the export is incomplete".into() });
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
                Some(c) if !options.overwrite && changed_at_ms(c) >= changed_at_ms(record) => {
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
mod tests {
    use super::super::{Op, watermark_key};
    use super::*;
    use crate::config::{StoreBackend, SyncMode};

    fn fp(b: u8) -> Fingerprint {
        Fingerprint([b; 32])
    }

    #[test]
    fn watermark_keys_sort_inside_the_scan_bounds() {
        let k = watermark_key("orders.v1", 12);
        assert!(k.as_slice() >= b"wm/".as_slice() && k.as_slice() < b"wm0".as_slice());
        let _ = Op::Delete(Tree::Meta, k);
    }

    #[test]
    fn export_then_import_restores_records_and_watermarks_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let a = KeyStore::open(StoreBackend::Sled, &dir.path().join("a"), SyncMode::Batch).unwrap();
        let now = 1_000_000;
        let records = [
            (
                "done",
                Record::Completed(Completed {
                    fingerprint: fp(1),
                    outcome: Completion::Succeeded,
                    result: br#"{"b":1, "a":[1.50,2]}"#.to_vec(),
                    error: None,
                    first_seen_at_ms: 10,
                    completed_at_ms: 20,
                    expires_at_ms: now + 5_000,
                    attempts: 2,
                }),
            ),
            (
                "multi-line",
                Record::Completed(Completed {
                    fingerprint: fp(2),
                    outcome: Completion::Failed,
                    result: b"{\n  \"status\": 400\n}".to_vec(),
                    error: Some("HTTP 400".into()),
                    first_seen_at_ms: 10,
                    completed_at_ms: 20,
                    expires_at_ms: now + 5_000,
                    attempts: 1,
                }),
            ),
            (
                "gone",
                Record::Completed(Completed {
                    fingerprint: fp(3),
                    outcome: Completion::Succeeded,
                    result: b"{}".to_vec(),
                    error: None,
                    first_seen_at_ms: 1,
                    completed_at_ms: 2,
                    expires_at_ms: now - 1,
                    attempts: 1,
                }),
            ),
            (
                "unknown",
                Record::Indeterminate(Indeterminate {
                    fingerprint: fp(4),
                    claimed_at_ms: 7,
                    attempts: 1,
                    why: "crash".into(),
                }),
            ),
            (
                "running",
                Record::InProgress(InProgress {
                    fingerprint: fp(5),
                    claimed_at_ms: 8,
                    attempts: 1,
                    source: SourcePos { topic: "t".into(), partition: 2, offset: 9 },
                }),
            ),
        ];
        for (k, r) in &records {
            a.compare_and_swap(k, None, Some(r)).unwrap().unwrap();
        }
        a.raise_watermarks(&[("t".into(), 2, 41), ("u.v".into(), 0, 7)]).unwrap();
        let mut buf = Vec::new();
        let counts = a.export_to(now, &mut buf).unwrap();
        assert_eq!(counts, ExportCounts { records: 5, watermarks: 2 });
        assert_eq!(validate(buf.as_slice(), |_| {}).unwrap(), counts);

        let b = KeyStore::open(StoreBackend::Fjall, &dir.path().join("b"), SyncMode::Batch).unwrap();
        let report = b.import_from(buf.as_slice(), ImportOptions { overwrite: false, now_ms: now }, |_| {}).unwrap();
        assert_eq!(report, ImportReport { imported: 4, unchanged: 0, kept_newer: 0, expired: 1, watermarks_raised: 2 });
        for (k, r) in &records {
            let got = b.get(k).unwrap();
            if *k == "gone" { assert_eq!(got, None) } else { assert_eq!(got.as_ref(), Some(r), "{k}") }
        }
        assert_eq!(b.watermark("t", 2).unwrap(), Some(41));
        assert_eq!(b.watermark("u.v", 0).unwrap(), Some(7));
        assert_eq!(b.counts().completed, 2);

        // Again: nothing changes. A newer stored record is kept unless overwriting.
        let newer = Record::Indeterminate(Indeterminate {
            fingerprint: fp(4),
            claimed_at_ms: 99,
            attempts: 1,
            why: "x".into(),
        });
        let old = b.get("unknown").unwrap();
        b.compare_and_swap("unknown", old.as_ref(), Some(&newer)).unwrap().unwrap();
        let again = b.import_from(buf.as_slice(), ImportOptions { overwrite: false, now_ms: now }, |_| {}).unwrap();
        assert_eq!(again, ImportReport { imported: 0, unchanged: 3, kept_newer: 1, expired: 1, watermarks_raised: 0 });
        assert_eq!(b.get("unknown").unwrap(), Some(newer));
        let forced = b.import_from(buf.as_slice(), ImportOptions { overwrite: true, now_ms: now }, |_| {}).unwrap();
        assert_eq!(forced.imported, 1);
        assert_eq!(b.get("unknown").unwrap().as_ref(), Some(&records[3].1));
    }

    #[test]
    fn bad_lines_are_named_by_number() {
        let good = format!("{}\n{}\n", header_line(1, "sled", 0), end_line(0, 0));
        assert_eq!(validate(good.as_bytes(), |_| {}).unwrap(), ExportCounts::default());
        let cases = [
            (
                format!("{}\n{{\"v\":1,\"type\":\"record\",\"state\":\"completed\"}}\n", header_line(1, "s", 0)),
                2,
                "missing field",
            ),
            (format!("{}\n{{\"v\":2,\"type\":\"end\"}}\n", header_line(1, "s", 0)), 2, "version 2"),
            (format!("{}\n", end_line(0, 0)), 1, "header"),
            (format!("{}\n{}\n", header_line(1, "s", 0), watermark_line("t", 0, 1)), 2, "incomplete"),
            (format!("{}\n{}\n", header_line(1, "s", 0), end_line(3, 0)), 2, "end line counts"),
            ("not json\n".to_string(), 1, "not a JSON object"),
        ];
        for (text, line, needle) in cases {
            match validate(text.as_bytes(), |_| {}) {
                Err(TransferError::Line { line: l, reason }) => {
                    assert_eq!(l, line, "{text}: {reason}");
                    assert!(reason.contains(needle), "{text}: {reason}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}

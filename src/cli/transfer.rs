//! `export FILE` and `import FILE` (JSON Lines, format in docs/admin.md), on a stopped
//! store or through the admin API. A progress bar goes to stderr when it is a terminal;
//! otherwise they stay quiet and print only their summary.
//!
//! An export is written to `FILE.part` and renamed once complete, so a cut-off stream never
//! leaves a FILE that looks whole. An import checks the whole file first (every line, the
//! header, the end line's counts), so a bad file changes nothing.

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Write};

use std::path::Path;
use tempfile::NamedTempFile;

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::Method;

use super::CliError;
use super::direct::Direct;
use super::remote::{Remote, check};
use crate::store::transfer::{Entry, ExportCounts, ImportOptions, ImportReport, parse_line, validate};

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
    move |source| CliError::File { path: path.display().to_string(), source }
}

/// A bar on a terminal, a hidden one otherwise. `bytes` picks the units.
fn progress(len: u64, what: &str, bytes: bool) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let template = if bytes {
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})"
    } else {
        "{msg} [{bar:40}] {pos}/{len} lines ({eta})"
    };
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A hidden temporary file beside `file` that becomes `file` once it is whole. Dropped on
/// an error, it deletes itself: a failed export never leaves a partial file behind.
fn part_file(file: &Path) -> Result<NamedTempFile, CliError> {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".part")
        .tempfile_in(dir)
        .map_err(file_error(&dir.join(format!(".{name}.*.part"))))
}

/// Counts the lines going through, for the bar.
struct LineCounter<W: Write> {
    inner: W,
    bar: ProgressBar,
}

impl<W: Write> Write for LineCounter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(data)?;
        self.bar.inc(data[..n].iter().filter(|b| **b == b'\n').count() as u64);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Makes the part file durable and renames it to `file`.
fn finish_file(out: BufWriter<NamedTempFile>, file: &Path) -> Result<(), CliError> {
    let part = out.into_inner().map_err(|e| file_error(file)(e.into_error()))?;
    part.as_file().sync_all().map_err(file_error(part.path()))?;
    part.persist(file).map_err(|e| file_error(file)(e.error))?;
    Ok(())
}

/// Exports a stopped store to `file`.
pub fn export_direct(d: &Direct, file: &Path) -> Result<ExportCounts, CliError> {
    let out = BufWriter::new(part_file(file)?);
    let c = d.store.counts();
    let lines = (c.in_progress + c.completed + c.indeterminate) as u64 + d.store.watermarks()?.len() as u64 + 2;
    let mut counter = LineCounter { inner: out, bar: progress(lines, "export", false) };
    let result = d.store.export_to(chrono::Utc::now().timestamp_millis(), &mut counter);
    counter.bar.finish_and_clear();
    let counts = result?;
    finish_file(counter.inner, file)?;
    Ok(counts)
}

/// Exports a running instance's store to `file` through `GET /v1/export`. On any error the
/// part file is dropped, which deletes it.
pub async fn export_remote(r: &Remote, file: &Path) -> Result<ExportCounts, CliError> {
    let response =
        r.request(Method::GET, r.url(&["export"])?).send().await.map_err(|e| CliError::Remote(e.to_string()))?;
    let response = check(response).await?;
    let mut out = BufWriter::new(part_file(file)?);
    let part = out.get_ref().path().to_path_buf();
    let bar = progress(0, "export", false);
    let mut first_line: Option<Vec<u8>> = Some(Vec::new());
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| CliError::Remote(format!("export stream cut: {e}")))?;
        out.write_all(&chunk).map_err(file_error(&part))?;
        // The header line tells how many records to expect: the bar's length.
        if let Some(first) = first_line.as_mut() {
            first.extend_from_slice(&chunk);
            if let Some(nl) = first.iter().position(|b| *b == b'\n') {
                if let Ok(Entry::Header { records_estimate, .. }) = parse_line(&String::from_utf8_lossy(&first[..nl])) {
                    bar.set_length(records_estimate.max(0) as u64 + 2);
                }
                first_line = None;
            }
        }
        bar.inc(chunk.iter().filter(|b| **b == b'\n').count() as u64);
    }
    bar.finish_and_clear();
    out.flush().map_err(file_error(&part))?;
    // A stream cut by a failing server ends without its end line: refuse it.
    let counts = validate(BufReader::new(File::open(&part).map_err(file_error(&part))?), |_| {})?;
    finish_file(out, file)?;
    Ok(counts)
}

/// Checks the whole file, with a bar over its bytes.
fn validate_file(file: &Path) -> Result<ExportCounts, CliError> {
    let f = File::open(file).map_err(file_error(file))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress(len, "check", true);
    let counts = validate(BufReader::new(f), |n| bar.inc(n));
    bar.finish_and_clear();
    Ok(counts?)
}

/// Imports `file` into a stopped store.
pub fn import_direct(d: &Direct, file: &Path, overwrite: bool, force: bool) -> Result<ImportReport, CliError> {
    validate_file(file)?;
    let f = File::open(file).map_err(file_error(file))?;
    let bar = progress(f.metadata().map(|m| m.len()).unwrap_or(0), "import", true);
    let options = ImportOptions { overwrite, force, now_ms: chrono::Utc::now().timestamp_millis() };
    let report = d.store.import_from(BufReader::new(f), options, |n| bar.inc(n));
    bar.finish_and_clear();
    Ok(report?)
}

/// Imports `file` into a running instance's store through `POST /v1/import`.
pub async fn import_remote(r: &Remote, file: &Path, overwrite: bool, force: bool) -> Result<ImportReport, CliError> {
    validate_file(file)?;
    let f = tokio::fs::File::open(file).await.map_err(file_error(file))?;
    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
    let bar = progress(len, "import", true);
    let counted = bar.clone();
    let body = tokio_util::io::ReaderStream::new(f).inspect(move |chunk| {
        if let Ok(c) = chunk {
            counted.inc(c.len() as u64);
        }
    });
    let mut url = r.url(&["import"])?;
    url.query_pairs_mut()
        .append_pair("overwrite", if overwrite { "true" } else { "false" })
        .append_pair("force", if force { "true" } else { "false" });
    let response = r
        .request(Method::POST, url)
        .header(reqwest::header::CONTENT_TYPE, "application/jsonl")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .map_err(|e| CliError::Remote(e.to_string()));
    bar.finish_and_clear();
    let response = check(response?).await?;
    response.json::<ImportReport>().await.map_err(|e| CliError::Remote(e.to_string()))
}

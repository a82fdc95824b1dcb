//! docs/metrics.md and docs/contract.md §10 say what the library's metric catalogue
//! (src/ops/metrics/catalogue.rs) says: every catalogued metric appears in both, with its
//! labels (contract §10 spells them `name{label,label}`, docs/metrics.md in its labels
//! column) and, in docs/metrics.md's tables, its type; and neither doc names a `dedupd_`
//! metric the catalogue lacks. The process collector's `process_*` metrics are not
//! dedupd's and are not checked. No broker needed.

use std::path::Path;

use dedupd::ops::metrics::catalogue::{CATALOGUE, MetricDef, PREFIX};

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A doc's word on one metric: its name without the prefix, its labels as written, and
/// its type where the doc gives one.
#[derive(Debug)]
struct Mention {
    name: String,
    labels: Vec<String>,
    kind: Option<String>,
}

/// The text between backticks in `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// One of the process collector's `process_*` (but dedupd's own `process_duration_seconds`).
fn is_process_collectors(name: &str) -> bool {
    name.starts_with("process_") && catalogued(name).is_none()
}

fn unprefixed(name: &str) -> &str {
    name.strip_prefix(PREFIX).and_then(|n| n.strip_prefix('_')).unwrap_or(name)
}

/// The metrics of docs/metrics.md's tables: `| `name`[, `name`] | type | labels | ...`.
fn table_mentions(text: &str) -> Vec<Mention> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (names, kind, labels) = (cells[1], cells[2], cells[3]);
        for name in code_spans(names).into_iter().filter(|n| !is_process_collectors(n)) {
            out.push(Mention {
                name: unprefixed(name).to_string(),
                labels: code_spans(labels).into_iter().map(str::to_string).collect(),
                kind: Some(kind.to_string()),
            });
        }
    }
    out
}

/// docs/contract.md's §10, up to the next section.
fn contract_section_10(text: &str) -> &str {
    let start = text.find("\n## 10. ").expect("docs/contract.md has a section 10");
    let rest = &text[start + 1..];
    &rest[..rest[1..].find("\n## ").map_or(rest.len(), |end| end + 1)]
}

/// The metrics §10 names: each code span shaped `name` or `name{label,label}` (not
/// `store.changelog`, `process_*` or the bare prefix `dedupd_`).
fn contract_mentions(section: &str) -> Vec<Mention> {
    let metric_like = |s: &&str| {
        s.starts_with(|c: char| c.is_ascii_lowercase())
            && !s.ends_with('_')
            && !is_process_collectors(s)
            && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_{},".contains(c))
    };
    code_spans(section)
        .into_iter()
        .filter(metric_like)
        .map(|span| {
            let (name, labels) = match span.split_once('{') {
                Some((name, labels)) => {
                    (name, labels.trim_end_matches('}').split(',').map(|l| l.trim().to_string()).collect())
                }
                None => (span, Vec::new()),
            };
            Mention { name: unprefixed(name).to_string(), labels, kind: None }
        })
        .collect()
}

/// Every `dedupd_<name>` written anywhere in `text` (PromQL and prose included), as
/// `<name>` with a histogram's `_bucket`, `_sum` or `_count` kept.
fn prefixed_names(text: &str) -> Vec<String> {
    let prefix = format!("{PREFIX}_");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(&prefix) {
        rest = &rest[at + prefix.len()..];
        let end =
            rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(rest.len());
        if end > 0 {
            out.push(rest[..end].to_string());
        }
    }
    out
}

fn catalogued(name: &str) -> Option<&'static MetricDef> {
    CATALOGUE.iter().copied().find(|d| d.name == name)
}

/// Whether `name` is a catalogued metric or one of a histogram's series.
fn is_catalogued_series(name: &str) -> bool {
    catalogued(name).is_some()
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix).and_then(catalogued).is_some_and(|d| d.kind.as_str() == "histogram")
        })
}

/// What `doc` gets wrong against the catalogue, one line per fault, each naming its metric.
fn faults(doc: &str, mentions: &[Mention], prefixed: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for m in mentions {
        let Some(def) = catalogued(&m.name) else {
            out.push(format!("{doc}: names {PREFIX}_{}, which the catalogue lacks", m.name));
            continue;
        };
        if m.labels != def.labels {
            out.push(format!("{doc}: {PREFIX}_{} has labels {:?}, the catalogue {:?}", m.name, m.labels, def.labels));
        }
        if let Some(kind) = m.kind.as_deref().filter(|k| *k != def.kind.as_str()) {
            out.push(format!("{doc}: {PREFIX}_{} is a {kind}, the catalogue's a {}", m.name, def.kind.as_str()));
        }
    }
    for def in CATALOGUE {
        match mentions.iter().filter(|m| m.name == def.name).count() {
            0 => out.push(format!("{doc}: {} is missing (catalogued: {:?})", def.exposed_name(), def.labels)),
            1 => {}
            n => out.push(format!("{doc}: {} is named {n} times", def.exposed_name())),
        }
    }
    for name in prefixed.iter().filter(|n| !is_catalogued_series(n)) {
        out.push(format!("{doc}: names {PREFIX}_{name}, which the catalogue lacks"));
    }
    out
}

fn metrics_md_faults(text: &str) -> Vec<String> {
    faults("docs/metrics.md", &table_mentions(text), &prefixed_names(text))
}

fn contract_faults(text: &str) -> Vec<String> {
    faults("docs/contract.md §10", &contract_mentions(contract_section_10(text)), &prefixed_names(text))
}

#[test]
fn metrics_md_matches_the_catalogue() {
    let faults = metrics_md_faults(&read("docs/metrics.md"));
    assert!(faults.is_empty(), "\n{}", faults.join("\n"));
}

#[test]
fn contract_section_10_matches_the_catalogue() {
    let faults = contract_faults(&read("docs/contract.md"));
    assert!(faults.is_empty(), "\n{}", faults.join("\n"));
}

/// `text` with `from` replaced once by `to` (which must be there).
fn edited(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in the doc");
    text.replacen(from, to, 1)
}

fn assert_one_fault(faults: Vec<String>, naming: &str) {
    assert!(faults.len() == 1 && faults[0].contains(naming), "expected one fault naming {naming}: {faults:?}");
}

#[test]
fn the_checker_finds_what_is_wrong_in_metrics_md() {
    let doc = read("docs/metrics.md");
    let dropped_label = edited(
        &doc,
        "| `commands_total` | counter | `outcome`, `route` |",
        "| `commands_total` | counter | `outcome` |",
    );
    assert_one_fault(metrics_md_faults(&dropped_label), "dedupd_commands_total has labels");
    let wrong_type = edited(&doc, "| `in_flight` | gauge |", "| `in_flight` | counter |");
    assert_one_fault(metrics_md_faults(&wrong_type), "dedupd_in_flight is a counter");
    let row = doc.lines().find(|l| l.starts_with("| `rebalances_total` |")).expect("the row").to_string();
    assert_one_fault(metrics_md_faults(&edited(&doc, &format!("{row}\n"), "")), "dedupd_rebalances_total is missing");
    let unknown = edited(&doc, "| `in_flight` |", "| `in_flight_peak` | gauge | – | x | x |\n| `in_flight` |");
    assert_one_fault(metrics_md_faults(&unknown), "dedupd_in_flight_peak, which the catalogue lacks");
    let in_prose = format!("{doc}\nAlert on `rate(dedupd_retries_total[5m])`.\n");
    assert_one_fault(metrics_md_faults(&in_prose), "dedupd_retries_total, which the catalogue lacks");
}

#[test]
fn the_checker_finds_what_is_wrong_in_contract_section_10() {
    let doc = read("docs/contract.md");
    let dropped_label = edited(&doc, "`consumer_lag{topic,partition}`", "`consumer_lag{topic}`");
    assert_one_fault(contract_faults(&dropped_label), "dedupd_consumer_lag has labels");
    let no_labels = edited(&doc, "`store_records{state}`", "`store_records`");
    assert_one_fault(contract_faults(&no_labels), "dedupd_store_records has labels");
    let missing = edited(&doc, "`rebalances_total`, ", "");
    assert_one_fault(contract_faults(&missing), "dedupd_rebalances_total is missing");
    let unknown = edited(&doc, "`in_flight`,", "`in_flight`, `in_flight_peak`,");
    assert_one_fault(contract_faults(&unknown), "dedupd_in_flight_peak, which the catalogue lacks");
    // A metric named in another section only does not count for §10.
    let elsewhere = edited(&doc, "`rebalances_total`, ", "");
    let heading = "\n## 11. Logs and traces\n";
    let elsewhere = edited(&elsewhere, heading, &format!("{heading}\n`rebalances_total`\n"));
    assert_one_fault(contract_faults(&elsewhere), "dedupd_rebalances_total is missing");
}

//! What dedupd reports, checked against the ground truth: the `/metrics` exposition (the
//! catalogue, every value, the histograms' buckets), `/v1/status` and `dedupd status`, and
//! the store opened once dedupd has stopped.

use std::collections::BTreeMap;
use std::path::Path;

use super::truth::Truth;
use super::{ADMIN_TOKEN, DISTINCT, PARTITIONS, catalogue};
use crate::common::exposition::Exposition;

pub(super) use crate::common::exposition::scrape;

/// Every metric of the catalogue has HELP, TYPE and samples (but those in `absent`, which
/// may have no series yet), and nothing outside the catalogue is exposed.
pub(super) fn check_catalogue(e: &Exposition, absent: &[&str]) {
    let catalogue = catalogue();
    for (name, kind) in catalogue.iter().filter(|(n, _)| !absent.contains(&n.as_str())) {
        assert!(e.help.get(name).is_some_and(|h| !h.is_empty()), "no # HELP for {name}");
        assert_eq!(e.types.get(name).map(String::as_str), Some(*kind), "# TYPE of {name}");
        let has_samples = e.samples.iter().any(|s| {
            s.name == *name
                || s.name.strip_prefix(name.as_str()).is_some_and(|r| ["_bucket", "_sum", "_count"].contains(&r))
        });
        assert!(has_samples, "no samples of {name}");
    }
    let mut declared: Vec<&str> = e.types.keys().map(String::as_str).collect();
    declared.sort();
    let mut expected: Vec<&str> =
        catalogue.iter().map(|(n, _)| n.as_str()).filter(|n| !absent.contains(n) || declared.contains(n)).collect();
    expected.sort();
    assert_eq!(declared, expected, "metric families exposed");
}

pub(super) fn check_scrape(e: &Exposition, truth: &Truth, input: &str) {
    let dump =
        || e.samples.iter().map(|s| format!("{} {:?} {}", s.name, s.labels, s.value)).collect::<Vec<_>>().join("\n");
    check_catalogue(e, &[]);

    assert_eq!(
        e.nonzero_by("dedupd_commands_total", &["outcome", "route"]),
        truth.commands,
        "commands_total\n{}",
        dump()
    );
    assert_eq!(e.nonzero_by("dedupd_dead_letter_total", &["reason"]), truth.dead_letters, "dead_letter_total");
    assert_eq!(
        e.nonzero_by("dedupd_sink_requests_total", &["sink", "status"]),
        truth.sink_requests,
        "sink_requests_total"
    );
    // The receiver answers every request it takes, so every call was answered.
    assert_eq!(
        e.nonzero_by("dedupd_sink_calls_total", &["sink", "answer"]),
        BTreeMap::from([(vec!["receiver".to_string(), "answered".to_string()], truth.sink_calls)]),
        "sink_calls_total"
    );
    assert_eq!(
        e.value("dedupd_sink_duration_seconds_count", &[("sink", "receiver")]),
        Some(truth.sink_calls),
        "sink_duration_seconds_count"
    );
    assert!(
        e.value("dedupd_process_duration_seconds_count", &[]).is_some_and(|n| n > 0.0),
        "process_duration_seconds_count"
    );
    assert_eq!(
        e.nonzero_by("dedupd_duplicate_age_seconds_count", &["route"]),
        truth.duplicates,
        "duplicate_age_seconds_count"
    );
    let records = |state: &str| e.value("dedupd_store_records", &[("state", state)]);
    assert_eq!(
        records("completed"),
        Some(truth.main_completed),
        "store_records{{completed}} once the brief keys expired"
    );
    assert_eq!(records("in_progress"), Some(0.0), "store_records{{in_progress}}");
    assert_eq!(records("indeterminate"), Some(0.0), "store_records{{indeterminate}}");
    assert!(e.value("dedupd_store_disk_bytes", &[]).is_some_and(|b| b > 0.0), "store_disk_bytes");
    // The build, the store's volume and the process, beside the pipeline.
    assert_eq!(e.value("dedupd_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), Some(1.0), "build_info");
    let size = e.value("dedupd_store_volume_size_bytes", &[]).unwrap_or(0.0);
    let free = e.value("dedupd_store_volume_free_bytes", &[]).unwrap_or(0.0);
    let disk = e.value("dedupd_store_disk_bytes", &[]).unwrap_or(0.0);
    assert!(size > 0.0 && free > 0.0 && free + disk <= size, "store volume: size {size}, free {free}, store {disk}");
    assert!(e.value("process_resident_memory_bytes", &[]).is_some_and(|b| b > 1e6), "process_resident_memory_bytes");
    assert!(e.value("process_open_fds", &[]).is_some_and(|n| n > 3.0), "process_open_fds");
    assert_eq!(
        e.value("dedupd_compaction_removed_total", &[]),
        Some(truth.brief_completed),
        "compaction_removed_total"
    );
    for p in 0..PARTITIONS {
        let lag = e.value("dedupd_consumer_lag", &[("topic", input), ("partition", &p.to_string())]);
        assert_eq!(lag, Some(0.0), "consumer_lag of {input}/{p}\n{}", dump());
    }
    assert_eq!(e.series("dedupd_consumer_lag").len(), PARTITIONS as usize, "consumer_lag series");
    assert_eq!(e.value("dedupd_in_flight", &[]), Some(0.0), "in_flight at rest");
    assert!(e.value("dedupd_rebalances_total", &[]).is_some_and(|n| n >= 1.0), "rebalances_total");
    // No broker outage here: the consumer was never fenced, so never replaced.
    assert_eq!(e.value("dedupd_consumer_restarts_total", &[]), Some(0.0), "consumer_restarts_total");
    assert_eq!(e.value("dedupd_refused_partitions", &[]), Some(0.0), "refused_partitions");
    assert_eq!(e.value("dedupd_assigned_partitions", &[]), Some(f64::from(PARTITIONS)), "assigned_partitions");
    // One 503 among answers is no outage: the receiver's circuit never stayed open.
    assert_eq!(e.value("dedupd_sink_circuit_open", &[("sink", "receiver")]), Some(0.0), "sink_circuit_open");

    // Buckets: cumulative, +Inf = count, and spanning what they measure.
    for (name, labels, lowest, highest) in [
        ("dedupd_sink_duration_seconds", vec![("sink", "receiver")], 0.005, 10.0),
        ("dedupd_process_duration_seconds", vec![], 0.005, 60.0),
        ("dedupd_duplicate_age_seconds", vec![("route", "main")], 1.0, 7.0 * 86_400.0),
    ] {
        let mut buckets: Vec<(f64, f64)> = e
            .series(&format!("{name}_bucket"))
            .into_iter()
            .filter(|(l, _)| labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(l, v)| (l["le"].parse::<f64>().unwrap_or(f64::INFINITY), v))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{name} buckets are cumulative: {buckets:?}");
        let count = e.value(&format!("{name}_count"), &labels);
        assert_eq!(
            buckets.last().map(|b| (b.0, Some(b.1))),
            Some((f64::INFINITY, count)),
            "{name}: +Inf bucket = count"
        );
        let finite: Vec<f64> = buckets.iter().map(|b| b.0).filter(|b| b.is_finite()).collect();
        assert!(finite.first().is_some_and(|b| *b <= lowest), "{name}: lowest bucket {finite:?} above {lowest}");
        assert!(finite.last().is_some_and(|b| *b >= highest), "{name}: highest bucket {finite:?} below {highest}");
    }
}

/// `/v1/status` of the settled instance, and `dedupd status --admin` printing it: every
/// input partition running at lag 0, nothing in flight, the sink's circuit closed, the
/// store's completed records as the topics say.
pub(super) async fn check_status(client: &reqwest::Client, http: &str, input: &str, truth: &Truth) {
    let answer = client.get(format!("http://{http}/v1/status")).bearer_auth(ADMIN_TOKEN).send().await.expect("status");
    assert_eq!(answer.status(), 200, "GET /v1/status");
    let status: dedupd::ops::Status = answer.json().await.expect("status JSON");
    assert!(status.ready && status.alive, "ready and alive: {status:?}");
    let partitions: Vec<(String, String, Option<i64>)> =
        status.partitions.iter().map(|p| (p.partition.clone(), p.state.clone(), p.lag)).collect();
    let expected: Vec<(String, String, Option<i64>)> =
        (0..PARTITIONS).map(|p| (format!("{input}/{p}"), "running".to_string(), Some(0))).collect();
    assert_eq!(partitions, expected, "partitions in /v1/status");
    assert_eq!(status.in_flight, 0);
    assert_eq!(status.circuits.get("receiver").map(String::as_str), Some("closed"));
    assert_eq!(status.store.records.get("completed").map(|n| *n as f64), Some(truth.main_completed));
    assert!(status.store.volume_size_bytes > 0 && status.store.disk_bytes > 0, "{:?}", status.store);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["status", "--admin", &format!("http://{http}")])
        .env("DEDUPD_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .expect("dedupd status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "dedupd status: {}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("  ready  alive  in flight 0"), "{table}");
    for p in 0..PARTITIONS {
        let line = table.lines().find(|l| l.starts_with(&format!("{input}/{p} "))).unwrap_or_default();
        assert!(line.contains("running") && line.trim_end().ends_with(" 0"), "partition {p} in\n{table}");
    }
    assert!(table.contains("receiver") && table.contains("closed"), "{table}");
}

/// The store, opened after dedupd stopped, holds what the last scrape said it held.
pub(super) fn check_store(path: &Path, e: &Exposition) {
    let store = dedupd::store::KeyStore::open(Default::default(), path, Default::default()).expect("open store");
    let records = store.scan_records(None, 100_000).expect("scan");
    let mut by_state: BTreeMap<&str, f64> = BTreeMap::new();
    let mut completed_keys = Vec::new();
    for (key, r) in &records {
        *by_state.entry(r.state().as_str()).or_insert(0.0) += 1.0;
        if r.state().as_str() == "completed" {
            completed_keys.push(key.clone());
        }
    }
    for state in ["in_progress", "completed", "indeterminate"] {
        let gauge = e.value("dedupd_store_records", &[("state", state)]);
        assert_eq!(gauge, Some(by_state.get(state).copied().unwrap_or(0.0)), "store_records{{{state}}} vs the store");
    }
    // Fresh keys' claims went through journal fsyncs, completions through store flushes
    // (the same refresh that set `store_records` set these).
    for file in ["journal", "store"] {
        let fsyncs = e.value("dedupd_store_fsyncs_total", &[("file", file)]).unwrap_or(0.0);
        assert!(fsyncs >= 1.0, "store_fsyncs_total{{{file}}} = {fsyncs}");
    }
    completed_keys.sort();
    let expected: Vec<String> = (0..DISTINCT).map(|i| format!("main-{i}")).collect();
    assert_eq!(completed_keys, expected, "completed keys left after compaction");
}

//! Metrics tests: the registry against the catalogue, and what each update renders.

use std::collections::BTreeSet;

use prometheus::proto::{MetricFamily, MetricType};

use super::catalogue::{CATALOGUE, Kind, MetricDef};
use super::*;

/// A `Metrics` whose every family has a series: a labelled family without one is not
/// gathered. A metric added to the catalogue with labels needs a line here.
fn every_family() -> Metrics {
    let m = Metrics::new().unwrap();
    m.init_known(&["mail"], &["smtp"]);
    m.lag("commands", 0, 1);
    m.set_sink_circuit_open("smtp", false);
    m.worker_panicked("commands", 0);
    m.set_restoring(0, false);
    m.intake_answered("http", "agent", 200, 0.01);
    m
}

/// What is wrong with `family` against `def` (empty: nothing).
fn mismatches(def: &MetricDef, family: &MetricFamily) -> Vec<String> {
    let name = def.exposed_name();
    let mut wrong = Vec::new();
    let kind = match family.type_() {
        MetricType::COUNTER => Some(Kind::Counter),
        MetricType::GAUGE => Some(Kind::Gauge),
        MetricType::HISTOGRAM => Some(Kind::Histogram),
        _ => None,
    };
    if kind != Some(def.kind) {
        wrong.push(format!("{name}: registered as {:?}, catalogued as {:?}", family.type_(), def.kind));
    }
    if family.help() != def.help {
        wrong.push(format!("{name}: help {:?}, catalogued {:?}", family.help(), def.help));
    }
    let catalogued: BTreeSet<&str> = def.labels.iter().copied().collect();
    for metric in family.get_metric() {
        let labels: BTreeSet<&str> = metric.get_label().iter().map(|l| l.name()).collect();
        if labels != catalogued {
            wrong.push(format!("{name}: labels {labels:?}, catalogued {catalogued:?}"));
        }
        if def.kind == Kind::Histogram {
            let bounds: Vec<f64> = metric.get_histogram().get_bucket().iter().map(|b| b.upper_bound()).collect();
            if Some(&bounds[..]) != def.buckets {
                wrong.push(format!("{name}: buckets {bounds:?}, catalogued {:?}", def.buckets));
            }
        }
    }
    wrong
}

#[test]
fn the_registry_holds_the_catalogue_and_nothing_else() {
    let families = every_family().registry.gather();
    let mut wrong = Vec::new();
    for def in CATALOGUE {
        match families.iter().find(|f| f.name() == def.exposed_name()) {
            Some(family) => wrong.extend(mismatches(def, family)),
            None => wrong.push(format!("{}: catalogued, not registered (or no series)", def.exposed_name())),
        }
    }
    for family in &families {
        if !CATALOGUE.iter().any(|d| d.exposed_name() == family.name()) {
            wrong.push(format!("{}: registered, not in the catalogue", family.name()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let names: BTreeSet<&str> = CATALOGUE.iter().map(|d| d.name).collect();
    assert_eq!(names.len(), CATALOGUE.len(), "a name catalogued twice");
}

#[test]
fn a_definition_builds_only_its_own_kind() {
    let e = catalogue::COMMANDS.int_counter().map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("commands_total"), "{e}");
    assert!(catalogue::COMMANDS.int_gauge_vec().is_err());
    assert!(catalogue::IN_FLIGHT.histogram().is_err());
    assert!(catalogue::TRANSACTION_COMMIT.histogram_vec().is_err());
    assert!(catalogue::TRANSACTION_COMMIT.histogram().is_ok());
}

#[test]
fn the_checker_finds_a_family_unlike_its_definition() {
    let families = every_family().registry.gather();
    let find = |name: &str| families.iter().find(|f| f.name() == name).unwrap();
    let wrong_labels = MetricDef { labels: &["outcome"], ..catalogue::COMMANDS };
    let wrong_buckets = MetricDef { buckets: Some(&[1.0]), ..catalogue::TRANSACTION_COMMIT };
    let wrong_kind = MetricDef { kind: Kind::Counter, ..catalogue::IN_FLIGHT };
    for (def, what) in [(&wrong_labels, "labels"), (&wrong_buckets, "buckets"), (&wrong_kind, "registered as")] {
        let wrong = mismatches(def, find(&def.exposed_name()));
        assert!(!wrong.is_empty() && wrong.iter().all(|w| w.contains(what) && w.contains(def.name)), "{wrong:?}");
    }
}

#[test]
fn renders_spec_names_with_prefix() {
    let m = Metrics::new().unwrap();
    m.command(Outcome::Succeeded, Some("mail"));
    m.sink_request("smtp", "ok", 0.01);
    m.dead_lettered("invalid_json");
    m.duplicate_age(Some("mail"), 5.0);
    m.lag("commands", 0, 3);
    m.set_sink_circuit_open("smtp", true);
    let text = m.render();
    for name in [
        "dedupd_commands_total{outcome=\"succeeded\",route=\"mail\"} 1",
        "dedupd_sink_requests_total",
        "dedupd_sink_duration_seconds_bucket",
        "dedupd_process_duration_seconds",
        "dedupd_store_records{state=\"in_progress\"} 0",
        "dedupd_store_disk_bytes",
        "dedupd_compaction_removed_total",
        "dedupd_consumer_lag{partition=\"0\",topic=\"commands\"} 3",
        "dedupd_in_flight",
        "dedupd_dead_letter_total{reason=\"invalid_json\"} 1",
        "dedupd_rebalances_total",
        "dedupd_duplicate_age_seconds_bucket",
        "dedupd_sink_circuit_open{sink=\"smtp\"} 1",
        "dedupd_transaction_commit_seconds_count 0",
        "dedupd_fenced_total 0",
        "dedupd_stalled_transactions_aborted_total 0",
        "dedupd_state_standby_records_total 0",
        "dedupd_state_standby_partitions 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

#[test]
fn store_write_errors_are_counted_by_kind_from_zero() {
    let m = Metrics::new().unwrap();
    assert!(m.render().contains(r#"dedupd_store_write_errors_total{kind="disk_full"} 0"#), "{}", m.render());
    m.store_write_failed("disk_full");
    let text = m.render();
    assert!(text.contains(r#"dedupd_store_write_errors_total{kind="disk_full"} 1"#), "{text}");
    assert!(text.contains(r#"dedupd_store_write_errors_total{kind="io"} 0"#), "{text}");
}

#[test]
fn known_series_render_at_zero_before_any_event() {
    let m = Metrics::new().unwrap();
    m.init_known(&["mail"], &["smtp"]);
    let text = m.render();
    for line in [
        "dedupd_commands_total{outcome=\"conflict\",route=\"mail\"} 0",
        "dedupd_commands_total{outcome=\"rejected\",route=\"-\"} 0",
        "dedupd_sink_requests_total{sink=\"smtp\",status=\"permanent\"} 0",
        "dedupd_sink_duration_seconds_count{sink=\"smtp\"} 0",
        "dedupd_duplicate_age_seconds_count{route=\"mail\"} 0",
        "dedupd_dead_letter_total{reason=\"no_route\"} 0",
        "dedupd_dead_letter_total{reason=\"stale\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    assert!(!text.contains("route=\"-\",") && !text.contains("outcome=\"rejected\",route=\"mail\""), "{text}");
}

//! Metrics tests: names, help and what each update renders.

use super::*;

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

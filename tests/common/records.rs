//! Store records and config files for the operator tests (admin API, CLI), so each test
//! writes only what it is about.

use std::path::{Path, PathBuf};

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{Completed, Completion, Held, InProgress, Indeterminate, Record, SourcePos};

/// A `succeeded` record with fingerprint `[fp; 32]` that expires at `expires_at_ms`.
pub fn completed(fp: u8, expires_at_ms: i64) -> Record {
    Record::Completed(Completed {
        fingerprint: Fingerprint([fp; 32]),
        outcome: Completion::Succeeded,
        result: br#"{"accepted":true}"#.to_vec(),
        error: None,
        first_seen_at_ms: 1_000,
        completed_at_ms: 2_000,
        expires_at_ms,
        attempts: 1,
        source: None,
        settled: None,
    })
}

/// A `succeeded` record that expires an hour from now.
pub fn completed_for_an_hour(fp: u8) -> Record {
    completed(fp, chrono::Utc::now().timestamp_millis() + 3_600_000)
}

/// An `indeterminate` record left by a crash.
pub fn indeterminate(fp: u8) -> Record {
    Record::Indeterminate(Indeterminate {
        fingerprint: Fingerprint([fp; 32]),
        claimed_at_ms: 1_000,
        attempts: 1,
        why: "crash".into(),
        held: None,
    })
}

/// An `indeterminate` record claimed at `claimed_at_ms` by `route`, whose call of `sink`
/// may have landed: the command in doubt kept with it.
pub fn indeterminate_at(fp: u8, claimed_at_ms: i64, route: &str, sink: &str) -> Record {
    Record::Indeterminate(Indeterminate {
        fingerprint: Fingerprint([fp; 32]),
        claimed_at_ms,
        attempts: 1,
        why: format!("the call may have reached sink `{sink}` without an answer"),
        held: Some(Box::new(Held {
            sink: sink.into(),
            route: route.into(),
            kind: "payment.charge".into(),
            payload: br#"{"amount":5}"#.to_vec(),
            source: SourcePos { topic: "commands".into(), partition: 0, offset: i64::from(fp) },
            intake_client: None,
        })),
    })
}

/// An `in_progress` record of `commands`/0 at offset 7.
pub fn in_progress(fp: u8) -> Record {
    Record::InProgress(InProgress {
        fingerprint: Fingerprint([fp; 32]),
        claimed_at_ms: 1_000,
        attempts: 1,
        source: SourcePos { topic: "commands".into(), partition: 0, offset: 7 },
        held: None,
    })
}

/// Writes a config file at `path` for a stopped instance whose store is at `store` (with
/// `backend` when given, else the default) and a log sink; returns `path`.
pub fn config_file(path: &Path, store: &Path, backend: Option<&str>) -> PathBuf {
    config_file_with_sink(path, store, backend, "log", "kind = \"log\"\n")
}

/// As [`config_file`], with the sink `name` whose table (its keys and sub-tables, written
/// as `[sinks.NAME.SUB]`) is `table`, to which every command type is routed.
pub fn config_file_with_sink(path: &Path, store: &Path, backend: Option<&str>, name: &str, table: &str) -> PathBuf {
    let backend = backend.map(|b| format!("backend = \"{b}\"\n")).unwrap_or_default();
    let text = format!(
        r#"[kafka]
bootstrap_servers = "127.0.0.1:9"
group_id = "g"
input_topics = ["in"]
results_topic = "results"
dead_letter_topic = "dlq"

[store]
path = {store:?}
{backend}
[sinks.{name}]
{table}
[[routes]]
types = ["*"]
sink = "{name}"
"#
    );
    std::fs::write(path, text).expect("write the config file");
    path.to_path_buf()
}

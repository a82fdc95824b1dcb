//! docs/sinks.md's "Adding a kind" example, kept word for word in docs/examples/file_sink.rs:
//! compiled here as `src/sinks/file.rs` would be (a child module whose `super` is
//! `dedupd::sinks`), checked to be the very text the doc shows, and run through the engine.
//! Needs nothing outside the process: `cargo test --test docs docs_sink_example::`.

use crate::common;

use std::sync::Arc;

use common::orphan::EngineWithSink;
use dedupd::outcome::Outcome;
use dedupd::sinks::{Sink, SinkKind};
use serde_json::{Value, json};

use self::sinks::file::FileSinkConfig;

/// What `super` names inside `src/sinks/file.rs`.
#[path = "../../docs/examples"]
mod sinks {
    pub use dedupd::sinks::*;

    #[path = "file_sink.rs"]
    pub mod file;
}

#[test]
fn the_doc_shows_the_compiled_text() {
    let doc = include_str!("../../docs/sinks.md");
    let example = include_str!("../../docs/examples/file_sink.rs");
    assert!(
        doc.contains(&format!("```rust\n{example}```\n")),
        "docs/sinks.md's `file` sink example differs from docs/examples/file_sink.rs"
    );
}

#[test]
fn its_config_parses_validates_and_states_its_facts() {
    let config: FileSinkConfig = toml::from_str("path = \"/var/lib/dedupd/journal.jsonl\"").unwrap();
    assert_eq!(config.problems("sinks.journal"), vec![]);
    assert!(config.forwards_key());
    let sink = Sink::build("journal", &config).unwrap();
    assert_eq!(sink.name(), "journal");
    assert!(sink.forwards_key());
    assert!(sink.circuit().is_some(), "the breaker is on by default, as for every kind");
    let empty: FileSinkConfig = toml::from_str("path = \"\"").unwrap();
    assert_eq!(empty.problems("sinks.journal")[0].key, "sinks.journal.path");
    assert!(toml::from_str::<FileSinkConfig>("path = \"x\"\nmode = 1").is_err(), "unknown keys are refused");
}

#[tokio::test]
async fn through_the_engine_it_appends_one_line_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let config: FileSinkConfig = toml::from_str(&format!("path = '{}'", path.display())).unwrap();
    let mut h = EngineWithSink::new(Arc::new(Sink::build("journal", &config).unwrap()));

    let items = [h.item("a", json!({"n": 1})), h.item("b", json!({"n": 2})), h.item("a", json!({"n": 1}))];
    let outcomes: Vec<Outcome> = h.deliver(&items).await.into_iter().map(|p| p.result.outcome).collect();
    assert_eq!(outcomes, [Outcome::Succeeded, Outcome::Succeeded, Outcome::Duplicate]);

    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    lines.sort_by_key(|line| line["key"].to_string());
    assert_eq!(
        lines,
        [json!({"key": "a", "type": "t", "payload": {"n": 1}}), json!({"key": "b", "type": "t", "payload": {"n": 2}})]
    );
}

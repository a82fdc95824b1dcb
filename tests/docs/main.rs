//! The docs tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=docs) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod config_docs;
mod doc_paths;
mod docs_sink_example;
mod metrics_docs;
mod module_map;

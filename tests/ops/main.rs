//! The ops tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=ops) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod admin_api;
mod deploy_files;
mod logs_traces;
mod metrics_run;
mod ops_http;
mod prometheus;
mod release_metadata;

//! The intake tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=intake) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod intake;
mod intake_instances;
mod intake_kill;
mod intake_mcp;

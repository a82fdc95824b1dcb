//! The cli tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=cli) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod cli_admin;
mod cli_check_config;
mod cli_dead_letters;
mod cli_direct;
mod cli_generate;
mod cli_progress;
mod cli_resolve_check;
mod cli_transfer;
mod demo;
mod import_bounded;

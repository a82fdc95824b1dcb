//! The store tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=store) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod disk_full;
mod store_crash;
mod store_faults;

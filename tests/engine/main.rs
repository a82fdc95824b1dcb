//! The engine tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=engine) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod batch_overlap;
mod circuit_engine;
mod circuit_lone_command;
mod engine_answered_at;
mod engine_attempts;
mod engine_changelog;
mod engine_concurrency;
mod engine_drain;
mod engine_group_commit;
mod engine_model;
mod engine_operator;
mod engine_overlap;
mod engine_reconcile;
mod engine_tickets;
mod engine_unanswered;
mod shutdown_drain;
mod shutdown_overdue;

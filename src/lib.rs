//! dedupd: consumer-side deduplication for side-effect commands on Kafka.
//!
//! A command is claimed in an embedded store *before* its sink runs, executed once,
//! its result stored and replayed to every repeat. Data flows one way:
//!
//! ```text
//! Kafka record ─▶ envelope ─▶ decide ◀─▶ store ─▶ sink ─▶ publish ─▶ offset stored
//! ```
//!
//! Module map (lower lines never import higher ones' runtime):
//! - [`config`]: the TOML config, env overrides, validation naming the key.
//! - [`fingerprint`]: RFC 8785 canonical JSON + SHA-256, with route exclusions.
//! - [`routes`]: command types (exact or glob) to sinks, TTL precedence.
//! - [`envelope`]: a Kafka record to a `Command` or a typed `Rejection`.
//! - [`store`]: the key store: CAS claims, group commit, expiry index, compaction, watermarks.
//! - [`decide`]: the pure decision table of docs/contract.md §4.
//! - [`sinks`]: the `Sink` trait, the `sink_kinds!` registration, one file per kind (docs/sinks.md).
//! - [`outcome`]: what became of a record; the result record of docs/contract.md §5.
//! - [`cli`]: the command line; [`demo`]: `dedupd demo` on a mock cluster.
//! - [`pipeline`]: `dedupd run`: consumer thread, partition workers, publisher, purge.
//! - [`ops`]: the HTTP listener (metrics, health, admin) and the metrics catalogue.
//! - [`engine`]: a batch of commands through decide, claim, flush, sinks, complete, flush.

// Lint policy. No unsafe code of our own: the store, Kafka and TLS crates carry theirs.
// Nothing that comes from outside may panic the process: `unwrap`/`expect` are refused
// outside tests (a test's panic is its failure report). Everything clippy warns about is
// an error in CI (`cargo clippy --all-targets -- -D warnings`, scripts/test).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![warn(rust_2018_idioms)]

pub mod cli;
pub mod config;
pub mod decide;
pub mod demo;
pub mod engine;
pub mod envelope;
pub mod fingerprint;
pub mod log;
pub mod ops;
pub mod outcome;
pub mod pipeline;
pub mod routes;
pub mod sinks;
pub mod store;
pub mod time;

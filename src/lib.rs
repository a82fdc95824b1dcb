//! dedupd: consumer-side deduplication for side-effect commands on Kafka.
//!
//! A command is claimed in an embedded store *before* its sink runs, executed once,
//! its result stored and replayed to every repeat. Data flows one way:
//!
//! ```text
//! Kafka record ─▶ envelope ─▶ decide ◀─▶ store ─▶ sink ─▶ publish ─▶ offset stored
//! ```
//!
//! Module map, from the top down: a module imports only modules listed below it. The one
//! exception is each section's config type (`store::config`, `pipeline::config`, ...), a
//! leaf file that [`config`] composes (tests/docs/module_map.rs holds the code to this map).
//! - [`cli`]: the command line: `run`, `check-config`, `demo` and the operator commands.
//! - [`demo`]: `dedupd demo`, the whole product on librdkafka's mock cluster.
//! - [`pipeline`]: `dedupd run`: consumer thread, partition table, workers, publisher, purge.
//! - [`intake`]: the HTTP and MCP intake (`[intake]`): a command posted with an
//!   `Idempotency-Key` (or a tool called with `idempotency_key`) is produced into the
//!   pipeline and answered with its result; RFC 9457 problems.
//! - [`config`]: the TOML file composed of every section's type, env overrides, validation
//!   naming the key.
//! - [`ops`]: the HTTP listener (metrics, health, liveness, admin API, `/v1/status`) and the
//!   metrics catalogue.
//! - [`engine`]: a batch of commands as named steps: queue by key, start, claim, run sinks,
//!   complete, release or wait.
//! - [`sinks`]: `Sink`, the kinds' `SinkKind`/`SinkEffect` traits and the `sink_kinds!`
//!   registration, one file per kind (docs/sinks.md); limits and circuits.
//! - [`outcome`]: what became of a record; the result record of docs/contract.md §5.
//! - [`decide`]: the pure decision table of docs/contract.md §4.
//! - [`envelope`]: a Kafka record to a `Command` or a typed `Rejection`.
//! - [`routes`]: command types (exact or glob) to sinks, TTL precedence.
//! - [`store`]: the key store: claim journal, CAS claims, group commit, expiry index,
//!   compaction, watermarks; its backends registered in one place.
//! - [`fingerprint`]: RFC 8785 canonical JSON + SHA-256, with route exclusions.
//! - [`connection`]: `[kafka.connection]`, the librdkafka settings every Kafka client
//!   shares; secrets from env or files, redacted; offline checks and a connect probe.
//! - [`telemetry`]: `[telemetry]`, OpenTelemetry spans of commands and sink calls, exported
//!   over OTLP; the W3C trace context they pass on.
//! - [`log`]: the `[log]` section and the tracing subscriber (JSON lines carry `trace_id`).
//! - [`time`]: the clock and RFC 3339 instants.
//! - [`problems`]: what a config refuses, collected: each section's type checks its values
//!   into one `Problems`, each problem naming its key, value and reason.
//! - [`crash`]: named crash points for the crash suite, compiled in only with the
//!   `failpoints` feature.

// Lint policy. No unsafe code of our own: the store, Kafka and TLS crates carry theirs.
// Nothing that comes from outside may panic the process: `unwrap`/`expect` are refused
// outside tests (a test's panic is its failure report). Everything clippy warns about is
// an error in CI (`cargo clippy --all-targets -- -D warnings`, scripts/test).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![warn(rust_2018_idioms)]

pub mod cli;
pub mod config;
pub mod connection;
pub mod crash;
pub mod decide;
pub mod demo;
pub mod engine;
pub mod envelope;
pub mod fingerprint;
pub mod intake;
pub mod log;
pub mod ops;
pub mod outcome;
pub mod pipeline;
pub mod problems;
pub mod routes;
pub mod sinks;
pub mod store;
pub mod telemetry;
pub mod time;

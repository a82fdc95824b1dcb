//! The sinks tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=sinks) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod exec_sink;
mod http_check;
mod http_sink;
mod http_sink_redirects;
mod http_webhook;
mod kafka_sink;
mod kafka_sink_check;
mod sink_limits;
mod sink_outage;
mod smtp_sink;

//! The kafka tests: one module per test file, so a test's name is `<file>::<test>`
//! (`cargo nextest run -E 'binary(=kafka) & test(/^<file>::/)'` runs one file's).

#[path = "../common/mod.rs"]
mod common;

mod kafka_broker_restart;
mod kafka_changelog;
mod kafka_chaos;
mod kafka_compression;
mod kafka_e2e;
mod kafka_expiry;
mod kafka_group_session;
mod kafka_internal_topics;
mod kafka_kill;
mod kafka_kill_checked;
mod kafka_kill_transactional;
mod kafka_kill_unsent;
mod kafka_lag;
mod kafka_late_writer;
mod kafka_lifecycle;
mod kafka_liveness;
mod kafka_poison;
mod kafka_rebalance_transactional;
mod kafka_record_size;
mod kafka_restart;
mod kafka_restore_background;
mod kafka_restore_resume;
mod kafka_revoke_race;
mod kafka_secured;
mod kafka_secured_harness;
mod kafka_stalled;
mod kafka_standby;
mod kafka_topics_missing;
mod kafka_unanswered;
mod kafka_zombie;

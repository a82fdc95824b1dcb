//! Helpers shared by the integration tests. Each test binary uses a part of them.
#![allow(dead_code)]

pub mod admin;
pub mod claims;
pub mod effects;
pub mod engine;
pub mod exposition;
pub mod intake;
pub mod kafka;
pub mod kill_check;
pub mod kill_workload;
pub mod orphan;
pub mod otlp;
pub mod pay_kills;
pub mod process;
pub mod records;
pub mod scripted;
pub mod scripted_sink;
pub mod secured_kafka;
pub mod silent_smtp;
pub mod slow_receiver;
pub mod smtp_server;
pub mod state_group;

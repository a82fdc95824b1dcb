//! The `[envelope]` and `[limits]` sections: how commands are recognised in Kafka records.

use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use super::KeySource;

/// Which envelope shapes are accepted.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeFormat {
    /// Detect native, tool call or CloudEvents per record.
    #[default]
    Auto,
    /// `{"id", "type", "payload"}` only.
    Native,
    /// `{"tool", "arguments"}` only.
    ToolCall,
    /// CloudEvents 1.0, structured or binary.
    Cloudevents,
}

/// Which timestamp decides whether a command is stale.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StaleBy {
    /// The Kafka record timestamp.
    #[default]
    KafkaTimestamp,
    /// The envelope's `created_at`, falling back to the Kafka timestamp when absent.
    CreatedAt,
}

/// Envelope settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvelopeConfig {
    /// `auto`, `native`, `tool_call` or `cloudevents`.
    pub format: EnvelopeFormat,
    /// Where the idempotency key comes from: `auto`, `header:NAME`, `json:/pointer`, `record-key`.
    pub key: KeySource,
    /// Refuse to execute commands produced longer ago than their TTL.
    pub stale_guard: bool,
    /// `kafka_timestamp` or `created_at`.
    pub stale_by: StaleBy,
}

impl Default for EnvelopeConfig {
    fn default() -> Self {
        Self {
            format: EnvelopeFormat::Auto,
            key: KeySource::Auto,
            stale_guard: true,
            stale_by: StaleBy::KafkaTimestamp,
        }
    }
}

/// Input limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest accepted record value in bytes; larger ones are dead-lettered as `too_large`.
    pub max_command_bytes: NonZeroUsize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self { max_command_bytes: NonZeroUsize::new(1024 * 1024).unwrap_or(NonZeroUsize::MIN) }
    }
}

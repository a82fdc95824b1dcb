//! An input partition's batch under the by-key hop (`hop`): each command is forwarded to
//! its key's partition of the by-key topic, to be decided there; a record that is not one
//! is rejected here (its result and dead letter name it). Forwards, rejections and the
//! input offset go out in the one open transaction (docs/decisions.md, "State on Kafka").

use std::time::Instant;

use rdkafka::message::{Message, OwnedMessage};

use super::{PartitionWorker, StatePartitions, Stop, Unacked};
use crate::engine::{Item, rejected};
use crate::envelope::{Command, RejectReason, Rejection};
use crate::outcome::Processed;
use crate::pipeline::changelog::state_partition;
use crate::pipeline::hop::{forward_record, forward_size};

impl PartitionWorker {
    /// Forwards `batch`'s commands to the by-key topic of `state`, rejects the rest, and
    /// records the batch's last offset. Returns what was sent; the whole batch always is.
    pub(super) async fn forward(
        &self,
        batch: Vec<OwnedMessage>,
        state: &StatePartitions,
    ) -> Result<(Option<Unacked>, bool), Stop> {
        let (by_key, partitions) = (state.by_key.as_deref().unwrap_or_default(), state.count);
        // The hop runs only in transactions (config validation); the writer names itself in
        // each forward (transactions, invariant 8).
        let writer = self.shared.transactions.as_ref().map_or("", |t| t.id());
        let started = Instant::now();
        let Some(last_offset) = batch.last().map(Message::offset) else { return Ok((None, true)) };
        self.in_batch.set(&batch);
        let mut commands: Vec<(OwnedMessage, String)> = Vec::with_capacity(batch.len());
        let mut rejections: Vec<(OwnedMessage, Processed)> = Vec::new();
        for m in batch {
            let mut item: Item = self.untraced_item(&m, None);
            if let Ok(cmd) = &item.parsed {
                let size = forward_size(by_key, &cmd.key, &m, writer);
                if size > state.forward_limit {
                    item.parsed = Err(too_large_to_forward(cmd, size, state.forward_limit));
                }
            }
            match &item.parsed {
                Ok(cmd) => {
                    let key = cmd.key.clone();
                    commands.push((m, key));
                }
                Err(rejection) => {
                    // Decided here: its span is this partition's.
                    item.span = self.command_span(&m, &item);
                    let processed = rejected(&item, rejection);
                    rejections.push((m, processed));
                }
            }
        }
        let forwards = commands
            .iter()
            .map(|(m, key)| forward_record((by_key, state_partition(key, partitions)), key, m, writer))
            .collect();
        let refs: Vec<(&OwnedMessage, &Processed)> = rejections.iter().map(|(m, p)| (m, p)).collect();
        let acks = self.publish(&refs, forwards, last_offset).await?;
        tracing::debug!(topic = %self.topic, partition = self.partition, forwarded = commands.len(), rejected = rejections.len(), "batch forwarded");
        Ok((Some(Unacked { records: rejections, acks, started, last_offset }), true))
    }
}

/// The rejection of a command whose forward would be larger than the by-key topic or the
/// producer takes (its headers do not count against `limits.max_command_bytes`).
fn too_large_to_forward(cmd: &Command, size: usize, limit: usize) -> Rejection {
    Rejection {
        reason: RejectReason::TooLarge,
        message: format!(
            "its forward to the by-key topic would be {size} bytes with its key and headers, more than the {limit} the topic and the producer take"
        ),
        key: Some(cmd.key.clone()),
        kind: Some(cmd.kind.clone()),
    }
}

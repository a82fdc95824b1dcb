//! The by-key topic keeps its records until they are processed (it is created with
//! `retention.ms = -1`, since a time limit could delete forwards no instance has decided
//! yet), and dedupd deletes what is done: every [`PURGE_INTERVAL`] and at a clean stop, the
//! records of each partition below the group's committed offset, as Kafka Streams purges its
//! repartition topics. The committed offsets are the group's, so any instance may purge
//! every partition; two purging at once delete the same records.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::connection::probe;
use crate::pipeline::{KafkaConfig, PipelineError, producer_config};

/// How often the by-key topic is purged (Kafka Streams' `repartition.purge.interval.ms`).
const PURGE_INTERVAL: Duration = Duration::from_secs(30);
/// How long reading the committed offsets, or a deletion, may take.
const PURGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Deletes from the by-key topic what the group has committed.
pub(crate) struct Purger {
    topic: String,
    partitions: i32,
    /// Never subscribes: it only reads the group's committed offsets.
    offsets: Arc<BaseConsumer>,
    admin: AdminClient<DefaultClientContext>,
}

impl Purger {
    /// Under the by-key hop (`topic` has a by-key topic): the purger of that topic.
    pub(crate) fn of_by_key(
        kafka: &KafkaConfig,
        topic: Option<&crate::pipeline::changelog::ChangelogTopic>,
    ) -> Result<Option<Purger>, PipelineError> {
        match topic.and_then(|t| t.by_key.as_deref().map(|by_key| (by_key, t.partitions))) {
            Some((by_key, partitions)) => Purger::new(kafka, by_key, partitions).map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn new(kafka: &KafkaConfig, topic: &str, partitions: i32) -> Result<Purger, PipelineError> {
        let consumer_config = kafka.client_config(&[("group.id", kafka.group_id.as_str())], &Default::default())?;
        let offsets = probe::create(&consumer_config, "by-key purge consumer")?;
        let admin = probe::create(&producer_config(kafka)?, "admin")?;
        Ok(Purger { topic: topic.to_string(), partitions, offsets: Arc::new(offsets), admin })
    }

    /// Deletes the records below each partition's committed offset; a failure is logged and
    /// the next purge tries again (nothing is lost by purging late).
    pub(crate) async fn purge(&self) {
        let mut wanted = TopicPartitionList::new();
        for p in 0..self.partitions {
            wanted.add_partition(&self.topic, p);
        }
        let offsets = Arc::clone(&self.offsets);
        let committed = tokio::task::spawn_blocking(move || offsets.committed_offsets(wanted, PURGE_TIMEOUT)).await;
        let committed = match committed {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return tracing::warn!(error = %e, topic = %self.topic, "by-key purge: could not read the committed offsets");
            }
            Err(e) => return tracing::warn!(error = %e, "by-key purge: the offsets read failed"),
        };
        let mut below = TopicPartitionList::new();
        for e in committed.elements() {
            if let Offset::Offset(next) = e.offset()
                && next > 0
                && let Err(err) = below.add_partition_offset(&self.topic, e.partition(), Offset::Offset(next))
            {
                tracing::warn!(error = %err, "by-key purge: offset not added");
            }
        }
        if below.count() == 0 {
            return;
        }
        let options = AdminOptions::new().operation_timeout(Some(PURGE_TIMEOUT));
        match tokio::time::timeout(PURGE_TIMEOUT, self.admin.delete_records(&below, &options)).await {
            Ok(Ok(result)) => {
                for e in result.elements().iter().filter(|e| e.error().is_err()) {
                    tracing::warn!(partition = e.partition(), error = ?e.error(), "by-key purge: a partition's records were not deleted");
                }
                tracing::debug!(topic = %self.topic, partitions = below.count(), "by-key topic purged");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, topic = %self.topic, "by-key purge failed"),
            Err(_) => tracing::warn!(topic = %self.topic, "by-key purge: no answer in time"),
        }
    }
}

/// Purges every [`PURGE_INTERVAL`] until `stop`.
pub(crate) async fn purge_every(purger: Arc<Purger>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(PURGE_INTERVAL);
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => purger.purge().await,
        }
    }
}

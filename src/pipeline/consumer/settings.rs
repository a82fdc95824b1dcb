//! The consumer's settings: what dedupd sets on librdkafka, and the static member id.

use rdkafka::ClientConfig;

use super::super::{KafkaConfig, PipelineError};
use crate::connection::ConnectionError;
use crate::store::KeyStore;

/// The consumer settings dedupd chooses; `[kafka.connection]` and then `kafka.consumer.*`
/// override them (see [`KafkaConfig::client_config`]).
pub fn consumer_config(kafka: &KafkaConfig) -> Result<ClientConfig, ConnectionError> {
    let mut c = kafka.client_config(
        &[
            ("enable.auto.commit", "true"),
            ("auto.commit.interval.ms", "1000"),
            ("auto.offset.reset", "earliest"),
            // librdkafka's default of 1000 ms stalls a consumer draining a backlog for a
            // second each time its prefetch queue fills; 10 ms drained 5x faster here.
            ("fetch.queue.backoff.ms", "10"),
            // Statistics feed `dedupd_consumer_lag`; every 5 s is cheap and fresh enough.
            ("statistics.interval.ms", "5000"),
        ],
        &kafka.consumer,
    )?;
    // The offset is stored only after the record's result is acknowledged (validation
    // refuses these keys in `kafka.consumer`).
    c.set("group.id", &kafka.group_id).set("enable.auto.offset.store", "false");
    if kafka.transactional_results {
        // Offsets are committed in the results transaction only (pipeline/transactions/mod.rs).
        c.set("enable.auto.commit", "false");
    }
    Ok(c)
}

/// Bounds what librdkafka prefetches for each partition to what the partition's worker may
/// have waiting: `queued.min.messages` = `records` and `queued.max.messages.kbytes` =
/// `bytes` (in KiB, at least 1), unless `kafka.consumer` sets them. With split partition
/// queues (see `split`) librdkafka applies both per partition and stops fetching a
/// partition once its queue holds that much, which is the consumer's backpressure.
pub(super) fn bound_prefetch(config: &mut ClientConfig, kafka: &KafkaConfig, records: usize, bytes: usize) {
    if !kafka.consumer.contains_key("queued.min.messages") {
        config.set("queued.min.messages", records.clamp(1, 10_000_000).to_string());
    }
    if !kafka.consumer.contains_key("queued.max.messages.kbytes") {
        config.set("queued.max.messages.kbytes", (bytes / 1024).clamp(1, 2_097_151).to_string());
    }
}

/// The `group.instance.id` dedupd gives the consumer: none when `kafka.static_membership`
/// is off or `kafka.consumer` names one itself (a StatefulSet's pod name), else one made
/// from the store's identity, which a restart on the same store keeps (see
/// `store::identity`).
pub(super) fn static_member_id(kafka: &KafkaConfig, store: &KeyStore) -> Result<Option<String>, PipelineError> {
    if !kafka.static_membership || kafka.consumer.contains_key("group.instance.id") {
        return Ok(None);
    }
    Ok(Some(format!("dedupd-{}", store.identity()?)))
}

//! The first step of `run`: the consumer's and the results producer's settings connect to
//! the cluster within `kafka.connect_timeout`, or `run` stops with the cause (a refused
//! login, an untrusted certificate, no answer) instead of retrying silently forever.

use super::{KafkaConfig, PipelineError, consumer_config, producer_config};
use crate::connection::probe::{self, ConnectError};

/// Probes both clients at once, each on a blocking thread (librdkafka's calls block).
pub(super) async fn check_cluster(kafka: &KafkaConfig) -> Result<(), PipelineError> {
    let timeout = kafka.connect_timeout;
    let consumer = consumer_config(kafka)?;
    let producer = producer_config(kafka)?;
    let consumer = tokio::task::spawn_blocking(move || probe::probe("consumer", &consumer, timeout));
    let producer = tokio::task::spawn_blocking(move || probe::probe("results producer", &producer, timeout));
    let (consumer, producer) = tokio::join!(consumer, producer);
    for (client, joined) in [("consumer", consumer), ("results producer", producer)] {
        let view = joined.map_err(|e| ConnectError::Create { client: client.into(), reason: e.to_string() })??;
        tracing::info!(client, brokers = ?view.brokers, "connected to Kafka");
    }
    Ok(())
}

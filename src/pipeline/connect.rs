//! The first step of `run` ([`ClusterSetup`]): the consumer's and the results producer's
//! settings connect to the cluster within `kafka.connect_timeout`, or `run` stops with the
//! cause (a refused login, an untrusted certificate, no answer, a missing topic) instead of
//! retrying silently forever; then what the cluster's topics allow is read.

use std::time::Duration;

use rdkafka::admin::ResourceSpecifier;

use super::publish::DeadLetterLimit;
use super::{KafkaConfig, PipelineError, consumer_config, producer_config};
use crate::config::Config;
use crate::connection::probe::{self, ConnectError};

/// The broker's own default `max.message.bytes`, assumed when the topic's cannot be read.
const BROKER_DEFAULT_MAX_MESSAGE_BYTES: usize = 1_048_588;

/// What `run` learns from the cluster, and makes there, before it starts.
pub(super) struct ClusterSetup {
    /// Under transactional results: the largest dead-letter copy.
    pub(super) dead_letter_limit: Option<DeadLetterLimit>,
    /// Under `store.changelog`: the changelog topic (and the by-key topic), found or made.
    pub(super) changelog_topic: Option<super::changelog::ChangelogTopic>,
    /// Under the by-key hop: the largest forward the producer and the by-key topic take.
    pub(super) forward_limit: usize,
    /// The group session the broker enforces on the consumer (`session`).
    pub(super) session: Duration,
}

impl ClusterSetup {
    /// What the core is built from.
    pub(super) fn found(&self) -> super::Found<'_> {
        super::Found {
            dead_letter_limit: self.dead_letter_limit,
            changelog_topic: self.changelog_topic.as_ref(),
            session: self.session,
        }
    }

    pub(super) async fn read(config: &Config) -> Result<ClusterSetup, PipelineError> {
        let broker_id = check_cluster(&config.kafka).await?;
        let dead_letter_limit = match config.kafka.transactional_results {
            true => Some(dead_letter_limit(&config.kafka).await?),
            false => None,
        };
        let changelog_topic = match config.store.changelog {
            true => Some(super::changelog::ensure_topic(config).await?),
            false => None,
        };
        let forward_limit = match changelog_topic.as_ref().and_then(|t| t.by_key.as_deref()) {
            Some(by_key) => {
                let topic_max = topic_max_message_bytes(&config.kafka, by_key).await?;
                DeadLetterLimit::of_topic(topic_max.min(config.kafka.producer_max_bytes())).0
            }
            None => usize::MAX,
        };
        // Only transactional results use it (the call lease, the stalled-transaction wait).
        let session = match config.kafka.transactional_results {
            true => super::session::group_session(&config.kafka, broker_id).await?,
            false => config.kafka.session_timeout(),
        };
        Ok(ClusterSetup { dead_letter_limit, changelog_topic, forward_limit, session })
    }
}

/// Probes both clients at once, each on a blocking thread (librdkafka's calls block);
/// returns the id of a broker they saw.
async fn check_cluster(kafka: &KafkaConfig) -> Result<Option<i32>, PipelineError> {
    let timeout = kafka.connect_timeout;
    let consumer = consumer_config(kafka)?;
    let producer = producer_config(kafka)?;
    let consumer = tokio::task::spawn_blocking(move || probe::probe("consumer", &consumer, timeout));
    let producer = tokio::task::spawn_blocking(move || probe::probe("results producer", &producer, timeout));
    let (consumer, producer) = tokio::join!(consumer, producer);
    let mut seen = None;
    for (client, joined) in [("consumer", consumer), ("results producer", producer)] {
        let view = joined.map_err(|e| ConnectError::Create { client: client.into(), reason: e.to_string() })??;
        tracing::info!(client, brokers = ?view.brokers, "connected to Kafka");
        seen = Some(view);
    }
    // Before anything is published: the producer would have a broker that auto-creates
    // topics make a missing one, with the broker's defaults, and publish there.
    let broker_id = seen.as_ref().and_then(|view| view.brokers.first()).and_then(|b| b.split('@').next()?.parse().ok());
    let topics = seen.map(|view| view.topics).unwrap_or_default();
    for (key, topic) in
        [("kafka.results_topic", &kafka.results_topic), ("kafka.dead_letter_topic", &kafka.dead_letter_topic)]
    {
        if !topics.contains_key(topic) {
            return Err(ConnectError::MissingTopic { key: key.into(), topic: topic.clone() }.into());
        }
    }
    Ok(broker_id)
}

/// Under transactional results: the largest dead-letter copy the dead-letter topic takes
/// (its `max.message.bytes`, read with DescribeConfigs), so that no copy aborts a
/// transaction (`publish`). When it cannot be read (no permission, an old broker) the
/// broker's default is assumed and the log says so.
async fn dead_letter_limit(kafka: &KafkaConfig) -> Result<DeadLetterLimit, PipelineError> {
    Ok(DeadLetterLimit::of_topic(topic_max_message_bytes(kafka, &kafka.dead_letter_topic).await?))
}

/// `topic`'s `max.message.bytes`, or the broker's default (logged) when it cannot be read.
async fn topic_max_message_bytes(kafka: &KafkaConfig, topic: &str) -> Result<usize, PipelineError> {
    let read = super::describe::settings(kafka, &ResourceSpecifier::Topic(topic)).await?.and_then(|settings| {
        let value = settings.get("max.message.bytes");
        value.and_then(|v| v.parse::<usize>().ok()).ok_or_else(|| "no max.message.bytes".to_string())
    });
    Ok(read.unwrap_or_else(|why| {
        tracing::warn!(
            topic,
            why,
            assumed = BROKER_DEFAULT_MAX_MESSAGE_BYTES,
            "could not read the topic's max.message.bytes; assuming the broker's default"
        );
        BROKER_DEFAULT_MAX_MESSAGE_BYTES
    }))
}

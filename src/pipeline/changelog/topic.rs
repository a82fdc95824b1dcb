//! The changelog topic: found, or created compacted with one partition per state partition.
//! Its partition count is fixed by the input (with `kafka.copartitioned` an input partition
//! is a state partition), so every input topic must have the same count, and a changelog
//! topic that exists with another count is refused: its records would be on the wrong
//! partitions.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Config;
use crate::connection::probe;
use crate::pipeline::{PipelineError, producer_config};

/// The changelog topic as `run` found or made it.
#[derive(Debug, Clone)]
pub(crate) struct ChangelogTopic {
    /// Its name.
    pub(crate) name: String,
    /// Its partitions: the state partitions.
    pub(crate) partitions: i32,
}

/// `store.changelog_topic`, or `"<kafka.group_id>.dedupd-state"` (SPEC §8).
pub(crate) fn topic_name(config: &Config) -> String {
    config.store.changelog_topic.clone().unwrap_or_else(|| format!("{}.dedupd-state", config.kafka.group_id))
}

/// The replication factor and `min.insync.replicas` a new changelog topic gets on a cluster
/// of `brokers`: the configured ones, the first capped by the brokers; the second at most
/// the first and, when the brokers capped it, below it (so that a smaller cluster still
/// takes writes with one replica down, as the defaults 3/2 do on three brokers).
fn replication(configured_rf: u16, configured_min_isr: u16, brokers: usize) -> (i32, i32) {
    let wanted = i32::from(configured_rf);
    let rf = wanted.min(i32::try_from(brokers).unwrap_or(i32::MAX)).max(1);
    let ceiling = if rf < wanted { (rf - 1).max(1) } else { rf };
    (rf, i32::from(configured_min_isr).min(ceiling).max(1))
}

fn failed(why: impl std::fmt::Display) -> PipelineError {
    PipelineError::Changelog(why.to_string())
}

/// Finds the changelog topic, or creates it (`cleanup.policy=compact`), and checks its
/// partitions against the input topics'.
pub(crate) async fn ensure_topic(config: &Config) -> Result<ChangelogTopic, PipelineError> {
    let kafka = &config.kafka;
    let name = topic_name(config);
    let admin: AdminClient<DefaultClientContext> = probe::create(&producer_config(kafka)?, "admin")?;
    let timeout = kafka.connect_timeout;
    let metadata = {
        let client_config = producer_config(kafka)?;
        tokio::task::spawn_blocking(move || {
            let client: AdminClient<DefaultClientContext> = probe::create(&client_config, "admin")?;
            client
                .inner()
                .fetch_metadata(None, timeout)
                .map_err(|e| failed(format!("reading the cluster's metadata: {e}")))
        })
        .await
        .map_err(failed)??
    };
    let partitions_of = |topic: &str| {
        metadata.topics().iter().find(|t| t.name() == topic && t.error().is_none()).map(|t| t.partitions().len())
    };
    let mut counts = Vec::with_capacity(kafka.input_topics.len());
    for topic in &kafka.input_topics {
        let n = partitions_of(topic).ok_or_else(|| failed(format!("input topic {topic:?} does not exist")))?;
        counts.push((topic.as_str(), n));
    }
    let n = counts.first().map_or(0, |&(_, n)| n);
    if counts.iter().any(|&(_, c)| c != n) {
        return Err(failed(format!(
            "store.changelog with kafka.copartitioned needs every input topic to have as many partitions (one per state partition); they have {counts:?}"
        )));
    }
    let partitions = i32::try_from(n).map_err(failed)?;
    if let Some(existing) = partitions_of(&name) {
        if existing != n {
            return Err(failed(format!(
                "changelog topic {name:?} has {existing} partitions, the input topics {n}: its records would be on the wrong partitions"
            )));
        }
        return Ok(ChangelogTopic { name, partitions });
    }
    let (rf, min_isr) = replication(
        config.store.changelog_replication_factor,
        config.store.changelog_min_insync_replicas,
        metadata.brokers().len(),
    );
    let min_isr_text = min_isr.to_string();
    let topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(rf))
        .set("cleanup.policy", "compact")
        .set("min.insync.replicas", &min_isr_text);
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let created = tokio::time::timeout(timeout + Duration::from_secs(1), admin.create_topics([&topic], &options))
        .await
        .map_err(|_| failed(format!("creating changelog topic {name:?}: no answer in time")))?
        .map_err(|e| failed(format!("creating changelog topic {name:?}: {e}")))?;
    for result in created {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(failed(format!("creating changelog topic {name:?}: {code}"))),
        }
    }
    tracing::info!(topic = %name, partitions, replication_factor = rf, min_insync_replicas = min_isr, "changelog topic created");
    Ok(ChangelogTopic { name, partitions })
}

#[cfg(test)]
mod tests {
    use super::replication;

    #[test]
    fn replication_is_capped_by_the_brokers_and_min_isr_below_it() {
        assert_eq!(replication(3, 2, 5), (3, 2));
        assert_eq!(replication(3, 2, 3), (3, 2));
        assert_eq!(replication(3, 2, 2), (2, 1));
        assert_eq!(replication(3, 2, 1), (1, 1));
        assert_eq!(replication(5, 4, 5), (5, 4));
        assert_eq!(replication(3, 3, 5), (3, 3), "an explicit min.insync.replicas = rf is kept");
        assert_eq!(replication(3, 3, 2), (2, 1));
    }
}

//! The changelog topic, and under the by-key hop the by-key topic: found, or created.
//! - With `kafka.copartitioned` an input partition is a state partition, so every input
//!   topic must have the same partition count, and the changelog has as many.
//! - Otherwise (the hop) the state partitions are the by-key topic's
//!   (`"<kafka.group_id>.dedupd-by-key"`): when it is new, as many as the input topic with the
//!   most (as Kafka Streams sizes its repartition topics), and the changelog has as many.
//!
//! A changelog topic that exists with another count is refused: its records would be on the
//! wrong partitions; an existing changelog or by-key topic whose settings would delete what
//! dedupd needs is refused too (`kept`).

mod kept;

use std::time::{Duration, Instant};

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
    /// Under the by-key hop: the by-key topic, whose partitions are the state partitions.
    pub(crate) by_key: Option<String>,
}

/// `"<kafka.group_id>.dedupd-by-key"` (docs/config.md, `kafka.copartitioned`).
pub(crate) fn by_key_topic_name(config: &Config) -> String {
    format!("{}.dedupd-by-key", config.kafka.group_id)
}

/// `store.changelog_topic`, or `"<kafka.group_id>.dedupd-state"` (docs/config.md, `store.changelog_topic`).
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

/// Finds the changelog topic (and under the hop the by-key topic), or creates it, and
/// checks its partitions against the input topics'.
pub(crate) async fn ensure_topic(config: &Config) -> Result<ChangelogTopic, PipelineError> {
    let kafka = &config.kafka;
    let name = topic_name(config);
    let metadata = {
        let client_config = producer_config(kafka)?;
        let timeout = kafka.connect_timeout;
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
    let replication = replication(
        config.store.changelog_replication_factor,
        config.store.changelog_min_insync_replicas,
        metadata.brokers().len(),
    );
    let (n, by_key) = if kafka.copartitioned {
        let n = counts.first().map_or(0, |&(_, n)| n);
        if counts.iter().any(|&(_, c)| c != n) {
            return Err(failed(format!(
                "store.changelog with kafka.copartitioned needs every input topic to have as many partitions (one per state partition); they have {counts:?}"
            )));
        }
        (n, None)
    } else {
        let by_key = by_key_topic_name(config);
        let n = match partitions_of(&by_key) {
            Some(existing) => {
                kept::check(kafka, &by_key, Purpose::ByKey).await?;
                existing
            }
            None => {
                let n = counts.iter().map(|&(_, c)| c).max().unwrap_or(1);
                create(config, &by_key, n, replication, Purpose::ByKey).await?;
                n
            }
        };
        (n, Some(by_key))
    };
    let partitions = i32::try_from(n).map_err(failed)?;
    match partitions_of(&name) {
        Some(existing) if existing != n => Err(failed(format!(
            "changelog topic {name:?} has {existing} partitions, the state partitions are {n}: its records would be on the wrong partitions"
        ))),
        Some(_) => {
            kept::check(kafka, &name, Purpose::Changelog).await?;
            Ok(ChangelogTopic { name, partitions, by_key })
        }
        None => {
            create(config, &name, n, replication, Purpose::Changelog).await?;
            Ok(ChangelogTopic { name, partitions, by_key })
        }
    }
}

/// The `max.message.bytes` a new by-key topic gets: room for the largest command
/// (`limits.max_command_bytes`) with its headers, and no less than the results producer's
/// own limit, so that a forward the producer takes the topic takes too.
fn by_key_max_message_bytes(max_command_bytes: usize) -> usize {
    max_command_bytes.saturating_add(64 * 1024).max(crate::pipeline::config::RESULTS_PRODUCER_MAX_BYTES)
}

/// What a topic dedupd creates is for.
#[derive(Debug, Clone, Copy)]
enum Purpose {
    /// Compacted: the latest record of each key is its state.
    Changelog,
    /// Records kept until dedupd deletes what its group committed (`purge`), as Kafka
    /// Streams keeps its repartition topics: a time limit could delete forwarded commands
    /// no instance has processed yet.
    ByKey,
}

/// Creates `name` with `partitions` and `(rf, min_isr)`, for `purpose`.
async fn create(
    config: &Config,
    name: &str,
    partitions: usize,
    (rf, min_isr): (i32, i32),
    purpose: Purpose,
) -> Result<(), PipelineError> {
    let kafka = &config.kafka;
    let admin: AdminClient<DefaultClientContext> = probe::create(&producer_config(kafka)?, "admin")?;
    let timeout = kafka.connect_timeout;
    let min_isr_text = min_isr.to_string();
    let max_bytes_text = by_key_max_message_bytes(config.limits.max_command_bytes.get()).to_string();
    let partitions = i32::try_from(partitions).map_err(failed)?;
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(rf)).set("min.insync.replicas", &min_isr_text);
    let topic = match purpose {
        Purpose::Changelog => topic.set("cleanup.policy", "compact"),
        Purpose::ByKey => {
            topic.set("cleanup.policy", "delete").set("retention.ms", "-1").set("max.message.bytes", &max_bytes_text)
        }
    };
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let created = tokio::time::timeout(timeout + Duration::from_secs(1), admin.create_topics([&topic], &options))
        .await
        .map_err(|_| failed(format!("creating topic {name:?}: no answer in time")))?
        .map_err(|e| failed(format!("creating topic {name:?}: {e}")))?;
    for result in created {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(failed(format!("creating topic {name:?}: {code}"))),
        }
    }
    tracing::info!(topic = %name, ?purpose, partitions, replication_factor = rf, min_insync_replicas = min_isr, "topic created");
    let name = name.to_string();
    let listed = tokio::task::spawn_blocking(move || wait_until_listed(&admin, &name, partitions, timeout)).await;
    if let Ok(Err(topic)) = listed {
        // Not an error: restores read a partition again while their client does not know it (ends.rs).
        tracing::warn!(%topic, ?timeout, "topic created but not yet listed with all its partitions led; going on");
    }
    Ok(())
}

/// Waits up to `timeout` until the cluster's metadata lists `name` with `partitions`
/// partitions, each with a leader: a broker learns of a new topic after its controller, and
/// a client that asks it meanwhile is told the partition is unknown. Blocking; `Err(name)`
/// when the time is up.
fn wait_until_listed(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let listed = admin.inner().fetch_metadata(Some(name), left).is_ok_and(|metadata| {
            metadata.topics().iter().any(|t| {
                t.name() == name
                    && t.error().is_none()
                    && t.partitions().len() == usize::try_from(partitions).unwrap_or(0)
                    && t.partitions().iter().all(|p| p.error().is_none() && p.leader() >= 0)
            })
        });
        if listed {
            return Ok(());
        }
        if left.is_zero() {
            return Err(name.to_string());
        }
        std::thread::sleep(Duration::from_millis(100).min(left));
    }
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

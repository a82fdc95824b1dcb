//! A resource's settings read with DescribeConfigs (a topic, the group, a broker), for what
//! `run` checks at start (`connect`, `changelog::topic`, `session`). A setting is listed
//! with its value, or not at all when the broker gives none.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use super::{KafkaConfig, PipelineError, producer_config};
use crate::connection::probe;

/// `resource`'s settings, or why they could not be read (no permission, no answer within
/// `kafka.connect_timeout`, an answer rdkafka cannot parse); `Err` when no admin client
/// could be made.
pub(super) async fn settings(
    kafka: &KafkaConfig,
    resource: &ResourceSpecifier<'_>,
) -> Result<Result<HashMap<String, String>, String>, PipelineError> {
    let admin: AdminClient<DefaultClientContext> = probe::create(&producer_config(kafka)?, "admin")?;
    let options = AdminOptions::new().request_timeout(Some(kafka.connect_timeout));
    let within = kafka.connect_timeout + Duration::from_secs(1);
    let described = match tokio::time::timeout(within, admin.describe_configs([resource], &options)).await {
        Err(_) => return Ok(Err("no answer in time".into())),
        Ok(Err(e)) => return Ok(Err(e.to_string())),
        Ok(Ok(described)) => described,
    };
    Ok(match described.into_iter().next() {
        None => Err("no answer".into()),
        Some(Err(code)) => Err(format!("{code:?}")),
        Some(Ok(config)) => Ok(config.entries.into_iter().filter_map(|e| Some((e.name, e.value?))).collect()),
    })
}

//! The intake beside the pipeline (`[intake]`): its Kafka clients, made as every client of
//! the cluster is, and its serving for one run of the pipeline.

use std::net::SocketAddr;
use std::sync::Arc;

use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::FutureProducer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Core, PipelineError, changelog};
use crate::config::Config;
use crate::intake::{Checks, IntakeConfig, IntakeError, Parts};

/// Serves the intake on `listener` for this run, until `stop`.
pub(super) async fn serve(
    config: &Config,
    intake: &IntakeConfig,
    listener: &std::net::TcpListener,
    core: &Core,
    stop: &CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), PipelineError> {
    let kafka = &config.kafka;
    let topic = intake.topic.clone().or_else(|| kafka.input_topics.first().cloned()).unwrap_or_default();
    let parts = Parts {
        config: intake,
        topic,
        producer: producer(config)?,
        results: (kafka.results_topic.clone(), results_reader(config)?),
        checks: Checks {
            envelope: config.envelope.clone(),
            limits: config.limits.clone(),
            router: Arc::clone(core.engine.router()),
        },
        store: Arc::clone(&core.store),
        owner: core.changelog.as_ref().map(changelog::Changelog::key_owner),
        metrics: Arc::clone(&core.metrics),
    };
    Ok(crate::intake::serve(listener, parts, stop.clone()).await?)
}

/// Idempotent, `acks=all`, no linger (a request waits on it), and Kafka's murmur2
/// partitioner: a key lands on the partition `kafka.copartitioned` expects it on.
/// `kafka.producer` applies as to the results producer, but for the partitioner.
fn producer(config: &Config) -> Result<FutureProducer, PipelineError> {
    let kafka = &config.kafka;
    let mut c = kafka.client_config(&[("linger.ms", "0"), ("message.timeout.ms", "30000")], &kafka.producer)?;
    c.set("enable.idempotence", "true").set("acks", "all").set("partitioner", "murmur2_random");
    c.create().map_err(|e| IntakeError::Kafka(format!("cannot create the producer: {e}")).into())
}

/// The results topic's reader: assigned (in no group), `read_committed` under transactional
/// results so that no aborted result answers a request.
fn results_reader(config: &Config) -> Result<BaseConsumer, PipelineError> {
    let kafka = &config.kafka;
    let isolation = if kafka.transactional_results { "read_committed" } else { "read_uncommitted" };
    let mut c = kafka.client_config(&[("fetch.wait.max.ms", "50")], &Default::default())?;
    c.set("group.id", format!("{}.dedupd-intake", kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", isolation);
    c.create().map_err(|e| IntakeError::Kafka(format!("cannot create the results reader: {e}")).into())
}

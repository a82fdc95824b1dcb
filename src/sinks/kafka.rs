//! The `kafka` sink: produces one record per command to a topic through an idempotent
//! producer (`enable.idempotence=true`, `acks=all`), and forwards the key so that a
//! consumer downstream can deduplicate a crash re-run.
//!
//! What goes out, per attempt:
//! - record key = the idempotency key (so one command always lands in one partition);
//! - headers `idempotency-key: <key>`, `dedupd-command-type: <type>`, `dedupd-attempt: <n>`,
//!   and `traceparent` (with `tracestate`) when there is one;
//! - value = the payload as JSON, or `template` rendered from it (a JSON value whose
//!   string leaves may name payload fields, see [`super::template`]).
//!
//! Each call ends answered (acknowledged, or refused by the cluster for good), never sent
//! (librdkafka would not take the message) or maybe (a delivery timeout, anything else):
//! see [`classify`]; the key is forwarded, so a transient failure, answered or not, is
//! retried with the same key.
//!
//! The stored result is `{"topic", "partition", "offset"}` of the acknowledged record.
//! Failures are classified in [`classify`]; `[sinks.NAME.check]` finds a command's record
//! in the topic by its key header ([`check`]).

pub mod check;
pub(crate) mod classify;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::limit::SinkLimits;
use super::template::JsonTemplate;
use super::{CallAnswer, CheckAnswer, CheckTiming};
use super::{Problem, Problems, SinkBuildError, SinkEffect, SinkError, SinkKind, SinkOutput, SinkRequest};
use crate::connection::{ConnectionConfig, ConnectionError};
use check::{KEY_HEADER, KafkaCheck, KafkaCheckConfig};
use classify::{Class, classify, delivery_answer};

/// Config of a `kafka` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Comma-separated `host:port` list of the target cluster's brokers (`brokers` is
    /// accepted as another name); `kafka.bootstrap_servers` when unset.
    #[serde(alias = "brokers", default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_servers: Option<String>,
    /// librdkafka connection settings of the target cluster. When unset, a sink on the
    /// main cluster (no `bootstrap_servers`, or the same as `kafka.bootstrap_servers`)
    /// uses `[kafka.connection]`; a sink on another cluster gets none of it, so the main
    /// cluster's credentials never go elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionConfig>,
    /// Whether `connection` is `[kafka.connection]`, taken by [`Self::inherit_main_cluster`]
    /// (its problems are reported there, once).
    #[serde(skip)]
    connection_inherited: bool,
    /// The topic records are produced to.
    pub topic: String,
    /// The record value as a JSON template over the payload; the payload itself when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Value>,
    /// Extra librdkafka producer properties, passed through verbatim (like
    /// `kafka.producer.*`); those that would weaken delivery are refused.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
    /// How long one attempt may wait for the broker's acknowledgement
    /// (librdkafka `message.timeout.ms`); past it the attempt is transient.
    #[serde(default = "default_delivery_timeout", with = "humantime_serde")]
    pub delivery_timeout: Duration,
    /// Rate and concurrency limits.
    #[serde(default)]
    pub limits: SinkLimits,
    /// The circuit breaker (`[sinks.NAME.circuit]`, see docs/sinks.md).
    #[serde(default)]
    pub circuit: crate::sinks::circuit::CircuitConfig,
    /// The check (`[sinks.NAME.check]`): finding a command's record in the topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<KafkaCheckConfig>,
}

fn default_delivery_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Producer properties dedupd sets itself: the sink's delivery guarantee rests on them.
const RESERVED: [&str; 5] =
    ["bootstrap.servers", "enable.idempotence", "acks", "message.timeout.ms", "delivery.timeout.ms"];

impl KafkaSinkConfig {
    /// Completes a sink of the main cluster: without `bootstrap_servers` it takes the main
    /// cluster's, and without a `connection` table of its own a sink on the main cluster
    /// takes `main_connection` (see [`KafkaSinkConfig::connection`]).
    pub fn inherit_main_cluster(&mut self, main_bootstrap: &str, main_connection: &ConnectionConfig) {
        let on_main = self.is_on(main_bootstrap);
        if self.bootstrap_servers.is_none() {
            self.bootstrap_servers = Some(main_bootstrap.to_string());
        }
        if on_main && self.connection.is_none() {
            self.connection = Some(main_connection.clone());
            self.connection_inherited = true;
        }
    }
}

impl KafkaSinkConfig {
    /// Whether the sink produces to the cluster at `bootstrap` (the same brokers, in any
    /// order and spelling: `SASL_SSL://b:9092` and `b` are one).
    pub fn is_on(&self, bootstrap: &str) -> bool {
        self.bootstrap_servers.as_deref().is_none_or(|own| crate::connection::servers::same_brokers(own, bootstrap))
    }
}

impl KafkaSinkConfig {
    /// The producer's settings: dedupd's, then `connection`, then `producer`, then the
    /// ones delivery rests on, which nothing overrides. Reads `env`/`file` values now.
    pub fn client_config(&self, name: &str) -> Result<ClientConfig, ConnectionError> {
        let mut c = ClientConfig::new();
        c.set("client.id", "dedupd").set("linger.ms", "2");
        if let Some(connection) = &self.connection {
            connection.apply(&format!("sinks.{name}.connection"), &mut c)?;
        }
        for (k, v) in &self.producer {
            c.set(k, v);
        }
        // Set last, so nothing passed through can weaken them (validate refuses it too).
        c.set("bootstrap.servers", self.bootstrap_servers.as_deref().unwrap_or_default())
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", self.delivery_timeout.as_millis().max(1).to_string());
        Ok(c)
    }

    /// The check's consumer settings: dedupd's, then `connection` (not `producer`: those
    /// are the producer's), then a group id of its own that never joins a group nor commits
    /// (librdkafka assigns partitions only to a consumer with one) and `read_committed`.
    pub fn check_client_config(&self, name: &str) -> Result<ClientConfig, ConnectionError> {
        let mut c = ClientConfig::new();
        c.set("client.id", "dedupd");
        if let Some(connection) = &self.connection {
            connection.apply(&format!("sinks.{name}.connection"), &mut c)?;
        }
        c.set("bootstrap.servers", self.bootstrap_servers.as_deref().unwrap_or_default())
            .set("group.id", format!("dedupd-check-{name}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest");
        Ok(c)
    }
}

impl SinkKind for KafkaSinkConfig {
    fn validate(&self, problems: &mut Problems) {
        if self.bootstrap_servers.as_deref().is_none_or(|b| b.trim().is_empty()) {
            problems.add("bootstrap_servers", "\"\"", "must list at least one host:port");
        }
        if self.topic.trim().is_empty() {
            problems.add("topic", "\"\"", "must not be empty");
        }
        let own_connection = self.connection.as_ref().filter(|_| !self.connection_inherited);
        for (property, value) in own_connection.map(|c| c.per_client_properties()).unwrap_or_default() {
            problems.push(Problem {
                key: crate::connection::key_of(&format!("{}.connection", problems.at()), property),
                value,
                reason: "is set by dedupd for each client (docs/config.md) and cannot be shared".into(),
            });
        }
        for key in RESERVED {
            if let Some(value) = self.producer.get(key) {
                problems.add(
                    &format!("producer.\"{key}\""),
                    value.clone(),
                    "is set by dedupd itself (use bootstrap_servers / delivery_timeout)",
                );
            }
        }
        if self.delivery_timeout < Duration::from_millis(1)
            || self.delivery_timeout > Duration::from_millis(i32::MAX as u64)
        {
            problems.add(
                "delivery_timeout",
                humantime::format_duration(self.delivery_timeout).to_string(),
                "must be between 1ms and ~24 days",
            );
        }
        if let Some(template) = &self.template
            && let Err(e) = JsonTemplate::parse(template)
        {
            problems.add("template", template.to_string(), e.to_string());
        }
        if let Some(check) = &self.check {
            check.validate(self.delivery_timeout, problems);
        }
    }

    fn check_timing(&self) -> Option<CheckTiming> {
        self.check.as_ref().map(|c| c.timing(self.delivery_timeout))
    }

    fn forwards_key(&self) -> bool {
        // The key goes out as record key and header: a downstream consumer can drop a re-run.
        true
    }

    fn call_holds_a_resource(&self) -> bool {
        // Every call goes through one producer.
        false
    }

    fn limits(&self) -> &SinkLimits {
        &self.limits
    }

    fn circuit(&self) -> &crate::sinks::circuit::CircuitConfig {
        &self.circuit
    }

    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError> {
        let sink =
            KafkaSink::new(name, self).map_err(|e| SinkBuildError { name: name.to_string(), reason: e.to_string() })?;
        Ok(Arc::new(sink))
    }
}

/// Why a `kafka` sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSinkError {
    /// The template does not parse.
    #[error("sink `{sink}`: template: {source}")]
    Template {
        /// The sink instance.
        sink: String,
        /// What is wrong.
        #[source]
        source: super::template::TemplateError,
    },
    /// A `connection` value could not be read.
    #[error("{0}")]
    Connection(#[from] ConnectionError),
    /// librdkafka refused the producer configuration.
    #[error("sink `{sink}`: cannot create the producer: {reason}")]
    Producer {
        /// The sink instance.
        sink: String,
        /// librdkafka's reason, secrets cut out.
        reason: String,
    },
}

/// A `kafka` sink at run time: one producer per instance.
pub struct KafkaSink {
    name: String,
    topic: String,
    template: Option<JsonTemplate>,
    delivery_timeout: Duration,
    producer: FutureProducer,
    check: Option<KafkaCheck>,
}

impl KafkaSink {
    /// Builds the sink and its producer (librdkafka connects lazily: an unreachable
    /// cluster shows as transient failures, not as a build error).
    pub fn new(name: &str, config: &KafkaSinkConfig) -> Result<KafkaSink, KafkaSinkError> {
        let template = config
            .template
            .as_ref()
            .map(JsonTemplate::parse)
            .transpose()
            .map_err(|source| KafkaSinkError::Template { sink: name.to_string(), source })?;
        let c = config.client_config(name)?;
        let producer = c.create().map_err(|e| KafkaSinkError::Producer {
            sink: name.to_string(),
            reason: crate::connection::check::client_error(&c, &e),
        })?;
        let check = match &config.check {
            Some(check) => Some(KafkaCheck::new(&config.topic, config.check_client_config(name)?, check)),
            None => None,
        };
        Ok(KafkaSink {
            name: name.to_string(),
            topic: config.topic.clone(),
            template,
            delivery_timeout: config.delivery_timeout,
            producer,
            check,
        })
    }
}

#[async_trait::async_trait]
impl SinkEffect for KafkaSink {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let bytes = match self.value(&request) {
            Ok(bytes) => bytes,
            Err(e) => {
                // Refused before anything was handed to the producer.
                request.never_sent();
                return Err(e);
            }
        };
        let attempt = request.attempt().to_string();
        let mut headers = OwnedHeaders::new()
            .insert(Header { key: KEY_HEADER, value: Some(request.key()) })
            .insert(Header { key: "dedupd-command-type", value: Some(request.kind()) })
            .insert(Header { key: "dedupd-attempt", value: Some(attempt.as_str()) });
        for (key, value) in [("traceparent", request.traceparent()), ("tracestate", request.tracestate())] {
            if let Some(value) = value {
                headers = headers.insert(Header { key, value: Some(value) });
            }
        }
        let record = FutureRecord::to(&self.topic).key(request.key()).payload(&bytes).headers(headers);
        let delivery = match self.enqueue(record, &request).await {
            Ok(delivery) => delivery,
            Err(err) => {
                // librdkafka refused the message itself (a queue that stayed full, a message
                // over the client's message.max.bytes, an unknown partition): it never
                // entered the producer, so nothing of it left.
                request.never_sent();
                return Err(self.failure(&request, &err));
            }
        };
        // librdkafka reports every message within message.timeout.ms; the outer bound is
        // a safety net so that an attempt can never hang.
        let bound = self.delivery_timeout.saturating_add(Duration::from_secs(5));
        match tokio::time::timeout(bound, delivery).await {
            Ok(Ok(Ok(delivery))) => {
                request.answered();
                tracing::debug!(sink = %self.name, key = request.key(), partition = delivery.partition, offset = delivery.offset, "kafka sink: acknowledged");
                Ok(json!({ "topic": self.topic, "partition": delivery.partition, "offset": delivery.offset }))
            }
            Ok(Ok(Err((err, _message)))) => {
                if delivery_answer(&err) == CallAnswer::Answered {
                    request.answered();
                }
                Err(self.failure(&request, &err))
            }
            // The producer dropped the delivery: its outcome is unknown (maybe).
            Ok(Err(_canceled)) => Err(self.failure(&request, &KafkaError::Canceled)),
            // No report in time: the record may have been written (maybe).
            Err(_) => Err(SinkError::Transient {
                message: format!(
                    "producing to `{}`: no acknowledgement within {}",
                    self.topic,
                    humantime::format_duration(bound)
                ),
                retry_after: None,
            }),
        }
    }

    async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        match &self.check {
            Some(check) => check.check(request).await,
            None => CheckAnswer::Error(format!("sink `{}` has no [sinks.{}.check]", self.name, self.name)),
        }
    }
}

impl KafkaSink {
    /// The record's value: the payload, or the template rendered from it.
    fn value(&self, request: &SinkRequest<'_>) -> Result<Vec<u8>, SinkError> {
        let value = match &self.template {
            Some(template) => template.render(request.payload()).map_err(|e| permanent(e.to_string()))?,
            None => request.payload().clone(),
        };
        serde_json::to_vec(&value).map_err(|e| permanent(format!("cannot serialise the value: {e}")))
    }

    /// Hands the record to the producer, waiting up to `delivery_timeout` while its queue is
    /// full (as `FutureProducer::send` does, but telling a refused enqueue from a failed
    /// delivery), or until the caller gives up: nothing left then either.
    async fn enqueue(
        &self,
        mut record: FutureRecord<'_, str, Vec<u8>>,
        request: &SinkRequest<'_>,
    ) -> Result<DeliveryFuture, KafkaError> {
        let until = tokio::time::Instant::now() + self.delivery_timeout;
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((full @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if tokio::time::Instant::now() < until =>
                {
                    record = back;
                    tokio::select! {
                        () = request.given_up() => return Err(full),
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
                Err((err, _)) => return Err(err),
            }
        }
    }

    /// The failure `err` of `request`'s call, classified.
    fn failure(&self, request: &SinkRequest<'_>, err: &KafkaError) -> SinkError {
        let message = format!("producing to `{}`: {err}", self.topic);
        tracing::debug!(sink = %self.name, key = request.key(), error = %message, "kafka sink: not delivered");
        match classify(err) {
            Class::Transient => SinkError::Transient { message, retry_after: None },
            Class::Permanent => permanent(message),
        }
    }
}

fn permanent(message: String) -> SinkError {
    SinkError::Permanent { result: json!({ "error": message }), message }
}

#[cfg(test)]
mod tests;

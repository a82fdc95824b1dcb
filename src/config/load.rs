//! Loading a [`Config`]: the TOML file, the `DEDUPD_*` environment overrides, and
//! [`Config::validate`], which names the key, the value and the reason of what is wrong.

use super::env::EnvOverrides;
use super::*;
use crate::problems::Problems;

impl Config {
    /// Reads `path`, applies `DEDUPD_*` overrides from `env`, and validates.
    pub fn load(
        path: &std::path::Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let config = Self::read(path, env)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text, applies `DEDUPD_*` overrides from `env`, and validates.
    pub fn from_toml_str(text: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let config = Self::read_toml_str(text, env)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads `path` and applies `DEDUPD_*` overrides like [`load`](Self::load), without
    /// validating: `check-config` then lists every [`problem`](Self::problems).
    pub fn read(
        path: &std::path::Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::read_toml_str(&text, env)
    }

    pub(super) fn read_toml_str(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| super::env::not_toml(text, &e))?;
        let overrides = EnvOverrides::read(env)?;
        let set_by_env = overrides.keys();
        let mut config: Config = overrides.apply(text, table)?;
        config.set_by_env = set_by_env;
        config.complete_kafka_sinks();
        Ok(config)
    }

    /// Kafka sinks on the main cluster take its servers and `[kafka.connection]`.
    fn complete_kafka_sinks(&mut self) {
        for sink in self.sinks.values_mut() {
            if let SinkConfig::Kafka(k) = sink {
                k.inherit_main_cluster(&self.kafka.bootstrap_servers, &self.kafka.connection);
            }
        }
    }

    /// Checks what serde cannot: references, ranges and patterns. Names the key on error;
    /// the first of [`problems`](Self::problems).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Everything [`validate`](Self::validate) refuses, in file order of sections; a
    /// problem with a key a `DEDUPD_*` variable set names that variable.
    pub fn problems(&self) -> Vec<ConfigError> {
        self.rule_problems().into_iter().map(|e| self.blame_env(e)).collect()
    }

    /// `e` as the error of the variable that set its key, if one did.
    fn blame_env(&self, e: ConfigError) -> ConfigError {
        let ConfigError::Invalid { key, .. } = &e else { return e };
        match self.variable_setting(key) {
            Some(var) => ConfigError::Env { var: var.to_string(), reason: e.to_string() },
            None => e,
        }
    }

    /// The `DEDUPD_*` variable that set `key` (`kafka.connection."ssl.ca.location"`) or a
    /// table holding it, if one did.
    pub fn variable_setting(&self, key: &str) -> Option<&str> {
        let key = key.to_ascii_lowercase();
        self.set_by_env
            .iter()
            .find(|(set, _)| {
                key.strip_prefix(set.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .map(|(_, var)| var.as_str())
    }

    /// Every section's own problems, then the rules that span sections, as errors.
    fn rule_problems(&self) -> Vec<ConfigError> {
        let mut problems = Problems::new("");
        problems.within("kafka", |p| self.kafka.validate(p));
        problems.within("store", |p| self.store.validate(p));
        validate_changelog(self, &mut problems);
        problems.within("retry", |p| self.retry.validate(p));
        for (name, sink) in &self.sinks {
            problems.within(&format!("sinks.{name}"), |p| sink.validate(p));
        }
        for (i, route) in self.routes.iter().enumerate() {
            problems.within(&format!("routes[{i}]"), |p| route.validate(p));
        }
        validate_route_references(&self.routes, &self.sinks, self.store.max_ttl, &mut problems);
        validate_sizes(self, &mut problems);
        problems.within("http", |p| self.http.validate(p));
        problems.within("log", |p| self.log.validate(p));
        if let Some(intake) = &self.intake {
            problems.within("intake", |p| intake.validate(p));
            validate_intake(self, intake, &mut problems);
        }
        problems.into_vec().into_iter().map(ConfigError::from).collect()
    }
}

/// `store.changelog` and what it needs: transactions (a claim is committed to the changelog
/// before its sink runs, the completion with the result and the offsets) and, for the
/// by-key hop, an internal topic that is not also an input topic.
fn validate_changelog(c: &Config, problems: &mut Problems) {
    let s = &c.store;
    if let Some(topic) = &s.changelog_topic
        && (topic.trim().is_empty() || c.kafka.input_topics.contains(topic))
    {
        problems.add("store.changelog_topic", topic, "must be a non-empty topic that is not an input topic");
    }
    if !s.changelog {
        return;
    }
    if !c.kafka.transactional_results {
        problems.add(
            "store.changelog",
            "true",
            "needs kafka.transactional_results = true (claims, completions, results and offsets are committed in Kafka transactions)",
        );
    }
    let by_key = format!("{}.dedupd-by-key", c.kafka.group_id);
    if !c.kafka.copartitioned && c.kafka.input_topics.contains(&by_key) {
        problems.add(
            "kafka.input_topics",
            &by_key,
            "is the by-key topic dedupd forwards input to under store.changelog; it cannot be an input topic too",
        );
    }
    if c.kafka.copartitioned && c.kafka.input_topics.len() > 1 {
        // Kafka's assignors (roundrobin, KIP-848's on the broker) need not give partition p
        // of every topic to one member: two instances would then own state partition p.
        problems.add(
            "kafka.copartitioned",
            "true",
            format!(
                "takes one input topic, not {}: Kafka need not assign partition p of every input topic to one instance, and two owners of state partition p would each run its keys; set it to false (commands then reach their state partition through the by-key topic)",
                c.kafka.input_topics.len()
            ),
        );
    }
    if !c.kafka.copartitioned
        && let Some(reset) = c.kafka.consumer.get("auto.offset.reset")
        && !matches!(reset.trim(), "earliest" | "smallest" | "beginning")
    {
        // The by-key topic is read by the same consumer: a partition of it that moves with
        // no committed offset must be read from its start, or the commands on it are lost.
        problems.add(
            "kafka.consumer.\"auto.offset.reset\"",
            reset,
            "must be earliest under store.changelog without kafka.copartitioned: the by-key topic is read by the same consumer, and a partition of it with no committed offset read from its end loses the commands forwarded to it",
        );
    }
}

/// `[intake]` against the rest: it produces native envelopes to an input topic, with the
/// key where `envelope.key` looks, on a listener of its own.
fn validate_intake(c: &Config, intake: &crate::intake::IntakeConfig, problems: &mut Problems) {
    use crate::envelope::{EnvelopeFormat, KeySource};
    if let Some(topic) = &intake.topic
        && !c.kafka.input_topics.contains(topic)
    {
        problems.add(
            "intake.topic",
            topic,
            "must be one of kafka.input_topics (the pipeline runs what the intake produces)",
        );
    }
    let format = match c.envelope.format {
        EnvelopeFormat::ToolCall => Some("tool_call"),
        EnvelopeFormat::Cloudevents => Some("cloudevents"),
        EnvelopeFormat::Auto | EnvelopeFormat::Native => None,
    };
    if let Some(format) = format {
        problems.add(
            "envelope.format",
            format,
            "must be auto or native with [intake]: the intake produces native envelopes",
        );
    }
    if let KeySource::JsonPointer(pointer) = &c.envelope.key
        && pointer != "/id"
    {
        problems.add(
            "envelope.key",
            &c.envelope.key,
            "must not be a JSON pointer other than /id with [intake]: the intake's envelopes carry the key in id",
        );
    }
    if intake.listen == c.http.listen && intake.listen.port() != 0 {
        problems.add("intake.listen", intake.listen, "must not be http.listen: the intake has a listener of its own");
    }
}

/// `[[routes]]` against the rest: each names a sink of `[sinks]`, and its TTL is under
/// `store.max_ttl` (it would be cut to the cap without a word).
fn validate_route_references(
    routes: &[RouteConfig],
    sinks: &BTreeMap<String, SinkConfig>,
    max_ttl: std::time::Duration,
    problems: &mut Problems,
) {
    for (i, route) in routes.iter().enumerate() {
        if !sinks.contains_key(&route.sink) {
            problems.add(&format!("routes[{i}].sink"), &route.sink, "names no sink in [sinks]");
        }
        if let Some(ttl) = route.ttl
            && ttl > max_ttl
        {
            problems.add(
                &format!("routes[{i}].ttl"),
                humantime::format_duration(ttl),
                format!("is above store.max_ttl ({}), which caps every TTL", humantime::format_duration(max_ttl)),
            );
        }
    }
}

/// A command `limits.max_command_bytes` admits fits in one record of the results
/// producer, so that its dead-letter copy can be published intact, and in a key's record
/// (at most `sinks::MAX_RESULT_BYTES`, as a result), so that an export line holding it is
/// one an import reads.
fn validate_sizes(c: &Config, problems: &mut Problems) {
    let max_command = c.limits.max_command_bytes.get();
    if max_command > crate::sinks::MAX_RESULT_BYTES {
        problems.add(
            "limits.max_command_bytes",
            max_command,
            format!(
                "must be at most {} (8 MiB): a command in doubt is kept in its key's record",
                crate::sinks::MAX_RESULT_BYTES
            ),
        );
    }
    let key = "kafka.producer.\"message.max.bytes\"";
    let producer_max = match c.kafka.producer.get("message.max.bytes") {
        None => crate::pipeline::config::RESULTS_PRODUCER_MAX_BYTES,
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) => n,
            Err(_) => return problems.add(key, text, "is not a number of bytes"),
        },
    };
    if max_command > producer_max {
        problems.add(
            key,
            producer_max,
            format!(
                "is below limits.max_command_bytes = {max_command}: a command's dead-letter copy could not be \
                 published; raise it or lower limits.max_command_bytes"
            ),
        );
    }
}

//! Loading a [`Config`]: the TOML file, the `DEDUPD_*` environment overrides, and
//! [`Config::validate`], which names the key, the value and the reason of what is wrong.

use super::env::EnvOverrides;
use super::*;
use crate::pipeline::config::KafkaConfig;
use crate::store::StoreConfig;

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

    fn rule_problems(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        validate_kafka(&self.kafka, &mut errors);
        validate_store(&self.store, &mut errors);
        validate_changelog(self, &mut errors);
        if self.retry.initial_backoff.is_zero() {
            // Doubling zero stays zero: every retry would follow its failure at once.
            errors.push(invalid("retry.initial_backoff", "0s", "must be positive"));
        }
        if self.retry.max_backoff < self.retry.initial_backoff {
            errors.push(invalid(
                "retry.max_backoff",
                humantime::format_duration(self.retry.max_backoff),
                "must be at least retry.initial_backoff",
            ));
        }
        for (name, sink) in &self.sinks {
            for (key, value, reason) in sink.problems(&format!("sinks.{name}")) {
                errors.push(invalid(&key, value, reason));
            }
        }
        validate_routes(&self.routes, &self.sinks, self.store.max_ttl, &mut errors);
        validate_sizes(self, &mut errors);
        if let Some(token) = &self.http.admin_token
            && token.len() < 16
        {
            errors.push(invalid("http.admin_token", "(hidden)", "must be at least 16 characters"));
        }
        if let Err(e) = self.log.level.parse::<tracing_subscriber::EnvFilter>() {
            errors.push(invalid("log.level", &self.log.level, format!("is not a tracing filter: {e}")));
        }
        errors
    }
}

/// `kafka.bootstrap_servers`: at least one entry, each a broker address.
fn validate_bootstrap(servers: &str, errors: &mut Vec<ConfigError>) {
    if servers.trim().is_empty() {
        errors.push(invalid("kafka.bootstrap_servers", "\"\"", "must list at least one host:port"));
    } else if let Some(bad) = servers.split(',').find(|s| crate::connection::servers::broker_address(s).is_none()) {
        errors.push(invalid(
            "kafka.bootstrap_servers",
            format!("{servers:?}"),
            format!("{:?} is not a host:port (port 1-65535; an IPv6 host in brackets)", bad.trim()),
        ));
    }
}

/// `[kafka]` on its own: non-empty names, no loops from results to input, no property
/// that dedupd sets itself, and no feature that is not there yet.
fn validate_kafka(k: &KafkaConfig, errors: &mut Vec<ConfigError>) {
    validate_bootstrap(&k.bootstrap_servers, errors);
    if k.group_id.trim().is_empty() {
        errors.push(invalid("kafka.group_id", "\"\"", "must not be empty"));
    }
    if k.input_topics.is_empty() || k.input_topics.iter().any(|t| t.trim().is_empty()) {
        errors.push(invalid(
            "kafka.input_topics",
            format!("[{}]", k.input_topics.join(", ")),
            "must list non-empty topic names",
        ));
    }
    for (key, topic) in [("kafka.results_topic", &k.results_topic), ("kafka.dead_letter_topic", &k.dead_letter_topic)] {
        if topic.trim().is_empty() {
            errors.push(invalid(key, "\"\"", "must not be empty"));
        }
        if k.input_topics.contains(topic) {
            errors.push(invalid(
                key,
                topic,
                "must not be one of kafka.input_topics (results would be consumed as commands)",
            ));
        }
    }
    for forbidden in ["enable.auto.offset.store", "group.id", "bootstrap.servers"] {
        if k.consumer.contains_key(forbidden) {
            errors.push(invalid(
                &format!("kafka.consumer.\"{forbidden}\""),
                &k.consumer[forbidden],
                "is set by dedupd itself; use the dedicated key",
            ));
        }
    }
    for (property, value) in k.connection.per_client_properties() {
        errors.push(invalid(
            &crate::connection::key_of("kafka.connection", property),
            value,
            "is set by dedupd for each client (docs/config.md) and cannot be shared",
        ));
    }
    for forbidden in ["bootstrap.servers", "enable.idempotence", "acks", "transactional.id"] {
        if let Some(value) = k.producer.get(forbidden) {
            errors.push(invalid(
                &format!("kafka.producer.\"{forbidden}\""),
                crate::connection::shown_text(forbidden, value),
                "is set by dedupd itself: results are published idempotently with acks=all",
            ));
        }
    }
    if k.connect_timeout.is_zero() {
        errors.push(invalid("kafka.connect_timeout", "0s", "must be positive"));
    }
    if k.transaction_interval.is_zero() {
        errors.push(invalid("kafka.transaction_interval", "0s", "must be positive"));
    }
    // Measured (docs/decisions.md, "Rebalance protocol"): under the classic protocol's
    // cooperative assignor, the broker refuses the transaction committed on a revoke, so
    // every rebalance fenced and restarted an instance, and left keys indeterminate.
    let classic = k.consumer.get("group.protocol").is_none_or(|p| p.trim().eq_ignore_ascii_case("classic"));
    if let Some(strategy) = k.consumer.get("partition.assignment.strategy")
        && k.transactional_results
        && classic
        && strategy.contains("cooperative")
    {
        errors.push(invalid(
            "kafka.consumer.\"partition.assignment.strategy\"",
            strategy,
            "cannot be cooperative with kafka.transactional_results under the classic group protocol: the broker refuses \
             the transaction committed on a revoke, fencing the instance at every rebalance; for incremental rebalances \
             use kafka.consumer.\"group.protocol\" = \"consumer\" (Kafka 4.0 or later)",
        ));
    }
}

/// The largest `store.max_ttl`: beyond it an expiry is no longer a date anyone means (and far
/// beyond it, past year 262143, not one that can be written).
const MAX_TTL_CAP: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// `[store]` on its own: positive TTLs and intervals, the cap above the default.
fn validate_store(s: &StoreConfig, errors: &mut Vec<ConfigError>) {
    if s.default_ttl.is_zero() {
        errors.push(invalid("store.default_ttl", "0s", "must be positive"));
    }
    if s.max_ttl > MAX_TTL_CAP {
        errors.push(invalid(
            "store.max_ttl",
            humantime::format_duration(s.max_ttl),
            "must be at most 100 years: a record is kept at most this long",
        ));
    }
    if s.max_ttl < s.default_ttl {
        errors.push(invalid(
            "store.max_ttl",
            humantime::format_duration(s.max_ttl),
            "must be at least store.default_ttl",
        ));
    }
    if s.compaction_interval.is_zero() {
        errors.push(invalid("store.compaction_interval", "0s", "must be positive"));
    }
}

/// `store.changelog` and what it needs: transactions (a claim is committed to the changelog
/// before its sink runs, the completion with the result and the offsets) and, for the
/// by-key hop, an internal topic that is not also an input topic.
fn validate_changelog(c: &Config, errors: &mut Vec<ConfigError>) {
    let s = &c.store;
    if s.changelog_replication_factor == 0 {
        errors.push(invalid("store.changelog_replication_factor", "0", "must be at least 1"));
    }
    if s.changelog_min_insync_replicas == 0 {
        errors.push(invalid("store.changelog_min_insync_replicas", "0", "must be at least 1"));
    }
    if let Some(topic) = &s.changelog_topic
        && (topic.trim().is_empty() || c.kafka.input_topics.contains(topic))
    {
        errors.push(invalid("store.changelog_topic", topic, "must be a non-empty topic that is not an input topic"));
    }
    if !s.changelog {
        if s.standby {
            errors.push(invalid(
                "store.standby",
                "true",
                "needs store.changelog = true (a standby tails the changelog)",
            ));
        }
        return;
    }
    if !c.kafka.transactional_results {
        errors.push(invalid(
            "store.changelog",
            "true",
            "needs kafka.transactional_results = true (claims, completions, results and offsets are committed in Kafka transactions)",
        ));
    }
    let by_key = format!("{}.dedupd-by-key", c.kafka.group_id);
    if !c.kafka.copartitioned && c.kafka.input_topics.contains(&by_key) {
        errors.push(invalid(
            "kafka.input_topics",
            &by_key,
            "is the by-key topic dedupd forwards input to under store.changelog; it cannot be an input topic too",
        ));
    }
    if c.kafka.copartitioned && c.kafka.input_topics.len() > 1 {
        // Kafka's assignors (roundrobin, KIP-848's on the broker) need not give partition p
        // of every topic to one member: two instances would then own state partition p.
        errors.push(invalid(
            "kafka.copartitioned",
            "true",
            format!(
                "takes one input topic, not {}: Kafka need not assign partition p of every input topic to one instance, and two owners of state partition p would each run its keys; set it to false (commands then reach their state partition through the by-key topic)",
                c.kafka.input_topics.len()
            ),
        ));
    }
    if !c.kafka.copartitioned
        && let Some(reset) = c.kafka.consumer.get("auto.offset.reset")
        && !matches!(reset.trim(), "earliest" | "smallest" | "beginning")
    {
        // The by-key topic is read by the same consumer: a partition of it that moves with
        // no committed offset must be read from its start, or the commands on it are lost.
        errors.push(invalid(
            "kafka.consumer.\"auto.offset.reset\"",
            reset,
            "must be earliest under store.changelog without kafka.copartitioned: the by-key topic is read by the same consumer, and a partition of it with no committed offset read from its end loses the commands forwarded to it",
        ));
    }
}

/// `[[routes]]`: each names a sink of `[sinks]`, has valid globs, a positive TTL and JSON
/// pointers for its exclusions.
fn validate_routes(
    routes: &[RouteConfig],
    sinks: &BTreeMap<String, SinkConfig>,
    max_ttl: std::time::Duration,
    errors: &mut Vec<ConfigError>,
) {
    for (i, route) in routes.iter().enumerate() {
        let at = format!("routes[{i}]");
        if !sinks.contains_key(&route.sink) {
            errors.push(invalid(&format!("{at}.sink"), &route.sink, "names no sink in [sinks]"));
        }
        if route.types.is_empty() {
            errors.push(invalid(&format!("{at}.types"), "[]", "must list at least one type or glob"));
        }
        for t in &route.types {
            if let Err(e) = globset::Glob::new(t) {
                errors.push(invalid(&format!("{at}.types"), t, format!("is not a valid glob: {e}")));
            }
        }
        match route.ttl {
            Some(ttl) if ttl.is_zero() => errors.push(invalid(&format!("{at}.ttl"), "0s", "must be positive")),
            // It would be cut to the cap without a word.
            Some(ttl) if ttl > max_ttl => errors.push(invalid(
                &format!("{at}.ttl"),
                humantime::format_duration(ttl),
                format!("is above store.max_ttl ({}), which caps every TTL", humantime::format_duration(max_ttl)),
            )),
            _ => {}
        }
        for p in &route.fingerprint_exclude {
            if !(p.is_empty() || p.starts_with('/')) {
                errors.push(invalid(
                    &format!("{at}.fingerprint_exclude"),
                    p,
                    "must be a JSON pointer starting with '/'",
                ));
            }
        }
    }
}

/// A command `limits.max_command_bytes` admits fits in one record of the results
/// producer, so that its dead-letter copy can be published intact, and in a key's record
/// (at most `sinks::MAX_RESULT_BYTES`, as a result), so that an export line holding it is
/// one an import reads.
fn validate_sizes(c: &Config, errors: &mut Vec<ConfigError>) {
    let max_command = c.limits.max_command_bytes.get();
    if max_command > crate::sinks::MAX_RESULT_BYTES {
        errors.push(invalid(
            "limits.max_command_bytes",
            max_command,
            format!(
                "must be at most {} (8 MiB): a command in doubt is kept in its key's record",
                crate::sinks::MAX_RESULT_BYTES
            ),
        ));
    }
    let key = "kafka.producer.\"message.max.bytes\"";
    let producer_max = match c.kafka.producer.get("message.max.bytes") {
        None => crate::pipeline::config::RESULTS_PRODUCER_MAX_BYTES,
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) => n,
            Err(_) => return errors.push(invalid(key, text, "is not a number of bytes")),
        },
    };
    if max_command > producer_max {
        errors.push(invalid(
            key,
            producer_max,
            format!(
                "is below limits.max_command_bytes = {max_command}: a command's dead-letter copy could not be \
                 published; raise it or lower limits.max_command_bytes"
            ),
        ));
    }
}

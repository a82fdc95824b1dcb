//! `dedupd check-config [--connect]`: everything `run` would refuse, found before it runs.
//!
//! Without `--connect` nothing touches the network: the config's own rules (every broken
//! one, not the first), then each Kafka client's settings through librdkafka's parser and
//! its client builder (see [`crate::connection::check`]). With `--connect` it also
//! connects as the consumer and the results producer, checks that the topics exist and
//! that the consumer group's offsets can be read — without joining the group, which would
//! rebalance a running instance.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::CliError;
use super::output::print_line;
use crate::config::{Config, ConfigError, line_of};
use crate::connection::check::{Problem, check_client, check_properties};
use crate::connection::probe::{self, ClusterView};
use crate::connection::{ConnectionConfig, PropertyValue};
use crate::pipeline::{KafkaConfig, consumer_config, producer_config};
use crate::sinks::SinkConfig;

/// Runs the check; the exit code is 0 when nothing is wrong.
pub(super) fn check_config(path: &Path, connect: bool) -> Result<ExitCode, CliError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    let config = match Config::read(path, std::env::vars()) {
        Ok(config) => config,
        // Nothing to check the rules of: the one problem, in the same form.
        Err(e @ (ConfigError::Parse { .. } | ConfigError::Value { .. } | ConfigError::Env { .. })) => {
            return print_problems(path, &[unread_problem(&e)]);
        }
        Err(e) => return Err(e.into()),
    };
    let mut problems: Vec<(Option<usize>, String)> = config
        .problems()
        .into_iter()
        .map(|e| (line_of(&text, &key_of_error(&e)), e.to_string()))
        .chain(kafka_problems_worded(&config).into_iter().map(|(key, m)| (key.and_then(|k| line_of(&text, &k)), m)))
        .chain(telemetry_problem(&config).map(|message| (line_of(&text, "telemetry.traces"), message)))
        .collect();
    // In file order; problems of no one line (a whole client) last.
    problems.sort_by_key(|(line, _)| line.unwrap_or(usize::MAX));
    if !problems.is_empty() {
        return print_problems(path, &problems);
    }
    print_line(format_args!(
        "{}: ok ({} sink(s), {} route(s), store {} at {})",
        path.display(),
        config.sinks.len(),
        config.routes.len(),
        super::output::config_name(&config.store.backend),
        config.store.path.display()
    ))?;
    for line in config.kafka.connection.shown() {
        print_line(format_args!("  kafka.connection: {line}"))?;
    }
    if connect {
        return check_cluster(&config);
    }
    Ok(ExitCode::SUCCESS)
}

/// A standard `OTEL_*` variable `run` would refuse with these traces settings.
fn telemetry_problem(config: &Config) -> Option<String> {
    crate::telemetry::config::chosen(&config.telemetry, &|var| std::env::var(var).ok()).err().map(|e| e.to_string())
}

/// Each problem as `FILE:LINE: message` (`FILE: message` with no line), then the count;
/// exit 2.
fn print_problems(path: &Path, problems: &[(Option<usize>, String)]) -> Result<ExitCode, CliError> {
    for (line, message) in problems {
        match line {
            Some(line) => print_line(format_args!("{}:{line}: {message}", path.display()))?,
            None => print_line(format_args!("{}: {message}", path.display()))?,
        }
    }
    print_line(format_args!("{}: {} problem(s)", path.display(), problems.len()))?;
    Ok(ExitCode::from(2))
}

/// The problem of a file that could not be read as a config: its line, and the message
/// (without the line, which leads it).
fn unread_problem(e: &ConfigError) -> (Option<usize>, String) {
    match e {
        ConfigError::Parse { line, message } => (*line, format!("config is not valid TOML: {message}")),
        ConfigError::Value { line, .. } => (*line, e.to_string()),
        _ => (None, e.to_string()),
    }
}

fn key_of_error(e: &ConfigError) -> String {
    match e {
        ConfigError::Invalid { key, .. } => key.clone(),
        _ => String::new(),
    }
}

/// What `run` refuses before it connects: each problem [`kafka_client_problems`] finds, as
/// `check-config` words it (naming the variable that set the key, if one did).
pub(super) fn kafka_settings_refused(config: &Config) -> Result<(), CliError> {
    let problems: Vec<String> = kafka_problems_worded(config).into_iter().map(|(_, message)| message).collect();
    if problems.is_empty() { Ok(()) } else { Err(CliError::KafkaSettings(problems)) }
}

/// Each problem [`kafka_client_problems`] finds, with the key its line is found by and its
/// message; a key a `DEDUPD_*` variable set is in no line of the file (the nearest would be
/// its table's), so that variable is named instead.
fn kafka_problems_worded(config: &Config) -> Vec<(Option<String>, String)> {
    kafka_client_problems(config)
        .into_iter()
        .map(|p| match config.variable_setting(&p.key) {
            Some(var) => (None, ConfigError::Env { var: var.to_string(), reason: p.to_string() }.to_string()),
            None => (Some(p.key.clone()), p.to_string()),
        })
        .collect()
}

/// Each Kafka client's tables on their own, then each client whole (when its tables
/// passed, so that one bad property is reported once).
fn kafka_client_problems(config: &Config) -> Vec<Problem> {
    let kafka = &config.kafka;
    let mut problems = table_problems("kafka.connection", &kafka.connection);
    let shared_ok = problems.is_empty() && kafka.connection.per_client_properties().is_empty();
    let mut whole_client: Option<Problem> = None;
    for (at, table, client) in
        [("kafka.consumer", &kafka.consumer, "consumer"), ("kafka.producer", &kafka.producer, "results producer")]
    {
        let own = check_properties(at, table.iter().map(|(k, v)| (k.as_str(), PropertyValue::Text(v.clone()))));
        if shared_ok && own.is_empty() {
            let settings = if client == "consumer" { consumer_config(kafka) } else { producer_config(kafka) };
            if let Ok(settings) = settings
                && let Err(p) = check_client(client, &settings)
            {
                // Both clients refused for one reason (most often in [kafka.connection]): once.
                whole_client = Some(match whole_client.take() {
                    Some(first) if first.reason == p.reason => {
                        Problem { key: "consumer and results producer".into(), reason: p.reason }
                    }
                    Some(first) => {
                        problems.push(first);
                        p
                    }
                    None => p,
                });
            }
        }
        problems.extend(own);
    }
    for (name, sink) in &config.sinks {
        if let SinkConfig::Kafka(k) = sink {
            let mut own = match &k.connection {
                Some(c) if c != &kafka.connection => table_problems(&format!("sinks.{name}.connection"), c),
                _ => Vec::new(),
            };
            let at = format!("sinks.{name}.producer");
            own.extend(check_properties(
                &at,
                k.producer.iter().map(|(p, v)| (p.as_str(), PropertyValue::Text(v.clone()))),
            ));
            // A sink sharing [kafka.connection] would only repeat the clients' problem.
            if own.is_empty()
                && (shared_ok || k.connection.as_ref() != Some(&kafka.connection))
                && let Ok(client) = k.client_config(name)
                && let Err(p) = check_client(&format!("sinks.{name}"), &client)
                && whole_client.as_ref().is_none_or(|w| w.reason != p.reason)
            {
                problems.push(p);
            }
            problems.extend(own);
        }
    }
    problems.extend(whole_client);
    problems
}

fn table_problems(at: &str, table: &ConnectionConfig) -> Vec<Problem> {
    check_properties(at, table.iter().map(|(k, v)| (k, v.clone())))
}

/// `--connect`: the cluster answers both clients, the topics exist, the group's offsets
/// can be read. Prints what it found; exit 2 when anything failed.
fn check_cluster(config: &Config) -> Result<ExitCode, CliError> {
    let kafka = &config.kafka;
    let timeout = kafka.connect_timeout;
    let consumer = consumer_config(kafka).map_err(|e| CliError::Other(e.to_string()))?;
    let producer = producer_config(kafka).map_err(|e| CliError::Other(e.to_string()))?;
    let mut failed = 0usize;
    let mut view = None;
    // Both at once: an unreachable cluster costs one `connect_timeout`, not one per client.
    let probes = std::thread::scope(|s| {
        let consumer = s.spawn(|| probe::probe("consumer", &consumer, timeout));
        let producer = s.spawn(|| probe::probe("results producer", &producer, timeout));
        [("consumer", consumer.join()), ("results producer", producer.join())]
    });
    for (client, probed) in probes {
        let probed = probed.map_err(|_| CliError::Other(format!("the {client} probe panicked")))?;
        match probed {
            Ok(v) => {
                print_line(format_args!("connect: {client}: ok, brokers {}", v.brokers.join(", ")))?;
                view = Some(v);
            }
            Err(e) => {
                failed += 1;
                print_line(format_args!("connect: error: {e}"))?;
            }
        }
    }
    if let Some(view) = view {
        failed += check_topics(config, &view)?;
        failed += check_group(kafka, &consumer, &view, timeout)?;
    }
    if failed > 0 {
        print_line(format_args!("connect: {failed} problem(s)"))?;
        return Ok(ExitCode::from(2));
    }
    print_line(format_args!("connect: ok"))?;
    Ok(ExitCode::SUCCESS)
}

/// Every topic dedupd reads or writes on the main cluster exists. Returns the failures.
fn check_topics(config: &Config, view: &ClusterView) -> Result<usize, CliError> {
    let kafka = &config.kafka;
    let mut wanted: Vec<(String, String)> =
        kafka.input_topics.iter().map(|t| ("kafka.input_topics".to_string(), t.clone())).collect();
    wanted.push(("kafka.results_topic".into(), kafka.results_topic.clone()));
    wanted.push(("kafka.dead_letter_topic".into(), kafka.dead_letter_topic.clone()));
    for (name, sink) in &config.sinks {
        if let SinkConfig::Kafka(k) = sink
            && k.is_on(&kafka.bootstrap_servers)
        {
            wanted.push((format!("sinks.{name}.topic"), k.topic.clone()));
        }
    }
    let mut failed = 0;
    for (key, topic) in wanted {
        match view.topics.get(&topic) {
            Some(partitions) => print_line(format_args!("connect: {key}: {topic} ({partitions} partition(s))"))?,
            None => {
                failed += 1;
                print_line(format_args!("connect: error: {key}: topic {topic} does not exist (or is not visible)"))?
            }
        }
    }
    Ok(failed)
}

/// The consumer group's coordinator answers and its committed offsets can be read.
fn check_group(
    kafka: &KafkaConfig,
    consumer: &rdkafka::ClientConfig,
    view: &ClusterView,
    timeout: Duration,
) -> Result<usize, CliError> {
    let Some((topic, partitions)) = kafka.input_topics.iter().find_map(|t| view.topics.get(t).map(|p| (t, *p))) else {
        return Ok(0);
    };
    match probe::check_group(consumer, topic, partitions, timeout) {
        Ok(committed) => {
            print_line(format_args!(
                "connect: kafka.group_id: {} (offsets readable; {committed} of {partitions} partition(s) of {topic} committed)",
                kafka.group_id
            ))?;
            Ok(0)
        }
        Err(reason) => {
            print_line(format_args!("connect: error: kafka.group_id: {}: {reason}", kafka.group_id))?;
            Ok(1)
        }
    }
}

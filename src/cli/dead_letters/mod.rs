//! `dedupd dead-letters replay -c FILE [--reason R]... [--since T] [--to TOPIC] [--yes]`:
//! re-produces dead letters (docs/contract.md §5: the input's key, value and headers, with
//! dedupd's reason headers taken off again) to the topic each came from, or `--to`, once
//! each. Like `resolve --where` ([`super::bulk`]): the count first, on stderr, and nothing
//! written without `--yes`; then one JSON line per dead letter; exit 2 if any was not
//! replayed.
//!
//! Once each: every replay is one transaction that writes the replayed record (with a
//! `dedupd-replay-of` header naming the dead letter) and a mark on the dead-letter topic
//! (key `dedupd-replayed`, header `dedupd-replayed-of`); a run reads every mark up to where
//! the topic ended at its start and skips what they name ([`replay`] says why two runs at
//! once cannot replay one record twice either). Stand-ins carry no value: they are
//! reported and skipped, never marked.
//!
//! - [`letter`]: what a record of the dead-letter topic is;
//! - [`read`]: reading the topic once, bounded;
//! - [`replay`]: one dead letter re-produced and marked, in one transaction.

mod letter;
mod read;
mod replay;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use self::letter::{Letter, Position};
use self::replay::Replayer;
use super::CliError;
use super::output::{print_error, print_line};
use crate::config::Config;
use crate::connection::probe::{self, ClusterView};

/// `dedupd dead-letters ...`.
#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Re-produce dead letters (their original key, value and headers) to the topic each
    /// came from, or --to, once each: the count first, nothing written without --yes.
    Replay(ReplayArgs),
}

/// `dead-letters replay`'s selection and target.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Only dead letters with this `dedupd-reason` (e.g. no_route); repeat for several.
    #[arg(long = "reason", value_name = "REASON")]
    pub reasons: Vec<String>,
    /// Only dead letters written at or after this RFC 3339 instant (their record timestamp).
    #[arg(long, value_name = "RFC3339")]
    pub since: Option<String>,
    /// Re-produce to this topic instead of the one each came from (its `dedupd-source`).
    #[arg(long, value_name = "TOPIC")]
    pub to: Option<String>,
    /// Replay. Without it, only the number of matching dead letters is printed.
    #[arg(long)]
    pub yes: bool,
}

/// Runs `dead-letters replay` with `config`: blocking (librdkafka's calls), so off the
/// runtime.
pub(super) fn run(config: &Config, command: &DeadLettersCommand) -> Result<ExitCode, CliError> {
    let DeadLettersCommand::Replay(args) = command;
    let since = match &args.since {
        Some(text) => Some(
            chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|e| CliError::Other(format!("--since {text}: not an RFC 3339 instant ({e})")))?
                .timestamp_millis(),
        ),
        None => None,
    };
    let kafka = &config.kafka;
    let reader = read::reader_config(kafka)?;
    let view = probe::probe("dead-letter reader", &reader, kafka.connect_timeout)
        .map_err(|e| CliError::Other(e.to_string()))?;
    let partitions = topic_partitions(&view, "kafka.dead_letter_topic", &kafka.dead_letter_topic)?;
    if let Some(to) = &args.to {
        topic_partitions(&view, "--to", to)?;
    }
    // Taken before the read, so that the marks read are final (see `replay`).
    let replayer = if args.yes { Some(Replayer::start(kafka)?) } else { None };
    let keep = |reason: &str, timestamp_ms: Option<i64>| {
        (args.reasons.is_empty() || args.reasons.iter().any(|r| r == reason))
            && since.is_none_or(|since| timestamp_ms.is_some_and(|t| t >= since))
    };
    let read = read::read(kafka, &reader, partitions, &keep)?;
    let (todo, already): (Vec<&Letter>, Vec<&Letter>) =
        read.letters.iter().partition(|letter| !read.marked.contains(&letter.at));
    announce(todo.len(), already.len(), read.stand_ins.len(), args.yes);
    let Some(replayer) = replayer else { return Ok(ExitCode::SUCCESS) };
    for (at, reason, source, original_size) in &read.stand_ins {
        let skipped = format!(
            "a stand-in without key and value (the value was {original_size} bytes): replay the input from its source"
        );
        print_line(json!({"dead_letter": place(at), "reason": reason, "source": source, "skipped": skipped}))?;
    }
    let target = |letter: &Letter| target_of(letter, args.to.as_deref(), &kafka.input_topics, &view);
    let done = replay_each(&replayer, &todo, &target)?;
    print_error(format_args!("replayed {done} of {} dead letter(s)", todo.len()));
    if done == todo.len() {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(CliError::Other(format!("{} dead letter(s) not replayed: see their lines", todo.len() - done)))
    }
}

/// The partition count of `topic`, or an error naming `key` when the cluster has no such
/// topic.
fn topic_partitions(view: &ClusterView, key: &str, topic: &str) -> Result<i32, CliError> {
    match view.topics.get(topic) {
        Some(&n) => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
        None => Err(CliError::Other(format!("{key}: topic {topic} does not exist (or is not visible)"))),
    }
}

/// The count, on stderr, before anything is written.
fn announce(todo: usize, already: usize, stand_ins: usize, yes: bool) {
    let mut besides = Vec::new();
    if already > 0 {
        besides.push(format!("{already} already replayed, skipped"));
    }
    if stand_ins > 0 {
        besides.push(format!("{stand_ins} stand-in(s) without their value, which cannot be replayed"));
    }
    let besides = if besides.is_empty() { String::new() } else { format!(" ({})", besides.join("; ")) };
    if yes {
        print_error(format_args!("{todo} dead letter(s) match: replay each{besides}"));
    } else {
        print_error(format_args!("{todo} dead letter(s) match; nothing replayed: add --yes to replay them{besides}"));
    }
}

/// A dead letter's place as its line shows it.
fn place(at: &Position) -> Value {
    json!({"partition": at.partition, "offset": at.offset})
}

/// Where `letter` goes: `--to`, else the topic it came from, else the config's one input
/// topic; the topic must exist.
fn target_of(letter: &Letter, to: Option<&str>, inputs: &[String], view: &ClusterView) -> Result<String, String> {
    let topic = match (to, &letter.source, inputs) {
        (Some(to), _, _) => to.to_string(),
        (None, Some(source), _) => source.topic.clone(),
        (None, None, [only]) => only.clone(),
        (None, None, _) => {
            return Err("no readable dedupd-source to tell where it came from: name a topic with --to".into());
        }
    };
    if view.topics.contains_key(&topic) {
        Ok(topic)
    } else {
        Err(format!("topic {topic} does not exist (or is not visible): name another with --to"))
    }
}

/// Replays each of `todo` in order, one JSON line each; returns how many were replayed.
/// A producer that cannot go on (fenced by another replay) ends the run: the rest are
/// reported as not attempted.
fn replay_each(
    replayer: &Replayer,
    todo: &[&Letter],
    target: &dyn Fn(&Letter) -> Result<String, String>,
) -> Result<usize, CliError> {
    let mut done = 0;
    let mut stopped: Option<String> = None;
    for letter in todo {
        let line = |result: Result<Value, String>| {
            let mut line = json!({"dead_letter": place(&letter.at), "reason": letter.reason});
            match result {
                Ok(to) => line["to"] = to,
                Err(error) => line["error"] = json!(error),
            }
            line
        };
        if let Some(why) = &stopped {
            print_line(line(Err(format!("not attempted: {why}"))))?;
            continue;
        }
        let replayed = if letter.unreadable_headers > 0 {
            Err(format!(
                "{} header(s) whose name is not UTF-8 cannot be copied: re-produce it by hand",
                letter.unreadable_headers
            ))
        } else {
            target(letter).and_then(|to| {
                replayer.replay(letter, &to).map_err(|failed| {
                    if !failed.can_go_on {
                        stopped =
                            Some(format!("an earlier replay failed and the producer cannot go on ({})", failed.error));
                    }
                    failed.error
                })
            })
        };
        let replayed = replayed.map(|to| json!({"topic": to.topic, "partition": to.partition, "offset": to.offset}));
        done += usize::from(replayed.is_ok());
        print_line(line(replayed))?;
    }
    Ok(done)
}

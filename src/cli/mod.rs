//! The command line (docs/contract.md §8). `run` and `demo` start the pipeline; the operator commands
//! (`inspect`, `keys`, `forget`, `resolve`, `stats`, `compact`, `export`, `import`) work on a running
//! instance through its admin API with `--admin URL` (token from `DEDUPD_ADMIN_TOKEN`), or
//! on a stopped instance's store directly with `-c FILE` ([`direct`]; [`remote`];
//! [`transfer`] for export and import). Both paths print the same things.
//!
//! `-c FILE` and `--admin URL` are global: they go before or after the subcommand. Output
//! goes through [`output`], which stops quietly when stdout is closed. `run` raises its open
//! files limit first ([`open_files`]).
//!
//! `dead-letters replay` works on the cluster, with `-c FILE` only ([`dead_letters`]).
//!
//! Exit codes: 0 done, 2 error, 3 refused because of the key's state, 4 no such key.

mod bulk;
mod check;
mod dead_letters;
mod direct;
mod generate;
mod keys;
mod librdkafka;
mod open_files;
mod output;
mod remote;
mod status;
mod transfer;

pub use librdkafka::LibrdkafkaBuild;
pub use output::print_error;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use self::output::{print_json, print_line};
use crate::config::{Config, ConfigError};
use crate::log::LogFormat;
use crate::store::{Completion, StoreError, TransferError};
use crate::telemetry::Traces;

/// dedupd: execute side-effect commands from Kafka at most once per idempotency key.
#[derive(Debug, Parser)]
#[command(name = "dedupd", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// The config file or admin API to act on (before or after the subcommand).
    #[command(flatten)]
    pub target: Target,
}

/// Parses the process's arguments, exiting on `--help`, `--version` or an error as clap
/// does. `--version` also names librdkafka and its `builtin.features`, which only
/// librdkafka itself can tell at run time, hence not `Cli::parse()`.
pub fn parse() -> Cli {
    // Leaked once per process: clap keeps a `&'static str` and the process needs it until
    // it exits anyway.
    let long_version: &'static str = Box::leak(librdkafka::long_version().into_boxed_str());
    let matches = Cli::command().long_version(long_version).get_matches();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut Cli::command()).exit(),
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume commands and execute them once each.
    Run {
        /// Process partitions whose committed offset is beyond the store's watermark
        /// (after the store was lost or replaced on purpose).
        #[arg(long)]
        accept_empty_store: bool,
    },
    /// A self-contained demonstration: in-process Kafka mock cluster, local HTTP receiver.
    Demo {
        /// Distinct valid commands to produce.
        #[arg(long, default_value_t = 2000)]
        commands: usize,
    },
    /// Print the shell completion script for SHELL (e.g. `dedupd completions bash >
    /// /etc/bash_completion.d/dedupd`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff; `dedupd man > dedupd.1`, `man ./dedupd.1`), or the page of
    /// one subcommand (`dedupd man run > dedupd-run.1`), which the main page lists; with
    /// `--dir DIR`, write every page into DIR instead.
    Man {
        /// The subcommand whose page to print.
        subcommand: Option<String>,
        /// Write every page (dedupd.1, dedupd-run.1, ...) into this directory.
        #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
        dir: Option<PathBuf>,
    },
    /// Validate a config file: report every problem (with its line) and exit non-zero.
    CheckConfig {
        /// Also connect to the cluster: both clients authenticate, the topics exist, the
        /// group's offsets can be read (the group is not joined).
        #[arg(long)]
        connect: bool,
    },
    /// Show the stored record of a key.
    Inspect {
        /// The key.
        key: String,
    },
    /// List the records matching every filter given, one JSON document per line (e.g.
    /// `keys --state indeterminate --sink payments`).
    Keys(keys::KeysArgs),
    /// Remove a key so that its next arrival runs again. An `in_progress` key needs
    /// `--force`: forget it only when no instance is executing it.
    Forget {
        /// The key (or --where).
        #[arg(required_unless_present = "filters", conflicts_with = "filters")]
        key: Option<String>,
        /// Also forget an `in_progress` key.
        #[arg(long)]
        force: bool,
        /// Every key a filter matches instead.
        #[command(flatten)]
        bulk: bulk::Bulk,
    },
    /// Resolve an indeterminate key as succeeded or failed, or (`--check`) by asking its
    /// sink's receiver with the sink's check: found, succeeded with its answer; absent,
    /// failed; neither, left as it is (exit 2).
    Resolve {
        /// The key (or --where).
        #[arg(required_unless_present = "filters", conflicts_with = "filters")]
        key: Option<String>,
        /// Every indeterminate key a filter matches instead.
        #[command(flatten)]
        bulk: bulk::Bulk,
        /// The outcome to record.
        #[arg(long = "as", value_enum, required_unless_present = "check", conflicts_with = "check")]
        outcome: Option<ResolveAs>,
        /// Run the check of the sink the key's command went to, now, and settle the key by
        /// its answer.
        #[arg(long)]
        check: bool,
    },
    /// The dead-letter topic (needs -c): `replay` re-produces dead letters once each.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// Record counts per state, disk usage, next expiry.
    Stats,
    /// A running instance at a glance (needs --admin): ready and alive, each partition's
    /// state and lag, commands in flight, circuits, the store and its volume.
    Status {
        /// Refresh every two seconds until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// Remove expired records now.
    Compact,
    /// Write every record and partition watermark to FILE as JSON Lines (docs/admin.md).
    Export {
        /// The file to write (replaced only once the export is complete).
        file: PathBuf,
    },
    /// Read an export FILE into the store: expired records are skipped, newer stored
    /// records kept (unless `--overwrite`), watermarks only raised.
    Import {
        /// The JSON Lines file written by `export`.
        file: PathBuf,
        /// Replace stored records even when they are newer than the imported ones.
        #[arg(long)]
        overwrite: bool,
        /// Also replace stored `in_progress` claims: only when no instance is executing
        /// them (an instance that is could run the effect again).
        #[arg(long)]
        force: bool,
    },
}

/// What a command acts on: the config file (`run`, `check-config`, and an operator command
/// on a stopped instance's store) or a running instance's admin API (operator commands).
/// Global, so each goes before or after the subcommand; `demo` ignores both.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The TOML config file (for an operator command: of a stopped instance, for its store
    /// path and backend).
    #[arg(short, long, env = "DEDUPD_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Operator commands: the HTTP listener of a running instance, e.g.
    /// http://127.0.0.1:9464; the bearer token is read from DEDUPD_ADMIN_TOKEN. Wins over
    /// --config.
    #[arg(long, env = "DEDUPD_ADMIN_URL", global = true)]
    pub admin: Option<String>,
}

/// `resolve --as`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ResolveAs {
    /// The effect happened.
    Succeeded,
    /// The effect did not happen; repeats replay a failure.
    Failed,
}

impl From<ResolveAs> for Completion {
    fn from(outcome: ResolveAs) -> Completion {
        match outcome {
            ResolveAs::Succeeded => Completion::Succeeded,
            ResolveAs::Failed => Completion::Failed,
        }
    }
}

/// A CLI failure; its message is printed and the process exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad config.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// Store failure.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Export or import failed.
    #[error("{0}")]
    Transfer(#[from] TransferError),
    /// The key has no record (exit 4).
    #[error("{0}")]
    NotFound(String),
    /// The key's state does not allow the action (exit 3).
    #[error("{0}")]
    Conflict(String),
    /// The store is held by a running instance.
    #[error(
        "the store at {path} is locked, most likely by a running dedupd: use --admin URL (or DEDUPD_ADMIN_URL) \
         with DEDUPD_ADMIN_TOKEN to act through its admin API ({source})"
    )]
    Locked { path: String, source: StoreError },
    /// Kafka client settings librdkafka refuses, each as `check-config` reports it.
    #[error("{}", .0.join("; "))]
    KafkaSettings(Vec<String>),
    /// Neither --admin nor --config.
    #[error("say where: --admin URL for a running instance, or -c FILE for a stopped one's store")]
    NoTarget,
    /// `status` without --admin.
    #[error("status shows a running instance: use --admin URL (or DEDUPD_ADMIN_URL) with DEDUPD_ADMIN_TOKEN")]
    StatusNeedsAdmin,
    /// `run` or `check-config` without a config file.
    #[error("say which config: -c FILE (or DEDUPD_CONFIG=FILE)")]
    NoConfig,
    /// Writing the output failed (other than a closed stdout, which ends it quietly).
    #[error("writing to stdout: {0}")]
    Stdout(std::io::Error),
    /// The admin API answered with an error, or could not be reached.
    #[error("admin API: {0}")]
    Remote(String),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    File { path: String, source: std::io::Error },
    /// The pipeline stopped with an error.
    #[error("{0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
    /// The demo failed.
    #[error("{0}")]
    Demo(#[from] crate::demo::DemoError),
    /// OpenTelemetry cannot be set up as asked.
    #[error("{0}")]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
    Config::load(path, std::env::vars())
}

/// Sets up tracing for `format` and `level` (`DEDUPD_LOG`, then `RUST_LOG`, win when set).
pub fn init_tracing(format: LogFormat, level: &str) {
    crate::log::init(format, level);
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// The connection an operator command works through.
enum Conn {
    /// Boxed: a store with its config is much larger than a client.
    Direct(Box<direct::Direct>),
    Remote(remote::Remote),
}

impl Target {
    /// Connects for `command`: only `import` may create the store it opens directly.
    fn connect(&self, command: &Command) -> Result<Conn, CliError> {
        let creates = matches!(command, Command::Import { .. });
        match (&self.admin, &self.config) {
            (Some(url), _) => Ok(Conn::Remote(remote::Remote::new(url)?)),
            (None, Some(config)) => Ok(Conn::Direct(Box::new(direct::Direct::open(load(config)?, creates)?))),
            (None, None) => Err(CliError::NoTarget),
        }
    }
}

/// Runs an operator command; a missing key exits 4, a refusal 3.
async fn operate(command: Command, target: &Target) -> Result<ExitCode, CliError> {
    if matches!(command, Command::Status { .. }) && target.admin.is_none() {
        return Err(CliError::StatusNeedsAdmin);
    }
    let result = match target.connect(&command) {
        Ok(conn) => run_operator(command, conn).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(CliError::NotFound(m)) => {
            print_error(m);
            Ok(ExitCode::from(4))
        }
        Err(CliError::Conflict(m)) => {
            print_error(m);
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e),
    }
}

async fn run_operator(command: Command, conn: Conn) -> Result<(), CliError> {
    match command {
        Command::Inspect { key } => print_json(&match conn {
            Conn::Direct(d) => d.inspect(&key),
            Conn::Remote(r) => r.inspect(&key).await,
        }?),
        Command::Forget { key: None, force, bulk } => bulk::forget(conn, &bulk, force).await,
        Command::Resolve { key: None, outcome, check, bulk } => bulk::resolve(conn, &bulk, outcome, check).await,
        Command::Forget { key: Some(key), force, .. } => {
            let was = match conn {
                Conn::Direct(d) => d.forget(&key, force),
                Conn::Remote(r) => r.forget(&key, force).await,
            }?;
            print_line(format_args!("forgot {} (was {was})", output::quoted(&key)))
        }
        Command::Resolve { key: Some(key), check: true, .. } => print_json(&match conn {
            Conn::Direct(d) => d.resolve_by_check(&key).await,
            Conn::Remote(r) => r.resolve_by_check(&key).await,
        }?),
        Command::Resolve { key: Some(key), outcome, .. } => {
            let Some(outcome) = outcome.map(Completion::from) else {
                return Err(CliError::Other("resolve takes --as succeeded|failed or --check".into()));
            };
            print_json(&match conn {
                Conn::Direct(d) => d.resolve(&key, outcome),
                Conn::Remote(r) => r.resolve(&key, outcome).await,
            }?)
        }
        Command::Keys(args) => match conn {
            Conn::Direct(d) => keys::list_direct(&d, &args),
            Conn::Remote(r) => keys::list_remote(&r, &args).await,
        },
        Command::Stats => print_json(&match conn {
            Conn::Direct(d) => d.stats(),
            Conn::Remote(r) => r.stats().await,
        }?),
        Command::Status { watch } => match conn {
            Conn::Remote(r) => status::show(&r, watch).await,
            Conn::Direct(_) => Err(CliError::StatusNeedsAdmin),
        },
        Command::Compact => {
            let removed = match conn {
                Conn::Direct(d) => d.compact(),
                Conn::Remote(r) => r.compact().await,
            }?;
            print_line(format_args!("removed {removed} expired record(s)"))
        }
        Command::Export { file } => {
            let counts = match conn {
                Conn::Direct(d) => transfer::export_direct(&d, &file),
                Conn::Remote(r) => transfer::export_remote(&r, &file).await,
            }?;
            print_line(format_args!(
                "exported {} record(s) and {} watermark(s) to {}",
                counts.records,
                counts.watermarks,
                file.display()
            ))
        }
        Command::Import { file, overwrite, force } => {
            let report = match conn {
                Conn::Direct(d) => transfer::import_direct(&d, &file, overwrite, force),
                Conn::Remote(r) => transfer::import_remote(&r, &file, overwrite, force).await,
            }?;
            print_json(&serde_json::to_value(report).map_err(|e| CliError::Other(e.to_string()))?)
        }
        Command::Run { .. }
        | Command::Demo { .. }
        | Command::CheckConfig { .. }
        | Command::DeadLetters(_)
        | Command::Completions { .. }
        | Command::Man { .. } => Err(CliError::Other("not an operator command".into())),
    }
}

/// Runs the parsed command.
pub async fn dispatch(cli: Cli) -> Result<ExitCode, CliError> {
    let Cli { command, target } = cli;
    match command {
        Command::Run { accept_empty_store } => {
            let config = load(target.config.as_deref().ok_or(CliError::NoConfig)?)?;
            // What check-config would refuse without a cluster, refused the same way rather
            // than in librdkafka's terser words when a client is made.
            check::kafka_settings_refused(&config)?;
            init_tracing(config.log.format, &config.log.level);
            librdkafka::log_build();
            open_files::raise_open_files_limit();
            let traces = Traces::start(&config.telemetry, &|var| std::env::var(var).ok())?;
            let tracer = traces.as_ref().map(Traces::tracer);
            let options = crate::pipeline::RunOptions { accept_empty_store, tracer };
            let ran = crate::pipeline::run(config, options, shutdown_signal(), |_| {}).await;
            if let Some(traces) = traces {
                // The last spans go out on the exporter's thread: wait for it off the runtime.
                let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
            }
            ran?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { commands } => {
            init_tracing(LogFormat::Text, "warn");
            let summary = crate::demo::run(commands).await?;
            print_line(&summary)?;
            Ok(if summary.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Completions { shell } => generate::completions(shell).map(|()| ExitCode::SUCCESS),
        Command::Man { subcommand, dir: None } => generate::man(subcommand.as_deref()).map(|()| ExitCode::SUCCESS),
        Command::Man { dir: Some(dir), .. } => generate::man_pages(&dir).map(|()| ExitCode::SUCCESS),
        Command::CheckConfig { connect } => {
            let path = target.config.as_deref().ok_or(CliError::NoConfig)?;
            let path = path.to_path_buf();
            // librdkafka's calls block: off the runtime.
            tokio::task::spawn_blocking(move || check::check_config(&path, connect))
                .await
                .map_err(|e| CliError::Other(e.to_string()))?
        }
        Command::DeadLetters(command) => {
            let config = load(target.config.as_deref().ok_or(CliError::NoConfig)?)?;
            // librdkafka's calls block: off the runtime.
            tokio::task::spawn_blocking(move || dead_letters::run(&config, &command))
                .await
                .map_err(|e| CliError::Other(e.to_string()))?
        }
        other => operate(other, &target).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn target_flags_go_before_or_after_the_subcommand() {
        for args in [
            ["dedupd", "--admin", "http://h:1", "export", "f.jsonl"],
            ["dedupd", "export", "--admin", "http://h:1", "f.jsonl"],
            ["dedupd", "export", "f.jsonl", "--admin", "http://h:1"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert_eq!(cli.target.admin.as_deref(), Some("http://h:1"), "{args:?}");
            assert!(matches!(cli.command, Command::Export { ref file } if file.as_os_str() == "f.jsonl"), "{args:?}");
        }
        for args in [["dedupd", "-c", "x.toml", "run"], ["dedupd", "run", "-c", "x.toml"]] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert_eq!(cli.target.config.as_deref(), Some(std::path::Path::new("x.toml")), "{args:?}");
        }
    }
}

//! The command line (SPEC §7). `run` and `demo` start the pipeline; the key commands open
//! a stopped instance's store directly (the admin-API path for a running instance comes
//! with the admin API).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError, LogFormat};
use crate::store::{Completion, KeyStore, Record, ResolveError, StoreError};

/// dedupd: execute side-effect commands from Kafka at most once per idempotency key.
#[derive(Debug, Parser)]
#[command(name = "dedupd", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume commands and execute them once each.
    Run {
        /// The TOML config file.
        #[arg(short, long, env = "DEDUPD_CONFIG")]
        config: PathBuf,
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
    /// Validate a config file and exit non-zero naming the bad key.
    CheckConfig {
        /// The TOML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Show the stored record of a key (store of a stopped instance).
    Inspect {
        /// The key.
        key: String,
        /// The TOML config file (for the store path and backend).
        #[arg(short, long, env = "DEDUPD_CONFIG")]
        config: PathBuf,
    },
    /// Remove a key whatever its state, so the next arrival runs again.
    Forget {
        /// The key.
        key: String,
        /// The TOML config file.
        #[arg(short, long, env = "DEDUPD_CONFIG")]
        config: PathBuf,
    },
    /// Resolve an indeterminate key as succeeded or failed.
    Resolve {
        /// The key.
        key: String,
        /// The outcome to record.
        #[arg(long = "as", value_enum)]
        outcome: ResolveAs,
        /// The TOML config file.
        #[arg(short, long, env = "DEDUPD_CONFIG")]
        config: PathBuf,
    },
    /// Record counts per state and disk usage.
    Stats {
        /// The TOML config file.
        #[arg(short, long, env = "DEDUPD_CONFIG")]
        config: PathBuf,
    },
    /// Remove expired records now.
    Compact {
        /// The TOML config file.
        #[arg(short, long, env = "DEDUPD_CONFIG")]
        config: PathBuf,
    },
}

/// `resolve --as`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ResolveAs {
    /// The effect happened.
    Succeeded,
    /// The effect did not happen; repeats replay a failure.
    Failed,
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
    /// Resolve refused.
    #[error("{0}")]
    Resolve(#[from] ResolveError),
    /// The pipeline stopped with an error.
    #[error("{0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
    /// The demo failed.
    #[error("{0}")]
    Demo(#[from] crate::demo::DemoError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
    Config::load(path, std::env::vars())
}

fn open_store(config: &Config) -> Result<KeyStore, StoreError> {
    KeyStore::open(config.store.backend, &config.store.path, config.store.sync)
}

/// Sets up tracing for `format` and `level` (RUST_LOG wins when set).
pub fn init_tracing(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
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

fn print_record(key: &str, record: &Record) {
    let json = crate::store::record_json(key, record);
    println!("{}", serde_json::to_string_pretty(&json).unwrap_or_default());
}

/// Runs the parsed command.
pub async fn dispatch(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Run { config, accept_empty_store } => {
            let config = load(&config)?;
            init_tracing(config.log.format, &config.log.level);
            let options = crate::pipeline::RunOptions { accept_empty_store };
            crate::pipeline::run(config, options, shutdown_signal(), |_| {}).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { commands } => {
            init_tracing(LogFormat::Text, "warn");
            let summary = crate::demo::run(commands).await?;
            println!("{summary}");
            Ok(if summary.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::CheckConfig { config } => {
            let c = load(&config)?;
            println!(
                "{}: ok ({} sink(s), {} route(s), store {:?} at {})",
                config.display(),
                c.sinks.len(),
                c.routes.len(),
                c.store.backend,
                c.store.path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { key, config } => {
            let store = open_store(&load(&config)?)?;
            match store.get(&key)? {
                Some(r) => {
                    print_record(&key, &r);
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("key {key:?}: no record");
                    Ok(ExitCode::from(4))
                }
            }
        }
        Command::Forget { key, config } => {
            let store = open_store(&load(&config)?)?;
            match store.forget(&key)? {
                Some(r) => {
                    println!("forgot {key:?} (was {})", r.state().as_str());
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("key {key:?}: no record");
                    Ok(ExitCode::from(4))
                }
            }
        }
        Command::Resolve { key, outcome, config } => {
            let config = load(&config)?;
            let store = open_store(&config)?;
            let outcome = match outcome {
                ResolveAs::Succeeded => Completion::Succeeded,
                ResolveAs::Failed => Completion::Failed,
            };
            let ttl = i64::try_from(config.store.default_ttl.as_millis()).unwrap_or(i64::MAX);
            let r = store.resolve(&key, outcome, chrono::Utc::now().timestamp_millis(), ttl)?;
            print_record(&key, &r);
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats { config } => {
            let store = open_store(&load(&config)?)?;
            let counts = store.counts();
            let stats = serde_json::json!({
                "backend": store.backend_name(),
                "records": counts,
                "disk_bytes": store.disk_bytes()?,
                "next_expiry": store.next_expiry()?.map(crate::outcome::rfc3339_ms),
            });
            println!("{}", serde_json::to_string_pretty(&stats).unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact { config } => {
            let config = load(&config)?;
            let store = open_store(&config)?;
            let n = store.compact_expired(chrono::Utc::now().timestamp_millis(), config.store.compaction_chunk.get())?;
            println!("removed {n} expired record(s)");
            Ok(ExitCode::SUCCESS)
        }
    }
}

//! End-to-end benchmark on a real Kafka broker (BENCHMARKS.md, "Pipeline benchmark").
//!
//! In one run, for each store backend:
//! 1. the store floor: `KeyStore` claim + flush + complete + flush in batches of 500, the
//!    store work dedupd does per command;
//! 2. a plain rdkafka consumer reading the same input topic, and a plain relay that reads
//!    it and produces one result-sized record per input (the Kafka ceiling of any
//!    consume → produce service here: the broker shares the machine's cores;
//!    `pipeline/relay.rs`);
//! 3. `dedupd run` (the real pipeline, a `log` sink that does nothing, durable claims)
//!    draining a backlog: commands/s from the first result to the last (result records'
//!    timestamps, so group-join time is not counted), read once the drain is over;
//! 4. latency at a fixed rate: produce at R commands/s for 2 s of warm-up (not measured) and
//!    then S seconds to a running pipeline;
//!    latency = result record timestamp (when dedupd handed it to its producer, after the
//!    completion was flushed) minus the input's produce time; p50/p99. The plain relay's
//!    latency is measured the same way once (after its backlog), with the p99 of fsyncs made
//!    beside it (a probe on the same disk while the broker serves the relay's load) and of
//!    fsyncs on the disk alone after it, and the table gives issue 13's bound on dedupd's p99
//!    from them (relay p99 + two fsync p99 + 5 ms), with each.
//!
//! With `--changelog`, each drain of step 3 is followed by two with the store on Kafka
//! (`store.changelog`, transactional results): one with `kafka.copartitioned` (the backlog
//! is keyed by the idempotency key with the murmur2 partitioner), one through the by-key
//! topic. With `--restore N`, only the
//! restore phase (`pipeline/restore.rs`): N keys restored into an empty store, then a tail
//! of 10,000 after a clean stop. With `--instances`, only drains with 1, 2 and 3 instances
//! in one group, and with `--failover` only the failover of a killed instance at `--rate`,
//! with `--state N` keys on the changelog first and `--standby` for standby copies
//! (`pipeline/instances.rs`); with `--takeover`, only a state of `--state N` keys taken over
//! by an instance joining the group at `--rate` (`pipeline/takeover.rs`). With `--streams`,
//! only dedupd with its store on Kafka against Kafka Streams' own dedup recipe
//! (`benches/streams-dedup`, `exactly_once_v2`) on the same backlog, side by side in
//! `--rounds N` rounds (default 3): the recipe on the input as keyed against the copartitioned
//! mode, the recipe with a repartition topic against the by-key topic (`pipeline/streams.rs`;
//! it needs Java 17+, the broker's, and for its first build Maven). With `--traces`, only drains with OpenTelemetry traces off
//! and on, alternated, on the first backend (`pipeline/traces.rs`). With `--warm-broker`,
//! before any of these, the backlog is relayed and drained six times over, so that the
//! broker has stopped compiling (`pipeline/warm.rs`).
//!
//! Run: `scripts/kafka/kafka.sh with cargo bench --bench pipeline -- [--records N]
//! [--rate R] [--seconds S] [--backends NAME,NAME] [--streams [--rounds N]] [--changelog] [--drain-only]
//! [--restore N] [--instances] [--failover [--state N] [--standby]] [--takeover --state N] [--traces] [--warm-broker]` (default: every registered backend; `--drain-only` runs
//! only step 3, e.g. under `perf`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupd::config::Config;
use dedupd::pipeline::RunOptions;
use dedupd::routes::RouteConfig;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::log::LogSinkConfig;
use dedupd::store::StoreBackend;
use tokio_util::sync::CancellationToken;

use args::args;
use relay::{plain_consume, plain_relay, relay_latency_bound};
use topics::{create_topic, produce_backlog, read_results, unique, wait_for_results};

#[path = "pipeline/args.rs"]
mod args;
#[path = "pipeline/cpu.rs"]
mod cpu;
#[path = "support/floor.rs"]
mod floor;
#[path = "pipeline/instances.rs"]
mod instances;
#[path = "pipeline/latency.rs"]
mod latency;
#[path = "pipeline/relay.rs"]
mod relay;
#[path = "pipeline/restore.rs"]
mod restore;
#[path = "pipeline/streams.rs"]
mod streams;
#[path = "pipeline/takeover.rs"]
mod takeover;
#[path = "pipeline/topics.rs"]
mod topics;
#[path = "pipeline/traces.rs"]
mod traces;
#[path = "pipeline/warm.rs"]
mod warm;

/// The binary's allocator (as dedupd's own: `src/main.rs`), for both sides of every comparison.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Where the store's history lives in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The embedded store (transactional results with DEDUPD_BENCH_TRANSACTIONAL=1).
    Embedded,
    /// `store.changelog = true` (with transactional results and `kafka.copartitioned`).
    Changelog,
    /// `store.changelog = true` (with transactional results) through the by-key topic.
    ByKey,
}

/// The drains with the store on Kafka, printed, after one embedded drain.
async fn drain_on_kafka(bootstrap: &str, input: &str, backend: StoreBackend, records: usize) {
    for (mode, what) in [(Mode::Changelog, "copartitioned"), (Mode::ByKey, "through the by-key topic")] {
        let rate = measure_drain_in(mode, bootstrap, input, backend, records).await;
        println!(
            "dedupd run, {backend:?}, store on Kafka (changelog, {what}), draining the backlog: {rate:.0} commands/s"
        );
    }
}

fn config(bootstrap: &str, input: &str, results: &str, backend: StoreBackend, dir: &std::path::Path) -> Config {
    config_in(Mode::Embedded, bootstrap, input, results, backend, dir)
}

fn config_in(
    mode: Mode,
    bootstrap: &str,
    input: &str,
    results: &str,
    backend: StoreBackend,
    dir: &std::path::Path,
) -> Config {
    let mut c = Config::default();
    c.kafka.bootstrap_servers = bootstrap.into();
    c.kafka.group_id = unique("bench-dedupd");
    c.kafka.input_topics = vec![input.into()];
    c.kafka.results_topic = results.into();
    c.kafka.dead_letter_topic = unique("bench-dlq");
    c.store.backend = backend;
    c.store.path = dir.to_path_buf();
    c.http.listen = "127.0.0.1:0".parse().expect("addr");
    c.sinks.insert("noop".into(), SinkConfig::Log(LogSinkConfig::default()));
    c.routes.push(RouteConfig {
        name: None,
        types: vec!["*".into()],
        sink: "noop".into(),
        ttl: None,
        fingerprint_exclude: vec![],
    });
    // DEDUPD_BENCH_TRANSACTIONAL=1: `kafka.transactional_results = true` (a drain's rate
    // comes from the result records' timestamps, so it does not count the last commit).
    c.kafka.transactional_results = std::env::var("DEDUPD_BENCH_TRANSACTIONAL").is_ok_and(|v| v == "1");
    if mode != Mode::Embedded {
        c.kafka.transactional_results = true;
        c.kafka.copartitioned = mode == Mode::Changelog;
        c.store.changelog = true;
        c.store.changelog_replication_factor = 1;
    }
    // DEDUPD_BENCH_MAX_IN_FLIGHT=N: `pipeline.max_in_flight` (also the most claims per round).
    if let Some(n) = std::env::var("DEDUPD_BENCH_MAX_IN_FLIGHT").ok().and_then(|v| v.parse().ok()) {
        c.pipeline.max_in_flight = Some(n);
    }
    // DEDUPD_BENCH_BATCH_SIZE=N: `pipeline.batch_size`.
    if let Some(n) = std::env::var("DEDUPD_BENCH_BATCH_SIZE").ok().and_then(|v| v.parse().ok()) {
        c.pipeline.batch_size = n;
    }
    // Tuning experiments: DEDUPD_BENCH_PRODUCER / DEDUPD_BENCH_CONSUMER="key=value,key=value"
    // go to `kafka.producer` / `kafka.consumer` as a config file's tables would.
    for (var, table) in
        [("DEDUPD_BENCH_PRODUCER", &mut c.kafka.producer), ("DEDUPD_BENCH_CONSUMER", &mut c.kafka.consumer)]
    {
        for kv in std::env::var(var).unwrap_or_default().split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').expect("key=value");
            table.insert(k.to_string(), v.to_string());
        }
    }
    c
}

/// Commands/s from the first result's timestamp to the last (so the time to join the group
/// and start is not counted).
fn drain_rate(seen: &HashMap<(i32, i64), i64>) -> f64 {
    let (lo, hi) = seen.values().fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
    (seen.len() as f64 - 1.0) / ((hi - lo).max(1) as f64 / 1000.0)
}

async fn start_pipeline(config: Config) -> (CancellationToken, tokio::task::JoinHandle<()>, Arc<dedupd::ops::Health>) {
    start_pipeline_with(config, RunOptions::default()).await
}

async fn start_pipeline_with(
    config: Config,
    options: RunOptions,
) -> (CancellationToken, tokio::task::JoinHandle<()>, Arc<dedupd::ops::Health>) {
    topics::ensure_dead_letter_topic(&config.kafka.bootstrap_servers, &config.kafka.dead_letter_topic).await;
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let s = stop.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = dedupd::pipeline::run(config, options, s.cancelled_owned(), move |r| {
            let _ = tx.send(Arc::clone(&r.health));
        })
        .await
        {
            eprintln!("pipeline: {e}");
        }
    });
    let health = rx.await.expect("started");
    (stop, task, health)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return -1;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// `dedupd run` draining the backlog of `n` commands in `input`: commands/s.
async fn measure_drain(bootstrap: &str, input: &str, backend: StoreBackend, n: usize) -> f64 {
    measure_drain_in(Mode::Embedded, bootstrap, input, backend, n).await
}

/// [`measure_drain`] with the store's history where `mode` says.
async fn measure_drain_in(mode: Mode, bootstrap: &str, input: &str, backend: StoreBackend, n: usize) -> f64 {
    measure_drain_with(mode, bootstrap, input, backend, n, RunOptions::default()).await
}

/// [`measure_drain_in`] with `options` (e.g. a tracer).
async fn measure_drain_with(
    mode: Mode,
    bootstrap: &str,
    input: &str,
    backend: StoreBackend,
    n: usize,
    options: RunOptions,
) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = unique("bench-results");
    create_topic(bootstrap, &results, 6).await;
    let config = config_in(mode, bootstrap, input, &results, backend, dir.path());
    let cpu_from = cpu::Snapshot::take();
    let (stop, task, _) = start_pipeline_with(config, options).await;
    let b = bootstrap.to_string();
    let seen = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(600);
        wait_for_results(&b, &results, n, deadline);
        // The results are all on the topic: the drain's CPU ends here, before reading them.
        let cpu_to = cpu::Snapshot::take();
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(60);
        (read_results(&b, &results, n, left), cpu_to)
    })
    .await
    .expect("read");
    stop.cancel();
    let _ = task.await;
    let (seen, cpu_to) = seen;
    cpu_from.print_per_record(&cpu_to, n, &format!("dedupd run draining, {backend:?}, {mode:?}"));
    drain_rate(&seen)
}

fn main() {
    // The receiver's address goes into the environment before any thread exists.
    let traces_receiver = std::env::args().any(|a| a == "--traces").then(traces::bind_receiver);
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime").block_on(run(traces_receiver));
}

async fn run(traces_receiver: Option<std::net::TcpListener>) {
    // The log `dedupd run` sets up (stderr, `info` unless DEDUPD_LOG or RUST_LOG says
    // otherwise), so the drains pay what a real run pays for its spans; the `log` sink
    // stands in for a sink that does nothing, so its own line per command is left out.
    dedupd::log::init(dedupd::log::LogFormat::Text, "info,dedupd::sinks::log=warn");
    let a = args();
    let Ok(bootstrap) = std::env::var("DEDUPD_TEST_KAFKA_BOOTSTRAP") else {
        eprintln!("needs a broker: scripts/kafka/kafka.sh with cargo bench --bench pipeline");
        std::process::exit(2);
    };
    if let Some(keys) = a.restore {
        restore::measure(&bootstrap, keys).await;
        return;
    }
    if a.takeover {
        for backend in &a.backends {
            takeover::takeover(&bootstrap, *backend, (a.failover_state, a.rate)).await;
        }
        return;
    }
    if a.failover {
        for backend in &a.backends {
            let failover = instances::Failover { rate: a.rate, state: a.failover_state, standby: a.standby };
            instances::failover(&bootstrap, *backend, &failover).await;
        }
        return;
    }
    let input = unique("bench-in");
    create_topic(&bootstrap, &input, 6).await;
    let t = Instant::now();
    produce_backlog(&bootstrap, &input, a.records).await;
    println!("produced {} commands in {:.1} s", a.records, t.elapsed().as_secs_f64());
    if a.warm_broker {
        let backend = a.backends.first().copied().unwrap_or(StoreBackend::Fjall);
        warm::warm_broker(&bootstrap, &input, backend, a.records).await;
    }
    if a.streams {
        for backend in &a.backends {
            streams::side_by_side(&bootstrap, &input, *backend, a.records, a.rounds).await;
        }
        return;
    }
    if a.instances {
        for backend in &a.backends {
            instances::drain_with_instances(&bootstrap, &input, *backend, a.records).await;
        }
        return;
    }
    if let Some(listener) = traces_receiver {
        let backend = a.backends.first().copied().unwrap_or(StoreBackend::Fjall);
        traces::measure(&bootstrap, &input, backend, a.records, listener).await;
        return;
    }
    if a.drain_only {
        for backend in &a.backends {
            let rate = measure_drain(&bootstrap, &input, *backend, a.records).await;
            println!("dedupd run, {backend:?}, draining the backlog: {rate:.0} commands/s");
            if a.changelog {
                drain_on_kafka(&bootstrap, &input, *backend, a.records).await;
            }
        }
        return;
    }
    let (b, i, n) = (bootstrap.clone(), input.clone(), a.records);
    let plain = tokio::task::spawn_blocking(move || plain_consume(&b, &i, n)).await.expect("plain");
    println!("plain rdkafka consumer: {plain:.0} msgs/s");
    let relay_out = unique("bench-relay-out");
    create_topic(&bootstrap, &relay_out, 6).await;
    let relay = plain_relay(&bootstrap, &input, &relay_out, a.records, Some("plain relay"), None).await;
    println!("plain relay (consume + produce a result each, no dedupd): {relay:.0} records/s");
    let p99_bound = relay_latency_bound(&bootstrap, a.rate, a.seconds).await;

    println!(
        "\n| backend | store floor (claim+complete/s) | dedupd run (commands/s) | ratio to store floor | ratio to plain relay | p50 ms | p99 ms | p99 bound ms: fsyncs beside the relay (alone) | at rate |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for backend in &a.backends {
        let floor_n = a.records.min(100_000);
        let floor = tokio::task::spawn_blocking({
            let backend = *backend;
            move || floor::store_floor(backend, floor_n)
        })
        .await
        .expect("floor");

        let rate = measure_drain(&bootstrap, &input, *backend, a.records).await;
        if a.changelog {
            drain_on_kafka(&bootstrap, &input, *backend, a.records).await;
        }

        // Latency at a fixed rate.
        let lat_in = unique("bench-lat-in");
        let lat_out = unique("bench-lat-out");
        create_topic(&bootstrap, &lat_in, 6).await;
        create_topic(&bootstrap, &lat_out, 6).await;
        let dir2 = tempfile::tempdir().expect("tempdir");
        let (stop, task, health) = start_pipeline(config(&bootstrap, &lat_in, &lat_out, *backend, dir2.path())).await;
        let ready_by = Instant::now() + Duration::from_secs(60);
        while !health.is_ready() && Instant::now() < ready_by {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lat = latency::at_rate(&bootstrap, &lat_in, &lat_out, a.rate, a.seconds).await;
        stop.cancel();
        let _ = task.await;
        println!(
            "| {:?} | {:.0} | {:.0} | {:.2} | {:.2} | {} | {} | {:.1} ({:.1}) | {}/s for {} s ({} results) |",
            backend,
            floor,
            rate,
            rate / floor,
            rate / relay,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            p99_bound.0,
            p99_bound.1,
            a.rate,
            a.seconds,
            lat.len()
        );
    }
}

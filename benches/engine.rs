//! Where a command's CPU goes inside dedupd, without Kafka: envelope parsing, the engine
//! (decision, claim, sink, completion, with durable group commits, a `log` sink), and
//! result serialisation, each timed on its own over the same commands, next to the store
//! floor (the store calls alone, `support/floor.rs`, as in `benches/pipeline.rs`), measured
//! right after the engine in the same run, with the process's CPU per command for each.
//!
//! Run: `cargo bench --bench engine -- [--records N] [--batch B] [--partitions P]
//! [--backend NAME] [--max-in-flight N]` (P batches through the engine at once, as P
//! partitions would; NAME a registered store backend, the store's default if not given; B
//! and N `pipeline.batch_size` and `pipeline.max_in_flight`, their defaults if not given).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use dedupd::config::Config;
use dedupd::engine::{Engine, EngineParts, Item, ItemResult, SystemClock};
use dedupd::envelope::{InputRecord, parse};
use dedupd::routes::RouteConfig;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::log::LogSinkConfig;
use dedupd::store::{KeyStore, SourcePos};
use dedupd::store::{StoreBackend, SyncMode};
use tokio_util::sync::CancellationToken;

#[path = "support/floor.rs"]
mod floor;
#[path = "support/idle.rs"]
#[allow(dead_code)] // only its CPU clock
mod idle;

/// The binary's allocator (as dedupd's own: `src/main.rs`), for both sides of every comparison.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(name: &str, default: &str) -> String {
    let argv: Vec<String> = std::env::args().collect();
    argv.iter().position(|a| a == name).and_then(|i| argv.get(i + 1).cloned()).unwrap_or_else(|| default.into())
}

fn command(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"id": format!("bench-{i}"), "type": "bench.noop", "payload": {"i": i, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}))
        .expect("json")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if std::env::var("RUST_LOG").is_ok() {
        // Where a round's time goes: `RUST_LOG=dedupd::engine=trace`.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let records: usize = arg("--records", "100000").parse().expect("--records N");
    let default_batch = Config::default().pipeline.batch_size.get().to_string();
    let batch: usize = arg("--batch", &default_batch).parse().expect("--batch B");
    let partitions: usize = arg("--partitions", "1").parse().expect("--partitions P");
    let backend: StoreBackend = arg("--backend", StoreBackend::default().name()).parse().expect("--backend NAME");
    let default_in_flight = Config::default().max_in_flight().get().to_string();
    let max_in_flight: usize = arg("--max-in-flight", &default_in_flight).parse().expect("--max-in-flight N");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::default();
    config.sinks.insert("noop".into(), SinkConfig::Log(LogSinkConfig::default()));
    config.routes.push(RouteConfig {
        name: None,
        types: vec!["*".into()],
        sink: "noop".into(),
        ttl: None,
        fingerprint_exclude: vec![],
    });
    let router = Arc::new(config.router().expect("router"));
    let sinks: HashMap<String, Arc<dedupd::sinks::Sink>> =
        dedupd::sinks::build_all(&config.sinks.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<BTreeMap<_, _>>())
            .expect("sinks")
            .into_iter()
            .map(|(name, sink)| (name, Arc::new(sink)))
            .collect();
    let store = Arc::new(KeyStore::open(backend, dir.path(), SyncMode::Batch).expect("store"));
    let engine = Engine::new(EngineParts {
        store: Arc::clone(&store),
        router: Arc::clone(&router),
        sinks,
        max_in_flight,
        retry: config.retry.clone(),
        stale_guard: config.envelope.stale_guard,
        clock: Arc::new(SystemClock),
    })
    .expect("engine");

    let values: Vec<Vec<u8>> = (0..records).map(command).collect();
    let keys: Vec<String> = (0..records).map(|i| format!("k{i}")).collect();
    let now = chrono::Utc::now().timestamp_millis();

    let t = Instant::now();
    let items: Vec<Item> = values
        .iter()
        .zip(&keys)
        .enumerate()
        .map(|(i, (v, k))| {
            let record = InputRecord {
                topic: "in",
                partition: 0,
                offset: i as i64,
                timestamp_ms: Some(now),
                key: Some(k.as_bytes()),
                value: Some(v.as_slice()),
                headers: &[],
            };
            Item {
                source: SourcePos { topic: "in".into(), partition: 0, offset: i as i64 },
                parsed: parse(&record, &config.envelope, &config.limits, &router),
                traceparent: None,
                tracestate: None,
                span: None,
                checked_absent: None,
            }
        })
        .collect();
    let parse_us = t.elapsed().as_secs_f64() * 1e6 / records as f64;

    // `partitions` streams at once, as the pipeline's partition workers run: stream p takes
    // every p-th batch, in order.
    let engine = Arc::new(engine);
    let items = Arc::new(items);
    let (t, cpu) = (Instant::now(), idle::process_cpu());
    let streams: Vec<_> = (0..partitions)
        .map(|p| {
            let (engine, items) = (Arc::clone(&engine), Arc::clone(&items));
            tokio::spawn(async move {
                let cancel = CancellationToken::new();
                let mut out = Vec::new();
                for chunk in items.chunks(batch).skip(p).step_by(partitions) {
                    out.extend(engine.process_batch(chunk, &cancel).await.expect("batch"));
                }
                out
            })
        })
        .collect();
    let mut results: Vec<ItemResult> = Vec::with_capacity(records);
    for s in streams {
        results.extend(s.await.expect("stream"));
    }
    let engine_us = t.elapsed().as_secs_f64() * 1e6 / records as f64;
    let engine_cpu_us = (idle::process_cpu() - cpu).as_secs_f64() * 1e6 / records as f64;

    let t = Instant::now();
    let mut bytes = 0usize;
    for r in &results {
        if let ItemResult::Done(p) = r {
            bytes += serde_json::to_vec(&p.result).expect("json").len();
        }
    }
    let serialise_us = t.elapsed().as_secs_f64() * 1e6 / records as f64;
    assert_eq!(store.counts().completed as usize, records, "every command completed");

    println!(
        "{backend:?}, {records} fresh commands, batches of {batch}, {partitions} partition(s) at once, max_in_flight {max_in_flight}, per command:"
    );
    println!("  envelope parse + fingerprint : {parse_us:8.2} µs");
    println!("  engine (log sink, durable)   : {engine_us:8.2} µs  ({:.0} commands/s)", 1e6 / engine_us);
    // The same store work alone, on a fresh store, right after (same machine state).
    let cpu = idle::process_cpu();
    let floor = floor::store_floor(backend, records);
    let floor_cpu_us = (idle::process_cpu() - cpu).as_secs_f64() * 1e6 / records as f64;
    println!(
        "  store floor (claim + complete, batches of 500): {floor:.0} commands/s; engine / floor = {:.2}",
        1e6 / engine_us / floor
    );
    // CPU is steadier than rates on a shared machine: what each side costs the machine.
    println!(
        "  CPU per command (user + sys, all threads): engine {engine_cpu_us:.2} µs, store floor {floor_cpu_us:.2} µs"
    );
    println!("  result serialisation         : {serialise_us:8.2} µs  ({} B/result)", bytes / records.max(1));
}

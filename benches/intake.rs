//! The HTTP intake against a plain pass-through proxy, in one run on a real broker
//! (BENCHMARKS.md, "The HTTP intake"): `--clients C` closed-loop clients, each request a
//! new idempotency key, for `--seconds S` against each of
//! 1. a pass-through proxy (this process, axum + reqwest) to the sink: the floor of any HTTP
//!    service in front of it;
//! 2. `dedupd run` (a process of its own: the release binary) with `[intake]`, the command
//!    produced into the pipeline, claimed durably, run through the `http` sink and answered
//!    with its result;
//!
//! both in front of the same sink, an HTTP server in this process that answers at once.
//! Requests/s and p50/p99 latency for each, in `--rounds N` alternating rounds (default 3),
//! and the p99 of an fsync on the store's disk measured in the same run: the goal is
//! ≥ 0.5× the proxy's throughput and a p99 within the proxy's p99 + two fsyncs' p99 + 5 ms.
//!
//! Run: `scripts/kafka/kafka.sh with cargo bench --bench intake -- [--seconds S]
//! [--clients C] [--rounds N] [--partitions P]` (defaults 10, 32, 3, 4).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const API_KEY: &str = "bench-key-0123456789abcdef";
const BODY: &str = r#"{"amount": 1200, "currency": "EUR", "customer": "c_42"}"#;

struct Args {
    seconds: u64,
    clients: usize,
    rounds: usize,
    /// Partitions of the input topic (dedupd runs a partition's batches one after another).
    partitions: i32,
}

fn args() -> Args {
    let mut a = Args { seconds: 10, clients: 32, rounds: 3, partitions: 4 };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse::<u64>().ok()).expect("a number after the flag");
        match flag.as_str() {
            "--seconds" => a.seconds = value(),
            "--clients" => a.clients = value() as usize,
            "--rounds" => a.rounds = value() as usize,
            "--partitions" => a.partitions = value() as i32,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// One side's figures in one round.
struct Measured {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let Ok(bootstrap) = std::env::var("DEDUPD_TEST_KAFKA_BOOTSTRAP") else {
        panic!("needs the broker: scripts/kafka/kafka.sh with cargo bench --bench intake");
    };
    let sink = serve(axum::Router::new().fallback(axum::routing::post(|| async { r#"{"id":"ch_1"}"# }))).await;
    let proxy = {
        let client = reqwest::Client::new();
        let target = format!("http://{sink}/pay");
        serve(axum::Router::new().fallback(axum::routing::post(forward)).with_state(Arc::new((client, target)))).await
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut dedupd, intake) = start_dedupd(&bootstrap, &format!("http://{sink}/pay"), dir.path(), a.partitions).await;
    let fsync_p99 = fsync_p99_ms(dir.path());
    println!(
        "{} clients, {} input partitions, {} s per side and round, {} rounds; fsync p99 on the store's disk {fsync_p99:.2} ms",
        a.clients, a.partitions, a.seconds, a.rounds
    );
    let (mut proxied, mut intaken) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        let p = load(&format!("http://{proxy}/v1/commands/payment.charge"), &a, round).await;
        let i = load(&format!("http://{intake}/v1/commands/payment.charge"), &a, round).await;
        println!(
            "round {round}: proxy {:.0}/s p50 {:.2} ms p99 {:.2} ms; intake {:.0}/s p50 {:.2} ms p99 {:.2} ms",
            p.per_second, p.p50_ms, p.p99_ms, i.per_second, i.p50_ms, i.p99_ms
        );
        proxied.push(p);
        intaken.push(i);
    }
    let median = |v: &[Measured], f: fn(&Measured) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let (p_rate, i_rate) = (median(&proxied, |m| m.per_second), median(&intaken, |m| m.per_second));
    let (p_p99, i_p99) = (median(&proxied, |m| m.p99_ms), median(&intaken, |m| m.p99_ms));
    let bound = p_p99 + 2.0 * fsync_p99 + 5.0;
    println!("| | requests/s | p50 | p99 |");
    println!("| --- | --- | --- | --- |");
    println!("| pass-through proxy | {p_rate:.0} | {:.2} ms | {p_p99:.2} ms |", median(&proxied, |m| m.p50_ms));
    println!(
        "| dedupd intake | {i_rate:.0} ({:.2}×) | {:.2} ms | {i_p99:.2} ms (bound {bound:.2} ms) |",
        i_rate / p_rate,
        median(&intaken, |m| m.p50_ms)
    );
    let _ = dedupd.kill();
    let _ = dedupd.wait();
}

async fn forward(State(to): State<Arc<(reqwest::Client, String)>>, body: Bytes) -> (axum::http::StatusCode, Bytes) {
    let (client, target) = &*to;
    match client.post(target).header("content-type", "application/json").body(body).send().await {
        Ok(r) => {
            let status =
                axum::http::StatusCode::from_u16(r.status().as_u16()).unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
            (status, r.bytes().await.unwrap_or_default())
        }
        Err(_) => (axum::http::StatusCode::BAD_GATEWAY, Bytes::new()),
    }
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// `dedupd run` with the intake in front of `sink`; its intake's address once ready.
async fn start_dedupd(bootstrap: &str, sink: &str, dir: &std::path::Path, partitions: i32) -> (Child, SocketAddr) {
    let unique = |name: &str| format!("bench-intake-{name}-{}", std::process::id());
    let (input, results, dlq) = (unique("in"), unique("out"), unique("dlq"));
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin");
    let topics = [
        NewTopic::new(&input, partitions, TopicReplication::Fixed(1)),
        NewTopic::new(&results, partitions, TopicReplication::Fixed(1)),
        NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)),
    ];
    admin.create_topics(&topics, &AdminOptions::new()).await.expect("topics");
    let (ops, intake) = (free_port(), free_port());
    let config = format!(
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"{group}\"\ninput_topics = [\"{input}\"]\nresults_topic = \"{results}\"\ndead_letter_topic = \"{dlq}\"\n\n\
         [store]\npath = {store:?}\n\n[http]\nlisten = \"127.0.0.1:{ops}\"\n\n[sinks.pay]\nkind = \"http\"\nurl = \"{sink}\"\n\n\
         [[routes]]\ntypes = [\"payment.*\"]\nsink = \"pay\"\n\n[intake]\nlisten = \"127.0.0.1:{intake}\"\n\n\
         [intake.clients.bench]\napi_key = \"{API_KEY}\"\nrate_per_second = 1000000\n",
        group = unique("group"),
        store = dir.join("store").to_str().expect("utf-8 path"),
    );
    let path = dir.join("dedupd.toml");
    std::fs::write(&path, config).expect("config");
    let log = std::fs::File::create(dir.join("dedupd.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["run", "-c", path.to_str().expect("path")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn dedupd");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client.get(format!("http://127.0.0.1:{ops}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("dedupd.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!(
                "dedupd not ready within 60 s; the end of its log:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, SocketAddr::from(([127, 0, 0, 1], intake)))
}

/// `args.clients` closed-loop clients posting new keys to `url` for `args.seconds`.
async fn load(url: &str, args: &Args, round: usize) -> Measured {
    let client = reqwest::Client::builder().pool_max_idle_per_host(args.clients).build().expect("client");
    let next = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (client, url, next) = (client.clone(), url.to_string(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    let key = format!("r{round}-{}", next.fetch_add(1, Ordering::Relaxed));
                    let started = Instant::now();
                    let response = client
                        .post(&url)
                        .bearer_auth(API_KEY)
                        .header("content-type", "application/json")
                        .header("idempotency-key", key)
                        .body(BODY)
                        .send()
                        .await
                        .expect("request");
                    assert!(response.status().is_success(), "{}", response.status());
                    let _ = response.bytes().await;
                    latencies.push(started.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client"));
    }
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)].as_secs_f64() * 1e3;
    Measured { per_second: all.len() as f64 / args.seconds as f64, p50_ms: at(0.50), p99_ms: at(0.99) }
}

/// The p99 of 200 fsyncs of a 4 KiB write in `dir`.
fn fsync_p99_ms(dir: &std::path::Path) -> f64 {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("fsync-probe")).expect("probe");
    let mut took: Vec<f64> = (0..200)
        .map(|_| {
            let started = Instant::now();
            file.write_all(&[7u8; 4096]).expect("write");
            file.sync_all().expect("fsync");
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    took.sort_by(f64::total_cmp);
    took[198]
}

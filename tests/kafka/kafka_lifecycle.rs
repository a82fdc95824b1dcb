//! Letting go and coming back, on a real Kafka broker (docs/contract.md §3, §5):
//! - shutdown drains in-flight work, publishes, commits; a restart finishes the rest with
//!   exactly one effect and one result per input;
//! - a revoked partition is drained and committed before it moves, and no result for it
//!   appears while another member owns it;
//! - a lost store makes dedupd refuse partitions (`/readyz` 503, metric) instead of
//!   re-running or skipping history, until `--accept-empty-store`.
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test kafka kafka_lifecycle::`.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::kafka::{self, header};
use dedupd::config::Config;
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::pipeline::RunOptions;
use dedupd::routes::RouteConfig;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::http::HttpSinkConfig;
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A receiver that takes `delay` per request and records every `Idempotency-Key`.
struct SlowReceiver {
    addr: SocketAddr,
    keys: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
}

impl SlowReceiver {
    async fn start(delay: Duration) -> SlowReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let keys: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = Arc::clone(&keys);
        let app = axum::Router::new().route(
            "/effects",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let seen = Arc::clone(&seen);
                async move {
                    tokio::time::sleep(delay).await;
                    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    seen.lock().push(key);
                    axum::Json(json!({"ok": true}))
                }
            }),
        );
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(s.cancelled_owned()).await });
        SlowReceiver { addr, keys, stop }
    }
    fn count(&self) -> usize {
        self.keys.lock().len()
    }
    fn per_key(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for k in self.keys.lock().iter() {
            *m.entry(k.clone()).or_insert(0) += 1;
        }
        m
    }
    async fn wait_for(&self, n: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        while self.count() < n {
            assert!(Instant::now() < deadline, "receiver saw {} of {n} requests within {bound:?}", self.count());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

struct Topics {
    input: String,
    results: String,
    dlq: String,
    group: String,
}

async fn topics(bootstrap: &str, name: &str, partitions: i32) -> Topics {
    let t = Topics {
        input: kafka::unique(&format!("{name}-in")),
        results: kafka::unique(&format!("{name}-results")),
        dlq: kafka::unique(&format!("{name}-dlq")),
        group: kafka::unique(&format!("{name}-group")),
    };
    kafka::create_topics(bootstrap, &[(&t.input, partitions), (&t.results, 2), (&t.dlq, 1)]).await;
    t
}

fn config(bootstrap: &str, t: &Topics, store: &std::path::Path, receiver: &SlowReceiver, in_flight: usize) -> Config {
    let mut c = Config::default();
    c.kafka.bootstrap_servers = bootstrap.into();
    c.kafka.group_id = t.group.clone();
    c.kafka.input_topics = vec![t.input.clone()];
    c.kafka.results_topic = t.results.clone();
    c.kafka.dead_letter_topic = t.dlq.clone();
    c.kafka.consumer.insert("session.timeout.ms".into(), "6000".into());
    c.kafka.consumer.insert("heartbeat.interval.ms".into(), "1000".into());
    c.store.path = store.to_path_buf();
    c.http.listen = "127.0.0.1:0".parse().expect("addr");
    c.pipeline.max_in_flight = std::num::NonZeroUsize::new(in_flight);
    c.pipeline.batch_size = std::num::NonZeroUsize::new(50).expect("nonzero");
    c.sinks.insert(
        "slow".into(),
        SinkConfig::Http(HttpSinkConfig {
            url: format!("http://{}/effects", receiver.addr),
            // Not forwarding: any re-run after a sloppy let-go would show as indeterminate
            // or as a second request.
            forward_key: false,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            ..HttpSinkConfig::default()
        }),
    );
    c.routes.push(RouteConfig {
        name: Some("slow".into()),
        types: vec!["*".into()],
        sink: "slow".into(),
        ttl: None,
        fingerprint_exclude: vec![],
    });
    c
}

async fn produce(bootstrap: &str, topic: &str, range: std::ops::Range<usize>) {
    let records = range
        .map(|i| {
            let v = json!({"id": format!("key-{i}"), "type": "effect.apply", "payload": {"i": i}});
            (format!("k{i}"), serde_json::to_vec(&v).expect("json"), vec![])
        })
        .collect();
    kafka::produce_all(bootstrap, topic, records).await;
}

struct Pipeline {
    stop: CancellationToken,
    task: JoinHandle<Result<(), dedupd::pipeline::PipelineError>>,
    http: SocketAddr,
}

async fn start(config: Config, options: RunOptions) -> Pipeline {
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = {
        let stop = stop.clone();
        tokio::spawn(dedupd::pipeline::run(config, options, stop.cancelled_owned(), move |r| {
            let _ = tx.send(r.http_addr);
        }))
    };
    let http = tokio::time::timeout(Duration::from_secs(30), rx).await.expect("pipeline started").expect("addr");
    Pipeline { stop, task, http }
}

impl Pipeline {
    async fn shutdown(self) {
        self.stop.cancel();
        match tokio::time::timeout(Duration::from_secs(60), self.task).await {
            Ok(Ok(Ok(()))) => {}
            other => panic!("pipeline did not stop cleanly: {other:?}"),
        }
    }
}

fn results_of(msgs: &[OwnedMessage]) -> Vec<ResultRecord> {
    msgs.iter()
        .map(|m| {
            let r: ResultRecord = serde_json::from_slice(m.payload().expect("value")).expect("result record");
            assert_eq!(header(m, "dedupd-outcome").as_deref(), Some(r.outcome.as_str()));
            r
        })
        .collect()
}

/// Committed offsets of `group` on `topic`'s partitions `0..partitions`.
async fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> HashMap<i32, i64> {
    let (b, g, t) = (bootstrap.to_string(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", &b).set("group.id", &g).create().expect("client");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&t, p);
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(10)).expect("committed");
        got.elements().iter().map(|e| (e.partition(), if let Offset::Offset(o) = e.offset() { o } else { 0 })).collect()
    })
    .await
    .expect("task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_commits_and_a_restart_finishes_exactly_once() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let t = topics(&bootstrap, "shutdown", 3).await;
    let n = 300;
    produce(&bootstrap, &t.input, 0..n).await;
    let receiver = SlowReceiver::start(Duration::from_millis(20)).await;
    let store = tempfile::tempdir().expect("tempdir");

    let p = start(config(&bootstrap, &t, store.path(), &receiver, 4), RunOptions::default()).await;
    receiver.wait_for(40, Duration::from_secs(90)).await;
    p.shutdown().await;

    // Everything published is committed, and everything committed is published: per
    // partition, the results cover exactly the offsets below the committed offset.
    let published = results_of(&kafka::read_all(&bootstrap, &t.results, n, Duration::from_secs(5)).await);
    assert!(published.len() < n, "shutdown came before the end ({} results)", published.len());
    let commits = committed(&bootstrap, &t.group, &t.input, 3).await;
    let mut by_partition: HashMap<i32, Vec<i64>> = HashMap::new();
    for r in &published {
        by_partition.entry(r.source.partition).or_default().push(r.source.offset);
    }
    for p in 0..3 {
        let mut offs = by_partition.remove(&p).unwrap_or_default();
        offs.sort_unstable();
        let c = commits.get(&p).copied().unwrap_or(0);
        assert_eq!(offs, (0..c).collect::<Vec<_>>(), "partition {p}: results vs committed offset {c}");
    }
    // No effect without a published result: cancelled work was released, not run.
    let executed: HashSet<String> = receiver.per_key().into_keys().collect();
    let reported: HashSet<String> = published.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(executed, reported, "effects and published results match at shutdown");

    // A restart over the same store finishes the rest.
    let p = start(config(&bootstrap, &t, store.path(), &receiver, 4), RunOptions::default()).await;
    let all = results_of(&kafka::read_all(&bootstrap, &t.results, n, Duration::from_secs(120)).await);
    p.shutdown().await;
    assert_eq!(all.len(), n, "one result per input");
    assert!(
        all.iter().all(|r| r.outcome == Outcome::Succeeded),
        "no duplicate or indeterminate after a clean shutdown"
    );
    let positions: HashSet<(i32, i64)> = all.iter().map(|r| (r.source.partition, r.source.offset)).collect();
    assert_eq!(positions.len(), n, "every input position exactly once");
    let per_key = receiver.per_key();
    assert_eq!(per_key.len(), n, "every key executed");
    assert!(per_key.values().all(|c| *c == 1), "no key executed twice");
    assert_eq!(kafka::count_records(&bootstrap, &t.results).await, n as i64, "nothing published twice");
    receiver.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_is_drained_and_committed_before_it_moves() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let parts = 4;
    let t = topics(&bootstrap, "revoke", parts).await;
    let n = 800;
    produce(&bootstrap, &t.input, 0..n).await;
    let receiver = SlowReceiver::start(Duration::from_millis(20)).await;
    let store = tempfile::tempdir().expect("tempdir");
    let p = start(config(&bootstrap, &t, store.path(), &receiver, 4), RunOptions::default()).await;
    receiver.wait_for(40, Duration::from_secs(90)).await;

    // Another member joins the group, takes some partitions for two seconds, and leaves.
    let (b, g, topic) = (bootstrap.clone(), t.group.clone(), t.input.clone());
    let (held, assigned_at, left_at) = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("group.id", &g)
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "6000")
            .create()
            .expect("intruder");
        c.subscribe(&[topic.as_str()]).expect("subscribe");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut assignment = TopicPartitionList::new();
        while assignment.count() == 0 {
            assert!(Instant::now() < deadline, "intruder got no partitions");
            let _ = c.poll(Duration::from_millis(100));
            assignment = c.assignment().expect("assignment");
        }
        let assigned_at = chrono::Utc::now().timestamp_millis();
        let got = c.committed_offsets(assignment, Duration::from_secs(10)).expect("committed");
        let held: HashMap<i32, i64> = got
            .elements()
            .iter()
            .map(|e| (e.partition(), if let Offset::Offset(o) = e.offset() { o } else { 0 }))
            .collect();
        let hold = Instant::now() + Duration::from_secs(2);
        while Instant::now() < hold {
            let _ = c.poll(Duration::from_millis(100));
        }
        let left_at = chrono::Utc::now().timestamp_millis();
        // Leave the group explicitly and serve the resulting events until the assignment
        // is gone (a plain drop of a subscribed BaseConsumer can block on close).
        c.unsubscribe();
        let bound = Instant::now() + Duration::from_secs(20);
        while c.assignment().map(|a| a.count() > 0).unwrap_or(false) && Instant::now() < bound {
            let _ = c.poll(Duration::from_millis(100));
        }
        // Dropping it would block in close (seen here); it has left the group already.
        std::mem::forget(c);
        (held, assigned_at, left_at)
    })
    .await
    .expect("intruder");
    assert!(!held.is_empty());

    let all = kafka::read_all(&bootstrap, &t.results, n, Duration::from_secs(180)).await;
    let results = results_of(&all);
    let positions: HashSet<(i32, i64)> = results.iter().map(|r| (r.source.partition, r.source.offset)).collect();
    assert_eq!(positions.len(), n, "every input position has a result");
    p.shutdown().await;
    assert_eq!(results.len(), n, "one result per input after the partitions came back");
    for (m, r) in all.iter().zip(&results) {
        let Some(&handed_over_at) = held.get(&r.source.partition) else { continue };
        let ts = m.timestamp().to_millis().expect("timestamp");
        if r.source.offset < handed_over_at {
            assert!(ts <= assigned_at, "result of {:?} published after the partition moved", r.source);
        } else {
            assert!(ts >= left_at, "result of {:?} published while another member held the partition", r.source);
        }
    }
    let per_key = receiver.per_key();
    assert_eq!(per_key.len(), n);
    assert!(per_key.values().all(|c| *c == 1), "no key executed twice across the rebalance");
    receiver.stop.cancel();
}

async fn readyz(addr: SocketAddr) -> (u16, String) {
    let r = reqwest::get(format!("http://{addr}/readyz")).await.expect("readyz");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_store_refuses_partitions_until_accepted() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let t = topics(&bootstrap, "lost-store", 2).await;
    produce(&bootstrap, &t.input, 0..100).await;
    let receiver = SlowReceiver::start(Duration::ZERO).await;
    let store = tempfile::tempdir().expect("tempdir");
    let path = store.path().join("store");

    let p = start(config(&bootstrap, &t, &path, &receiver, 16), RunOptions::default()).await;
    assert_eq!(kafka::read_all(&bootstrap, &t.results, 100, Duration::from_secs(120)).await.len(), 100);
    p.shutdown().await;

    // The store is lost; the group's committed offsets remain.
    std::fs::remove_dir_all(&path).expect("delete store");
    produce(&bootstrap, &t.input, 100..150).await;
    let p = start(config(&bootstrap, &t, &path, &receiver, 16), RunOptions::default()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = readyz(p.http).await;
        if status == 503 && body.contains(&format!("{}/0", t.input)) && body.contains(&format!("{}/1", t.input)) {
            break;
        }
        assert!(Instant::now() < deadline, "readyz never reported both partitions refused: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics =
        reqwest::get(format!("http://{}/metrics", p.http)).await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("dedupd_refused_partitions 2"), "{metrics}");
    // The commands waiting on the refused partitions show as their lag (the lag alert's
    // input), though neither is fetched.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics =
            reqwest::get(format!("http://{}/metrics", p.http)).await.expect("metrics").text().await.expect("text");
        let lags: Vec<i64> = (0..2)
            .filter_map(|partition| {
                let series = format!("dedupd_consumer_lag{{partition=\"{partition}\",topic=\"{}\"}} ", t.input);
                metrics.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.parse().ok())
            })
            .collect();
        if lags.len() == 2 && lags.iter().sum::<i64>() == 50 {
            break;
        }
        assert!(Instant::now() < deadline, "lag of the refused partitions never showed the 50 waiting: {lags:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Refused means nothing happens: watch for two seconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 100, "no effect from a refused partition");
    assert_eq!(kafka::count_records(&bootstrap, &t.results).await, 100, "no result from a refused partition");
    p.shutdown().await;

    // The operator accepts the empty store: the new commands run, history does not.
    let p = start(
        config(&bootstrap, &t, &path, &receiver, 16),
        RunOptions { accept_empty_store: true, ..RunOptions::default() },
    )
    .await;
    let all = kafka::read_all(&bootstrap, &t.results, 150, Duration::from_secs(120)).await;
    p.shutdown().await;
    assert_eq!(all.len(), 150);
    let per_key = receiver.per_key();
    assert_eq!(per_key.len(), 150);
    assert!(per_key.values().all(|c| *c == 1), "history was not re-run");

    // Accepted once is accepted: the store is lost again and accepted with nothing new to
    // process, and the next start without the flag takes both partitions.
    std::fs::remove_dir_all(&path).expect("delete store");
    let accepting = RunOptions { accept_empty_store: true, ..RunOptions::default() };
    let p = start(config(&bootstrap, &t, &path, &receiver, 16), accepting).await;
    until_ready(p.http).await;
    p.shutdown().await;
    let p = start(config(&bootstrap, &t, &path, &receiver, 16), RunOptions::default()).await;
    until_ready(p.http).await;
    produce(&bootstrap, &t.input, 150..160).await;
    assert_eq!(kafka::read_all(&bootstrap, &t.results, 160, Duration::from_secs(120)).await.len(), 160);
    p.shutdown().await;
    let per_key = receiver.per_key();
    assert_eq!(per_key.len(), 160);
    assert!(per_key.values().all(|c| *c == 1), "nothing re-run");
    receiver.stop.cancel();
}

/// Waits until `/readyz` says ready; fails on a refused partition or after 60 s.
async fn until_ready(http: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = readyz(http).await;
        assert!(!body.contains("refused"), "a partition was refused: {body}");
        if status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "never ready: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

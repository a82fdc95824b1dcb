//! SIGKILL the real `dedupd` binary twenty times while it works, on a real Kafka broker
//! (docs/contract.md §3 "durable before the sink is called", §4 crash rows, §5 "nothing is lost"), with
//! every sink kind in the same run.
//!
//! ~2,900 commands over 6 partitions, ~30% of them repeats (right behind the original in the
//! same batch, ~200 records later, or through another partition). Key `i` is routed (by its
//! command type) to one of seven sinks, `SINKS[i % 7]`, each one's downstream recording every
//! effect *when it happens* and answering a little later (so kills land between the effect
//! and the answer):
//! - `http-once` / `http-fwd` (`forward_key` false / true): one loopback HTTP receiver (the
//!   path names the sink) that records each request on arrival and answers 5–30 ms later;
//! - `kafka` (always forwards): its sink topic, read back;
//! - `smtp-once` / `smtp-fwd`: one aiosmtpd server (tests/common/smtp_server.rs) that stores
//!   each message and answers 5–30 ms later; the Message-ID `<KEY@SINK.test>` names key and sink;
//! - `exec-once` / `exec-fwd`: a script that appends `SINK KEY ATTEMPT RUN PAYLOAD` to a file,
//!   then sleeps 10–30 ms.
//!
//! The input is produced in 21 chunks, one as each incarnation starts. 20 incarnations are
//! SIGKILLed 50–600 ms after they start working: their first request or result once they
//! have their partitions (a kill before that tests nothing; a restarted incarnation rejoins
//! as the same static member at once, with the default 45 s session); every fifth instead
//! 50–600 ms after spawn (store open, group join). The 21st runs until every input has a result and is
//! stopped with SIGTERM. Then, from the outside only (the downstreams, the results topic, the
//! store opened directly), every kind is held to the same rules (tests/common/kill_check.rs:
//! every input has a result; at most one effect per key at a non-forwarding sink, and
//! `indeterminate` for a key it never received; ...), and every sink must have seen a kill
//! between an effect and its completion.
//!
//! Every registered store backend, one after the other (to keep the load of a 2-core
//! machine bounded).
//! Seed: `KAFKA_KILL_SEED` (printed; replays kill timing and the HTTP receiver's delays, not
//! the scheduling nor the SMTP and exec delays). Needs python3 with aiosmtpd. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka_kill -- --nocapture`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::effects::{self, Downstreams, SinkKind};
use common::kafka;
use common::kill_check::{self, Outside, Plan};
use common::process::{
    DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, file_len, seed_from_env, tail_of_file,
    wait_for_line,
};
use common::smtp_server::SmtpServer;
use dedupd::outcome::ResultRecord;
use dedupd::store::KeyStore;
use dedupd::store::{StoreBackend, SyncMode};
use rdkafka::message::Message;
use serde_json::{Value, json};

const PARTITIONS: i32 = 6;
const RESULT_PARTITIONS: i32 = 3;
const SINK_TOPIC_PARTITIONS: i32 = 3;
/// Distinct keys; with the repeats this makes ~2,940 input records.
const DISTINCT: usize = 2_040;
/// A late repeat of key `i` follows the original of key `i + LATE_GAP`.
const LATE_GAP: usize = 150;
const KILLS: usize = 20;
/// Kill this long (ms, uniform) after an incarnation started working (or was spawned).
const KILL_DELAY_MS: (u64, u64) = (50, 600);
/// The HTTP and SMTP receivers answer this long (ms, uniform) after a request arrived.
const RECEIVER_DELAY_MS: (u64, u64) = (5, 30);
/// Longest wait for an incarnation to get its partitions.
const ASSIGN_BOUND: Duration = Duration::from_secs(30);
/// Longest wait, after that, for its first request or result (then it is killed anyway).
const FIRST_WORK_BOUND: Duration = Duration::from_secs(5);
/// Longest wait for the final run to publish a result for every input.
const RESULTS_BOUND: Duration = Duration::from_secs(150);

/// The sinks (name, kind, forwards the key), one route each; key `i` goes to
/// `SINKS[i % SINKS.len()]` through command type `NAME.apply`.
const SINKS: [(&str, SinkKind, bool); 7] = [
    ("http-once", SinkKind::Http, false),
    ("http-fwd", SinkKind::Http, true),
    ("kafka", SinkKind::Kafka, true),
    ("smtp-once", SinkKind::Smtp, false),
    ("smtp-fwd", SinkKind::Smtp, true),
    ("exec-once", SinkKind::Exec, false),
    ("exec-fwd", SinkKind::Exec, true),
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Original,
    SameBatch,
    Late,
    OtherPartition,
}

#[derive(Debug, Clone)]
struct Input {
    i: usize,
    kind: Kind,
    kafka_key: String,
    value: Vec<u8>,
    partition: i32,
}

fn id(i: usize) -> String {
    format!("cmd-{i}")
}

fn sink_of(i: usize) -> (&'static str, SinkKind, bool) {
    SINKS[i % SINKS.len()]
}

fn payload(i: usize) -> Value {
    match sink_of(i).1 {
        SinkKind::Smtp => {
            json!({"to": format!("u{i}@example.org"), "subject": format!("order {i}"), "text": format!("n={i}")})
        }
        _ => json!({"n": i, "customer": format!("c{}", i % 97), "amount": 100 + i}),
    }
}

fn command(i: usize) -> Vec<u8> {
    let kind = format!("{}.apply", sink_of(i).0);
    serde_json::to_vec(&json!({"id": id(i), "type": kind, "payload": payload(i)})).expect("json")
}

/// What the checks expect of key `i`.
fn plans() -> Vec<Plan> {
    (0..DISTINCT)
        .map(|i| {
            let (sink, kind, forwarding) = sink_of(i);
            Plan { key: id(i), sink, kind, forwarding, seen: effects::seen_as(kind, &payload(i)) }
        })
        .collect()
}

fn workload() -> Vec<Input> {
    let mut out = Vec::new();
    let mut late: BTreeMap<usize, Vec<Input>> = BTreeMap::new();
    for i in 0..DISTINCT {
        let p = (i % PARTITIONS as usize) as i32;
        let rec = |kind, kafka_key: String, partition| Input { i, kind, kafka_key, value: command(i), partition };
        out.push(rec(Kind::Original, format!("k-{i}"), p));
        match i % 34 {
            0..5 => out.push(rec(Kind::SameBatch, format!("k-{i}"), p)),
            5..10 => late.entry(i + LATE_GAP).or_default().push(rec(Kind::Late, format!("k-{i}"), p)),
            10..15 => out.push(rec(Kind::OtherPartition, format!("x-{i}"), (p + 3) % PARTITIONS)),
            _ => {}
        }
        if let Some(due) = late.remove(&i) {
            out.extend(due);
        }
    }
    out.extend(late.into_values().flatten());
    out
}

/// The `[sinks.NAME]` table of every sink (reaching `d`) and its route.
fn sinks_toml(d: &Downstreams<'_>) -> String {
    let mut out = String::new();
    for (name, kind, forwarding) in SINKS {
        let table = d.sink_table(name, kind, forwarding);
        out.push_str(&format!(
            "[sinks.{name}]\n{table}\n\n[[routes]]\nname = \"{name}\"\ntypes = [\"{name}.*\"]\nsink = \"{name}\"\n\n"
        ));
    }
    out
}

fn config_toml(bootstrap: &str, group: &str, topics: [&str; 3], backend: &str, store: &Path, sinks: &str) -> String {
    let store = store.to_str().expect("utf-8 path");
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}

[store]
backend = "{backend}"
path = {store:?}

[pipeline]
# Small, so that a chunk takes a few hundred ms and kills land mid-work.
max_in_flight = 8
batch_size = 50
batch_linger = "5ms"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"

{sinks}"#,
        kafka_table = kafka::kafka_table(bootstrap, group, input, results, dlq)
    )
}

/// What happened at one kill.
#[derive(Debug)]
struct Kill {
    incarnation: usize,
    from_spawn: bool,
    delay: Duration,
    /// Time from spawn to the kill.
    lived: Duration,
    /// Requests the receiver was answering at the kill.
    in_flight: usize,
    /// Requests the incarnation made.
    requests: usize,
    /// How long before the kill the latest request arrived (None: none so far).
    since_last_request: Option<Duration>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_twenty_times_on_each_backend() {
    for &backend in StoreBackend::ALL {
        run(backend).await;
    }
}

async fn run(kind: StoreBackend) {
    let backend = kind.name();
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let started = Instant::now();
    let seed = seed_from_env("KAFKA_KILL_SEED");
    println!("[{backend}] seed {seed} (replay the timing with KAFKA_KILL_SEED={seed})");
    let mut rng = SplitMix(seed);

    let input_topic = kafka::unique("kill-commands");
    let results_topic = kafka::unique("kill-results");
    let dlq_topic = kafka::unique("kill-dlq");
    let sink_topic = kafka::unique("kill-sink");
    kafka::create_topics(
        &bootstrap,
        &[
            (&input_topic, PARTITIONS),
            (&results_topic, RESULT_PARTITIONS),
            (&dlq_topic, 1),
            (&sink_topic, SINK_TOPIC_PARTITIONS),
        ],
    )
    .await;

    let Some(smtp) = SmtpServer::start_slow(RECEIVER_DELAY_MS) else { return };
    let receiver = SlowReceiver::start(RECEIVER_DELAY_MS, rng.next_u64()).await;
    let mut dir = KeptOnFailure::new();
    let store_path = dir.path().join("store");
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    let exec_effects = dir.path().join("exec-effects");
    let exec_program = effects::exec_recorder(dir.path(), &exec_effects);
    let downstreams = Downstreams {
        http: &receiver,
        kafka_bootstrap: &bootstrap,
        kafka_topic: &sink_topic,
        smtp_port: smtp.port,
        exec_program: &exec_program,
    };
    let toml = config_toml(
        &bootstrap,
        &kafka::unique("kill-dedupd"),
        [&input_topic, &results_topic, &dlq_topic],
        backend,
        &store_path,
        &sinks_toml(&downstreams),
    );
    std::fs::write(&config_path, toml).expect("write config");
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["check-config", "-c", config_path.to_str().expect("utf-8")])
        .output()
        .expect("run check-config");
    assert!(checked.status.success(), "check-config: {}", String::from_utf8_lossy(&checked.stderr));

    let sink_tail = TopicTail::start(&bootstrap, &sink_topic, SINK_TOPIC_PARTITIONS);
    let tail = TopicTail::start(&bootstrap, &results_topic, RESULT_PARTITIONS);

    // The input, in KILLS + 1 chunks produced in order, one as each incarnation starts.
    let inputs = Arc::new(workload());
    let n = inputs.len();
    let chunks: Vec<Range<usize>> = (0..=KILLS).map(|j| j * n / (KILLS + 1)..(j + 1) * n / (KILLS + 1)).collect();
    let repeats = |k: Kind| inputs.iter().filter(|r| r.kind == k).count();
    println!(
        "[{backend}] workload: {n} records, {DISTINCT} keys over {} sinks, repeats: {} same batch, {} late, {} other partition; \
         {} chunks of ~{}",
        SINKS.len(),
        repeats(Kind::SameBatch),
        repeats(Kind::Late),
        repeats(Kind::OtherPartition),
        chunks.len(),
        n / (KILLS + 1)
    );
    let (go, mut go_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let producer = {
        let (inputs, bootstrap, topic) = (Arc::clone(&inputs), bootstrap.clone(), input_topic.clone());
        tokio::spawn(async move {
            let mut positions = Vec::with_capacity(inputs.len());
            while let Some(j) = go_rx.recv().await {
                let records = inputs[chunks[j].clone()]
                    .iter()
                    .map(|r| (r.kafka_key.clone(), r.value.clone(), Vec::new(), Some(r.partition)))
                    .collect();
                positions.extend(kafka::produce_all_to(&bootstrap, &topic, records).await);
            }
            positions
        })
    };

    let mut kills: Vec<Kill> = Vec::new();
    let mut process = None;
    for incarnation in 0..=KILLS {
        go.send(incarnation).expect("producer task alive");
        let log_from = file_len(&log_path);
        let requests_before = receiver.count();
        let mut p = DedupdProcess::run(&config_path, &log_path);
        if incarnation == KILLS {
            process = Some(p);
            break;
        }
        let from_spawn = incarnation % 5 == 4;
        let delay = Duration::from_millis(rng.between(KILL_DELAY_MS.0, KILL_DELAY_MS.1));
        let base = if from_spawn {
            p.spawned
        } else {
            // "Starts working" = its first HTTP request, sink record or result once it has its partitions
            // (the assignment is logged by the consumer's assign callback, seconds after
            // the previous incarnation died, so nothing of that one is mistaken for it).
            let assigned =
                wait_for_line(&log_path, log_from, "partitions assigned", ASSIGN_BOUND, || p.exited().is_some()).await;
            if assigned.is_none() {
                panic!(
                    "incarnation {incarnation} got no partitions within {ASSIGN_BOUND:?} (exited: {:?}); log:\n{}",
                    p.exited(),
                    tail_of_file(&log_path, 40)
                );
            }
            let work = || (receiver.count(), tail.len(), sink_tail.len());
            let before = work();
            let deadline = Instant::now() + FIRST_WORK_BOUND;
            while work() == before && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Instant::now()
        };
        tokio::time::sleep_until((base + delay).into()).await;
        if let Some(status) = p.exited() {
            panic!(
                "dedupd exited by itself ({status}) in incarnation {incarnation}; log:\n{}",
                tail_of_file(&log_path, 40)
            );
        }
        let in_flight = receiver.in_flight();
        let lived = p.spawned.elapsed();
        p.kill();
        let requests = receiver.count() - requests_before;
        let since_last_request = receiver.last_arrival().map(|t| t.elapsed()).filter(|_| requests > 0);
        kills.push(Kill { incarnation, from_spawn, delay, lived, in_flight, requests, since_last_request });
    }
    let mut process = process.expect("final incarnation");
    drop(go);
    let positions = producer.await.expect("producer task");
    assert_eq!(positions.len(), n, "every input produced");
    let by_pos: HashMap<(i32, i64), usize> = positions.iter().enumerate().map(|(seq, pos)| (*pos, seq)).collect();
    assert_eq!(by_pos.len(), n, "every input has its own position");
    for (seq, r) in inputs.iter().enumerate() {
        assert_eq!(positions[seq].0, r.partition, "input {seq} went to the partition asked for");
    }
    println!(
        "[{backend}] {} kills in {:.1} s, {} of them while the HTTP receiver was answering requests:",
        kills.len(),
        started.elapsed().as_secs_f64(),
        kills.iter().filter(|k| k.in_flight > 0).count(),
    );
    for k in &kills {
        println!(
            "[{backend}]   #{:<2} {} + {:>3} ms (lived {:>5} ms): {:>3} HTTP requests made, {} in flight, the latest {}",
            k.incarnation,
            if k.from_spawn { "spawn" } else { "work " },
            k.delay.as_millis(),
            k.lived.as_millis(),
            k.requests,
            k.in_flight,
            k.since_last_request.map_or("-".to_string(), |d| format!("{} ms before the kill", d.as_millis()))
        );
    }

    // The final run: until every input has a result (bounded), then SIGTERM.
    let t = Instant::now();
    let mut covered: HashSet<usize> = HashSet::new();
    let mut read = 0usize;
    let deadline = Instant::now() + RESULTS_BOUND;
    while covered.len() < n && Instant::now() < deadline {
        for m in tail.since(read) {
            read += 1;
            if let Ok(r) = serde_json::from_slice::<ResultRecord>(m.payload().unwrap_or_default())
                && let Some(seq) = by_pos.get(&(r.source.partition, r.source.offset))
            {
                covered.insert(*seq);
            }
        }
        if let Some(status) = process.exited() {
            panic!("final dedupd exited by itself ({status}); log:\n{}", tail_of_file(&log_path, 40));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "[{backend}] final run: {}/{n} inputs with a result after {:.1} s",
        covered.len(),
        t.elapsed().as_secs_f64()
    );
    let status = process.terminate(Duration::from_secs(60));
    let mut failures: Vec<String> = Vec::new();
    match status {
        Some(s) if s.success() => {}
        other => failures.push(format!("final dedupd did not exit cleanly on SIGTERM within 60 s: {other:?}")),
    }
    // Everything published is read before checking.
    let published = kafka::count_records(&bootstrap, &results_topic).await as usize;
    let catch_up = Instant::now() + Duration::from_secs(30);
    while tail.len() < published && Instant::now() < catch_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let results = tail.stop();
    if results.len() != published {
        failures.push(format!("read {} result records, the topic holds {published}", results.len()));
    }
    let dead_letters = kafka::count_records(&bootstrap, &dlq_topic).await;
    if dead_letters != 0 {
        failures.push(format!("{dead_letters} dead letter(s), but every input is a valid command"));
    }
    let sink_published = kafka::count_records(&bootstrap, &sink_topic).await as usize;
    let catch_up = Instant::now() + Duration::from_secs(30);
    while sink_tail.len() < sink_published && Instant::now() < catch_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sunk = sink_tail.stop();
    if sunk.len() != sink_published {
        failures.push(format!("read {} records of the kafka sink's topic, it holds {sink_published}", sunk.len()));
    }
    // Every downstream's effects, in the order each received them.
    let mut received = effects::from_http(&receiver.seen());
    receiver.stop().await;
    received.extend(effects::from_kafka("kafka", &sunk, &mut failures));
    received.extend(effects::from_smtp(&smtp.received_numbered()));
    received.extend(effects::from_exec(&exec_effects, &mut failures));
    let store = KeyStore::open(kind, &store_path, SyncMode::Batch).expect("open the store after the final run");

    let plans = plans();
    let input_keys: Vec<usize> = inputs.iter().map(|r| r.i).collect();
    let outside = Outside {
        input_topic: &input_topic,
        inputs: &input_keys,
        by_pos: &by_pos,
        results: &results,
        effects: &received,
        store: &store,
    };
    let coverage = kill_check::check(backend, &plans, &outside, &mut failures);
    // The test must have exercised what it is about, or it proves nothing: at every sink, a
    // kill between an effect and its completion (each run sees 15-35 per sink; how many kills
    // land mid-request varies with the machine's load, so only one is required).
    for (name, _, forwards) in SINKS {
        let c = &coverage[name];
        let (exercised, what) = if forwards {
            (c.reran, "key re-run")
        } else {
            (c.received_indeterminate, "key received but never completed")
        };
        if exercised == 0 {
            failures.push(format!(
                "coverage: sink {name}: no {what}; the kills missed its crash row (timing too fast or slow?)"
            ));
        }
    }
    drop(store);
    if !failures.is_empty() {
        let kept = dir.keep();
        panic!(
            "[{backend}] {} failure(s) (seed {seed}; log, config and store kept in {}):\n{}\nlast log lines:\n{}",
            failures.len(),
            kept.display(),
            failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n"),
            tail_of_file(&log_path, 20)
        );
    }
    println!("[{backend}] passed in {:.1} s", started.elapsed().as_secs_f64());
}

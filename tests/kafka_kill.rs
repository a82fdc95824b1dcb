//! SIGKILL the real `dedupd` binary twenty times while it works, on a real Kafka broker
//! (SPEC §3 "durable before the sink is called", §4 crash rows, §5 "nothing is lost").
//!
//! ~2,900 commands over 6 partitions, ~30% of them repeats (right behind the original in the
//! same batch, ~200 records later, or through another partition), half of the keys routed
//! to an `http` sink with `forward_key = false` (path `/once`), half to one with
//! `forward_key = true` (path `/fwd`), both on one loopback receiver that records each
//! request on arrival (the effect) and answers 5–30 ms later (so kills land between the
//! effect and the answer).
//!
//! The input is produced in 21 chunks, one as each incarnation starts. 20 incarnations are
//! SIGKILLed 50–600 ms after they start working: their first request or result once they
//! have their partitions (a restart after SIGKILL waits ~2 s for the dead member's session
//! to expire, and a kill before that tests nothing); every fifth instead 50–600 ms after
//! spawn (store open, group join). The 21st runs until every input has a result and is stopped with SIGTERM.
//! Then, from the outside only (the receiver, the results topic, the store opened directly):
//! - every input record (partition/offset) has a result; repeated results only after kills;
//! - every key has a result; outcomes are only `succeeded`, `duplicate`, `indeterminate`;
//!   a key never has both a `succeeded`/`duplicate` and an `indeterminate`, nor two
//!   `succeeded`;
//! - non-forwarding sink: at most one request per key; a key it never received ends
//!   `indeterminate` (store and results);
//! - forwarding sink: every key ends `succeeded` (orphans are re-run, never indeterminate);
//!   its repeated requests for a key carry the same `Idempotency-Key` and body, and
//!   strictly increasing `Dedupd-Attempt`;
//! - every key stored or published as succeeded was received by its own sink, and its stored
//!   and replayed result is the answer to one of its own requests;
//! - the store holds no `in_progress` record after the final run.
//!
//! Both store backends (`kill_nine_twenty_times` on sled, `..._fjall`); the two tests take
//! turns (one at a time) to keep the load of a 2-core machine bounded.
//! Seed: `KAFKA_KILL_SEED` (printed; replays kill timing and receiver delays, not the
//! scheduling). Run with `scripts/kafka/kafka.sh with cargo test --test kafka_kill -- --nocapture`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::kafka::{self, header};
use common::process::{
    DedupdProcess, KeptOnFailure, Seen, SlowReceiver, SplitMix, TopicTail, file_len, seed_from_env, tail_of_file, wait_for_line,
};
use dedupd::config::{StoreBackend, SyncMode};
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::store::{Completion, KeyStore, Record};
use rdkafka::message::Message;
use serde_json::{Value, json};

const PARTITIONS: i32 = 6;
const RESULT_PARTITIONS: i32 = 3;
/// Distinct keys; with the repeats this makes ~2,940 input records.
const DISTINCT: usize = 2_040;
/// A late repeat of key `i` follows the original of key `i + LATE_GAP`.
const LATE_GAP: usize = 150;
const KILLS: usize = 20;
/// Kill this long (ms, uniform) after an incarnation started working (or was spawned).
const KILL_DELAY_MS: (u64, u64) = (50, 600);
/// The receiver answers this long (ms, uniform) after a request arrived.
const RECEIVER_DELAY_MS: (u64, u64) = (5, 30);
/// Longest wait for an incarnation to get its partitions.
const ASSIGN_BOUND: Duration = Duration::from_secs(30);
/// Longest wait, after that, for its first request or result (then it is killed anyway).
const FIRST_WORK_BOUND: Duration = Duration::from_secs(5);
/// Longest wait for the final run to publish a result for every input.
const RESULTS_BOUND: Duration = Duration::from_secs(150);

/// One test at a time in this binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// Odd keys go to the forwarding sink, even ones to the non-forwarding one.
fn forwarding(i: usize) -> bool {
    i % 2 == 1
}

fn path_of(i: usize) -> &'static str {
    if forwarding(i) { "/fwd" } else { "/once" }
}

fn payload(i: usize) -> Value {
    json!({"n": i, "customer": format!("c{}", i % 97), "amount": 100 + i})
}

fn command(i: usize) -> Vec<u8> {
    let kind = if forwarding(i) { "fwd.apply" } else { "once.apply" };
    serde_json::to_vec(&json!({"id": id(i), "type": kind, "payload": payload(i)})).expect("json")
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

#[allow(clippy::too_many_arguments)]
fn config_toml(
    bootstrap: &str,
    group: &str,
    input: &str,
    results: &str,
    dlq: &str,
    backend: &str,
    store: &Path,
    receiver: &SlowReceiver,
) -> String {
    let store = store.to_str().expect("utf-8 path");
    let (once, fwd) = (receiver.url("/once"), receiver.url("/fwd"));
    format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
input_topics = ["{input}"]
results_topic = "{results}"
dead_letter_topic = "{dlq}"

[kafka.consumer]
# A restart after SIGKILL waits for the dead member's session to expire.
"session.timeout.ms" = "2000"
"heartbeat.interval.ms" = "500"

[store]
backend = "{backend}"
path = {store:?}

[pipeline]
# Small, so that a chunk takes a few hundred ms and kills land mid-work.
max_in_flight = 8
batch_size = 50
batch_linger = "5ms"

[sinks.once]
kind = "http"
url = "{once}"
forward_key = false
request_timeout = "10s"

[sinks.fwd]
kind = "http"
url = "{fwd}"
forward_key = true
request_timeout = "10s"

[[routes]]
name = "once"
types = ["once.*"]
sink = "once"

[[routes]]
name = "fwd"
types = ["fwd.*"]
sink = "fwd"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"
"#
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
async fn kill_nine_twenty_times() {
    run("sled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_twenty_times_fjall() {
    run("fjall").await;
}

async fn run(backend: &str) {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let seed = seed_from_env("KAFKA_KILL_SEED");
    println!("[{backend}] seed {seed} (replay the timing with KAFKA_KILL_SEED={seed})");
    let mut rng = SplitMix(seed);

    let input_topic = kafka::unique("kill-commands");
    let results_topic = kafka::unique("kill-results");
    let dlq_topic = kafka::unique("kill-dlq");
    kafka::create_topics(&bootstrap, &[(&input_topic, PARTITIONS), (&results_topic, RESULT_PARTITIONS), (&dlq_topic, 1)])
        .await;

    let receiver = SlowReceiver::start(RECEIVER_DELAY_MS, rng.next_u64()).await;
    let mut dir = KeptOnFailure::new();
    let store_path = dir.path().join("store");
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    let toml = config_toml(
        &bootstrap,
        &kafka::unique("kill-dedupd"),
        &input_topic,
        &results_topic,
        &dlq_topic,
        backend,
        &store_path,
        &receiver,
    );
    std::fs::write(&config_path, toml).expect("write config");
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["check-config", "-c", config_path.to_str().expect("utf-8")])
        .output()
        .expect("run check-config");
    assert!(checked.status.success(), "check-config: {}", String::from_utf8_lossy(&checked.stderr));

    let tail = TopicTail::start(&bootstrap, &results_topic, RESULT_PARTITIONS);

    // The input, in KILLS + 1 chunks produced in order, one as each incarnation starts.
    let inputs = Arc::new(workload());
    let n = inputs.len();
    let chunks: Vec<Range<usize>> = (0..=KILLS).map(|j| j * n / (KILLS + 1)..(j + 1) * n / (KILLS + 1)).collect();
    println!("[{backend}] workload: {n} records, {DISTINCT} keys, {} chunks of ~{}", chunks.len(), n / (KILLS + 1));
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
            // "Starts working" = its first request or result once it has its partitions
            // (the assignment is logged by the consumer's assign callback, seconds after
            // the previous incarnation died, so nothing of that one is mistaken for it).
            let assigned = wait_for_line(&log_path, log_from, "partitions assigned", ASSIGN_BOUND, || p.exited().is_some()).await;
            if assigned.is_none() {
                panic!(
                    "incarnation {incarnation} got no partitions within {ASSIGN_BOUND:?} (exited: {:?}); log:\n{}",
                    p.exited(),
                    tail_of_file(&log_path, 40)
                );
            }
            let (requests, results) = (receiver.count(), tail.len());
            let deadline = Instant::now() + FIRST_WORK_BOUND;
            while receiver.count() == requests && tail.len() == results && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Instant::now()
        };
        tokio::time::sleep_until((base + delay).into()).await;
        if let Some(status) = p.exited() {
            panic!("dedupd exited by itself ({status}) in incarnation {incarnation}; log:\n{}", tail_of_file(&log_path, 40));
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
        "[{backend}] {} kills in {:.1} s, {} of them while the receiver was answering requests:",
        kills.len(),
        started.elapsed().as_secs_f64(),
        kills.iter().filter(|k| k.in_flight > 0).count(),
    );
    for k in &kills {
        println!(
            "[{backend}]   #{:<2} {} + {:>3} ms (lived {:>5} ms): {:>3} requests made, {} in flight, the latest {}",
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
    println!("[{backend}] final run: {}/{n} inputs with a result after {:.1} s", covered.len(), t.elapsed().as_secs_f64());
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
    let seen = receiver.seen();
    receiver.stop().await;
    let store = KeyStore::open(
        if backend == "fjall" { StoreBackend::Fjall } else { StoreBackend::Sled },
        &store_path,
        SyncMode::Batch,
    )
    .expect("open the store after the final run");

    let coverage = check(backend, &inputs, &by_pos, &input_topic, &results, &seen, &store, &mut failures);
    // The test must have exercised what it is about, or it proves nothing: kills between an
    // effect and its answer, for both kinds of sink. (How many kills land mid-request varies
    // with the machine's load: under I/O pressure the store's flushes leave gaps of a few
    // hundred ms between request bursts; those kills are printed, not required.)
    if coverage.answer_lost_once == 0 || coverage.reran_fwd == 0 {
        failures.push(format!(
            "coverage: {} non-forwarding key(s) were received but never completed, {} forwarding key(s) were re-run; the kills did \
             not exercise the crash rows (timing too fast or slow?)",
            coverage.answer_lost_once, coverage.reran_fwd
        ));
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

/// What the crash rows the run exercised.
struct Coverage {
    /// Non-forwarding keys received but ending indeterminate (killed between the request and
    /// the durable completion).
    answer_lost_once: usize,
    /// Forwarding keys requested more than once (orphan re-run).
    reran_fwd: usize,
}

#[allow(clippy::too_many_arguments)]
fn check(
    backend: &str,
    inputs: &[Input],
    by_pos: &HashMap<(i32, i64), usize>,
    input_topic: &str,
    results: &[rdkafka::message::OwnedMessage],
    seen: &[Seen],
    store: &KeyStore,
    failures: &mut Vec<String>,
) -> Coverage {
    let n = inputs.len();
    let mut fail = |s: String| failures.push(s);

    // Results: every input has at least one; each names a known input and its key.
    let mut per_seq: Vec<Vec<ResultRecord>> = vec![Vec::new(); n];
    let mut per_key: Vec<Vec<ResultRecord>> = vec![Vec::new(); DISTINCT];
    let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    for m in results {
        let r: ResultRecord = match serde_json::from_slice(m.payload().unwrap_or_default()) {
            Ok(r) => r,
            Err(e) => {
                fail(format!("unreadable result record: {e}"));
                continue;
            }
        };
        if r.source.topic != input_topic {
            fail(format!("result from another topic: {:?}", r.source));
            continue;
        }
        let Some(&seq) = by_pos.get(&(r.source.partition, r.source.offset)) else {
            fail(format!("result for an unknown input {:?}", r.source));
            continue;
        };
        let i = inputs[seq].i;
        if r.key.as_deref() != Some(id(i).as_str()) {
            fail(format!("result of input {seq} names key {:?}, expected {}", r.key, id(i)));
        }
        if header(m, "dedupd-outcome").as_deref() != Some(r.outcome.as_str()) {
            fail(format!("dedupd-outcome header of input {seq} differs from {}", r.outcome.as_str()));
        }
        *outcomes.entry(r.outcome.as_str()).or_insert(0) += 1;
        per_seq[seq].push(r.clone());
        per_key[i].push(r);
    }
    let missing: Vec<usize> = (0..n).filter(|s| per_seq[*s].is_empty()).collect();
    if !missing.is_empty() {
        fail(format!(
            "{} inputs without a result, e.g. {:?}",
            missing.len(),
            missing.iter().take(10).map(|s| (*s, inputs[*s].kind, id(inputs[*s].i))).collect::<Vec<_>>()
        ));
    }
    let repeated_results = per_seq.iter().filter(|v| v.len() > 1).count();

    // The receiver: who got what.
    let mut requests: Vec<Vec<&Seen>> = vec![Vec::new(); DISTINCT];
    for s in seen {
        let body: Value = match serde_json::from_slice(&s.body) {
            Ok(v) => v,
            Err(e) => {
                fail(format!("request {} has a body that is not JSON: {e}", s.seq));
                continue;
            }
        };
        let Some(i) = body.get("n").and_then(Value::as_u64).map(|n| n as usize).filter(|i| *i < DISTINCT) else {
            fail(format!("request {} with an unexpected body {body}", s.seq));
            continue;
        };
        if s.path != path_of(i) {
            fail(format!("request {} for {} went to {}, its route's sink is {}", s.seq, id(i), s.path, path_of(i)));
        }
        if s.key.as_deref() != Some(id(i).as_str()) {
            fail(format!("request {} for {} carries Idempotency-Key {:?}", s.seq, id(i), s.key));
        }
        if body != payload(i) {
            fail(format!("request {} for {}: body {body} is not the payload", s.seq, id(i)));
        }
        requests[i].push(s);
    }
    for (i, reqs) in requests.iter().enumerate() {
        if !forwarding(i) && reqs.len() > 1 {
            fail(format!(
                "non-forwarding key {} executed {} times (requests {:?})",
                id(i),
                reqs.len(),
                reqs.iter().map(|s| s.seq).collect::<Vec<_>>()
            ));
        }
        if forwarding(i) && reqs.len() > 1 {
            let first = reqs[0];
            for s in &reqs[1..] {
                if s.key != first.key || s.body != first.body {
                    fail(format!("forwarding key {}: request {} differs from request {} in key or body", id(i), s.seq, first.seq));
                }
            }
            let attempts: Vec<u64> = reqs.iter().map(|s| s.attempt.as_deref().and_then(|a| a.parse().ok()).unwrap_or(0)).collect();
            if attempts.windows(2).any(|w| w[0] >= w[1]) {
                fail(format!("forwarding key {}: Dedupd-Attempt not increasing over its re-runs: {attempts:?}", id(i)));
            }
        }
    }

    // Per key: results, requests and the stored record agree.
    let mut records: HashMap<String, Record> = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.scan_records(after.as_deref(), 1000).expect("scan the store");
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        records.extend(page);
    }
    let counts = store.counts();
    if counts.in_progress != 0 {
        fail(format!("the store holds {} in_progress record(s) after the final run", counts.in_progress));
    }
    let (mut ind_received, mut ind_not_received, mut reran) = (0usize, 0usize, 0usize);
    for i in 0..DISTINCT {
        let key = id(i);
        let rs = &per_key[i];
        let reqs = &requests[i];
        let own_seqs: HashSet<u64> = reqs.iter().map(|s| s.seq).collect();
        if forwarding(i) && reqs.len() > 1 {
            reran += 1;
        }
        if rs.is_empty() {
            fail(format!("key {key} has no result at all"));
        }
        let succeeded = rs.iter().filter(|r| r.outcome == Outcome::Succeeded).count();
        let ok = rs.iter().filter(|r| matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate)).count();
        let ind = rs.iter().filter(|r| r.outcome == Outcome::Indeterminate).count();
        if let Some(r) = rs.iter().find(|r| !matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate | Outcome::Indeterminate)) {
            fail(format!("key {key}: unexpected outcome {:?}: {r:?}", r.outcome));
        }
        if succeeded > 1 {
            fail(format!("key {key}: {succeeded} `succeeded` results (one execution may publish only one)"));
        }
        if ok > 0 && ind > 0 {
            fail(format!("key {key}: both succeeded/duplicate ({ok}) and indeterminate ({ind}) results"));
        }
        if forwarding(i) && ind > 0 {
            fail(format!("forwarding key {key} published `indeterminate` ({ind} times); its orphans must be re-run"));
        }
        if ok > 0 && reqs.is_empty() {
            fail(format!("key {key} was published as succeeded/duplicate but its sink ({}) never received it", path_of(i)));
        }
        match records.get(&key) {
            None => fail(format!("key {key}: no record in the store")),
            Some(Record::InProgress(p)) => fail(format!("key {key} is still in_progress: {p:?}")),
            Some(Record::Completed(c)) => {
                if c.outcome != Completion::Succeeded {
                    fail(format!("key {key} completed as {:?}: {:?}", c.outcome, c.error));
                }
                if reqs.is_empty() {
                    fail(format!("key {key} is stored completed but its sink ({}) never received it", path_of(i)));
                }
                let stored: Value = serde_json::from_slice(&c.result).unwrap_or(Value::Null);
                match stored.pointer("/body/seq").and_then(Value::as_u64) {
                    Some(seq) if own_seqs.contains(&seq) => {}
                    other => fail(format!("key {key}: the stored result {stored} answers request {other:?}, not one of its own {own_seqs:?}")),
                }
                for r in rs.iter().filter(|r| matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate)) {
                    if r.result != stored {
                        fail(format!("key {key}: published result {} (input {:?}) differs from the stored {stored}", r.result, r.source));
                    }
                }
                if ind > 0 {
                    fail(format!("key {key} is stored completed but was published indeterminate"));
                }
            }
            Some(Record::Indeterminate(r)) => {
                if forwarding(i) {
                    fail(format!("forwarding key {key} is stored indeterminate: {}", r.why));
                }
                if ok > 0 {
                    fail(format!("key {key} is stored indeterminate but was published succeeded/duplicate"));
                }
                if ind == 0 {
                    fail(format!("key {key} is stored indeterminate but no result says so"));
                }
                if reqs.is_empty() { ind_not_received += 1 } else { ind_received += 1 }
            }
        }
        if !forwarding(i) && reqs.is_empty() && ind == 0 {
            fail(format!("non-forwarding key {key} was never received and has no `indeterminate` result"));
        }
    }
    if records.len() != DISTINCT {
        fail(format!("the store holds {} records, expected {DISTINCT}", records.len()));
    }
    let once = seen.iter().filter(|s| s.path == "/once").count();
    println!(
        "[{backend}] results: {} records for {n} inputs ({repeated_results} inputs with more than one), outcomes {outcomes:?}",
        results.len()
    );
    println!(
        "[{backend}] receiver: {} requests ({once} non-forwarding, {} forwarding; {reran} forwarding keys re-run after a kill); \
         indeterminate keys: {ind_received} received (killed between the request and the completion flush), \
         {ind_not_received} never received (claimed, then killed before the request); \
         store {counts:?}",
        seen.len(),
        seen.len() - once
    );
    Coverage { answer_lost_once: ind_received, reran_fwd: reran }
}

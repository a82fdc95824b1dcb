//! End to end against a real Kafka broker: the whole pipeline (`dedupd::pipeline::run`),
//! an HTTP receiver, ~10,000 commands with duplicates, conflicts and bad records.
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test kafka kafka_e2e:: -- --nocapture`.
//! Without a broker the test prints "skipped: no broker" and passes, unless
//! `DEDUPD_REQUIRE_KAFKA=1`.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::kafka::{self, Receiver, header};
use dedupd::config::Config;
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::routes::RouteConfig;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::http::HttpSinkConfig;
use rdkafka::message::Message;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 6;
/// Distinct valid keys; with 30% duplicates, 1% conflicts and 1% bad records this makes
/// 10,000 input records.
const DISTINCT: usize = 6_800;
/// Upper bound on waiting for the pipeline to publish every result.
const RESULTS_BOUND: Duration = Duration::from_secs(180);

/// What one input record is, and so what its result must be.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// The command's first record in its own partition.
    Original(usize),
    /// The same command again, right behind the original (same batch, same partition).
    SameBatch(usize),
    /// The same command again, many offsets later (same partition).
    Late(usize),
    /// The same command through another partition (other Kafka key), right after the
    /// original: it races the original, so either of the two may be the one executed.
    OtherPartition(usize),
    /// Same id, other payload, right behind the original.
    Conflict(usize),
    /// Not a valid command: the expected `dedupd-reason`, and the key the result carries.
    Bad(&'static str, Option<String>),
}

struct Input {
    kind: Kind,
    kafka_key: String,
    value: Vec<u8>,
    partition: i32,
}

fn id(i: usize) -> String {
    format!("cmd-{i}")
}

fn payload(i: usize) -> Value {
    json!({"n": i, "customer": format!("c{}", i % 97), "amount": 100 + i})
}

fn command(i: usize, payload: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id(i), "type": "effect.apply", "payload": payload})).expect("json")
}

fn workload() -> Vec<Input> {
    let mut out = Vec::new();
    let mut late = Vec::new();
    let mut bad_n = 0usize;
    for i in 0..DISTINCT {
        let p = (i % PARTITIONS as usize) as i32;
        let orig = |kind| Input { kind, kafka_key: format!("k-{i}"), value: command(i, payload(i)), partition: p };
        out.push(orig(Kind::Original(i)));
        match i % 34 {
            0..5 => out.push(orig(Kind::SameBatch(i))),
            5..10 => late.push(orig(Kind::Late(i))),
            10..15 => out.push(Input {
                kind: Kind::OtherPartition(i),
                kafka_key: format!("x-{i}"),
                value: command(i, payload(i)),
                partition: (p + 3) % PARTITIONS,
            }),
            _ => {}
        }
        if i % 68 == 20 {
            out.push(Input {
                kind: Kind::Conflict(i),
                kafka_key: format!("k-{i}"),
                value: command(i, json!({"n": i, "amount": 999_999})),
                partition: p,
            });
        }
        if i % 68 == 40 {
            let j = bad_n;
            bad_n += 1;
            let (value, kind) = match j % 4 {
                0 => (b"{not json".to_vec(), Kind::Bad("invalid_json", None)),
                1 => (br#"{"type":"effect.apply","payload":{"n":1}}"#.to_vec(), Kind::Bad("missing_key", None)),
                2 => (
                    serde_json::to_vec(&json!({"id": format!("nr-{j}"), "type": "unknown.kind", "payload": {}}))
                        .expect("json"),
                    Kind::Bad("no_route", Some(format!("nr-{j}"))),
                ),
                _ => (br#"{"id":"","type":"effect.apply","payload":{}}"#.to_vec(), Kind::Bad("bad_key", None)),
            };
            out.push(Input { kind, kafka_key: format!("bad-{j}"), value, partition: (j % PARTITIONS as usize) as i32 });
        }
    }
    out.extend(late);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_commands_with_duplicates_conflicts_and_bad_records() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let started = Instant::now();
    let input_topic = kafka::unique("e2e-commands");
    let results_topic = kafka::unique("e2e-results");
    let dlq_topic = kafka::unique("e2e-dlq");
    kafka::create_topics(&bootstrap, &[(&input_topic, PARTITIONS), (&results_topic, 3), (&dlq_topic, 1)]).await;

    // Input, produced before the pipeline starts so that it meets a backlog.
    let inputs = workload();
    let n = inputs.len();
    let n_bad = inputs.iter().filter(|r| matches!(r.kind, Kind::Bad(..))).count();
    let n_conflict = inputs.iter().filter(|r| matches!(r.kind, Kind::Conflict(_))).count();
    println!("workload: {n} records, {DISTINCT} distinct valid keys, {n_conflict} conflicts, {n_bad} bad");
    let t = Instant::now();
    let positions = kafka::produce_all_to(
        &bootstrap,
        &input_topic,
        inputs
            .iter()
            .enumerate()
            .map(|(seq, r)| {
                (
                    r.kafka_key.clone(),
                    r.value.clone(),
                    vec![("test-seq".to_string(), seq.to_string())],
                    Some(r.partition),
                )
            })
            .collect(),
    )
    .await;
    println!("produced {n} records in {:.1} s", t.elapsed().as_secs_f64());
    let by_pos: HashMap<(i32, i64), usize> = positions.iter().enumerate().map(|(seq, pos)| (*pos, seq)).collect();
    assert_eq!(by_pos.len(), n, "every input has its own position");
    for (seq, r) in inputs.iter().enumerate() {
        assert_eq!(positions[seq].0, r.partition, "record {seq} went to the partition asked for");
    }

    // The receiver and the pipeline.
    let receiver = Receiver::start().await;
    let store_dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::default();
    config.kafka.bootstrap_servers = bootstrap.clone();
    config.kafka.group_id = kafka::unique("e2e-dedupd");
    config.kafka.input_topics = vec![input_topic.clone()];
    config.kafka.results_topic = results_topic.clone();
    config.kafka.dead_letter_topic = dlq_topic.clone();
    config.kafka.consumer.insert("session.timeout.ms".into(), "6000".into());
    config.kafka.consumer.insert("heartbeat.interval.ms".into(), "1500".into());
    config.store.path = store_dir.path().join("store");
    config.http.listen = "127.0.0.1:0".parse().expect("addr");
    config.sinks.insert(
        "receiver".into(),
        SinkConfig::Http(HttpSinkConfig {
            url: receiver.url(),
            forward_key: true,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            ..HttpSinkConfig::default()
        }),
    );
    config.routes.push(RouteConfig {
        name: Some("effects".into()),
        types: vec!["effect.*".into()],
        sink: "receiver".into(),
        ttl: None,
        fingerprint_exclude: vec![],
    });

    let t = Instant::now();
    let stop = CancellationToken::new();
    let pipeline = {
        let stop = stop.clone();
        tokio::spawn(dedupd::pipeline::run(config, Default::default(), stop.cancelled_owned(), |_| {}))
    };

    // Wait (bounded) until the results topic holds one record per input, then shut down.
    let results = kafka::read_all(&bootstrap, &results_topic, n, RESULTS_BOUND).await;
    let secs_to_results = t.elapsed().as_secs_f64();
    let dead = kafka::read_all(&bootstrap, &dlq_topic, n_bad, Duration::from_secs(30)).await;
    stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(60), pipeline).await;
    println!(
        "pipeline: {} results in {secs_to_results:.1} s ({:.0} records/s), stopped after {:.1} s",
        results.len(),
        results.len() as f64 / secs_to_results,
        t.elapsed().as_secs_f64()
    );
    match ended {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("pipeline failed: {e}"),
        Ok(Err(e)) => panic!("pipeline task panicked: {e}"),
        Err(_) => panic!("pipeline did not shut down within 60 s"),
    }
    receiver_and_results_checks(&inputs, &positions, &by_pos, &input_topic, &receiver, &results, &dead);
    // Nothing beyond what was read: the topics hold exactly one result per input and one
    // dead letter per bad record (the pipeline has stopped, so nothing more can arrive).
    assert_eq!(kafka::count_records(&bootstrap, &results_topic).await, n as i64, "records in the results topic");
    assert_eq!(kafka::count_records(&bootstrap, &dlq_topic).await, n_bad as i64, "records in the dead-letter topic");
    receiver.stop().await;
    println!("total {:.1} s", started.elapsed().as_secs_f64());
}

fn receiver_and_results_checks(
    inputs: &[Input],
    positions: &[(i32, i64)],
    by_pos: &HashMap<(i32, i64), usize>,
    input_topic: &str,
    receiver: &Receiver,
    results: &[rdkafka::message::OwnedMessage],
    dead: &[rdkafka::message::OwnedMessage],
) {
    let n = inputs.len();

    // The receiver: exactly one request per distinct valid key, with the command's payload.
    {
        let seen = receiver.seen.lock();
        let mut per_key: HashMap<String, usize> = HashMap::new();
        for (key, body) in seen.iter() {
            let key = key.clone().expect("every request carries Idempotency-Key");
            let count = per_key.entry(key.clone()).or_insert(0);
            *count += 1;
            assert_eq!(*count, 1, "key {key} executed more than once");
            let i: usize =
                key.strip_prefix("cmd-").and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("unexpected key {key}"));
            let body: Value = serde_json::from_slice(body).expect("request body is JSON");
            assert_eq!(body, payload(i), "body of {key}");
        }
        let missing: Vec<usize> = (0..DISTINCT).filter(|i| !per_key.contains_key(&id(*i))).collect();
        assert!(
            missing.is_empty(),
            "{} keys never executed, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
        assert_eq!(seen.len(), DISTINCT, "requests received");
    }

    // Results: one per input, identified by `source`.
    assert_eq!(results.len(), n, "results read within {RESULTS_BOUND:?}");
    let mut by_seq: Vec<Option<(ResultRecord, &rdkafka::message::OwnedMessage)>> = vec![None; n];
    for m in results {
        let r: ResultRecord = serde_json::from_slice(m.payload().expect("result has a value")).expect("result record");
        assert_eq!(r.source.topic, input_topic, "result source topic");
        let seq = *by_pos
            .get(&(r.source.partition, r.source.offset))
            .unwrap_or_else(|| panic!("result for an unknown source {:?}", r.source));
        assert!(by_seq[seq].is_none(), "two results for source {:?}", r.source);
        // Keyed by the command key (none when the record had none readable).
        assert_eq!(m.key().map(|k| String::from_utf8_lossy(k).into_owned()), r.key, "result record key");
        assert_eq!(header(m, "dedupd-outcome").as_deref(), Some(r.outcome.as_str()), "dedupd-outcome header");
        let replay_header = header(m, "idempotent-replay");
        assert_eq!(replay_header.as_deref() == Some("true"), r.replay, "idempotent-replay header vs replay");
        by_seq[seq] = Some((r, m));
    }
    let missing: Vec<usize> = (0..n).filter(|s| by_seq[*s].is_none()).collect();
    assert!(missing.is_empty(), "inputs without a result: {:?}", &missing[..missing.len().min(10)]);
    let by_seq: Vec<ResultRecord> = by_seq.into_iter().map(|o| o.expect("checked").0).collect();

    let mut succeeded_at: HashMap<usize, usize> = HashMap::new();
    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    for (seq, (input, r)) in inputs.iter().zip(&by_seq).enumerate() {
        *outcomes.entry(r.outcome.as_str()).or_insert(0) += 1;
        let ctx = format!("input {seq} {:?} at {:?}: {r:?}", input.kind, positions[seq]);
        match &input.kind {
            Kind::Original(i) | Kind::OtherPartition(i) | Kind::SameBatch(i) | Kind::Late(i) => {
                assert_eq!(r.key.as_deref(), Some(id(*i).as_str()), "{ctx}");
                match r.outcome {
                    Outcome::Succeeded => {
                        assert!(
                            matches!(input.kind, Kind::Original(_) | Kind::OtherPartition(_)),
                            "a repeat behind the original in its partition executed: {ctx}"
                        );
                        assert!(!r.replay, "{ctx}");
                        assert!(succeeded_at.insert(*i, seq).is_none(), "key succeeded twice: {ctx}");
                    }
                    Outcome::Duplicate => assert!(r.replay, "duplicate without replay: {ctx}"),
                    other => panic!("outcome {other:?}: {ctx}"),
                }
            }
            Kind::Conflict(i) => {
                assert_eq!(r.key.as_deref(), Some(id(*i).as_str()), "{ctx}");
                assert_eq!(r.outcome, Outcome::Conflict, "{ctx}");
            }
            Kind::Bad(reason, key) => {
                assert_eq!(r.outcome, Outcome::Rejected, "{ctx}");
                assert_eq!(&r.key, key, "{ctx}");
                // The type is named when it was read (contract §5): only the unrouted one's was.
                let kind = (*reason == "no_route").then_some("unknown.kind");
                assert_eq!(r.kind.as_deref(), kind, "{ctx}");
            }
        }
    }
    assert_eq!(succeeded_at.len(), DISTINCT, "keys with a succeeded result");
    let raced = succeeded_at.values().filter(|s| matches!(inputs[**s].kind, Kind::OtherPartition(_))).count();
    println!("keys executed through their other-partition copy: {raced}");
    // Every duplicate replays the stored result of the run that succeeded.
    for (seq, (input, r)) in inputs.iter().zip(&by_seq).enumerate() {
        if r.outcome == Outcome::Duplicate {
            let i = match input.kind {
                Kind::Original(i) | Kind::OtherPartition(i) | Kind::SameBatch(i) | Kind::Late(i) => i,
                _ => unreachable!(),
            };
            let first = &by_seq[succeeded_at[&i]];
            assert_eq!(r.result, first.result, "replayed result of input {seq}");
            assert_eq!(r.fingerprint, first.fingerprint, "fingerprint of input {seq}");
        }
    }
    let mut sorted: Vec<_> = outcomes.into_iter().collect();
    sorted.sort();
    println!("outcomes: {sorted:?}");

    // Dead letters: exactly the bad records, unchanged, with reason and source headers.
    let bad: HashMap<usize, &'static str> = inputs
        .iter()
        .enumerate()
        .filter_map(|(seq, r)| if let Kind::Bad(reason, _) = r.kind { Some((seq, reason)) } else { None })
        .collect();
    assert_eq!(dead.len(), bad.len(), "dead letters read");
    let mut seen_dead = HashSet::new();
    let mut reasons: HashMap<&str, usize> = HashMap::new();
    for m in dead {
        let source = header(m, "dedupd-source").expect("dedupd-source header");
        let mut parts = source.rsplitn(3, '/');
        let offset: i64 = parts.next().and_then(|s| s.parse().ok()).expect("source offset");
        let partition: i32 = parts.next().and_then(|s| s.parse().ok()).expect("source partition");
        assert_eq!(parts.next(), Some(input_topic), "source topic in {source}");
        let seq =
            *by_pos.get(&(partition, offset)).unwrap_or_else(|| panic!("dead letter from unknown source {source}"));
        let expected = *bad.get(&seq).unwrap_or_else(|| panic!("a valid record was dead-lettered: {source}"));
        assert!(seen_dead.insert(seq), "two dead letters for {source}");
        let reason = header(m, "dedupd-reason");
        assert_eq!(reason.as_deref(), Some(expected), "dedupd-reason of {source}");
        *reasons.entry(expected).or_insert(0) += 1;
        assert_eq!(header(m, "test-seq"), Some(seq.to_string()), "input headers kept on {source}");
        assert_eq!(m.payload(), Some(inputs[seq].value.as_slice()), "dead letter value of {source}");
        assert_eq!(m.key(), Some(inputs[seq].kafka_key.as_bytes()), "dead letter key of {source}");
    }
    assert_eq!(seen_dead.len(), bad.len(), "every bad record dead-lettered");
    println!("dead letters by reason: {reasons:?}");
}

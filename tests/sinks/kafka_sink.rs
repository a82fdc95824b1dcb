//! The `kafka` sink against a real broker: what lands in the sink topic (key, headers,
//! value, position), a template, and `dedupd run` end to end where repeats of a command
//! produce exactly one record in the sink topic and every result points at it.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test sinks kafka_sink::`.
//! Without a broker each test prints "skipped: no broker" and passes.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::kafka::{self, header};
use common::orphan::EngineWithSink;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use dedupd::config::Config;
use dedupd::outcome::Outcome;
use dedupd::sinks::{Sink, SinkRequest, build_all};
use dedupd::store::Record;
use rdkafka::message::Message;
use serde_json::{Value, json};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The sink called `out` built from TOML lines under `[sinks.out]`.
fn build(lines: &str) -> std::sync::Arc<Sink> {
    let text = format!("[sinks.out]\nkind = \"kafka\"\n{lines}\n");
    let config = Config::from_toml_str(&text, Vec::<(String, String)>::new()).expect("config");
    std::sync::Arc::new(build_all(&config.sinks).expect("build").remove("out").expect("sink out"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produces_key_headers_and_payload_and_returns_the_position() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("sink-out");
    kafka::create_topics(&bootstrap, &[(&topic, 3)]).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndelivery_timeout = \"20s\""));
    assert!(sink.forwards_key());

    let payload = json!({"order": 42, "lines": [{"sku": "A", "qty": 2}], "note": "é"});
    let claim = common::claims::durable_claim("order-42");
    let request = SinkRequest::new(&claim, "order.ship", &payload, 2, Some(TRACEPARENT));
    let result = tokio::time::timeout(Duration::from_secs(60), sink.execute(request)).await.expect("bounded").unwrap();

    let records = kafka::read_all(&bootstrap, &topic, 1, Duration::from_secs(30)).await;
    assert_eq!(records.len(), 1);
    let m = &records[0];
    assert_eq!(result, json!({"topic": topic, "partition": m.partition(), "offset": m.offset()}));
    assert_eq!(m.key(), Some("order-42".as_bytes()));
    assert_eq!(header(m, "idempotency-key").as_deref(), Some("order-42"));
    assert_eq!(header(m, "traceparent").as_deref(), Some(TRACEPARENT));
    assert_eq!(header(m, "dedupd-command-type").as_deref(), Some("order.ship"));
    assert_eq!(header(m, "dedupd-attempt").as_deref(), Some("2"));
    assert_eq!(serde_json::from_slice::<Value>(m.payload().expect("value")).unwrap(), payload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_shapes_the_value() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("sink-tpl");
    kafka::create_topics(&bootstrap, &[(&topic, 1)]).await;
    let sink = build(&format!(
        "bootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"\n\
         template = {{ event = \"shipped\", order = \"{{/order}}\", text = \"order {{payload.order}} for {{/customer/name}}\" }}"
    ));
    let payload = json!({"order": 7, "customer": {"name": "Ana"}});
    let claim = common::claims::durable_claim("k-7");
    let request = SinkRequest::new(&claim, "order.ship", &payload, 1, None);
    tokio::time::timeout(Duration::from_secs(60), sink.execute(request)).await.expect("bounded").unwrap();

    let records = kafka::read_all(&bootstrap, &topic, 1, Duration::from_secs(30)).await;
    assert_eq!(records.len(), 1);
    assert_eq!(header(&records[0], "traceparent"), None);
    assert_eq!(
        serde_json::from_slice::<Value>(records[0].payload().expect("value")).unwrap(),
        json!({"event": "shipped", "order": 7, "text": "order 7 for Ana"})
    );
}

/// The crash window (docs/contract.md §4): the interrupted run's record reached the sink topic, the
/// claim reached the disk, the process died before completing it; the command is
/// redelivered. The kafka sink always forwards the key, so it is re-run: a second record with
/// the same Kafka key and `idempotency-key` header, by which a consumer drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_claim_reruns_with_the_same_key() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("sink-orphan");
    kafka::create_topics(&bootstrap, &[(&topic, 3)]).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndelivery_timeout = \"20s\""));
    assert!(sink.forwards_key(), "kafka always forwards the key");

    let mut h = EngineWithSink::new(sink.clone());
    let payload = json!({"order": 9});
    let item = h.item("orphan-1", payload.clone());
    let earlier_claim = common::claims::durable_claim("orphan-1");
    let interrupted = SinkRequest::new(&earlier_claim, "t", &payload, 1, None);
    tokio::time::timeout(Duration::from_secs(60), sink.execute(interrupted)).await.expect("bounded").unwrap();
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Succeeded);
    assert!(done[0].sink_called);

    assert_eq!(kafka::count_records(&bootstrap, &topic).await, 2, "the interrupted run's record and the re-run's");
    let mut records = kafka::read_all(&bootstrap, &topic, 2, Duration::from_secs(30)).await;
    assert_eq!(records.len(), 2);
    records.sort_by_key(|m| m.offset());
    assert_eq!(records[0].partition(), records[1].partition(), "one key, one partition");
    for (m, attempt) in records.iter().zip(["1", "2"]) {
        assert_eq!(m.key(), Some("orphan-1".as_bytes()));
        assert_eq!(header(m, "idempotency-key").as_deref(), Some("orphan-1"));
        assert_eq!(header(m, "dedupd-attempt").as_deref(), Some(attempt), "the re-run counts the interrupted run");
        assert_eq!(serde_json::from_slice::<Value>(m.payload().expect("value")).unwrap(), payload);
    }
    match h.record("orphan-1") {
        Some(Record::Completed(c)) => {
            assert_eq!(c.attempts, 2);
            let stored: Value = serde_json::from_slice(&c.result).unwrap();
            let second = &records[1];
            assert_eq!(stored, json!({"topic": topic, "partition": second.partition(), "offset": second.offset()}));
        }
        other => panic!("expected completed, got {other:?}"),
    }
}

/// Distinct commands in the end-to-end run; each is sent 1 to 3 times.
const DISTINCT: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupd_run_produces_each_command_once_to_the_sink_topic() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq, out) =
        (kafka::unique("ks-in"), kafka::unique("ks-results"), kafka::unique("ks-dlq"), kafka::unique("ks-out"));
    kafka::create_topics(&bootstrap, &[(&input, 3), (&results, 1), (&dlq, 1), (&out, 3)]).await;

    // Every command once, then repeats: some through the same Kafka key, some through another.
    let command = |i: usize| {
        serde_json::to_vec(&json!({"id": format!("cmd-{i}"), "type": "order.ship", "payload": {"n": i}})).unwrap()
    };
    let mut records: Vec<kafka::Outgoing> = (0..DISTINCT).map(|i| (format!("k-{i}"), command(i), vec![])).collect();
    for i in 0..DISTINCT {
        match i % 3 {
            0 => records.push((format!("k-{i}"), command(i), vec![])),
            1 => {
                records.push((format!("k-{i}"), command(i), vec![]));
                records.push((format!("other-{i}"), command(i), vec![]));
            }
            _ => {}
        }
    }
    let inputs = records.len();
    kafka::produce_all(&bootstrap, &input, records).await;

    let mut dir = KeptOnFailure::new();
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    let store = dir.path().join("store");
    let group = kafka::unique("ks-group");
    std::fs::write(
        &config_path,
        format!(
            r#"{kafka_table}
[store]
path = {store:?}

[sinks.out]
kind = "kafka"
brokers = "{bootstrap}"
topic = "{out}"
delivery_timeout = "20s"

[sinks.out.limits]
max_concurrency = 4

[[routes]]
types = ["order.*"]
sink = "out"

[http]
listen = "127.0.0.1:0"
"#,
            kafka_table = kafka::kafka_table(&bootstrap, &group, &input, &results, &dlq)
        ),
    )
    .expect("write config");

    let mut child = DedupdProcess::run(&config_path, &log_path);
    let got = kafka::read_all(&bootstrap, &results, inputs, Duration::from_secs(120)).await;
    let exited = child.terminate(Duration::from_secs(30));
    if got.len() != inputs {
        let kept = dir.keep();
        panic!(
            "{} of {inputs} results (exit {exited:?}, kept {}); log tail:\n{}",
            got.len(),
            kept.display(),
            tail_of_file(&log_path, 40)
        );
    }

    // The sink topic: one record per distinct command, keyed and headed by its key.
    let sunk = kafka::read_all(&bootstrap, &out, DISTINCT + 1, Duration::from_secs(10)).await;
    assert_eq!(sunk.len(), DISTINCT, "one record per command in the sink topic");
    assert_eq!(kafka::count_records(&bootstrap, &out).await, DISTINCT as i64);
    let mut position: HashMap<String, (i32, i64)> = HashMap::new();
    for m in &sunk {
        let key = String::from_utf8(m.key().expect("key").to_vec()).unwrap();
        assert_eq!(header(m, "idempotency-key").as_deref(), Some(key.as_str()));
        let n: usize = key.strip_prefix("cmd-").and_then(|n| n.parse().ok()).expect("cmd-N");
        assert_eq!(serde_json::from_slice::<Value>(m.payload().expect("value")).unwrap(), json!({"n": n}));
        assert!(position.insert(key, (m.partition(), m.offset())).is_none(), "a key twice in the sink topic");
    }
    assert_eq!(position.keys().cloned().collect::<HashSet<_>>(), (0..DISTINCT).map(|i| format!("cmd-{i}")).collect());

    // Every result, first run or replay, points at that one record.
    let mut succeeded = HashSet::new();
    for m in &got {
        let result: Value = serde_json::from_slice(m.payload().expect("result")).unwrap();
        let key = result["key"].as_str().expect("key").to_string();
        let (partition, offset) = position[&key];
        assert_eq!(result["result"], json!({"topic": out, "partition": partition, "offset": offset}), "{result}");
        match result["outcome"].as_str() {
            Some("succeeded") => assert!(succeeded.insert(key), "succeeded twice"),
            Some("duplicate") => assert_eq!(result["replay"], json!(true)),
            other => panic!("unexpected outcome {other:?}: {result}"),
        }
    }
    assert_eq!(succeeded.len(), DISTINCT);
}

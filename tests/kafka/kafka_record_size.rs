//! No record stops its partition because of its size (docs/contract.md §5): on a real
//! broker, a 1,000,100-byte value that is not a command (over librdkafka's default
//! `message.max.bytes` of 1,000,000, under the broker's limit) and a 400,000-byte one are
//! dead-lettered, then 20 commands on the same partition all run. The dead-letter topic
//! accepts at most 500,000 bytes per record: the small copy lands intact, the large one as
//! a stand-in without key and value whose `dedupd-original-size` says how large it was.
//! Every input gets exactly one result. The same under `kafka.transactional_results`, where
//! a copy the broker refused would abort the transaction.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_record_size::`.

use crate::common;

use std::time::Duration;

use common::kafka::{self, header};
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};

const LARGE: usize = 1_000_100;
const SMALL: usize = 400_000;
const COMMANDS: usize = 20;

/// Limits the dead-letter topic's records to 500,000 bytes.
async fn limit_record_size(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin");
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", "500000");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let done = tokio::time::timeout(Duration::from_secs(60), admin.alter_configs(&[alter], &opts))
        .await
        .expect("alter_configs in time")
        .expect("alter_configs");
    for r in done {
        r.expect("topic config altered");
    }
}

/// Produces the two large non-commands, then the commands, in order to partition 0.
async fn produce_inputs(bootstrap: &str, topic: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("message.max.bytes", "2000000")
        .create()
        .expect("producer");
    let mut values: Vec<(String, Vec<u8>)> =
        vec![("large".into(), vec![b'x'; LARGE]), ("small".into(), vec![b'y'; SMALL])];
    for i in 0..COMMANDS {
        let command = json!({"id": format!("cmd-{i}"), "type": "t", "payload": {"n": i}});
        values.push((format!("k-{i}"), serde_json::to_vec(&command).unwrap()));
    }
    for (key, value) in &values {
        let record = FutureRecord::to(topic).key(key.as_str()).payload(value.as_slice()).partition(0);
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("produce");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_for_the_dead_letter_topic_stops_nothing() {
    scenario(false).await;
}

/// In a transaction a copy the broker refused would abort it (and the input would come
/// again and again): the copy is measured against the topic's limit before it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_for_the_dead_letter_topic_stops_nothing_under_transactional_results() {
    scenario(true).await;
}

async fn scenario(transactional: bool) {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("size-in"), kafka::unique("size-results"), kafka::unique("size-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;
    limit_record_size(&bootstrap, &dlq).await;
    produce_inputs(&bootstrap, &input).await;

    let mut dir = KeptOnFailure::new();
    let config = dir.path().join("dedupd.toml");
    let log = dir.path().join("dedupd.log");
    std::fs::write(
        &config,
        format!(
            "{}transactional_results = {transactional}\n\n[store]\npath = {:?}\n\n[sinks.log]\nkind = \"log\"\n\n[[routes]]\ntypes = [\"*\"]\nsink = \"log\"\n\n\
             [http]\nlisten = \"127.0.0.1:0\"\n",
            kafka::kafka_table(&bootstrap, &kafka::unique("size-group"), &input, &results, &dlq),
            dir.path().join("store"),
        ),
    )
    .expect("write config");
    let mut child = DedupdProcess::run(&config, &log);
    let inputs = COMMANDS + 2;
    let got = kafka::read_all(&bootstrap, &results, inputs, Duration::from_secs(120)).await;
    let exited = child.terminate(Duration::from_secs(30));
    if got.len() != inputs {
        let kept = dir.keep();
        panic!(
            "{} of {inputs} results (exit {exited:?}, kept {}):\n{}",
            got.len(),
            kept.display(),
            tail_of_file(&log, 40)
        );
    }
    assert!(exited.is_some_and(|s| s.success()), "exit {exited:?}");

    let outcomes: Vec<Value> =
        got.iter().map(|m| serde_json::from_slice::<Value>(m.payload().expect("value")).expect("json")).collect();
    assert_eq!(outcomes.iter().filter(|r| r["outcome"] == "rejected").count(), 2, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|r| r["outcome"] == "succeeded").count(), COMMANDS);
    if transactional {
        let all = kafka::read_all(&bootstrap, &results, inputs + 1, Duration::from_secs(5)).await;
        assert_eq!(all.len(), inputs, "one committed result per input, no more");
    } else {
        assert_eq!(kafka::count_records(&bootstrap, &results).await, inputs as i64, "one result per input, no more");
    }

    let letters = kafka::read_all(&bootstrap, &dlq, 3, Duration::from_secs(10)).await;
    assert_eq!(letters.len(), 2, "one dead letter per rejected record");
    let source = |offset: i64| format!("{input}/0/{offset}");
    let stand_in = letters.iter().find(|m| header(m, "dedupd-source") == Some(source(0))).expect("the large one");
    assert_eq!(stand_in.payload(), None, "the stand-in has no value");
    assert_eq!(stand_in.key(), None);
    assert_eq!(header(stand_in, "dedupd-original-size").as_deref(), Some(LARGE.to_string().as_str()));
    assert!(header(stand_in, "dedupd-reason").is_some());
    let copy = letters.iter().find(|m| header(m, "dedupd-source") == Some(source(1))).expect("the small one");
    assert_eq!(copy.payload().map(<[u8]>::len), Some(SMALL), "the small one is copied intact");
    assert_eq!(copy.key(), Some("small".as_bytes()));
    assert_eq!(header(copy, "dedupd-original-size"), None);
}

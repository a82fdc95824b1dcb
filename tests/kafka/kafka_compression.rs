//! Compressed input on a real broker: commands produced with `compression.type = zstd` and
//! with `lz4` (each key once in either codec), read by the whole pipeline
//! (`dedupd::pipeline::run`). Every input gets its result, and the HTTP receiver sees each
//! distinct key exactly once.
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test kafka kafka_compression::`. Without a
//! broker the test prints "skipped: no broker" and passes, unless `DEDUPD_REQUIRE_KAFKA=1`.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::kafka::{self, Receiver};
use dedupd::config::Config;
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::routes::RouteConfig;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::http::HttpSinkConfig;
use rdkafka::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 2;
/// Distinct keys; each is produced twice, once per codec, so half the inputs are repeats.
const DISTINCT: usize = 300;
const CODECS: [&str; 2] = ["zstd", "lz4"];

fn id(i: usize) -> String {
    format!("cmd-{i}")
}

/// Compressible on purpose: librdkafka sends a batch uncompressed when compressing does not
/// make it smaller, and then the test would not read compressed input.
fn payload(i: usize) -> Value {
    json!({"n": i, "note": "the same words again and again ".repeat(8)})
}

fn command(i: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id(i), "type": "effect.apply", "payload": payload(i)})).expect("json")
}

/// Produces `keys` (Kafka key = command key) with `codec`, batched (linger), and returns
/// each record's `(partition, offset)`. Creating the producer fails when librdkafka was
/// built without the codec.
async fn produce_compressed(bootstrap: &str, topic: &str, codec: &str, keys: &[usize]) -> Vec<(i32, i64)> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("linger.ms", "50")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "60000")
        .create()
        .unwrap_or_else(|e| panic!("producer with compression.type={codec}: {e}"));
    let mut acks = Vec::with_capacity(keys.len());
    for &i in keys {
        let (key, value) = (id(i), command(i));
        let record = FutureRecord::to(topic).key(key.as_str()).payload(value.as_slice());
        acks.push(producer.send_result(record).map_err(|(e, _)| e).expect("enqueue"));
    }
    let mut positions = Vec::with_capacity(acks.len());
    for ack in futures::future::join_all(acks).await {
        let delivery = ack.expect("producer dropped").map_err(|(e, _)| e).expect("delivery");
        positions.push((delivery.partition, delivery.offset));
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
    positions
}

fn pipeline_config(bootstrap: &str, input: &str, results: &str, dlq: &str, receiver: &Receiver) -> Config {
    let mut config = Config::default();
    config.kafka.bootstrap_servers = bootstrap.to_string();
    config.kafka.group_id = kafka::unique("compression-dedupd");
    config.kafka.input_topics = vec![input.to_string()];
    config.kafka.results_topic = results.to_string();
    config.kafka.dead_letter_topic = dlq.to_string();
    config.kafka.consumer.insert("session.timeout.ms".into(), "6000".into());
    config.kafka.consumer.insert("heartbeat.interval.ms".into(), "1500".into());
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
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_and_lz4_compressed_commands_are_read_and_run_once_per_key() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let input = kafka::unique("compression-commands");
    let results_topic = kafka::unique("compression-results");
    let dlq = kafka::unique("compression-dlq");
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results_topic, 1), (&dlq, 1)]).await;

    // Keys 0..DISTINCT/2 first with zstd, the rest first with lz4; then every key again in
    // the other codec, so that both codecs carry originals and repeats.
    let (first_half, second_half): (Vec<usize>, Vec<usize>) = (0..DISTINCT).partition(|i| *i < DISTINCT / 2);
    let all: Vec<usize> = (0..DISTINCT).collect();
    let mut codec_of: HashMap<(i32, i64), (&str, usize)> = HashMap::new();
    for (codec, keys) in [(CODECS[0], &first_half), (CODECS[1], &all), (CODECS[0], &second_half)] {
        let positions = produce_compressed(&bootstrap, &input, codec, keys).await;
        for (pos, &i) in positions.into_iter().zip(keys.iter()) {
            assert!(codec_of.insert(pos, (codec, i)).is_none(), "two inputs at {pos:?}");
        }
    }
    let n = codec_of.len();
    assert_eq!(n, 2 * DISTINCT, "inputs produced");

    let receiver = Receiver::start().await;
    let store_dir = tempfile::tempdir().expect("tempdir");
    let mut config = pipeline_config(&bootstrap, &input, &results_topic, &dlq, &receiver);
    config.store.path = store_dir.path().join("store");
    let stop = CancellationToken::new();
    let pipeline = {
        let stop = stop.clone();
        tokio::spawn(dedupd::pipeline::run(config, Default::default(), stop.cancelled_owned(), |_| {}))
    };
    let results = kafka::read_all(&bootstrap, &results_topic, n, Duration::from_secs(120)).await;
    stop.cancel();
    match tokio::time::timeout(Duration::from_secs(60), pipeline).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("pipeline failed: {e}"),
        Ok(Err(e)) => panic!("pipeline task panicked: {e}"),
        Err(_) => panic!("pipeline did not shut down within 60 s"),
    }

    // One result per input, each naming its own command: the values were decompressed.
    assert_eq!(results.len(), n, "results read");
    let mut outcomes: HashMap<usize, Vec<Outcome>> = HashMap::new();
    let mut per_codec: HashMap<&str, usize> = HashMap::new();
    for m in &results {
        let r: ResultRecord = serde_json::from_slice(m.payload().expect("result has a value")).expect("result record");
        let (codec, i) = codec_of
            .remove(&(r.source.partition, r.source.offset))
            .unwrap_or_else(|| panic!("result for an unknown or already answered source {:?}", r.source));
        assert_eq!(r.key.as_deref(), Some(id(i).as_str()), "key of the {codec} input at {:?}", r.source);
        outcomes.entry(i).or_default().push(r.outcome);
        *per_codec.entry(codec).or_default() += 1;
    }
    assert!(codec_of.is_empty(), "inputs without a result: {:?}", codec_of.values().take(10).collect::<Vec<_>>());
    assert_eq!(per_codec, HashMap::from([(CODECS[0], DISTINCT), (CODECS[1], DISTINCT)]), "results per codec");
    for (i, mut got) in outcomes {
        got.sort_by_key(|o| o.as_str());
        assert_eq!(got, [Outcome::Duplicate, Outcome::Succeeded], "outcomes of {}", id(i));
    }

    // The sink: each distinct key exactly once, with its decompressed payload.
    {
        let seen = receiver.seen.lock();
        let mut per_key: HashMap<String, usize> = HashMap::new();
        for (key, body) in seen.iter() {
            let key = key.clone().expect("every request carries Idempotency-Key");
            let i: usize = key.strip_prefix("cmd-").and_then(|s| s.parse().ok()).expect("a cmd-N key");
            let body: Value = serde_json::from_slice(body).expect("request body is JSON");
            assert_eq!(body, payload(i), "body of {key}");
            *per_key.entry(key).or_default() += 1;
        }
        assert_eq!(per_key.len(), DISTINCT, "distinct keys the sink saw");
        assert!(per_key.values().all(|c| *c == 1), "a key ran more than once: {per_key:?}");
    }
    assert_eq!(kafka::count_records(&bootstrap, &dlq).await, 0, "dead letters");
    receiver.stop().await;
}

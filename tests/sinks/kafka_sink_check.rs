//! The `kafka` sink's call answers and its check (`[sinks.NAME.check]`) against a real
//! broker: which calls are answered, never sent or maybe, and whether the check finds a
//! command's record by its `idempotency-key` header, within its window.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features
//! failpoints --test sinks kafka_sink_check::`. Without a broker the tests that need one print
//! "skipped: no broker" and pass; those about an unreachable cluster run anyway.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::kafka;
use dedupd::config::Config;
use dedupd::sinks::kafka::check::CLOCK_SKEW;
use dedupd::sinks::{CallAnswer, CallWatch, CheckAnswer, Sink, SinkError, SinkOutput, SinkRequest, build_all};
use dedupd::store::DurableClaim;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The sink called `out` built from TOML lines under `[sinks.out]`.
fn build(lines: &str) -> Arc<Sink> {
    let text = format!("[sinks.out]\nkind = \"kafka\"\n{lines}\n");
    let config = Config::from_toml_str(&text, Vec::<(String, String)>::new()).expect("config");
    Arc::new(build_all(&config.sinks).expect("build").remove("out").expect("sink out"))
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A `host:port` on 127.0.0.1 where nothing listens.
fn unreachable() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr.to_string()
}

/// One call of `sink` for `claim`, watched: its outcome and how it ended at the receiver.
async fn call(sink: &Sink, claim: &DurableClaim, payload: &Value) -> (Result<SinkOutput, SinkError>, CallAnswer) {
    let cancel = CancellationToken::new();
    let watch = CallWatch::new(&cancel);
    let request = SinkRequest::new(claim, "pay", payload, 1, None).watched_by(&watch);
    let outcome = tokio::time::timeout(Duration::from_secs(60), sink.execute(request)).await.expect("bounded call");
    (outcome, watch.answer())
}

/// The check of `sink` for `claim`, bounded.
async fn check(sink: &Sink, claim: &DurableClaim) -> CheckAnswer {
    let payload = json!({});
    let request = SinkRequest::new(claim, "pay", &payload, 1, None);
    tokio::time::timeout(Duration::from_secs(60), sink.check(request)).await.expect("bounded check")
}

/// Creates `topic` with `partitions` and the topic configs `configs`.
async fn create_topic_with(bootstrap: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = tokio::time::timeout(Duration::from_secs(60), admin.create_topics([&new], &opts))
        .await
        .expect("create_topics timed out")
        .expect("create_topics");
    for r in results {
        r.map_err(|(t, code)| format!("{t}: {code:?}")).expect("topic created");
    }
}

/// Produces records carrying the `idempotency-key` header `key` of each `(key, timestamp)`
/// (the producer's time when `None`), as another producer of the topic would.
async fn produce_keyed(producer: &FutureProducer, topic: &str, records: &[(String, Option<i64>)]) {
    for (key, timestamp) in records {
        let headers = OwnedHeaders::new().insert(Header { key: "idempotency-key", value: Some(key.as_str()) });
        let mut record = FutureRecord::to(topic).key(key.as_str()).payload("{}").headers(headers);
        if let Some(ts) = timestamp {
            record = record.timestamp(*ts);
        }
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("produce");
    }
}

fn others(prefix: &str, n: usize) -> Vec<(String, Option<i64>)> {
    (0..n).map(|i| (format!("{prefix}-{i}"), None)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_record_is_answered() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-ok");
    kafka::create_topics(&bootstrap, &[(&topic, 1)]).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndelivery_timeout = \"20s\""));
    let claim = common::claims::durable_claim("pay-ok");
    let (outcome, answer) = call(&sink, &claim, &json!({"amount": 5})).await;
    assert_eq!(outcome.expect("delivered"), json!({"topic": topic, "partition": 0, "offset": 0}));
    assert_eq!(answer, CallAnswer::Answered);
}

/// A record the topic refuses (larger than its `max.message.bytes`): the broker answered
/// with a definite refusal, so the call is answered and fails permanently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_topics_max_message_bytes_is_answered_and_permanent() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-big");
    create_topic_with(&bootstrap, &topic, 1, &[("max.message.bytes", "1024")]).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndelivery_timeout = \"20s\""));
    let claim = common::claims::durable_claim("pay-big");
    let (outcome, answer) = call(&sink, &claim, &json!({"blob": "x".repeat(8000)})).await;
    match outcome {
        Err(SinkError::Permanent { message, .. }) => assert!(message.contains("MessageSizeTooLarge"), "{message}"),
        other => panic!("expected a permanent failure, got {other:?}"),
    }
    assert_eq!(answer, CallAnswer::Answered);
    assert_eq!(kafka::count_records(&bootstrap, &topic).await, 0);
}

/// No broker answers: librdkafka gives up on the message after `delivery_timeout` with
/// `MessageTimedOut`. It could tell that no request carried it (`rd_kafka_message_status()`
/// says NOT_PERSISTED), but the rdkafka crate does not expose that and dedupd forbids
/// `unsafe`, so the sink cannot tell this timeout from one after the request left: maybe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_timeout_is_maybe_even_when_no_broker_was_reached() {
    let sink = build(&format!("brokers = \"{}\"\ntopic = \"t\"\ndelivery_timeout = \"1s\"", unreachable()));
    let claim = common::claims::durable_claim("pay-timeout");
    let (outcome, answer) = call(&sink, &claim, &json!({"amount": 5})).await;
    match outcome {
        Err(SinkError::Transient { message, .. }) => assert!(message.contains("MessageTimedOut"), "{message}"),
        other => panic!("expected a transient failure, got {other:?}"),
    }
    assert_eq!(answer, CallAnswer::Maybe);
}

/// Messages librdkafka refuses to enqueue never leave: one larger than the producer's whole
/// queue (`queue.buffering.max.kbytes`) finds it full until `delivery_timeout` (transient),
/// one over the client's `message.max.bytes` is refused at once (permanent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_refused_before_it_entered_the_producer_was_never_sent() {
    let at = unreachable();
    let payload = json!({"blob": "x".repeat(4000)});
    let small_queue = build(&format!(
        "brokers = \"{at}\"\ntopic = \"t\"\ndelivery_timeout = \"1s\"\n[sinks.out.producer]\n\"queue.buffering.max.kbytes\" = \"1\""
    ));
    let (outcome, answer) = call(&small_queue, &common::claims::durable_claim("pay-full"), &payload).await;
    match outcome {
        Err(SinkError::Transient { message, .. }) => assert!(message.contains("QueueFull"), "{message}"),
        other => panic!("expected a transient failure, got {other:?}"),
    }
    assert_eq!(answer, CallAnswer::NeverSent);

    let small_messages =
        build(&format!("brokers = \"{at}\"\ntopic = \"t\"\n[sinks.out.producer]\n\"message.max.bytes\" = \"1000\""));
    let (outcome, answer) = call(&small_messages, &common::claims::durable_claim("pay-large"), &payload).await;
    match outcome {
        Err(SinkError::Permanent { message, .. }) => assert!(message.contains("MessageSizeTooLarge"), "{message}"),
        other => panic!("expected a permanent failure, got {other:?}"),
    }
    assert_eq!(answer, CallAnswer::NeverSent);
}

/// The sink produced the command among other records (before and after it, across three
/// partitions): the check finds it and answers what the call stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_finds_the_record_the_sink_produced() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-found");
    kafka::create_topics(&bootstrap, &[(&topic, 3)]).await;
    let producer = kafka::idempotent_producer(&bootstrap);
    produce_keyed(&producer, &topic, &others("before", 20)).await;
    let sink = build(&format!(
        "brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndelivery_timeout = \"20s\"\n[sinks.out.check]\ntimeout = \"30s\""
    ));
    assert!(sink.check_timing().is_some());
    let claim = common::claims::durable_claim_at("pay-found", now_ms());
    let (outcome, _) = call(&sink, &claim, &json!({"amount": 5})).await;
    let stored = outcome.expect("delivered");
    produce_keyed(&producer, &topic, &others("after", 20)).await;
    assert_eq!(check(&sink, &claim).await, CheckAnswer::Found(stored));
}

/// Other commands' records since the claim, read to the high watermark: absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_says_absent_for_a_key_never_produced() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-absent");
    kafka::create_topics(&bootstrap, &[(&topic, 3)]).await;
    let claim = common::claims::durable_claim_at("pay-absent", now_ms());
    produce_keyed(&kafka::idempotent_producer(&bootstrap), &topic, &others("other", 30)).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\n[sinks.out.check]\ntimeout = \"30s\""));
    assert_eq!(check(&sink, &claim).await, CheckAnswer::Absent);
    // An empty topic too: nothing to read.
    let empty = kafka::unique("chk-empty");
    kafka::create_topics(&bootstrap, &[(&empty, 2)]).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{empty}\"\n[sinks.out.check]\ntimeout = \"30s\""));
    assert_eq!(check(&sink, &claim).await, CheckAnswer::Absent);
}

/// The key's record was written before the claim time less the clock skew allowance (an
/// earlier life of the key): the check does not look there, though it reads the records
/// stamped after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_before_the_claim_window_is_not_found() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-window");
    kafka::create_topics(&bootstrap, &[(&topic, 1)]).await;
    let producer = kafka::idempotent_producer(&bootstrap);
    produce_keyed(&producer, &topic, &[("pay-old".to_string(), None)]).await;
    // Claimed a minute past the skew allowance after that record; others stamped since.
    let claimed_at = now_ms() + (CLOCK_SKEW + Duration::from_secs(60)).as_millis() as i64;
    let later: Vec<(String, Option<i64>)> = (0..5).map(|i| (format!("later-{i}"), Some(claimed_at + i))).collect();
    produce_keyed(&producer, &topic, &later).await;
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\n[sinks.out.check]\ntimeout = \"30s\""));
    let claim = common::claims::durable_claim_at("pay-old", claimed_at);
    assert_eq!(check(&sink, &claim).await, CheckAnswer::Absent);
    // The same record within the window is found: the window, not the reading, hid it.
    let earlier = common::claims::durable_claim_at("pay-old", now_ms());
    assert_eq!(check(&sink, &earlier).await, CheckAnswer::Found(json!({"topic": topic, "partition": 0, "offset": 0})));
}

/// More records since the claim than `max_records` in a partition: the check cannot tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_cannot_tell_past_max_records() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-bound");
    kafka::create_topics(&bootstrap, &[(&topic, 1)]).await;
    let claim = common::claims::durable_claim_at("pay-bound", now_ms());
    produce_keyed(&kafka::idempotent_producer(&bootstrap), &topic, &others("other", 10)).await;
    let sink = build(&format!(
        "brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\n[sinks.out.check]\nmax_records = 3\ntimeout = \"30s\""
    ));
    match check(&sink, &claim).await {
        CheckAnswer::Unknown(why) => assert!(why.contains("max_records"), "{why}"),
        other => panic!("expected unknown, got {other:?}"),
    }
}

/// No broker answers: the check fails within its timeout, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_fails_when_the_cluster_is_unreachable() {
    let sink = build(&format!("brokers = \"{}\"\ntopic = \"t\"\n[sinks.out.check]\ntimeout = \"2s\"", unreachable()));
    let claim = common::claims::durable_claim_at("pay-down", now_ms());
    let started = std::time::Instant::now();
    match check(&sink, &claim).await {
        CheckAnswer::Error(why) => assert!(why.contains("`t`"), "{why}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // It kept asking within check.timeout (a refused connection may be a moment's), no longer.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(10), "{took:?}");
}

/// Another producer wrote to the topic in transactions, so its last offsets are markers
/// that a `read_committed` reader never gets as records: the check still reaches the high
/// watermark and answers, and finds a committed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_reads_past_transaction_markers() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-txn");
    kafka::create_topics(&bootstrap, &[(&topic, 1)]).await;
    let claim = common::claims::durable_claim_at("pay-txn", now_ms());
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", kafka::unique("chk-txn-id"))
        .create()
        .expect("transactional producer");
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30))).await.unwrap().unwrap();
    producer.begin_transaction().unwrap();
    produce_keyed(&producer, &topic, &[("pay-txn".to_string(), None), ("other".to_string(), None)]).await;
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(30))).await.unwrap().unwrap();
    let sink = build(&format!("brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\n[sinks.out.check]\ntimeout = \"20s\""));
    assert_eq!(check(&sink, &claim).await, CheckAnswer::Found(json!({"topic": topic, "partition": 0, "offset": 0})));
    let absent = common::claims::durable_claim_at("pay-none", now_ms() - 1000);
    let started = std::time::Instant::now();
    assert_eq!(check(&sink, &absent).await, CheckAnswer::Absent);
    assert!(started.elapsed() < Duration::from_secs(10), "answered at the marker, not at check.timeout");
}

/// A caller that gives up on a check (shutdown, revoke) gets its answer at once, not at
/// `check.timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_given_up_ends_at_once() {
    let sink = build(&format!("brokers = \"{}\"\ntopic = \"t\"\n[sinks.out.check]\ntimeout = \"60s\"", unreachable()));
    let claim = common::claims::durable_claim_at("pay-cancel", now_ms());
    let cancel = CancellationToken::new();
    let watch = CallWatch::new(&cancel);
    let payload = json!({});
    let request = SinkRequest::new(&claim, "pay", &payload, 1, None).watched_by(&watch);
    let started = std::time::Instant::now();
    let canceller = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel();
        })
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), sink.check(request)).await.expect("bounded check");
    assert!(matches!(&answer, CheckAnswer::Error(why) if why.contains("given up")), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    canceller.await.expect("canceller");
}

/// Another producer's transaction is open on the partition when the sink's record lands
/// after its first record: a `read_committed` reader cannot get past it, so the check
/// cannot tell (it must not say absent); once the transaction commits, it finds the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_before_the_record_leaves_the_check_unable_to_tell() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topic = kafka::unique("chk-open");
    kafka::create_topics(&bootstrap, &[(&topic, 1)]).await;
    let claim = common::claims::durable_claim_at("pay-open", now_ms());
    let txn: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", kafka::unique("chk-open-id"))
        .create()
        .expect("transactional producer");
    let p = txn.clone();
    tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30))).await.unwrap().unwrap();
    txn.begin_transaction().unwrap();
    produce_keyed(&txn, &topic, &[("in-txn".to_string(), None)]).await;
    let sink = build(&format!(
        "brokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndelivery_timeout = \"20s\"\n[sinks.out.check]\ntimeout = \"3s\""
    ));
    let (outcome, _) = call(&sink, &claim, &json!({"amount": 5})).await;
    let stored = outcome.expect("delivered");
    match check(&sink, &claim).await {
        CheckAnswer::Error(why) => assert!(why.contains("high watermark"), "{why}"),
        other => panic!("expected the check unable to tell, got {other:?}"),
    }
    let p = txn.clone();
    tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(30))).await.unwrap().unwrap();
    assert_eq!(check(&sink, &claim).await, CheckAnswer::Found(stored));
}

/// A caller that gives up (shutdown, revoke) while the producer's queue is full gets the
/// call back at once, never sent, not after `delivery_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_while_the_queue_is_full_was_never_sent() {
    let sink = build(&format!(
        "brokers = \"{}\"\ntopic = \"t\"\ndelivery_timeout = \"60s\"\n[sinks.out.producer]\n\"queue.buffering.max.kbytes\" = \"1\"",
        unreachable()
    ));
    let claim = common::claims::durable_claim("pay-given-up");
    let payload = json!({"blob": "x".repeat(4000)});
    let cancel = CancellationToken::new();
    let watch = CallWatch::new(&cancel);
    let request = SinkRequest::new(&claim, "pay", &payload, 1, None).watched_by(&watch);
    let started = std::time::Instant::now();
    let canceller = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel();
        })
    };
    let outcome = tokio::time::timeout(Duration::from_secs(30), sink.execute(request)).await.expect("bounded call");
    assert!(
        matches!(&outcome, Err(SinkError::Transient { message, .. }) if message.contains("QueueFull")),
        "{outcome:?}"
    );
    assert_eq!(watch.answer(), CallAnswer::NeverSent);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    canceller.await.expect("canceller");
}

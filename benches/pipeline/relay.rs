//! The plain rdkafka consumer and the plain relay (consume, then produce a result-sized
//! record per input; no dedupd code): the Kafka ceiling dedupd's drain and latency are
//! compared with.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::cpu;
use super::latency;
use super::topics::{create_topic, unique};

/// Plain consumer: messages/s from the first message to the n-th.
pub(super) fn plain_consume(bootstrap: &str, topic: &str, n: usize) -> f64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("bench-plain"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let mut got = 0usize;
    let mut first: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while got < n && Instant::now() < deadline {
        if let Some(Ok(_)) = c.poll(Duration::from_millis(100)) {
            first.get_or_insert_with(Instant::now);
            got += 1;
        }
    }
    let secs = first.map_or(f64::NAN, |f| f.elapsed().as_secs_f64());
    got as f64 / secs
}

/// The plain relay, the Kafka ceiling of any consume → produce service on this machine: it
/// reads `n` records of `input` and produces one result-sized JSON record per input to
/// `output` with dedupd's producer settings, naming the input's partition and offset as
/// dedupd's results do (so that latency is measured the same way), no dedupd code. Returns
/// records/s from the first input read to the last acknowledgement; prints the CPU they
/// cost as `what` (not at a fixed rate, where the window is mostly idle); says on
/// `assigned` once it holds partitions of `input`.
pub(super) async fn plain_relay(
    bootstrap: &str,
    input: &str,
    output: &str,
    n: usize,
    what: Option<&str>,
    mut assigned: Option<tokio::sync::oneshot::Sender<()>>,
) -> f64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("bench-relay"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("consumer");
    c.subscribe(&[input]).expect("subscribe");
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .create()
        .expect("producer");
    let cpu_from = cpu::Snapshot::take();
    let mut acks = Vec::with_capacity(n);
    let mut first: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while acks.len() < n && Instant::now() < deadline {
        let msg = tokio::task::block_in_place(|| c.poll(Duration::from_millis(100)));
        if assigned.is_some() && c.assignment().is_ok_and(|a| a.count() > 0) {
            assigned.take().map(|tx| tx.send(()));
        }
        let Some(Ok(m)) = msg else { continue };
        first.get_or_insert_with(Instant::now);
        let key = m.key().unwrap_or_default().to_vec();
        let mut result =
            format!("{{\"source\":{{\"partition\":{},\"offset\":{}}},\"pad\":\"", m.partition(), m.offset())
                .into_bytes();
        result.resize(RESULT_BYTES - 2, b'r');
        result.extend_from_slice(b"\"}");
        loop {
            match p.send_result(FutureRecord::to(output).key(&key).payload(&result)) {
                Ok(f) => {
                    acks.push(f);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }
    let got = acks.len();
    for a in futures::future::join_all(acks).await {
        a.expect("ack").expect("delivered");
    }
    let rate = got as f64 / first.map_or(f64::NAN, |f| f.elapsed().as_secs_f64());
    if let Some(what) = what {
        cpu_from.print_per_record(&cpu::Snapshot::take(), got, what);
    }
    rate
}

/// Bytes of a relayed record (about a result record's).
const RESULT_BYTES: usize = 370;

/// The plain relay's latency at `rate` for the same warm-up and `seconds` as dedupd's, on
/// topics of its own, and the fsync p99 beside that run and alone after it: returns issue
/// 13's bound on dedupd's p99 from each (`latency::print_bound`).
pub(super) async fn relay_latency_bound(bootstrap: &str, rate: usize, seconds: u64) -> (f64, f64) {
    let (input, output) = (unique("bench-relay-lat-in"), unique("bench-relay-lat-out"));
    create_topic(bootstrap, &input, 6).await;
    create_topic(bootstrap, &output, 6).await;
    let total = latency::records_at_rate(rate, seconds);
    let (assigned, relay_ready) = tokio::sync::oneshot::channel();
    let relay = tokio::spawn({
        let (b, i, o) = (bootstrap.to_string(), input.clone(), output.clone());
        async move { plain_relay(&b, &i, &o, total, None, Some(assigned)).await }
    });
    // As dedupd's latency waits for its readiness: the group join is not measured.
    let _ = tokio::time::timeout(Duration::from_secs(60), relay_ready).await;
    let probe = latency::FsyncProbe::start();
    let lat = latency::at_rate(bootstrap, &input, &output, rate, seconds).await;
    let beside = probe.p99_ms();
    let _ = relay.await;
    latency::print_bound(&lat, beside, tokio::task::spawn_blocking(latency::fsync_p99_ms).await.expect("fsync probe"))
}

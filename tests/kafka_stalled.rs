//! A transaction another instance left open on dedupd's own topics (killed, or frozen) is
//! aborted by fencing its writer once it has held a partition for the group session
//! (src/pipeline/transactions.rs, invariant 8; src/pipeline/changelog/stalled.rs), not
//! left until the coordinator's own timeout: the restore that waits for it goes on, what
//! it held is never restored, and its writer's producer is fenced.
//!
//! The dead instance is a transactional producer of the test's, named as dedupd names its
//! records, whose transaction stays open for two minutes as far as the broker is
//! concerned. `dedupd run` as a process, `store.changelog`, a 6 s session, one
//! non-forwarding HTTP sink. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka_stalled`.

mod common;

use std::time::{Duration, Instant};

use common::exposition::Exposition;
use common::kafka;
use common::pay_kills::{self, results};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, TopicTail, tail_of_file, wait_for_http_addr};
use dedupd::outcome::Outcome;
use dedupd::pipeline::state_partition;
use dedupd::store::{Completed, Completion, Record};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

const PARTITIONS: i32 = 3;
/// The key whose completion the dead instance's transaction holds.
const KEY: usize = 7;
/// The header dedupd names a record's writer in.
const WRITER_HEADER: &str = "dedupd-transaction";
/// The broker would abort the dead instance's transaction after this long: far beyond the
/// wait for the result below.
const DEAD_TRANSACTION_TIMEOUT_MS: &str = "120000";
/// How long the result may take: the session (6 s), a look or two of the stalled-transaction
/// thread, the restore and the call, with room for a slow machine; well short of the
/// coordinator's own abort.
const RESULT_WITHIN: Duration = Duration::from_secs(60);

/// A completion of command `i` with another fingerprint than the command's: restored, it
/// would make the command a conflict without a call.
fn completed_record(i: usize) -> Vec<u8> {
    Record::Completed(Completed {
        fingerprint: dedupd::fingerprint::Fingerprint([7; 32]),
        outcome: Completion::Succeeded,
        result: format!("{{\"i\":{i}}}").into_bytes(),
        error: None,
        first_seen_at_ms: 1,
        completed_at_ms: 2,
        expires_at_ms: 4_000_000_000_000,
        attempts: 1,
        source: None,
    })
    .encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_a_dead_instance_left_open_is_aborted_by_fencing_its_writer() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let unique = |what: &str| kafka::unique(&format!("stalled-{what}"));
    let (input, results_topic, dlq, group) = (unique("in"), unique("out"), unique("dlq"), unique("dedupd"));
    let changelog = format!("{group}.dedupd-state");
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results_topic, 1), (&dlq, 1), (&changelog, PARTITIONS)])
        .await;
    let dir = KeptOnFailure::new();
    let receiver = SlowReceiver::start((1, 2), 13).await;
    let kafka_extra = "transactional_results = true\ncopartitioned = true\n\n[kafka.consumer]\n\
                       \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n";
    let toml = pay_kills::config_toml(
        &bootstrap,
        &group,
        [&input, &results_topic, &dlq],
        &dir.path().join("store"),
        &receiver.url("/pay"),
        kafka_extra,
        "",
    )
    .replace("[store]\n", "[store]\nchangelog = true\n");
    let config = dir.path().join("dedupd.toml");
    std::fs::write(&config, toml).expect("write config");
    let log = dir.path().join("dedupd.log");
    let tail = TopicTail::start(&bootstrap, &results_topic, 1);

    // The dead instance's transaction: a completion of KEY on its changelog partition, the
    // first record of the transaction there naming its writer, as dedupd's would.
    let dead_id = kafka::unique("dedupd-dead");
    let dead: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", &dead_id)
        .set("transaction.timeout.ms", DEAD_TRANSACTION_TIMEOUT_MS)
        .create()
        .expect("transactional producer");
    dead.init_transactions(Duration::from_secs(30)).expect("init transactions");
    dead.begin_transaction().expect("begin");
    let key = pay_kills::key(KEY);
    let completed = completed_record(KEY);
    let record = FutureRecord::to(&changelog)
        .partition(state_partition(&key, PARTITIONS))
        .key(key.as_bytes())
        .payload(&completed)
        .headers(OwnedHeaders::new().insert(Header { key: WRITER_HEADER, value: Some(&dead_id) }));
    dead.send(record, Duration::from_secs(10)).await.expect("sent in the transaction");
    let inputs =
        kafka::produce_all_to(&bootstrap, &input, vec![pay_kills::command(KEY, state_partition(&key, PARTITIONS))])
            .await;

    let mut p = DedupdProcess::run(&config, &log);
    let addr = wait_for_http_addr(&log, &mut p, Duration::from_secs(60)).await;
    let started = Instant::now();
    while results(&tail).is_empty() {
        let exited = p.exited();
        assert!(
            started.elapsed() < RESULT_WITHIN && exited.is_none(),
            "no result within {RESULT_WITHIN:?} (exited: {exited:?}): the open transaction still holds the restore; \
             log:\n{}",
            tail_of_file(&log, 40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // What the open transaction held was never restored: the command ran, once.
    let seen = results(&tail);
    assert_eq!(seen.len(), 1, "one result: {seen:?}");
    assert_eq!((seen[0].source.partition, seen[0].source.offset), inputs[0]);
    assert_eq!(seen[0].outcome, Outcome::Succeeded, "decided from an aborted completion");
    assert_eq!(receiver.count(), 1, "one call for the key");
    // dedupd aborted it, by fencing its writer (not the coordinator's timeout, which would
    // also have left the producer usable for its next transaction).
    // The count follows `init_transactions`' return, which can come after the markers the
    // restore waited for.
    let counted_by = Instant::now() + Duration::from_secs(30);
    loop {
        let scrape = reqwest::get(format!("http://{addr}/metrics")).await.expect("scrape").text().await.expect("body");
        let aborted = Exposition::parse(&scrape).value("dedupd_stalled_transactions_aborted_total", &[]);
        if aborted == Some(1.0) {
            break;
        }
        assert!(Instant::now() < counted_by, "the abort was not counted: {aborted:?}\n{}", tail_of_file(&log, 20));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let commit = dead.commit_transaction(Duration::from_secs(30));
    assert!(commit.is_err(), "the dead instance's producer was not fenced: its commit went through");

    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "not stopped cleanly: {status:?}\n{}", tail_of_file(&log, 40));
    // dedupd's own changelog records name it too, the first of each partition in each
    // transaction: KEY's claim and its completion, committed one after the other.
    let named: Vec<String> = kafka::read_all(&bootstrap, &changelog, 2, Duration::from_secs(30))
        .await
        .iter()
        .filter_map(|m| kafka::header(m, WRITER_HEADER))
        .collect();
    assert!(
        named.len() == 2 && named.iter().all(|w| w.starts_with("dedupd-") && *w != dead_id),
        "dedupd's changelog records do not name their writer: {named:?}"
    );
    tail.stop();
    receiver.stop().await;
}

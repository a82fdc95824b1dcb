//! A transaction another instance left open on dedupd's own topics (killed, or frozen) is
//! aborted by fencing its writer once it has held a partition for the group session
//! (src/pipeline/transactions/, invariant 8; src/pipeline/changelog/stalled.rs), not
//! left until the coordinator's own timeout: what waited for it goes on (a restore, the
//! read of the group's committed offsets), what it held is never restored, and its
//! writer's producer is fenced.
//!
//! The dead instance is a transactional producer of the test's that names itself as dedupd
//! does, and whose transaction stays open for two minutes as far as the broker is
//! concerned. `dedupd run` as a process, `store.changelog`, a 6 s session, one
//! non-forwarding HTTP sink. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_stalled::`.

use crate::common;

use std::time::{Duration, Instant};

use common::exposition::Exposition;
use common::kafka;
use common::pay_kills::{self, results};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, TopicTail, tail_of_file, wait_for_http_addr};
use common::state_group::WRITER_KEY_PREFIX;
use dedupd::outcome::Outcome;
use dedupd::pipeline::state_partition;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

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

/// One test's topics, config, sink and `dedupd run` (not started).
struct Setup {
    bootstrap: String,
    input: String,
    changelog: String,
    group: String,
    /// Kept while the test runs (and after, when it fails).
    _dir: KeptOnFailure,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    receiver: SlowReceiver,
    tail: TopicTail,
}

impl Setup {
    async fn new(bootstrap: &str, name: &str) -> Setup {
        let unique = |what: &str| kafka::unique(&format!("{name}-{what}"));
        let (input, results, dlq, group) = (unique("in"), unique("out"), unique("dlq"), unique("dedupd"));
        let changelog = format!("{group}.dedupd-state");
        kafka::create_topics(bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
        kafka::create_changelog(bootstrap, &changelog, PARTITIONS).await;
        let dir = KeptOnFailure::new();
        let receiver = SlowReceiver::start((1, 2), 13).await;
        let kafka_extra = "transactional_results = true\ncopartitioned = true\n\n[kafka.consumer]\n\
                           \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n";
        let toml = pay_kills::config_toml(
            bootstrap,
            &group,
            [&input, &results, &dlq],
            &dir.path().join("store"),
            &receiver.url("/pay"),
            kafka_extra,
            "",
        )
        .replace("[store]\n", "[store]\nchangelog = true\n");
        let config = dir.path().join("dedupd.toml");
        std::fs::write(&config, toml).expect("write config");
        let log = dir.path().join("dedupd.log");
        let tail = TopicTail::start(bootstrap, &results, 1);
        Setup { bootstrap: bootstrap.to_string(), input, changelog, group, _dir: dir, config, log, receiver, tail }
    }

    /// The dead instance: its producer, named as dedupd names them, its transaction open.
    fn dead_instance(&self) -> (FutureProducer, String) {
        let id = kafka::unique("dedupd-dead");
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("transactional.id", &id)
            .set("transaction.timeout.ms", DEAD_TRANSACTION_TIMEOUT_MS)
            .create()
            .expect("transactional producer");
        producer.init_transactions(Duration::from_secs(30)).expect("init transactions");
        producer.begin_transaction().expect("begin");
        (producer, id)
    }

    /// Starts dedupd and waits for a result of each of `inputs` (one each), within
    /// [`RESULT_WITHIN`]; returns the process and its HTTP address.
    async fn run_until_results(&self, inputs: &[(i32, i64)]) -> (DedupdProcess, String) {
        let mut p = DedupdProcess::run(&self.config, &self.log);
        let addr = wait_for_http_addr(&self.log, &mut p, Duration::from_secs(60)).await;
        let started = Instant::now();
        while results(&self.tail).len() < inputs.len() {
            let exited = p.exited();
            assert!(
                started.elapsed() < RESULT_WITHIN && exited.is_none(),
                "no result within {RESULT_WITHIN:?} (exited: {exited:?}): the open transaction still holds \
                 dedupd; log:\n{}",
                tail_of_file(&self.log, 40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let seen = results(&self.tail);
        let mut got: Vec<(i32, i64)> = seen.iter().map(|r| (r.source.partition, r.source.offset)).collect();
        got.sort_unstable();
        assert_eq!(got, inputs, "one result per input");
        (p, addr)
    }

    /// Asserts that dedupd counted one abort, that `dead` was fenced, and stops dedupd.
    async fn assert_fenced_and_stop(&self, mut p: DedupdProcess, addr: String, dead: &FutureProducer) {
        // The count follows `init_transactions`' return, which can come after the markers
        // what waited could go on with.
        let counted_by = Instant::now() + Duration::from_secs(30);
        loop {
            let scrape =
                reqwest::get(format!("http://{addr}/metrics")).await.expect("scrape").text().await.expect("body");
            let aborted = Exposition::parse(&scrape).value("dedupd_stalled_transactions_aborted_total", &[]);
            if aborted == Some(1.0) {
                break;
            }
            assert!(
                Instant::now() < counted_by,
                "the abort was not counted: {aborted:?}\n{}",
                tail_of_file(&self.log, 20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // dedupd fenced it (the coordinator's own timeout would have left the producer
        // usable for its next transaction).
        let commit = dead.commit_transaction(Duration::from_secs(30));
        assert!(commit.is_err(), "the dead instance's producer was not fenced: its commit went through");
        let status = p.terminate(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "not stopped cleanly: {status:?}\n{}",
            tail_of_file(&self.log, 40)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_a_dead_instance_left_open_on_the_changelog_is_aborted_by_fencing_its_writer() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = Setup::new(&bootstrap, "stalled").await;
    // A completion of KEY on its changelog partition, the first record of the transaction
    // there naming its writer, as dedupd's would.
    let (dead, dead_id) = run.dead_instance();
    let key = pay_kills::key(KEY);
    let completed = common::state_group::completed_record(KEY);
    let record = FutureRecord::to(&run.changelog)
        .partition(state_partition(&key, PARTITIONS))
        .key(key.as_bytes())
        .payload(&completed)
        .headers(OwnedHeaders::new().insert(Header { key: WRITER_HEADER, value: Some(&dead_id) }));
    dead.send(record, Duration::from_secs(10)).await.expect("sent in the transaction");
    let inputs =
        kafka::produce_all_to(&bootstrap, &run.input, vec![pay_kills::command(KEY, state_partition(&key, PARTITIONS))])
            .await;

    // The restore waited for it; what it held was never restored: the command ran, once.
    let (p, addr) = run.run_until_results(&inputs).await;
    let seen = results(&run.tail);
    assert_eq!(seen[0].outcome, Outcome::Succeeded, "decided from an aborted completion");
    assert_eq!(run.receiver.count(), 1, "one call for the key");
    run.assert_fenced_and_stop(p, addr, &dead).await;

    // dedupd's own changelog records name it too, the first of each partition in each
    // transaction: KEY's claim and its completion, committed one after the other.
    let named: Vec<String> = kafka::read_all(&bootstrap, &run.changelog, 2, Duration::from_secs(30))
        .await
        .iter()
        .filter_map(|m| kafka::header(m, WRITER_HEADER))
        .collect();
    assert!(
        named.len() == 2 && named.iter().all(|w| w.starts_with("dedupd-") && *w != dead_id),
        "dedupd's changelog records do not name their writer: {named:?}"
    );
    run.tail.stop();
    run.receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_holds_only_the_groups_offsets_is_aborted_too() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = Setup::new(&bootstrap, "stalled-offsets").await;
    let keys = KEY..KEY + 3;
    let placed = |i: usize| pay_kills::command(i, state_partition(&pay_kills::key(i), PARTITIONS));
    let inputs = kafka::produce_all_to(&bootstrap, &run.input, keys.map(placed).collect()).await;
    // Offsets of dedupd's group pending in the dead instance's transaction, which every
    // read of the group's committed offsets waits for, and only the record dedupd writes
    // in such a transaction to name its writer: a tombstone on the changelog.
    let (dead, dead_id) = run.dead_instance();
    let marker = format!("{WRITER_KEY_PREFIX}{dead_id}");
    let record = FutureRecord::<str, [u8]>::to(&run.changelog)
        .partition(0)
        .key(marker.as_str())
        .headers(OwnedHeaders::new().insert(Header { key: WRITER_HEADER, value: Some(&dead_id) }));
    dead.send(record, Duration::from_secs(10)).await.expect("sent in the transaction");
    let group: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &run.group)
        .create()
        .expect("a consumer of the group");
    let mut offsets = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        offsets.add_partition_offset(&run.input, p, Offset::Offset(0)).expect("offset");
    }
    let metadata = group.group_metadata().expect("group metadata");
    dead.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(30)).expect("offsets in the transaction");

    // dedupd's start read the committed offsets once the transaction was aborted, and the
    // restore skipped the record that only names a writer.
    let (p, addr) = run.run_until_results(&inputs).await;
    let outcomes: Vec<Outcome> = results(&run.tail).iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, vec![Outcome::Succeeded; 3], "every key ran");
    assert_eq!(run.receiver.count(), inputs.len(), "one call per key");
    run.assert_fenced_and_stop(p, addr, &dead).await;
    run.tail.stop();
    run.receiver.stop().await;
}

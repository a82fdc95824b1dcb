//! Several instances in one group with the store on Kafka (docs/contract.md §12), while instances die,
//! stop and start: no double effect, no lost command, exactly one result per input.
//!
//! Three `dedupd run` slots share one group on the real broker, each with its own store,
//! `store.changelog = true`, transactional results and the by-key hop (repeats come on
//! other input partitions than their first sighting). 10,000 commands (7,000 keys, 3,000
//! repeats) on twelve input partitions are produced over about 40 s, all to one HTTP sink
//! that does not forward the key. Every 2–5 s one slot is SIGKILLed, SIGTERMed or started
//! (at random, seeded); once every command is produced the chaos ends, every slot runs,
//! and the test waits for a committed result for every input. Then: exactly one
//! `read_committed` result per input, the sink called at most once per key, every key
//! `succeeded` (after a call) or `indeterminate` (a kill cut a call off, or a claim was
//! committed and its call never made).
//!
//! The same group is also scaled from one instance to three and back under load, with a
//! rolling restart of the three in between (every SIGTERM must stop an instance cleanly),
//! once with the classic group protocol and once with KIP-848's (`group.protocol =
//! "consumer"`); the same checks hold. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_chaos:: -- --nocapture`.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::kafka;
use common::pay_kills::{self, calls_per_key, results};
use common::process::{
    DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, seed_from_env, tail_of_file, wait_for_line,
};
use dedupd::outcome::{Outcome, ResultRecord};

const PARTITIONS: i32 = 12;
const KEYS: usize = 7_000;
const REPEATS: usize = 3_000;
const SLOTS: usize = 3;
/// Commands are produced in batches of this many every [`PRODUCE_EVERY`]: about 40 s.
const PRODUCE_BATCH: usize = 50;
const PRODUCE_EVERY: Duration = Duration::from_millis(200);
const CHAOS_EVERY_MS: (u64, u64) = (2_000, 5_000);
const SINK_DELAY_MS: (u64, u64) = (2, 10);
/// The group session: the broker's smallest by default, so that a killed slot's partitions
/// move on soon when it is not started again.
const SESSION_TIMEOUT_MS: u64 = 6_000;

/// Every key once on partition `i % 12`, then `REPEATS` of them on another partition, mixed
/// in after their first sighting.
fn commands() -> Vec<kafka::OutgoingTo> {
    let mut all: Vec<kafka::OutgoingTo> = Vec::with_capacity(KEYS + REPEATS);
    let mut repeats = (0..REPEATS).map(|r| r * KEYS / REPEATS).peekable();
    for i in 0..KEYS {
        all.push(pay_kills::command(i, i as i32 % PARTITIONS));
        // A repeat of a key comes a little after the key itself, on another partition.
        while let Some(&k) = repeats.peek()
            && k + 20 <= i
        {
            all.push(pay_kills::command(k, (k as i32 + 1 + (k as i32 % 11)) % PARTITIONS));
            repeats.next();
        }
    }
    all.extend(repeats.map(|k| pay_kills::command(k, (k as i32 + 1 + (k as i32 % 11)) % PARTITIONS)));
    all
}

/// One slot: its config and log, and its process while it runs.
struct Slot {
    config: PathBuf,
    log: PathBuf,
    process: Option<DedupdProcess>,
    /// Sent SIGTERM and not yet seen to exit: it must exit cleanly.
    terminating: bool,
}

impl Slot {
    /// Whether its process runs; a SIGTERMed one that exited must have exited cleanly.
    fn running(&mut self) -> bool {
        let Some(p) = &mut self.process else { return false };
        let Some(status) = p.exited() else { return true };
        assert!(
            !self.terminating || status.success(),
            "a SIGTERM did not stop an instance cleanly: {status:?}; log:\n{}",
            tail_of_file(&self.log, 40)
        );
        self.terminating = false;
        false
    }
}

/// What the chaos did.
#[derive(Debug, Default)]
struct Chaos {
    kills: usize,
    terms: usize,
    starts: usize,
}

impl Chaos {
    /// One action: start a stopped slot, or kill or SIGTERM a running one (a SIGTERMed
    /// one drains meanwhile, and may be killed while it does).
    fn act(&mut self, slots: &mut [Slot], rng: &mut SplitMix) {
        let running: Vec<usize> = (0..slots.len()).filter(|i| slots[*i].running()).collect();
        let stopped: Vec<usize> = (0..slots.len()).filter(|i| !running.contains(i)).collect();
        let roll = rng.between(0, 99);
        let mut pick = |among: &[usize]| among[rng.between(0, among.len() as u64 - 1) as usize];
        if running.is_empty() || (!stopped.is_empty() && roll < 40) {
            let slot = &mut slots[pick(&stopped)];
            slot.process = Some(DedupdProcess::run(&slot.config, &slot.log));
            self.starts += 1;
            return;
        }
        let slot = &mut slots[pick(&running)];
        let Some(p) = slot.process.as_mut() else { return };
        if roll < 75 || slot.terminating {
            p.kill();
            slot.terminating = false;
            self.kills += 1;
        } else {
            p.send_term();
            slot.terminating = true;
            self.terms += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_dying_and_starting_lose_nothing_and_run_nothing_twice() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let seed = seed_from_env("KAFKA_CHAOS_SEED");
    println!("seed {seed} (replay the chaos with KAFKA_CHAOS_SEED={seed})");
    let mut rng = SplitMix(seed);
    let mut group = Group::start(&bootstrap, "chaos", seed, Protocol::Classic).await;
    let mut chaos = Chaos::default();
    for i in 0..SLOTS {
        group.start_slot(i);
    }
    while !group.producing.is_finished() {
        tokio::time::sleep(Duration::from_millis(rng.between(CHAOS_EVERY_MS.0, CHAOS_EVERY_MS.1))).await;
        chaos.act(&mut group.slots, &mut rng);
    }
    println!("chaos: {chaos:?}");
    group.start_every_stopped_slot().await;
    group.settle().await;
}

/// Scaling out from one instance to three and back under load, with a rolling restart of
/// the three in between: every SIGTERM stops an instance cleanly, and the same checks hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_out_and_in_and_a_rolling_restart_lose_nothing() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    scale_out_and_in(&bootstrap, Protocol::Classic).await;
}

/// The same with the KIP-848 consumer group protocol (`group.protocol = "consumer"`),
/// whose rebalances move only the partitions that change owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_consumer_group_protocol_scaling_and_a_rolling_restart_lose_nothing() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    scale_out_and_in(&bootstrap, Protocol::Consumer).await;
}

/// The group protocol the instances use.
#[derive(Debug, Clone, Copy)]
enum Protocol {
    /// The classic protocol with librdkafka's default (eager) assignors, and a 6 s session.
    Classic,
    /// KIP-848's: the broker assigns, and its session timeout applies (45 s by default).
    Consumer,
}

impl Protocol {
    /// The `[kafka.consumer]` lines.
    fn consumer_settings(self) -> String {
        match self {
            Protocol::Classic => {
                format!("\"session.timeout.ms\" = \"{SESSION_TIMEOUT_MS}\"\n\"heartbeat.interval.ms\" = \"1000\"\n")
            }
            Protocol::Consumer => "\"group.protocol\" = \"consumer\"\n".to_string(),
        }
    }
}

async fn scale_out_and_in(bootstrap: &str, protocol: Protocol) {
    let name = format!("scale-{protocol:?}").to_lowercase();
    let mut group = Group::start(bootstrap, &name, seed_from_env("KAFKA_SCALE_SEED"), protocol).await;
    group.start_slot(0);
    group.wait_until_working(0).await;
    for i in 1..SLOTS {
        group.start_slot(i);
        group.wait_until_assigned(i).await;
    }
    for i in 0..SLOTS {
        group.stop_slot(i);
        group.start_slot(i);
        group.wait_until_assigned(i).await;
    }
    for i in (1..SLOTS).rev() {
        group.stop_slot(i);
    }
    assert!(!group.producing.is_finished(), "the commands were all produced before the scaling ended");
    group.settle().await;
}

/// The group's slots, the topics, the sink and the commands being produced.
struct Group {
    slots: Vec<Slot>,
    committed: TopicTail,
    receiver: SlowReceiver,
    producing: tokio::task::JoinHandle<Vec<(i32, i64)>>,
    _dir: KeptOnFailure,
}

impl Group {
    /// Topics, sink, the slots' configs, and the commands produced over about 40 s from now.
    async fn start(bootstrap: &str, name: &str, seed: u64, protocol: Protocol) -> Group {
        let (input, results_topic, dlq) = (
            kafka::unique(&format!("{name}-in")),
            kafka::unique(&format!("{name}-out")),
            kafka::unique(&format!("{name}-dlq")),
        );
        kafka::create_topics(bootstrap, &[(&input, PARTITIONS), (&results_topic, 3), (&dlq, 1)]).await;
        let receiver = SlowReceiver::start(SINK_DELAY_MS, seed).await;
        let dir = KeptOnFailure::new();
        let group = kafka::unique(&format!("{name}-dedupd"));
        let kafka_extra = format!("transactional_results = true\n\n[kafka.consumer]\n{}", protocol.consumer_settings());
        let slots: Vec<Slot> = (0..SLOTS)
            .map(|i| {
                let toml = pay_kills::config_toml(
                    bootstrap,
                    &group,
                    [&input, &results_topic, &dlq],
                    &dir.path().join(format!("store-{i}")),
                    &receiver.url("/pay"),
                    &kafka_extra,
                    "max_in_flight = 64\nbatch_size = 32",
                )
                .replace("[store]\n", "[store]\nchangelog = true\n");
                let config = dir.path().join(format!("{i}.toml"));
                std::fs::write(&config, toml).expect("write config");
                Slot { config, log: dir.path().join(format!("{i}.log")), process: None, terminating: false }
            })
            .collect();
        let committed = TopicTail::start(bootstrap, &results_topic, 3);
        // Produce over time, so that what happens to the instances lands while commands
        // arrive and run.
        let producing = {
            let bootstrap = bootstrap.to_string();
            tokio::spawn(async move {
                let producer = kafka::idempotent_producer(&bootstrap);
                let mut inputs = Vec::with_capacity(KEYS + REPEATS);
                for batch in commands().chunks(PRODUCE_BATCH) {
                    inputs.extend(kafka::produce_all_with(&producer, &input, batch.to_vec()).await);
                    tokio::time::sleep(PRODUCE_EVERY).await;
                }
                inputs
            })
        };
        Group { slots, committed, receiver, producing, _dir: dir }
    }

    fn start_slot(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.process = Some(DedupdProcess::run(&slot.config, &slot.log));
    }

    /// Starts every slot that is not running, once the SIGTERMed ones have exited.
    async fn start_every_stopped_slot(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..SLOTS {
            while self.slots[i].running() && self.slots[i].terminating {
                assert!(
                    Instant::now() < deadline,
                    "slot {i} did not stop after SIGTERM; log:\n{}",
                    tail_of_file(&self.slots[i].log, 40)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if !self.slots[i].running() {
                self.start_slot(i);
            }
        }
    }

    /// SIGTERM, which must stop the slot cleanly.
    fn stop_slot(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let status = slot.process.as_mut().and_then(|p| p.terminate(Duration::from_secs(60)));
        assert!(
            status.is_some_and(|s| s.success()),
            "slot {i} did not stop cleanly: {status:?}; log:\n{}",
            tail_of_file(&slot.log, 40)
        );
        slot.process = None;
    }

    /// Waits until the sink saw a call after slot `i` started.
    async fn wait_until_working(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.receiver.count() == 0 {
            assert!(
                self.slots[i].running() && Instant::now() < deadline,
                "slot {i} made no call; log:\n{}",
                tail_of_file(&self.slots[i].log, 40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until slot `i`'s current process was assigned partitions.
    async fn wait_until_assigned(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let Some(p) = slot.process.as_mut() else { panic!("slot {i} is not running") };
        let from = p.log_start;
        let exited = std::cell::Cell::new(false);
        let assigned = wait_for_line(&slot.log, from, "partitions assigned", Duration::from_secs(90), || {
            exited.set(p.exited().is_some());
            exited.get()
        })
        .await;
        assert!(assigned.is_some(), "slot {i} was not assigned partitions; log:\n{}", tail_of_file(&slot.log, 40));
    }

    /// Waits for the last command and its result, stops every slot (each cleanly), and
    /// checks the results and the sink's calls.
    async fn settle(mut self) {
        let inputs = (&mut self.producing).await.expect("producer task");
        wait_for_every_result(&self.committed, &inputs, &mut self.slots).await;
        for i in 0..SLOTS {
            if self.slots[i].running() {
                self.stop_slot(i);
            }
        }
        check_results(&results(&self.committed), &inputs, &calls_per_key(&self.receiver));
        self.committed.stop();
        self.receiver.stop().await;
    }
}

/// Exactly one committed result per produced input; no key called twice; every key
/// succeeded after a call, or is indeterminate.
fn check_results(seen: &[ResultRecord], inputs: &[(i32, i64)], calls: &HashMap<String, usize>) {
    let mut per_input: HashMap<(i32, i64), Vec<&ResultRecord>> = HashMap::new();
    for r in seen {
        per_input.entry((r.source.partition, r.source.offset)).or_default().push(r);
    }
    let repeated: Vec<_> = per_input.iter().filter(|(_, rs)| rs.len() > 1).take(5).collect();
    assert!(repeated.is_empty(), "inputs with more than one committed result: {repeated:?}");
    let known: HashSet<&(i32, i64)> = inputs.iter().collect();
    let foreign: Vec<_> = per_input.keys().filter(|p| !known.contains(p)).take(5).collect();
    assert!(foreign.is_empty(), "results for inputs never produced: {foreign:?}");
    assert_eq!(seen.len(), inputs.len(), "one committed result per input");

    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "a non-forwarding sink called twice for one key: {twice:?}");
    let (succeeded, indeterminate) = pay_kills::succeeded_and_indeterminate(seen, calls);
    assert_eq!(succeeded.len() + indeterminate.len(), KEYS, "every key succeeded or is indeterminate");
    let outcomes: HashSet<Outcome> = seen.iter().map(|r| r.outcome).collect();
    let allowed = HashSet::from([Outcome::Succeeded, Outcome::Duplicate, Outcome::Indeterminate]);
    assert!(outcomes.is_subset(&allowed), "unexpected outcomes: {outcomes:?}");
    println!(
        "{} inputs, {} results, {} keys succeeded, {} indeterminate, {} sink calls",
        inputs.len(),
        seen.len(),
        succeeded.len(),
        indeterminate.len(),
        calls.values().sum::<usize>()
    );
}

/// Waits until every input has a committed result; fails with the slots' logs if a
/// started one exits or five minutes pass.
async fn wait_for_every_result(tail: &TopicTail, inputs: &[(i32, i64)], slots: &mut [Slot]) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let seen: HashSet<(i32, i64)> = results(tail).iter().map(|r| (r.source.partition, r.source.offset)).collect();
        let done = inputs.iter().filter(|i| seen.contains(i)).count();
        if done == inputs.len() {
            return;
        }
        for (i, slot) in slots.iter_mut().enumerate() {
            let started = slot.process.is_some();
            assert!(!started || slot.running(), "slot {i} exited; log:\n{}", tail_of_file(&slot.log, 40));
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {} results; logs:\n{}",
            inputs.len(),
            slots.iter().map(|s| tail_of_file(&s.log, 15)).collect::<Vec<_>>().join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

//! The crash suite: `dedupd run` on a real broker, SIGKILLed 400 times per store backend while it
//! works, then checked from the outside only.
//!
//! Seven sinks, one route each (tests/common/kill_workload.rs): HTTP, SMTP and a program,
//! each once forwarding the key and once not, and a Kafka topic:
//! - `http-once` / `http-fwd`: a `SlowReceiver` answering after 5–30 ms;
//! - `smtp-once` / `smtp-fwd`: aiosmtpd, answering after 5–30 ms;
//! - `kafka`: records produced to a topic (always forwards the key: `dedupd-key` header);
//! - `exec-once` / `exec-fwd`: a script that appends `SINK KEY ATTEMPT RUN PAYLOAD` to a file,
//!   then sleeps 10–30 ms.
//!
//! The input is produced in chunks, one as each incarnation starts (before it, for one meant
//! to die where a round carries completions, so that a backlog waits, and a burst should it
//! run out of work before the point: kafka_kill/backlog.rs), each with two compaction
//! fodder commands (a route whose records expire after two seconds); before an incarnation
//! meant to die in compaction, records that expire two seconds later are imported into the
//! store. Every incarnation ends in
//! a SIGKILL, in one of two ways, shuffled:
//! - **at a crash point** (src/crash.rs), 25 times per point: the process kills itself the
//!   first or second time it reaches the point: claims written but not synced (also while
//!   the same durability point carries the previous round's completions), synced but no
//!   sink called, during a sink call, after the sink before its completion, completions
//!   durable but results not published, results acknowledged but the offset not stored,
//!   during a claim journal rewrite, during compaction. Each one must be reached;
//! - **at random**, 175 times: 50–600 ms after it started working (its first request or
//!   result once it has its partitions), every fifth instead 50–600 ms after spawn (store
//!   open, group join).
//!
//! A restarted incarnation rejoins the group as the same static member at once
//! (static membership, the default). The last one
//! runs until every input has a result and is stopped with SIGTERM. Then, from the outside
//! only (the downstreams, the results topic, the store opened directly), every sink is held
//! to the same rules (tests/common/kill_check.rs: every input has a result; at most one
//! effect per key at a non-forwarding sink, and `indeterminate` for a key it never received;
//! ...), and every sink must have seen a kill between an effect and its completion.
//!
//! Every registered store backend, at the same time. Needs the `failpoints` feature (scripts/test
//! passes it) and python3 with aiosmtpd. Seed: `KAFKA_KILL_SEED` (printed; replays the
//! schedule and kill timing, not the scheduling). `KAFKA_KILL_POINT_KILLS` and
//! `KAFKA_KILL_RANDOM_KILLS` shrink a local run. Run with
//! `scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_kill:: -- --nocapture`.

mod backlog;
mod checks;
mod schedule;

use crate::common;

use std::ops::Range;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::Backlog;
use checks::{check_after_final_run, report_kills};
use common::effects::{self, Downstreams};
use common::kafka;
use common::kill_workload::{self as workload, Input, PARTITIONS, RESULT_PARTITIONS, SINK_TOPIC_PARTITIONS};
use common::process::{
    DedupdProcess, KeptOnFailure, SlowReceiver, SplitMix, TopicTail, file_len, seed_from_env, tail_of_file,
    wait_for_line,
};
use common::smtp_server::SmtpServer;
use dedupd::store::StoreBackend;
use parking_lot::Mutex;
use schedule::{Ending, chunks, count_from_env, schedule};

/// Kills at each crash point, per backend.
const POINT_KILLS: usize = 25;
/// Kills at random moments, per backend.
const RANDOM_KILLS: usize = 175;
/// Kill this long (ms, uniform) after an incarnation started working (or was spawned).
const KILL_DELAY_MS: (u64, u64) = (50, 600);
/// A `sink.call` kill comes this long (ms, uniform) after the call started: the receivers
/// answer after 5–30 ms, so most land while the downstream is answering.
const DURING_CALL_MS: (u64, u64) = (1, 20);
/// The HTTP and SMTP receivers answer this long (ms, uniform) after a request arrived.
const RECEIVER_DELAY_MS: (u64, u64) = (5, 30);
/// Longest wait for an incarnation to get its partitions.
const ASSIGN_BOUND: Duration = Duration::from_secs(30);
/// Longest wait, after that, for its first request or result (then it is killed anyway).
const FIRST_WORK_BOUND: Duration = Duration::from_secs(5);
/// Longest wait for an incarnation to reach its crash point and kill itself.
const POINT_BOUND: Duration = Duration::from_secs(20);
/// Longest wait for the final run to publish a result for every input.
const RESULTS_BOUND: Duration = Duration::from_secs(150);
/// Compaction fodder commands produced with each chunk.
const FODDER_PER_CHUNK: usize = 2;
/// The claim journal is rewritten past this many bytes (`journal.rewrite_at`), instead of
/// 4 MiB, so that rewrites happen all the time and a crash can land in one.
const JOURNAL_REWRITE_AT: u64 = 256;

/// Every kill chunk, wherever the schedule puts it, holds originals of keys (commands that
/// claim), one meant to die where a round carries completions at least three per
/// partition; the chunks cover the inputs in order.
#[test]
fn every_kill_chunk_holds_commands_that_claim() {
    let inputs = workload::workload();
    for seed in 0..8 {
        let endings = schedule(&mut SplitMix(seed), POINT_KILLS, RANDOM_KILLS);
        let chunks = chunks(&endings, &inputs);
        assert_eq!(chunks.len(), endings.len() + 1);
        assert_eq!((chunks[0].start, chunks[endings.len()].end), (0, inputs.len()));
        for (k, ending) in endings.iter().enumerate() {
            assert_eq!(chunks[k].end, chunks[k + 1].start, "chunks are contiguous");
            let originals = inputs[chunks[k].clone()].iter().filter(|i| i.kind == workload::Kind::Original).count();
            let least = match ending {
                Ending::At { point: "claim.appended_with_completions", .. } => 3 * PARTITIONS as usize,
                _ => 1,
            };
            assert!(originals >= least, "seed {seed}: chunk {k} ({ending:?}) holds {originals} originals");
        }
    }
}

/// What happened at one kill.
#[derive(Debug)]
struct Kill {
    ending: Ending,
    /// Time from spawn to the kill.
    lived: Duration,
    /// Requests the HTTP receiver was answering at the kill (random kills).
    in_flight: usize,
}

/// One backend's run: its topics, downstreams and files.
struct Lane {
    backend: &'static str,
    kind: StoreBackend,
    bootstrap: String,
    input_topic: String,
    results_topic: String,
    dlq_topic: String,
    sink_topic: String,
    receiver: SlowReceiver,
    smtp: SmtpServer,
    dir: KeptOnFailure,
    store_path: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    exec_effects: PathBuf,
    tail: TopicTail,
    sink_tail: TopicTail,
}

impl Lane {
    async fn start(kind: StoreBackend, bootstrap: String, rng: &mut SplitMix) -> Option<Lane> {
        let backend = kind.name();
        let [input_topic, results_topic, dlq_topic, sink_topic] =
            ["kill-commands", "kill-results", "kill-dlq", "kill-sink"].map(kafka::unique);
        kafka::create_topics(
            &bootstrap,
            &[
                (&input_topic, PARTITIONS),
                (&results_topic, RESULT_PARTITIONS),
                (&dlq_topic, 1),
                (&sink_topic, SINK_TOPIC_PARTITIONS),
            ],
        )
        .await;
        let smtp = SmtpServer::start_slow(RECEIVER_DELAY_MS)?;
        let receiver = SlowReceiver::start(RECEIVER_DELAY_MS, rng.next_u64()).await;
        let dir = KeptOnFailure::new();
        let (store_path, config_path) = (dir.path().join("store"), dir.path().join("dedupd.toml"));
        let (log_path, exec_effects) = (dir.path().join("dedupd.log"), dir.path().join("exec-effects"));
        let exec_program = effects::exec_recorder(dir.path(), &exec_effects);
        let downstreams = Downstreams {
            http: &receiver,
            kafka_bootstrap: &bootstrap,
            kafka_topic: &sink_topic,
            smtp_port: smtp.port,
            exec_program: &exec_program,
        };
        let toml = workload::config_toml(
            &bootstrap,
            &kafka::unique("kill-dedupd"),
            [&input_topic, &results_topic, &dlq_topic],
            backend,
            &store_path,
            &workload::sinks_toml(&downstreams),
        );
        std::fs::write(&config_path, toml).expect("write config");
        let checked = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
            .args(["check-config", "-c", config_path.to_str().expect("utf-8")])
            .output()
            .expect("run check-config");
        assert!(checked.status.success(), "check-config: {}", String::from_utf8_lossy(&checked.stderr));
        let sink_tail = TopicTail::start(&bootstrap, &sink_topic, SINK_TOPIC_PARTITIONS);
        let tail = TopicTail::start(&bootstrap, &results_topic, RESULT_PARTITIONS);
        Some(Lane {
            backend,
            kind,
            bootstrap,
            input_topic,
            results_topic,
            dlq_topic,
            sink_topic,
            receiver,
            smtp,
            dir,
            store_path,
            config_path,
            log_path,
            exec_effects,
            tail,
            sink_tail,
        })
    }

    /// Ends incarnation `backlog.0` as `ending` says (with a burst from `backlog.1` if it
    /// goes idle before a point that needs a backlog); `Err` names what went wrong.
    async fn end(
        &self,
        p: &mut DedupdProcess,
        ending: Ending,
        log_from: u64,
        (incarnation, mut backlog): (usize, Backlog),
    ) -> Result<Kill, String> {
        let label = || format!("[{}] {ending:?}", self.backend);
        match ending {
            Ending::At { point, .. } => {
                let deadline = Instant::now() + POINT_BOUND;
                let needs_backlog = point == "claim.appended_with_completions";
                while p.exited().is_none() && Instant::now() < deadline {
                    if needs_backlog && backlog.nudge(&self.tail, incarnation) {
                        println!("[{}] incarnation {incarnation} idle before {point}: a burst sent", self.backend);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let lived = p.spawned.elapsed();
                match p.exited() {
                    Some(s) if s.signal() == Some(9) => Ok(Kill { ending, lived, in_flight: 0 }),
                    Some(s) => Err(format!("{}: exited by itself ({s}) instead of at its crash point", label())),
                    None => {
                        p.kill();
                        Err(format!("{}: crash point not reached within {POINT_BOUND:?}", label()))
                    }
                }
            }
            Ending::Random { from_spawn, delay } => {
                let base = if from_spawn { p.spawned } else { self.started_working(p, log_from).await? };
                tokio::time::sleep_until((base + delay).into()).await;
                if let Some(status) = p.exited() {
                    return Err(format!("{}: dedupd exited by itself ({status})", label()));
                }
                let in_flight = self.receiver.in_flight();
                let lived = p.spawned.elapsed();
                p.kill();
                Ok(Kill { ending, lived, in_flight })
            }
        }
    }

    /// When the incarnation started working: its first HTTP request, sink record or result
    /// once it has its partitions (the assignment is logged by the consumer's assign callback,
    /// after the previous incarnation died, so nothing of that one is mistaken for it).
    async fn started_working(&self, p: &mut DedupdProcess, log_from: u64) -> Result<Instant, String> {
        let assigned =
            wait_for_line(&self.log_path, log_from, "partitions assigned", ASSIGN_BOUND, || p.exited().is_some()).await;
        if assigned.is_none() {
            return Err(format!(
                "[{}] got no partitions within {ASSIGN_BOUND:?} (exited: {:?})",
                self.backend,
                p.exited()
            ));
        }
        let work = || (self.receiver.count(), self.tail.len(), self.sink_tail.len());
        let before = work();
        let deadline = Instant::now() + FIRST_WORK_BOUND;
        while work() == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(Instant::now())
    }
}

/// Input record positions (partition, offset), in the order produced.
type Positions = Vec<(i32, i64)>;

/// What the producer is told.
enum Go {
    /// Produce chunk `.0` of the inputs (and its fodder), and say so on `.1` once the broker
    /// has it.
    Chunk(usize, Option<tokio::sync::oneshot::Sender<()>>),
    /// Produce a burst of fodder for incarnation `.0` (backlog.rs).
    Burst(usize),
}

/// Produces chunk `j` of the inputs (and its fodder), or a burst, each time `go` says so;
/// appends every position to `sent` as the broker acknowledges it; returns the inputs'
/// positions in order, and the fodder's (bursts included).
fn producer(
    lane: &Lane,
    inputs: Arc<Vec<Input>>,
    chunks: Vec<Range<usize>>,
    mut go: tokio::sync::mpsc::UnboundedReceiver<Go>,
    sent: Arc<Mutex<Positions>>,
) -> tokio::task::JoinHandle<(Positions, Positions)> {
    let (bootstrap, topic) = (lane.bootstrap.clone(), lane.input_topic.clone());
    tokio::spawn(async move {
        // One producer for the whole run: the suite already makes a few idempotent
        // producers per incarnation (dedupd's own), and each takes a producer id.
        let kafka_producer = kafka::idempotent_producer(&bootstrap);
        let (mut positions, mut fodder) = (Vec::with_capacity(inputs.len()), Vec::new());
        while let Some(order) = go.recv().await {
            let (records, inputs_in, produced_tx) = match order {
                Go::Chunk(j, produced_tx) => {
                    let records = inputs[chunks[j].clone()]
                        .iter()
                        .map(|r| (r.kafka_key.clone(), r.value.clone(), Vec::new(), Some(r.partition)));
                    let extra = (0..FODDER_PER_CHUNK).map(|f| {
                        let (key, value) = workload::fodder_command(j * FODDER_PER_CHUNK + f);
                        (key, value, Vec::new(), Some(((j + f) % PARTITIONS as usize) as i32))
                    });
                    (records.chain(extra).collect(), chunks[j].len(), produced_tx)
                }
                Go::Burst(incarnation) => (backlog::burst(incarnation), 0, None),
            };
            let produced = kafka::produce_all_with(&kafka_producer, &topic, records).await;
            sent.lock().extend_from_slice(&produced);
            let (ours, theirs) = produced.split_at(inputs_in);
            positions.extend_from_slice(ours);
            fodder.extend_from_slice(theirs);
            if let Some(tx) = produced_tx {
                let _ = tx.send(());
            }
        }
        (positions, fodder)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_hundred_kills_on_each_backend_at_every_crash_point_and_at_random() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    if !cfg!(feature = "failpoints") {
        let why = "the crash suite needs the crash points: run it with `--features failpoints`";
        assert!(std::env::var("DEDUPD_REQUIRE_KAFKA").is_err(), "{why}");
        println!("skipped: {why}");
        return;
    }
    let seed = seed_from_env("KAFKA_KILL_SEED");
    println!("seed {seed} (replay the schedule and timing with KAFKA_KILL_SEED={seed})");
    let lanes = StoreBackend::ALL.iter().enumerate().map(|(n, &kind)| run(kind, bootstrap.clone(), seed ^ n as u64));
    futures::future::join_all(lanes).await;
}

async fn run(kind: StoreBackend, bootstrap: String, seed: u64) {
    let started = Instant::now();
    let mut rng = SplitMix(seed);
    let endings = schedule(
        &mut rng,
        count_from_env("KAFKA_KILL_POINT_KILLS", POINT_KILLS),
        count_from_env("KAFKA_KILL_RANDOM_KILLS", RANDOM_KILLS),
    );
    let Some(mut lane) = Lane::start(kind, bootstrap, &mut rng).await else { return };
    let backend = lane.backend;
    let inputs = Arc::new(workload::workload());
    let n = inputs.len();
    let chunks = chunks(&endings, &inputs);
    println!("[{backend}] {n} inputs in {} chunks, {} kills", chunks.len(), endings.len());
    let (go, go_rx) = tokio::sync::mpsc::unbounded_channel::<Go>();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let producing = producer(&lane, Arc::clone(&inputs), chunks, go_rx, Arc::clone(&sent));

    let mut kills: Vec<Kill> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for (incarnation, ending) in endings.iter().enumerate() {
        // A round carries the previous round's completions only while more records wait
        // than the slots hold: records trickling in as the incarnation runs can each fit
        // one round. So that incarnation starts with its whole chunk on the broker.
        if let Ending::At { point: "claim.appended_with_completions", .. } = ending {
            let (produced_tx, produced) = tokio::sync::oneshot::channel();
            go.send(Go::Chunk(incarnation, Some(produced_tx))).expect("producer task alive");
            produced.await.expect("producer task alive");
        } else {
            go.send(Go::Chunk(incarnation, None)).expect("producer task alive");
        }
        if let Ending::At { point: "compaction.chunk", .. } = ending
            && let Err(e) =
                workload::plant_expiring(&lane.config_path, &lane.dir.path().join("planted.jsonl"), incarnation)
        {
            failures.push(format!("incarnation {incarnation}: {e}"));
            break;
        }
        let log_from = file_len(&lane.log_path);
        let failpoints = ending.failpoints();
        let args = ["run", "-c", lane.config_path.to_str().expect("utf-8")];
        let mut p = DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", failpoints.as_str())], &lane.log_path);
        let backlog = Backlog::new(go.clone(), Arc::clone(&sent));
        match lane.end(&mut p, *ending, log_from, (incarnation, backlog)).await {
            Ok(kill) => kills.push(kill),
            Err(e) => {
                failures.push(format!("incarnation {incarnation}: {e}"));
                break;
            }
        }
    }
    go.send(Go::Chunk(endings.len(), None)).expect("producer task alive");
    drop(go);
    let mut last = DedupdProcess::run(&lane.config_path, &lane.log_path);
    let (positions, fodder) = producing.await.expect("producer task");
    report_kills(backend, &kills, started);
    if failures.is_empty() {
        check_after_final_run(&mut lane, &inputs, &positions, &fodder, &mut last, &mut failures).await;
    }
    if !failures.is_empty() {
        let kept = lane.dir.keep();
        panic!(
            "[{backend}] {} failure(s) (seed {seed}; log, config and store kept in {}):\n{}\nlast log lines:\n{}",
            failures.len(),
            kept.display(),
            failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n"),
            tail_of_file(&lane.log_path, 20)
        );
    }
    println!("[{backend}] passed in {:.1} s", started.elapsed().as_secs_f64());
}

//! Crash points: the named places where the crash suite (tests/kafka/kafka_kill.rs) kills the
//! process with a real SIGKILL, so that each step a crash can interrupt is interrupted on
//! purpose, not only where random timing happens to land.
//!
//! They are failpoints of the `fail` crate, compiled in only with the `failpoints` feature
//! (tests; a release build has none, and [`point`] is then empty). A process started with
//! `FAILPOINTS="NAME=K*off->return"` in its environment passes point `NAME` K times and
//! SIGKILLs itself the next time; `return(MS)` instead kills it MS milliseconds later from
//! another thread, while the work at the point goes on (a kill *during* a sink call), and
//! `return(stop)` SIGSTOPs it there instead, until a SIGCONT (a zombie: a process frozen at
//! that step while its group moves on, tests/kafka/kafka_zombie.rs).
//!
//! The points, in the order a command meets them ([`POINTS`]):
//! 1. `claim.appended`: the round's claims written (journal or backend), not yet synced;
//! 2. `claim.appended_with_completions`: the same, in a round whose durability point also
//!    carries the previous round's completions (written, not yet synced, keys still held);
//! 3. `claim.synced`: the claims durable, no sink called yet;
//! 4. `sink.call`: a sink call starting (with `return(MS)`: killed while it runs);
//! 5. `sink.returned`: a sink answered, its completion not yet written;
//! 6. `completion.written`: a batch's completions durable, its results not yet published;
//! 7. `result.published`: a batch's results acknowledged, its offset not yet stored;
//! 8. `journal.rewrite`: the claim journal being rewritten (its new file written, not yet
//!    renamed over the old one);
//! 9. `compaction.chunk`: compaction between two chunks of expired records.
//!
//! Nine more points are not in [`POINTS`] (which the crash suite runs with transactions
//! off, point by point):
//! - `replay.delivered`: `dedupd dead-letters replay` with a replayed record and its mark
//!   delivered, their transaction not yet committed (tests/cli/cli_dead_letters.rs: killed
//!   there, neither counts, and the next run replays the record once);
//! - `transaction.delivered`: with Kafka transactions on, a transaction's records all
//!   delivered to the broker, its commit not yet asked for, so a kill there always leaves
//!   records the broker must abort (tests/kafka/kafka_kill_transactional.rs: random kills land
//!   inside a transaction only now and then);
//! - `sink.admitted`: a sink call admitted, the ownership of its key not yet proved
//!   (tests/kafka/kafka_zombie.rs freezes a process there);
//! - `rebalance.revoke`, for delaying only (the `fail` crate's `sleep(MS)`): the consumer
//!   thread about to handle a revoke. Delayed, it stands for a consumer that has not yet
//!   noticed it lost its partitions, so that what stops a zombie then (the broker refusing
//!   its commits) is tested on its own (tests/kafka/kafka_zombie.rs).
//! - `rebalance.revoke_drained` and `rebalance.revoke_let_go`, for delaying only: a revoke
//!   with its workers stopped, before and after the store stops owning its state
//!   partitions (both before its commit), so that an operator's write can be made to race
//!   it on either side (tests/kafka/kafka_revoke_race.rs).
//! - `restore.started`, for delaying only: a restore of state partitions about to read the
//!   changelog, on its own thread; delayed past `max.poll.interval.ms`, it shows that the
//!   group consumer goes on polling meanwhile (tests/kafka/kafka_restore_background.rs).
//! - `restore.applied`: a chunk of a restore applied to the store with its checkpoint;
//!   killed there, the next start goes on from the checkpoint rather than from the start
//!   (tests/kafka/kafka_restore_resume.rs);
//! - `consumer.turn`, for delaying only: the consumer loop's turn, before it polls. Delayed
//!   past the consumer's `max.poll.interval.ms`, it stands for a wedged loop, which
//!   `/healthz` must report (tests/kafka/kafka_liveness.rs).

/// Every crash point, in the order of the module docs.
pub const POINTS: [&str; 9] = [
    "claim.appended",
    "claim.appended_with_completions",
    "claim.synced",
    "sink.call",
    "sink.returned",
    "completion.written",
    "result.published",
    "journal.rewrite",
    "compaction.chunk",
];

/// Crash point `name` (one of [`POINTS`]): nothing unless the `failpoints` feature is on
/// and the point is configured.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
pub fn point(name: &str) {
    fail::fail_point!(name, |arg: Option<String>| match arg.as_deref() {
        Some("stop") => stop_self(),
        _ => kill_self(arg.and_then(|ms| ms.parse().ok())),
    });
}

/// SIGSTOPs this process where it stands; it goes on from here after a SIGCONT.
#[cfg(feature = "failpoints")]
fn stop_self() {
    // Nothing to do if it fails: the test then sees the process never stop and says so.
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP);
    // A signal sent to the whole process is taken by whichever thread the kernel picks, so
    // this one would go on for a moment (seen: a sink call made past the point). Held here
    // instead, it is stopped inside the point; after SIGCONT it wakes and goes on.
    std::thread::sleep(std::time::Duration::from_millis(100));
}

/// SIGKILLs this process, now or after `delay_ms` (from a thread of its own).
#[cfg(feature = "failpoints")]
fn kill_self(delay_ms: Option<u64>) {
    let kill = || {
        // Nothing to do if it fails: the suite then sees the process survive and says so.
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    };
    match delay_ms {
        None => kill(),
        Some(ms) => {
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                kill();
            });
        }
    }
}

/// Reads `FAILPOINTS` from the environment (the binary calls it once at start); the
/// returned guard keeps the configuration for the process's life.
#[cfg(feature = "failpoints")]
pub fn configure_from_env() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

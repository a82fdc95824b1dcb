//! The `--streams` phase: dedupd with its store on Kafka against Kafka Streams' own dedup
//! recipe (`benches/streams-dedup`: a persistent RocksDB store with its changelog, two stream
//! threads, `exactly_once_v2`), side by side on the same backlog, in rounds:
//! - the recipe reading the input as it is keyed (by the idempotency key, murmur2-partitioned),
//!   so no repartition, then `dedupd run` with `kafka.copartitioned`: the same shape;
//! - the recipe re-keying through a repartition topic, then `dedupd run` through its by-key
//!   topic: the same shape for input keyed by anything else.
//!
//! Both sides keep their state on Kafka and commit transactions; the recipe calls no sink,
//! dedupd calls the `log` sink that does nothing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dedupd::store::StoreBackend;
use rustix::process::{Pid, Signal, kill_process};

use super::topics::{create_topic, read_after_drain, unique};
use super::{Mode, drain_rate, measure_drain_in};

const GUARANTEE: &str = "exactly_once_v2";

fn run_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/streams-dedup/run.sh")
}

/// One round's four drains, commands/s.
struct Round {
    recipe_keyed: f64,
    copartitioned: f64,
    recipe_repartitioned: f64,
    by_key: f64,
}

/// `rounds` rounds of the four drains; prints each round and the medians of the ratios.
pub async fn side_by_side(bootstrap: &str, input: &str, backend: StoreBackend, n: usize, rounds: usize) {
    // The first build fetches Kafka Streams with Maven: done before any clock runs, and a
    // missing Java or Maven stops the bench here rather than as a timeout later.
    let built = Command::new(run_script()).arg("build").status().expect("run benches/streams-dedup/run.sh");
    assert!(built.success(), "benches/streams-dedup/run.sh build: {built}");
    let mut done = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let r = Round {
            recipe_keyed: recipe(bootstrap, input, n, "keyed").await,
            copartitioned: measure_drain_in(Mode::Changelog, bootstrap, input, backend, n).await,
            recipe_repartitioned: recipe(bootstrap, input, n, "repartition").await,
            by_key: measure_drain_in(Mode::ByKey, bootstrap, input, backend, n).await,
        };
        println!(
            "round {round}: recipe keyed {:.0}, dedupd copartitioned {:.0} ({:.2}×); recipe repartitioned {:.0}, dedupd by-key {:.0} ({:.2}×)",
            r.recipe_keyed,
            r.copartitioned,
            r.copartitioned / r.recipe_keyed,
            r.recipe_repartitioned,
            r.by_key,
            r.by_key / r.recipe_repartitioned
        );
        done.push(r);
    }
    print_table(backend, n, &done);
}

fn print_table(backend: StoreBackend, n: usize, rounds: &[Round]) {
    let row = |name: &str, f: &dyn Fn(&Round) -> f64, digits: usize| {
        let cells: Vec<String> = rounds.iter().map(|r| format!("{:.*}", digits, f(r))).collect();
        let median = median(rounds.iter().map(f).collect());
        println!("| {name} | {} | **{:.*}** |", cells.join(" | "), digits, median);
    };
    println!("\n{n} commands, {backend:?}, commands/s:\n");
    let heads: Vec<String> = (1..=rounds.len()).map(|i| format!("round {i}")).collect();
    println!("| | {} | median |", heads.join(" | "));
    println!("|---|{}---:|", "---:|".repeat(rounds.len()));
    row("Kafka Streams recipe, `exactly_once_v2`, input keyed (no repartition)", &|r| r.recipe_keyed, 0);
    row("`dedupd run`, store on Kafka, copartitioned", &|r| r.copartitioned, 0);
    row("copartitioned / recipe keyed", &|r| r.copartitioned / r.recipe_keyed, 2);
    row("Kafka Streams recipe, `exactly_once_v2`, repartitioned", &|r| r.recipe_repartitioned, 0);
    row("`dedupd run`, store on Kafka, through the by-key topic", &|r| r.by_key, 0);
    row("by-key / recipe repartitioned", &|r| r.by_key / r.recipe_repartitioned, 2);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        l if l % 2 == 1 => v[l / 2],
        l => (v[l / 2 - 1] + v[l / 2]) / 2.0,
    }
}

/// The recipe draining the backlog with `topology` (`keyed` or `repartition`): commands/s
/// from its first result to its last, as for `dedupd run`.
async fn recipe(bootstrap: &str, input: &str, n: usize, topology: &str) -> f64 {
    let output = unique("bench-streams-out");
    create_topic(bootstrap, &output, 6).await;
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().to_str().expect("a UTF-8 temp dir").to_string();
    let app_id = unique("bench-streams");
    let child = Command::new(run_script())
        .args([bootstrap, input, &output, &state_dir, GUARANTEE, &app_id, topology])
        .stdin(Stdio::null())
        .spawn()
        .expect("start benches/streams-dedup/run.sh");
    let (b, o) = (bootstrap.to_string(), output.clone());
    let seen =
        tokio::task::spawn_blocking(move || read_after_drain(&b, &o, n, Duration::from_secs(600))).await.expect("read");
    tokio::task::spawn_blocking(move || stop(child)).await.expect("stop");
    if seen.len() < n {
        println!("kafka streams dedup recipe ({GUARANTEE}, {topology}): only {} of {n} results", seen.len());
    }
    drain_rate(&seen)
}

/// SIGTERM (the program closes its Kafka Streams client), then SIGKILL if it is still
/// running after the close's own timeout and some.
fn stop(mut child: Child) {
    if let Err(e) = kill_process(Pid::from_child(&child), Signal::TERM) {
        eprintln!("streams-dedup: SIGTERM: {e}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                eprintln!("streams-dedup: wait: {e}; killing it");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
    eprintln!("streams-dedup: still running 30 s after SIGTERM; killing it");
    let _ = child.kill();
    let _ = child.wait();
}

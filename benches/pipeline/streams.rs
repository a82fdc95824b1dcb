//! The `--streams` phase: Kafka Streams' own dedup recipe (`benches/streams-dedup`: a
//! persistent RocksDB store with its changelog, commands keyed by their idempotency key,
//! two stream threads) draining the same backlog, once per processing guarantee.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use super::drain_rate;
use super::topics::{create_topic, read_after_drain, unique};

const GUARANTEES: [&str; 2] = ["at_least_once", "exactly_once_v2"];

fn run_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/streams-dedup/run.sh")
}

/// Prints one line per guarantee: commands/s from the first result to the last, as for
/// `dedupd run`.
pub async fn measure(bootstrap: &str, input: &str, n: usize) {
    // The first build fetches Kafka Streams with Maven: done before any clock runs, and a
    // missing Java or Maven stops the bench here rather than as a timeout later.
    let built = Command::new(run_script()).arg("build").status().expect("run benches/streams-dedup/run.sh");
    assert!(built.success(), "benches/streams-dedup/run.sh build: {built}");
    for guarantee in GUARANTEES {
        let output = unique("bench-streams-out");
        create_topic(bootstrap, &output, 6).await;
        let state = tempfile::tempdir().expect("tempdir");
        let state_dir = state.path().to_str().expect("a UTF-8 temp dir").to_string();
        let app_id = unique("bench-streams");
        let child = Command::new(run_script())
            .args([bootstrap, input, &output, &state_dir, guarantee, &app_id])
            .stdin(Stdio::null())
            .spawn()
            .expect("start benches/streams-dedup/run.sh");
        let (b, o) = (bootstrap.to_string(), output.clone());
        let seen = tokio::task::spawn_blocking(move || read_after_drain(&b, &o, n, Duration::from_secs(600)))
            .await
            .expect("read");
        tokio::task::spawn_blocking(move || stop(child)).await.expect("stop");
        if seen.len() < n {
            println!("kafka streams dedup recipe ({guarantee}): only {} of {n} results", seen.len());
        }
        println!("kafka streams dedup recipe ({guarantee}): {:.0} commands/s", drain_rate(&seen));
    }
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

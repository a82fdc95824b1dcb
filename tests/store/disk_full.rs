//! A full disk under a running `dedupd`, on a real size-limited file system (a small tmpfs
//! mounted for the test) and a real broker: dedupd stops taking work and exits non-zero with
//! a log line naming the full disk; once space returns and it is restarted, every command
//! has exactly one result and the (non-forwarding) HTTP sink was called at most once per
//! key, so no acknowledged claim was lost.
//!
//! Needs root (to mount); when the mount is refused with EPERM the test says so loudly and
//! passes. Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test store disk_full::`.

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use rdkafka::message::Message;
use rustix::mount::{MountFlags, UnmountFlags};
use serde_json::{Value, json};

/// The tmpfs: room for the store and its growth until the filler takes the rest.
const DISK_SIZE: &str = "size=8m";
/// Commands that run before the disk fills, and after.
const BEFORE: usize = 20;
const AFTER: usize = 200;

/// A tmpfs mounted at a directory, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Mounts it, or `None` (said loudly) when this machine does not allow mounting.
    fn mount(at: &Path) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).expect("mount point");
        let options = std::ffi::CString::new(DISK_SIZE).expect("options");
        match rustix::mount::mount("tmpfs", at, "tmpfs", MountFlags::empty(), options.as_c_str()) {
            Ok(()) => Some(SmallDisk(at.to_path_buf())),
            Err(rustix::io::Errno::PERM) => {
                eprintln!("\n*** SKIPPED disk_full: mounting a tmpfs was refused (EPERM): not root here ***\n");
                None
            }
            Err(e) => panic!("mounting a tmpfs at {}: {e}", at.display()),
        }
    }

    /// Writes a file until the disk is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0x5a_u8; 64 * 1024];
        // Bounded: the disk is 8 MiB, 64 KiB at a time.
        for _ in 0..1024 {
            if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
                assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "filling the disk: {e}");
                return path;
            }
        }
        panic!("the {DISK_SIZE} tmpfs never filled up");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if let Err(e) = rustix::mount::unmount(&self.0, UnmountFlags::DETACH) {
            eprintln!("unmounting {}: {e}", self.0.display());
        }
    }
}

fn command(i: usize) -> kafka::OutgoingTo {
    let id = format!("cmd-{i}");
    let value = serde_json::to_vec(&json!({"id": id, "type": "order.ship", "payload": {"n": i}})).expect("json");
    (format!("k-{i}"), value, vec![], Some(0))
}

fn config(bootstrap: &str, topics: &[String; 3], store: &Path, receiver: &str) -> String {
    let group = kafka::unique("df-group");
    format!(
        "{kafka_table}\n[kafka.consumer]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1500\"\n\n\
         [store]\npath = {store:?}\n\n[sinks.out]\nkind = \"http\"\nurl = \"{receiver}\"\nforward_key = false\n\n\
         [[routes]]\ntypes = [\"order.*\"]\nsink = \"out\"\n\n[http]\nlisten = \"127.0.0.1:0\"\n",
        kafka_table = kafka::kafka_table(bootstrap, &group, &topics[0], &topics[1], &topics[2])
    )
}

/// Waits (bounded) for the process to exit.
async fn wait_for_exit(child: &mut DedupdProcess, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if let Some(status) = child.exited() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Waits (bounded) until `topic` holds at least `n` records; returns how many it holds.
async fn wait_for_records(bootstrap: &str, topic: &str, n: usize, bound: Duration) -> usize {
    let deadline = Instant::now() + bound;
    loop {
        let have = usize::try_from(kafka::count_records(bootstrap, topic).await).unwrap_or(0);
        if have >= n || Instant::now() >= deadline {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Results per key (the command id) and outcome.
async fn results_by_key(bootstrap: &str, topic: &str, n: usize) -> HashMap<String, Vec<String>> {
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    for m in kafka::read_all(bootstrap, topic, n, Duration::from_secs(30)).await {
        let r: Value = serde_json::from_slice(m.payload().expect("result")).expect("result json");
        let key = r["key"].as_str().unwrap_or("").to_string();
        by_key.entry(key).or_default().push(r["outcome"].as_str().unwrap_or("").to_string());
    }
    by_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_dedupd_and_loses_nothing() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let mut dir = KeptOnFailure::new();
    let Some(disk) = SmallDisk::mount(&dir.path().join("disk")) else { return };
    let store = disk.0.join("store");
    let topics = [kafka::unique("df-in"), kafka::unique("df-results"), kafka::unique("df-dlq")];
    kafka::create_topics(&bootstrap, &[(&topics[0], 1), (&topics[1], 1), (&topics[2], 1)]).await;
    let receiver = kafka::Receiver::start().await;
    let config_path = dir.path().join("dedupd.toml");
    std::fs::write(&config_path, config(&bootstrap, &topics, &store, &receiver.url())).expect("config");
    let (log1, log2) = (dir.path().join("dedupd-1.log"), dir.path().join("dedupd-2.log"));

    let mut child = DedupdProcess::run(&config_path, &log1);
    kafka::produce_all_to(&bootstrap, &topics[0], (0..BEFORE).map(command).collect()).await;
    let before = wait_for_records(&bootstrap, &topics[1], BEFORE, Duration::from_secs(30)).await;
    assert_eq!(before, BEFORE, "results before the disk fills; log:\n{}", tail_of_file(&log1, 30));

    let filler = disk.fill();
    kafka::produce_all_to(&bootstrap, &topics[0], (BEFORE..BEFORE + AFTER).map(command).collect()).await;
    let status = wait_for_exit(&mut child, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(&log1).unwrap_or_default();
    if status.is_none_or(|s| s.success()) {
        let kept = dir.keep();
        panic!(
            "dedupd did not exit non-zero on a full disk ({status:?}, kept {}):\n{}",
            kept.display(),
            tail_of_file(&log1, 40)
        );
    }
    let names_the_disk = log.lines().find(|l| l.contains("no space left") && l.contains(&*store.to_string_lossy()));
    let Some(line) = names_the_disk else {
        panic!("no log line names the full disk ({}):\n{}", store.display(), tail_of_file(&log1, 40))
    };
    eprintln!("dedupd exited with {status:?}, logging: {line}");

    std::fs::remove_file(&filler).expect("space returns");
    let mut child = DedupdProcess::run(&config_path, &log2);
    let total = BEFORE + AFTER;
    let have = wait_for_records(&bootstrap, &topics[1], total, Duration::from_secs(45)).await;
    let exited = child.terminate(Duration::from_secs(30));
    let results = results_by_key(&bootstrap, &topics[1], have).await;
    let calls = receiver.counts();
    let mut failures = Vec::new();
    for i in 0..total {
        let key = format!("cmd-{i}");
        match results.get(&key).map(Vec::as_slice) {
            Some([_]) => {}
            other => failures.push(format!("{key}: results {other:?}")),
        }
        if calls.get(&key).copied().unwrap_or(0) > 1 {
            failures.push(format!("{key}: the sink was called {} times", calls[&key]));
        }
    }
    if !failures.is_empty() {
        let kept = dir.keep();
        panic!(
            "{} problems (restart exit {exited:?}, kept {}): {:?}\nlog of the restart:\n{}",
            failures.len(),
            kept.display(),
            &failures[..failures.len().min(20)],
            tail_of_file(&log2, 40)
        );
    }
    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    for outcome in results.values().flatten() {
        *outcomes.entry(outcome.as_str()).or_default() += 1;
    }
    eprintln!("after the restart: {outcomes:?}, {} sink calls", calls.values().sum::<usize>());
    receiver.stop().await;
}

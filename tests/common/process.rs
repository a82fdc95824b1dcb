//! Helpers for tests that run the real `dedupd` binary as a child process against a real
//! broker, and need to see everything it did from the outside:
//! - [`DedupdProcess`]: the child (`dedupd run -c FILE`), its output appended to a log file,
//!   SIGKILL ([`DedupdProcess::kill`]) and SIGTERM ([`DedupdProcess::terminate`]); killed on
//!   drop so that a failing test leaves no process behind holding the store;
//! - [`SlowReceiver`] (in `slow_receiver`, named here too): an HTTP receiver that records
//!   every request when it arrives and answers late;
//! - [`TopicTail`]: reads a whole topic from its beginning, for the whole test, on a thread
//!   of its own, without a consumer group;
//! - [`SplitMix`]: a small seedable RNG, so that a failing run can be replayed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// splitmix64: small, seedable, good enough to pick delays and kill moments.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// A seed from `var` when set (to replay a run), else from the clock.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var).ok().and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
    })
}

/// A running `dedupd` binary.
pub struct DedupdProcess {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// When it was spawned.
    pub spawned: Instant,
    /// The length of its log when it was spawned: where its own lines begin.
    pub log_start: u64,
    reaped: Option<ExitStatus>,
}

impl DedupdProcess {
    /// Spawns `dedupd ARGS...` with stdout and stderr appended to `log`. `DEDUPD_*`
    /// variables of the test's environment that would override config keys are removed.
    pub fn spawn(args: &[&str], log: &Path) -> DedupdProcess {
        DedupdProcess::spawn_with_env(args, &[], log)
    }

    /// Like [`DedupdProcess::spawn`], with `env` set for the child.
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)], log: &Path) -> DedupdProcess {
        let log_start = file_len(log);
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open child log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupd"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().expect("clone log handle")))
            .stderr(Stdio::from(file))
            .env("NO_COLOR", "1");
        for (k, _) in std::env::vars() {
            if k.starts_with("DEDUPD_") && k.contains("__") {
                cmd.env_remove(&k);
            }
        }
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().expect("spawn dedupd");
        DedupdProcess { pid: child.id(), child, spawned: Instant::now(), log_start, reaped: None }
    }

    /// `dedupd run -c CONFIG`.
    pub fn run(config: &Path, log: &Path) -> DedupdProcess {
        let config = config.to_str().expect("utf-8 config path");
        DedupdProcess::spawn(&["run", "-c", config], log)
    }

    /// Its exit status if it has exited (reaps it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait().expect("try_wait");
        }
        self.reaped
    }

    /// SIGKILL, then reap. Returns the exit status (or the earlier one if it had already
    /// exited by itself: check with [`DedupdProcess::exited`] first when that matters).
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(s) = self.exited() {
            return s;
        }
        let _ = self.child.kill(); // SIGKILL on Unix
        let s = self.child.wait().expect("wait after SIGKILL");
        self.reaped = Some(s);
        s
    }

    /// Sends SIGTERM without waiting (see [`DedupdProcess::exited`]).
    pub fn send_term(&mut self) {
        if self.exited().is_some() {
            return;
        }
        // The child is not reaped yet, so its pid cannot have been reused.
        let sent = Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status();
        assert!(sent.as_ref().is_ok_and(|s| s.success()), "could not send SIGTERM to {}: {sent:?}", self.pid);
    }

    /// SIGTERM, then waits up to `timeout` for it to exit; `None` if it did not (it is
    /// then SIGKILLed so that nothing is left running).
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited() {
            return Some(s);
        }
        // The child is not reaped yet, so its pid cannot have been reused.
        let sent = Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status();
        assert!(sent.as_ref().is_ok_and(|s| s.success()), "could not send SIGTERM to {}: {sent:?}", self.pid);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }
}

impl Drop for DedupdProcess {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until a line containing `needle` is appended to `path` after byte `from` (e.g.
/// the child's log, from its length at spawn); returns when it was seen, or `None` after
/// `timeout` or once `give_up()` says so (the child died).
pub async fn wait_for_line(
    path: &Path,
    from: u64,
    needle: &str,
    timeout: Duration,
    mut give_up: impl FnMut() -> bool,
) -> Option<Instant> {
    use std::io::{Read, Seek, SeekFrom};
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut pos = from;
    while Instant::now() < deadline {
        if let Ok(mut f) = std::fs::File::open(path)
            && f.seek(SeekFrom::Start(pos)).is_ok()
        {
            let n = f.read_to_end(&mut buf).unwrap_or(0);
            pos += n as u64;
            if String::from_utf8_lossy(&buf).lines().any(|l| l.contains(needle)) {
                return Some(Instant::now());
            }
            // Keep only the unfinished last line.
            if let Some(nl) = buf.iter().rposition(|b| *b == b'\n') {
                buf.drain(..=nl);
            }
        }
        if give_up() {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// The length of a file, 0 when it does not exist.
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The last `n` lines of a text file (for failure messages).
pub fn tail_of_file(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub use super::slow_receiver::{Seen, SlowReceiver};

/// Every record of a topic from its beginning, collected by a thread until [`TopicTail::stop`].
pub struct TopicTail {
    messages: Arc<Mutex<Vec<OwnedMessage>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TopicTail {
    /// Starts reading partitions `0..partitions` of `topic` from the beginning (assigned,
    /// no group membership, nothing committed), records of committed transactions only
    /// (librdkafka's default `isolation.level`).
    pub fn start(bootstrap: &str, topic: &str, partitions: i32) -> TopicTail {
        Self::start_with(bootstrap, topic, partitions, "read_committed")
    }

    /// As [`TopicTail::start`], with records of aborted and open transactions too.
    pub fn start_uncommitted(bootstrap: &str, topic: &str, partitions: i32) -> TopicTail {
        Self::start_with(bootstrap, topic, partitions, "read_uncommitted")
    }

    fn start_with(bootstrap: &str, topic: &str, partitions: i32, isolation: &str) -> TopicTail {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("isolation.level", isolation)
            .set("group.id", super::kafka::unique("tail"))
            .set("enable.auto.commit", "false")
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .expect("tail consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning).expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let messages: Arc<Mutex<Vec<OwnedMessage>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (messages, stop, topic) = (Arc::clone(&messages), Arc::clone(&stop), topic.to_string());
            std::thread::spawn(move || {
                let mut last_error: Option<Instant> = None;
                while !stop.load(Ordering::SeqCst) {
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => messages.lock().push(m.detach()),
                        // Transport errors while a broker restarts: say so now and then.
                        Some(Err(e)) if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) => {
                            eprintln!("tail({topic}): {e}");
                            last_error = Some(Instant::now());
                        }
                        Some(Err(_)) | None => {}
                    }
                }
            })
        };
        TopicTail { messages, stop, thread: Some(thread) }
    }

    /// Records read so far.
    pub fn len(&self) -> usize {
        self.messages.lock().len()
    }

    /// Records from index `from` on (to read incrementally).
    pub fn since(&self, from: usize) -> Vec<OwnedMessage> {
        let m = self.messages.lock();
        m[from.min(m.len())..].to_vec()
    }

    /// Stops the thread; returns every record read.
    pub fn stop(mut self) -> Vec<OwnedMessage> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.messages.lock())
    }
}

impl Drop for TopicTail {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A temporary directory that is kept (and its path printed) when the test fails, so
/// that the child's log and the store can be looked at.
pub struct KeptOnFailure {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl KeptOnFailure {
    /// A fresh temporary directory; kept whatever happens when `DEDUPD_TEST_KEEP` is set.
    pub fn new() -> KeptOnFailure {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        let mut kept = KeptOnFailure { dir: Some(dir), path };
        if std::env::var_os("DEDUPD_TEST_KEEP").is_some() {
            println!("DEDUPD_TEST_KEEP: keeping {}", kept.keep().display());
        }
        kept
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps it whatever happens; returns its path.
    pub fn keep(&mut self) -> PathBuf {
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        self.path.clone()
    }
}

impl Drop for KeptOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(d) = self.dir.take()
        {
            eprintln!("test failed: kept {}", d.keep().display());
        }
    }
}

/// The `http_addr` of the "dedupd running" line `child` wrote to its JSON log
/// (`log.format = "json"`), once it is there; fails if the process exits or `timeout`
/// passes first.
pub async fn wait_for_http_addr(log: &Path, child: &mut DedupdProcess, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        // Only what this process logged: an earlier one's address may be in the same log.
        let bytes = std::fs::read(log).unwrap_or_default();
        let start = usize::try_from(child.log_start).unwrap_or(0).min(bytes.len());
        let text = String::from_utf8_lossy(&bytes[start..]);
        let addr = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find_map(|v| {
            (v["fields"]["message"] == "dedupd running")
                .then(|| v["fields"]["http_addr"].as_str().map(str::to_string))?
        });
        if let Some(addr) = addr {
            return addr;
        }
        assert!(child.exited().is_none(), "dedupd exited early:\n{}", tail_of_file(log, 40));
        assert!(
            Instant::now() < deadline,
            "dedupd did not log `dedupd running` within {timeout:?}:\n{}",
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `cond` every 50 ms until it holds; fails after `timeout` or if dedupd died.
pub async fn until(what: &str, timeout: Duration, dedupd: &mut DedupdProcess, log: &Path, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(dedupd.exited().is_none(), "dedupd exited while waiting for {what}:\n{}", tail_of_file(log, 40));
        assert!(Instant::now() < deadline, "no {what} within {timeout:?}; dedupd log:\n{}", tail_of_file(log, 40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `condition` held within `within` (polled every 100 ms).
pub async fn wait_until(within: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !condition() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// Whether this build has the `failpoints` feature a test needs (`why` says for what):
/// without it the test is skipped, saying so, unless `DEDUPD_REQUIRE_KAFKA` asks for every
/// broker test to run, when it fails.
pub fn has_failpoints(why: &str) -> bool {
    if cfg!(feature = "failpoints") {
        return true;
    }
    let why = format!("{why}: run it with `--features failpoints`");
    assert!(std::env::var("DEDUPD_REQUIRE_KAFKA").is_err(), "{why}");
    println!("skipped: {why}");
    false
}

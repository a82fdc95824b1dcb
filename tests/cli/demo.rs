//! `dedupd demo` runs without a broker and passes only when every distinct valid command
//! ran exactly once.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Reads a child's stream to the end on its own thread, so a hung demo still shows
/// what it printed.
fn drain(mut stream: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

#[test]
fn demo_runs_every_distinct_command_once_and_exits_zero() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["demo", "--commands", "600"])
        .env("RUST_LOG", "info,dedupd=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dedupd demo");
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    let tail: String =
        stderr.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    let Some(status) = status else { panic!("demo did not finish within 180 s\n{stdout}\n--- stderr (tail)\n{tail}") };
    assert!(status.success(), "demo failed: {stdout}\n--- stderr (tail)\n{tail}");
    assert!(stdout.contains("effects done (HTTP requests received) : 600"), "{stdout}");
    assert!(stdout.contains("distinct valid keys                   : 600"), "{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
}

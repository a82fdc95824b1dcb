//! `dedupd demo` runs without a broker and passes only when every distinct valid command
//! ran exactly once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn demo_runs_every_distinct_command_once_and_exits_zero() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["demo", "--commands", "600"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dedupd demo");
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("demo did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("effects done (HTTP requests received) : 600"), "{stdout}");
    assert!(stdout.contains("distinct valid keys                   : 600"), "{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
}

//! `export` and `import` draw a progress bar on stderr only when it is a terminal: run once
//! under a pseudo-terminal (util-linux `script`) and once with stderr a pipe.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::records::config_file;
use dedupd::fingerprint::Fingerprint;
use dedupd::store::{Completed, Completion, KeyStore, Record};
use dedupd::store::{StoreBackend, SyncMode};

fn fill(store: &Path, n: usize) {
    let s = KeyStore::open(StoreBackend::default(), store, SyncMode::Batch).unwrap();
    let later = chrono::Utc::now().timestamp_millis() + 3_600_000;
    for i in 0..n {
        let r = Record::Completed(Completed {
            fingerprint: Fingerprint([1; 32]),
            outcome: Completion::Succeeded,
            result: b"{}".to_vec(),
            error: None,
            first_seen_at_ms: 1,
            completed_at_ms: 2,
            expires_at_ms: later,
            attempts: 1,
            source: None,
            settled: None,
        });
        s.compare_and_swap(&format!("k{i:07}"), None, Some(&r)).unwrap().unwrap();
    }
    s.flush_always().unwrap();
}

/// Runs dedupd with stdout and stderr pipes; returns (exit code, stdout, stderr).
fn piped(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupd")).args(args).env_remove("DEDUPD_ADMIN_URL").output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Runs dedupd under a pseudo-terminal; returns (exit code, everything it wrote to it).
fn on_terminal(args: &[&str]) -> (i32, String) {
    let line = std::iter::once(env!("CARGO_BIN_EXE_dedupd"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env_remove("DEDUPD_ADMIN_URL")
        .output()
        .expect("util-linux `script` (Debian: bsdutils, an essential package)");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into())
}

#[test]
fn progress_bar_only_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    fill(&a, 8_000);
    let config = |store: &Path| {
        let name = store.file_name().and_then(|n| n.to_str()).expect("a store directory name");
        config_file(&dir.path().join(format!("{name}.toml")), store, None)
    };
    let (ca, cb) = (config(&a), config(&b));
    let (ca, cb) = (ca.to_str().unwrap(), cb.to_str().unwrap());
    let file = dir.path().join("export.jsonl");
    let file = file.to_str().unwrap();

    let (code, stdout, stderr) = piped(&["export", file, "-c", ca]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), format!("exported 8000 record(s) and 0 watermark(s) to {file}"));
    assert_eq!(stderr, "");

    let (code, seen) = on_terminal(&["export", file, "-c", ca]);
    assert_eq!(code, 0, "{seen}");
    assert!(seen.contains("export [") && seen.contains("lines"), "no bar on the terminal: {seen:?}");

    let (code, seen) = on_terminal(&["import", file, "-c", cb]);
    assert_eq!(code, 0, "{seen}");
    assert!(seen.contains("import [") || seen.contains("check ["), "no bar on the terminal: {seen:?}");
    assert!(seen.contains("\"imported\": 8000"), "{seen:?}");

    let (code, stdout, stderr) = piped(&["import", file, "-c", cb]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["unchanged"], 8_000);
}

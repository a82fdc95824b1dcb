//! The operator CLI on a stopped instance's store (`-c FILE`), with the real `dedupd` binary:
//! `-c` before or after the subcommand, `check-config` reading `DEDUPD_CONFIG` as `run`
//! does, names rather than debug text in what it prints, and a closed stdout (`| head -1`)
//! ending the output quietly: exit 0, nothing on stderr, no panic.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::records::{completed_for_an_hour, config_file};
use dedupd::store::KeyStore;
use dedupd::store::{StoreBackend, SyncMode};

/// A stopped instance: a store holding `keys`, and its config file.
fn stopped_instance(dir: &Path, keys: &[&str]) -> PathBuf {
    let store_path = dir.join("store");
    let store = KeyStore::open(StoreBackend::Sled, &store_path, SyncMode::Batch).unwrap();
    for key in keys {
        store.compare_and_swap(key, None, Some(&completed_for_an_hour(7))).unwrap().unwrap();
    }
    store.flush_always().unwrap();
    drop(store);
    config_file(&dir.join("dedupd.toml"), &store_path, Some("sled"))
}

/// `dedupd` with no `DEDUPD_*` variables from the test's environment.
fn dedupd(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupd"));
    cmd.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") {
            cmd.env_remove(&k);
        }
    }
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_goes_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let config = stopped_instance(dir.path(), &["k1"]);
    let c = config.to_str().unwrap();

    let after = run(&mut dedupd(&["inspect", "k1", "-c", c]));
    let before = run(&mut dedupd(&["-c", c, "inspect", "k1"]));
    let long_before = run(&mut dedupd(&["--config", c, "inspect", "k1"]));
    assert_eq!(after.0, 0, "{after:?}");
    let record: serde_json::Value = serde_json::from_str(&after.1).unwrap();
    assert_eq!((record["key"].as_str(), record["state"].as_str()), (Some("k1"), Some("completed")));
    assert_eq!(record["expired"], false, "{record}");
    assert_eq!(before, after);
    assert_eq!(long_before, after);

    let stats = run(&mut dedupd(&["-c", c, "stats"]));
    assert_eq!(stats.0, 0, "{stats:?}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stats.1).unwrap()["records"]["completed"], 1);
    let missing = run(&mut dedupd(&["-c", c, "inspect", "nope"]));
    assert_eq!((missing.0, missing.2.trim()), (4, "dedupd: key \"nope\" has no record"), "{missing:?}");
}

#[test]
fn check_config_reads_dedupd_config_and_prints_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = stopped_instance(dir.path(), &[]);
    let c = config.to_str().unwrap();
    let store = dir.path().join("store");
    let expected = format!("{c}: ok (1 sink(s), 1 route(s), store sled at {})", store.display());

    let mut from_env = dedupd(&["check-config"]);
    from_env.env("DEDUPD_CONFIG", c);
    for mut cmd in [dedupd(&["check-config", "-c", c]), dedupd(&["-c", c, "check-config"]), from_env] {
        let (code, stdout, stderr) = run(&mut cmd);
        assert_eq!((code, stdout.trim(), stderr.as_str()), (0, expected.as_str(), ""), "{cmd:?}");
    }
    // Without a config, it says how to give one (as `run` does) and exits 2.
    for args in [["check-config"], ["run"]] {
        let (code, _, stderr) = run(&mut dedupd(&args));
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains("-c FILE") && stderr.contains("DEDUPD_CONFIG"), "{stderr}");
    }
}

/// Runs `dedupd ARGS` with stdout a pipe whose reading end is already closed, as when the
/// reader (`head -1`) has gone: every write to stdout fails with EPIPE.
fn with_stdout_closed(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    dedupd(args).stdout(writer).stderr(Stdio::piped()).output().unwrap()
}

#[test]
fn a_closed_stdout_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let config = stopped_instance(dir.path(), &["k1", "k2"]);
    let c = config.to_str().unwrap();
    let export = dir.path().join("export.jsonl");
    let export = export.to_str().unwrap();

    for args in [
        vec!["inspect", "k1", "-c", c],
        vec!["stats", "-c", c],
        vec!["check-config", "-c", c],
        vec!["compact", "-c", c],
        vec!["export", export, "-c", c],
        vec!["forget", "k2", "-c", c],
        vec!["--help"],
    ] {
        let out = with_stdout_closed(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!((out.status.code(), stderr.as_ref()), (Some(0), ""), "{args:?}");
    }
    // The commands ran: only their output went nowhere.
    assert!(Path::new(export).exists());
    let (code, _, stderr) = run(&mut dedupd(&["inspect", "k2", "-c", c]));
    assert_eq!(code, 4, "k2 was forgotten: {stderr}");

    // The same with the reader going away after the child started (`| head -1`'s race).
    let mut child = dedupd(&["inspect", "k1", "-c", c]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.as_ref()), (Some(0), ""));
}

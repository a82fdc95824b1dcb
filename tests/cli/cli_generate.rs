//! `dedupd completions SHELL` and `dedupd man [SUB] [--dir DIR]`, run as a user would: each names every
//! subcommand, so they follow the command line's definition (clap) as it changes.
//!
//! Run with `cargo test --test cli cli_generate::`.

use std::process::Command;

/// Every subcommand a user can type.
const SUBCOMMANDS: [&str; 14] = [
    "run",
    "demo",
    "check-config",
    "inspect",
    "forget",
    "resolve",
    "stats",
    "status",
    "compact",
    "export",
    "import",
    "completions",
    "man",
    "help",
];

fn dedupd(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupd")).args(args).output().expect("run dedupd");
    assert!(out.status.success(), "dedupd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn completions_for_every_shell_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = dedupd(&["completions", shell]);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} completions lack {sub}");
        }
        assert!(script.contains("admin") && script.contains("watch"), "{shell}: flags");
    }
    assert!(dedupd(&["completions", "bash"]).contains("complete -F _dedupd"), "bash registers its function");
}

#[test]
fn the_man_page_is_roff_naming_every_subcommand() {
    let page = dedupd(&["man"]);
    assert!(page.contains(".TH dedupd 1"), "a section-1 page:\n{}", &page[..page.len().min(300)]);
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(page.contains(section), "man page lacks {section}");
    }
    // `help` is clap's, with no page of its own to point to.
    for sub in SUBCOMMANDS.iter().filter(|s| **s != "help") {
        // roff escapes every hyphen.
        let name = format!("dedupd-{sub}").replace('-', "\\-");
        assert!(page.contains(&name), "man page lacks {sub}");
    }
}

#[test]
fn every_page_the_man_page_lists_is_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    dedupd(&["man", "--dir", dir.path().to_str().expect("utf-8")]);
    for sub in SUBCOMMANDS.iter().filter(|s| **s != "help") {
        let page = std::fs::read_to_string(dir.path().join(format!("dedupd-{sub}.1"))).expect("its page");
        assert!(page.contains(&format!(".TH dedupd-{sub} 1")), "dedupd-{sub}.1:\n{}", &page[..page.len().min(200)]);
        assert_eq!(page.trim_end(), dedupd(&["man", sub]).trim_end(), "`dedupd man {sub}` prints the same page");
    }
    let main = std::fs::read_to_string(dir.path().join("dedupd.1")).expect("the main page");
    assert_eq!(main.trim_end(), dedupd(&["man"]).trim_end());
    let out = Command::new(env!("CARGO_BIN_EXE_dedupd")).args(["man", "nope"]).output().expect("run dedupd");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("one of: run,"), "{out:?}");
}

#[test]
fn an_unknown_shell_is_refused_naming_the_choices() {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupd")).args(["completions", "tcsh"]).output().expect("run dedupd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tcsh") && err.contains("bash"), "{err}");
}

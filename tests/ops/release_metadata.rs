//! What a release says about itself, from the package's metadata and the notices it ships.
//! - Cargo metadata is complete: description, license (LICENSE, which exists), readme,
//!   rust-version, keywords, categories; never published to a registry by accident; and
//!   `cargo install` installs `dedupd` alone (the crash-test helper needs the test feature).
//! - The third-party notices (scripts/third-party-licenses, run by scripts/release and the
//!   Dockerfile): every package linked into the binary is listed and has a license text,
//!   the C libraries the `-sys` packages build in are there with their own texts, and what
//!   is not linked in (dev-dependencies, proc-macros, build tools) is not. Run for the host's
//!   target, as the container image's build runs it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_package_metadata_is_complete() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let package = &metadata["packages"][0];
    assert_eq!(package["name"], "dedupd");
    for field in ["description", "readme", "rust_version", "license_file"] {
        assert!(package[field].as_str().is_some_and(|v| !v.is_empty()), "Cargo.toml lacks {field}");
    }
    for field in ["keywords", "categories"] {
        assert!(package[field].as_array().is_some_and(|v| !v.is_empty()), "Cargo.toml lacks {field}");
    }
    let license = root().join(package["license_file"].as_str().unwrap_or_default());
    assert!(license.is_file(), "the license file {} exists", license.display());
    assert_eq!(package["publish"], serde_json::json!([]), "publish = false: no registry gets dedupd by accident");
    for target in package["targets"].as_array().into_iter().flatten() {
        let is_bin = target["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin"));
        if is_bin && target["name"] != "dedupd" {
            assert_eq!(
                target["required-features"],
                serde_json::json!(["failpoints"]),
                "`cargo install` would install {}",
                target["name"]
            );
        }
    }
}

fn notices() -> String {
    let root = root();
    let host = Command::new("rustc").arg("-vV").output().expect("run rustc -vV");
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let out = Command::new(root.join("scripts/third-party-licenses"))
        .args([&host, "9.9.9"])
        .current_dir(root)
        .output()
        .expect("run scripts/third-party-licenses (needs python3)");
    assert!(out.status.success(), "third-party-licenses failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 notices")
}

/// "name version" of each package in the list at the top ("  name version: license").
fn listed(notices: &str) -> BTreeSet<String> {
    notices
        .lines()
        .take_while(|l| !l.starts_with("====="))
        .filter_map(|l| l.strip_prefix("  ")?.split_once(": ").map(|(package, _)| package.to_owned()))
        .collect()
}

/// "name version" of each package named above a license text ("  name version (file)").
fn with_a_text(notices: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let mut in_header = false;
    for line in notices.lines() {
        match line {
            "The license text of:" => in_header = true,
            l if l.starts_with("-----") => in_header = false,
            l if in_header => {
                let package = l.trim().split(" (").next().unwrap_or_default();
                named.insert(package.to_owned());
            }
            _ => {}
        }
    }
    named
}

#[test]
fn every_linked_package_and_c_library_has_its_license_text() {
    let notices = notices();
    let listed = listed(&notices);
    let names: BTreeSet<&str> = listed.iter().filter_map(|p| p.split(' ').next()).collect();
    for linked in ["tokio", "rdkafka", "rdkafka-sys", "fjall", "sled", "openssl-sys", "openssl-src", "libz-sys"] {
        assert!(names.contains(linked), "{linked} is linked in but not listed: {names:?}");
    }
    // Dev-dependencies, proc-macros and build tools are not in the binary.
    for absent in ["proptest", "criterion", "serde_derive", "tokio-macros", "cc", "pkg-config"] {
        assert!(!names.contains(absent), "{absent} is not linked in, yet listed");
    }
    let with_a_text = with_a_text(&notices);
    let missing: Vec<&String> = listed.difference(&with_a_text).collect();
    assert!(missing.is_empty(), "listed without a license text: {missing:?}");

    // The C libraries' own texts, which their packages' Cargo metadata does not name.
    for c_source in [
        "librdkafka/LICENSES.txt",
        "openssl/LICENSE.txt",
        "src/zlib/LICENSE",
        "zstd/LICENSE",
        "c_src/mimalloc/v2/LICENSE",
    ] {
        assert!(notices.contains(&format!(" ({c_source})\n")), "no license text from {c_source}");
    }
    for (what, text) in [
        ("librdkafka", "librdkafka - Apache Kafka C driver library"),
        ("zlib", "Jean-loup Gailly"),
        ("the Rust standard library", "Copyright notices for The Rust Standard Library"),
    ] {
        assert!(notices.contains(text), "the notices lack {what}'s text ({text:?})");
    }
    assert!(notices.starts_with("Third-party software in dedupd 9.9.9 ("), "headed by the version");
}

//! Every path the docs and the deployment files cite exists, and no link leaves the
//! repository (a user's clone has nothing beside it):
//! - README.md, BENCHMARKS.md, docs/**/*.md and every file under deploy/ are scanned for
//!   markdown links (relative to the file) and for repository paths written out
//!   (`src/...`, `docs/...`, `deploy/...`, `Cargo.toml`, ...; relative to the repository);
//! - comments in src/, tests/ and benches/ are scanned for the docs they cite;
//! - a `#fragment` on a markdown file must name one of its headings, and
//!   `docs/contract.md §N` one of the contract's numbered sections; a section of any other
//!   document (`SPEC §8`, `decisions.md §2`) is refused: only the contract numbers its own.
//!
//! Paths under what a tool creates (the entries of .gitignore and fuzz/.gitignore, such as
//! `fuzz/artifacts`) need not exist, nor paths with a placeholder (`src/sinks/NAME.rs`) or
//! listed in [`FILES_TO_CREATE`]. Run with `cargo test --test docs doc_paths::`.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// Directories whose paths docs write out relative to the repository root.
const ROOTS: [&str; 8] = ["src", "tests", "benches", "docs", "deploy", "scripts", "fuzz", ".ci"];

/// Files at the repository root that docs name on their own.
const TOP_FILES: [&str; 7] =
    ["README.md", "BENCHMARKS.md", "Cargo.toml", "Cargo.lock", "Dockerfile", "docker-compose.yml", "rustfmt.toml"];

/// Files a doc tells the reader to create, as `(doc, path)`: they are examples, not citations.
const FILES_TO_CREATE: [(&str, &str); 1] = [("docs/sinks.md", "src/sinks/file.rs")];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every file under `dir` (relative to the root), sorted, as `/`-separated relative paths.
fn files_under(dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root().join(dir)];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("list {}: {e}", d.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let rel = path.strip_prefix(root()).expect("under the root");
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// The documents whose every path is checked.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_string(), "BENCHMARKS.md".to_string()];
    docs.extend(files_under("docs").into_iter().filter(|p| p.ends_with(".md")));
    docs.extend(files_under("deploy"));
    docs
}

/// Paths that tools create (build output, fuzzing corpus and artifacts): the plain entries
/// of the root's and fuzz/'s .gitignore, relative to the root.
fn generated_prefixes() -> Vec<String> {
    let mut out = Vec::new();
    for (file, base) in [(".gitignore", ""), ("fuzz/.gitignore", "fuzz/")] {
        for line in read(file).lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.contains('*') {
                continue;
            }
            out.push(format!("{base}{}", line.trim_start_matches('/').trim_end_matches('/')));
        }
    }
    out
}

/// `base/rel` with `.` and `..` resolved by text; `None` when it climbs above the root.
fn normalise(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut parts: Vec<String> = base.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    for c in Path::new(rel).components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.iter().collect())
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (code blocks skipped).
fn anchors(rel: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in read(rel).lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// One cited path: where it was cited, the path (relative to the root) and its fragment.
#[derive(Debug)]
struct Citation {
    at: String,
    path: PathBuf,
    fragment: Option<String>,
}

/// Checks one citation; returns what is wrong with it.
fn check(c: &Citation, generated: &[String]) -> Option<String> {
    let rel = c.path.to_string_lossy().replace('\\', "/");
    let is_generated = generated.iter().any(|g| rel == *g || rel.starts_with(&format!("{g}/")));
    let doc = c.at.split(':').next().unwrap_or_default();
    if is_generated || has_placeholder(&rel) || FILES_TO_CREATE.contains(&(doc, rel.as_str())) {
        return None;
    }
    let full = root().join(&c.path);
    if !full.exists() {
        return Some(format!("{}: cites {rel}, which does not exist", c.at));
    }
    let fragment = c.fragment.as_deref().filter(|f| !f.is_empty())?;
    if rel.ends_with(".md") && !anchors(&rel).contains(fragment) {
        return Some(format!("{}: cites {rel}#{fragment}, which has no such heading", c.at));
    }
    None
}

/// A path with a segment standing for a name the reader picks (`src/sinks/NAME.rs`).
fn has_placeholder(rel: &str) -> bool {
    const PLACEHOLDERS: [&str; 4] = ["NAME", "FILE", "DIR", "KEY"];
    rel.split('/').any(|seg| PLACEHOLDERS.contains(&seg.split('.').next().unwrap_or_default()))
}

fn split_fragment(target: &str) -> (&str, Option<String>) {
    match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment.to_string())),
        None => (target, None),
    }
}

/// Markdown links `[text](target)` of a markdown file, relative to its directory.
/// `Err` for a link that climbs out of the repository.
fn markdown_links(rel: &str, text: &str) -> Vec<Result<Citation, String>> {
    let dir = Path::new(rel).parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = format!("{rel}:{}", n + 1);
        for (i, _) in line.match_indices("](") {
            let target: String = line[i + 2..].chars().take_while(|c| *c != ')' && !c.is_whitespace()).collect();
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, fragment) = split_fragment(&target);
            let path = if path.is_empty() { rel } else { path };
            match if path == rel { Some(PathBuf::from(rel)) } else { normalise(dir, path) } {
                Some(p) => out.push(Ok(Citation { at: at.clone(), path: p, fragment })),
                None => out.push(Err(format!("{at}: link {target} leaves the repository"))),
            }
        }
    }
    out
}

/// Words of a line that may be paths: runs of path characters.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || "_.-/#".contains(c)))
        .map(|w| w.trim_end_matches(['.', ',', ':', ';']))
        .filter(|w| !w.is_empty())
}

fn is_repo_path(word: &str) -> bool {
    TOP_FILES.contains(&word) || ROOTS.iter().any(|r| word.starts_with(&format!("{r}/")))
}

/// Paths written out in a document: repository paths relative to the root, and `../`
/// paths relative to the document (`Err` when one climbs out of the repository).
fn written_paths(rel: &str, text: &str) -> Vec<Result<Citation, String>> {
    let dir = Path::new(rel).parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = format!("{rel}:{}", n + 1);
        for word in words(line) {
            let (path, fragment) = split_fragment(word);
            if path.starts_with("../") {
                match normalise(dir, path) {
                    Some(p) => out.push(Ok(Citation { at: at.clone(), path: p, fragment })),
                    None => out.push(Err(format!("{at}: {word} leaves the repository"))),
                }
            } else if is_repo_path(path) {
                out.push(Ok(Citation { at: at.clone(), path: PathBuf::from(path), fragment }));
            }
        }
    }
    out
}

/// Docs cited in the comments of a source file: `docs/...`, README.md, BENCHMARKS.md.
fn cited_in_comments(rel: &str, text: &str) -> Vec<Citation> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some((_, comment)) = line.split_once("//") else { continue };
        for word in words(comment) {
            let (path, fragment) = split_fragment(word);
            if path.starts_with("docs/") || path == "README.md" || path == "BENCHMARKS.md" {
                out.push(Citation { at: format!("{rel}:{}", n + 1), path: PathBuf::from(path), fragment });
            }
        }
    }
    out
}

/// Each `contract.md §N` of `text` that names no `## N.` section of docs/contract.md.
fn bad_contract_sections(rel: &str, text: &str, sections: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (i, _) in line.match_indices("contract.md §") {
            let number: String = line[i + "contract.md §".len()..].chars().take_while(char::is_ascii_digit).collect();
            if !number.is_empty() && !sections.contains(&number) {
                out.push(format!("{rel}:{}: docs/contract.md has no section §{number}", n + 1));
            }
        }
    }
    out
}

/// Each `NAME §N` of `text` whose NAME is a document but not docs/contract.md, the one
/// document with numbered sections: another `.md` file, or a name in capitals such as
/// `SPEC` (a brief the repository does not have). A bare `§N` (of the contract, from its
/// context) passes.
fn sections_of_other_documents(rel: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (i, _) in line.match_indices(" §") {
            let before = line[..i].rsplit(|c: char| c.is_whitespace() || "(`".contains(c)).next().unwrap_or("");
            let names_a_document =
                before.ends_with(".md") || (before.len() >= 2 && before.chars().all(|c| c.is_ascii_uppercase()));
            if names_a_document && !before.ends_with("contract.md") {
                out.push(format!("{rel}:{}: cites a section of {before}, which has no numbered sections here", n + 1));
            }
        }
    }
    out
}

/// The numbers of docs/contract.md's `## N. Title` sections.
fn contract_sections() -> BTreeSet<String> {
    read("docs/contract.md")
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter_map(|l| l.split_once(". ").map(|(n, _)| n.to_string()))
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        .collect()
}

#[test]
fn every_path_a_doc_or_deploy_file_cites_exists_inside_the_repository() {
    let generated = generated_prefixes();
    let sections = contract_sections();
    let mut problems = Vec::new();
    let mut checked = 0;
    for rel in documents() {
        let text = read(&rel);
        let mut citations = written_paths(&rel, &text);
        if rel.ends_with(".md") {
            citations.extend(markdown_links(&rel, &text));
        }
        for c in citations {
            checked += 1;
            match c {
                Ok(c) => problems.extend(check(&c, &generated)),
                Err(e) => problems.push(e),
            }
        }
        problems.extend(bad_contract_sections(&rel, &text, &sections));
        problems.extend(sections_of_other_documents(&rel, &text));
    }
    assert!(checked > 100, "expected the docs to cite many paths, found {checked}");
    assert!(problems.is_empty(), "{} bad citation(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn every_doc_a_source_comment_cites_exists() {
    let generated = generated_prefixes();
    let sections = contract_sections();
    let mut problems = Vec::new();
    for dir in ["src", "tests", "benches"] {
        for rel in files_under(dir).into_iter().filter(|p| p.ends_with(".rs")) {
            let text = read(&rel);
            for c in cited_in_comments(&rel, &text) {
                problems.extend(check(&c, &generated));
            }
            problems.extend(bad_contract_sections(&rel, &text, &sections));
            // This file's own doc and tests show what the rule refuses.
            if rel != "tests/docs/doc_paths.rs" {
                problems.extend(sections_of_other_documents(&rel, &text));
            }
        }
    }
    assert!(problems.is_empty(), "{} bad citation(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_checker_finds_what_is_wrong() {
    let generated = generated_prefixes();
    let text = "see [x](../../elsewhere/SPEC.md), [y](missing.md), `src/nowhere.rs`, \
                [z](runbook.md#no-such-heading) and fuzz/artifacts/envelope/crash-1";
    let mut problems = Vec::new();
    for c in written_paths("docs/a.md", text).into_iter().chain(markdown_links("docs/a.md", text)) {
        match c {
            Ok(c) => problems.extend(check(&c, &generated)),
            Err(e) => problems.push(e),
        }
    }
    let joined = problems.join("\n");
    for expected in ["leaves the repository", "docs/missing.md", "src/nowhere.rs", "no-such-heading"] {
        assert!(joined.contains(expected), "expected a problem naming {expected}, got:\n{joined}");
    }
    assert!(!joined.contains("fuzz/artifacts"), "generated paths are allowed:\n{joined}");
    assert!(has_placeholder("src/sinks/NAME.rs") && !has_placeholder("src/sinks/mod.rs"));
    assert!(!has_placeholder("README.md"));
    let cited = "as SPEC §8 says (see decisions.md §2, docs/contract.md §4, §3)";
    let found = sections_of_other_documents("src/a.rs", cited);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("SPEC") && found[1].contains("decisions.md"), "{found:?}");
    assert_eq!(slug("`http`: headers, auth, templates, response"), "http-headers-auth-templates-response");
}

//! The module map in src/lib.rs is true: every top-level module imports (outside its
//! tests) only modules listed below it in the map, except the section config files
//! (`<module>/config.rs`) that `config` composes; and the map lists every module.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The modules of the map, top down.
fn map_order() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("read src/lib.rs");
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of src/ belongs to (`None` for crate roots and binaries).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "main.rs" | "bin" => None,
        _ => Some(first.trim_end_matches(".rs").to_string()),
    }
}

/// Whether the file is a section's config type (`src/<module>/config.rs` or deeper).
fn is_section_config(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "config.rs") && module_of(path).is_some_and(|m| m != "config")
}

/// `crate::X` paths used in code (not in comments), before the file's tests.
fn imported_modules(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

#[test]
fn every_module_imports_only_modules_below_it_in_the_map() {
    let order = map_order();
    assert!(order.len() > 5, "no module map found in src/lib.rs: {order:?}");
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(file) else { continue };
        let Some(here) = rank(&module) else {
            wrong.push(format!("{}: module `{module}` is missing from the map", file.display()));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        for used in imported_modules(&text) {
            if used == module {
                continue;
            }
            let Some(there) = rank(&used) else { continue };
            // `config` composes the section types, which live in leaf files of their modules.
            let composes_section = module == "config";
            if there < here && !composes_section && !is_section_config(file) {
                wrong.push(format!("{} ({module}) imports `{used}`, listed above it", file.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "the module map in src/lib.rs is not true:\n{}", wrong.join("\n"));
}

#[test]
fn section_config_files_import_nothing_of_ours_above_them() {
    let order = map_order();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for file in files.iter().filter(|f| is_section_config(f)) {
        let text = std::fs::read_to_string(file).expect("read source");
        let used = imported_modules(&text);
        assert!(!used.contains("config"), "{} imports the config module", file.display());
        let module = module_of(file).expect("module");
        let here = order.iter().position(|o| *o == module).expect("listed");
        for u in &used {
            if let Some(there) = order.iter().position(|o| o == u) {
                assert!(there >= here, "{} imports `{u}`, listed above its module", file.display());
            }
        }
    }
}

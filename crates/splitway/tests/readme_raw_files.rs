//! Every published figure comes from a committed raw file, and every
//! committed raw file backs a published figure:
//! - in the README and docs/benchmarks.md (the figure documents), each
//!   section with a table names a raw result file (`lab-results/…` or
//!   `bench-results/…`: .json, .txt or a glob);
//! - every raw path the README or a doc names exists;
//! - docs/results.md, the index, names every raw path the README and the
//!   other docs name (`scripts/results-index.py` writes it);
//! - every file under bench-results/ and lab-results/ is named by a doc or
//!   the index: as itself, by a glob, or by its folder (`…/dir/`).

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `lab-results/…` and `bench-results/…` paths in `text` (a trailing `*`
/// or a `*` inside the file name is a glob).
fn raw_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["lab-results/", "bench-results/"] {
        let mut rest = text;
        while let Some(i) = rest.find(start) {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-_./*".contains(c)))
                .unwrap_or(tail.len());
            let path = tail[..end].trim_end_matches('.');
            if path.len() > start.len() {
                out.push(path.to_owned());
            }
            rest = &tail[end..];
        }
    }
    out
}

fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len())
                    .any(|skip| glob_match(tail, &name[head.len() + skip..]))
        }
    }
}

/// Whether `path` (relative to the repository, maybe a glob in its file
/// name) names at least one existing file.
fn exists(path: &str) -> bool {
    let full = repo().join(path);
    if path.ends_with('/') {
        // A directory of raw files: it must hold at least one.
        return std::fs::read_dir(&full).is_ok_and(|mut d| d.next().is_some());
    }
    if !path.contains('*') {
        return full.is_file();
    }
    let (Some(dir), Some(pattern)) = (full.parent(), full.file_name()) else {
        return false;
    };
    let pattern = pattern.to_string_lossy();
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| glob_match(&pattern, &e.file_name().to_string_lossy()))
    })
}

/// (heading, body) of each section: split at every `#` heading.
fn sections(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![(String::new(), String::new())];
    for line in text.lines() {
        if line.starts_with('#') {
            out.push((line.to_owned(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// The documents that publish measured figures: every table in them is a
/// measurement.
const FIGURE_DOCS: &[&str] = &["README.md", "docs/benchmarks.md"];

/// The index of raw files.
const INDEX: &str = "docs/results.md";

/// The folders of raw results.
const RESULT_DIRS: &[&str] = &["bench-results", "lab-results"];

/// (path relative to the repository, text) of README.md and every docs/*.md.
fn documents() -> Vec<(String, String)> {
    let mut out = vec![(
        "README.md".to_owned(),
        std::fs::read_to_string(repo().join("README.md")).expect("read README.md"),
    )];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("read docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for path in docs {
        let name = format!(
            "docs/{}",
            path.file_name().expect("a file").to_string_lossy()
        );
        out.push((name, std::fs::read_to_string(&path).expect("read a doc")));
    }
    out
}

#[test]
fn every_table_in_a_figure_doc_names_a_raw_file() {
    for doc in FIGURE_DOCS {
        let text = std::fs::read_to_string(repo().join(doc)).expect("read a figure doc");
        let mut tables = 0;
        for (heading, body) in sections(&text) {
            if !body.lines().any(|l| l.starts_with("|---")) {
                continue;
            }
            tables += body.lines().filter(|l| l.starts_with("|---")).count();
            // Raw rows (the lab's and bench's JSON, the shell benches' text
            // rows), not a chart drawn from them.
            let raw: Vec<String> = raw_paths(&body)
                .into_iter()
                .filter(|p| p.ends_with(".json") || p.ends_with(".txt") || p.contains('*'))
                .collect();
            assert!(
                !raw.is_empty(),
                "{doc}: section {heading:?} has a measured table but names no raw file \
                 (.json, .txt or a glob) in lab-results/ or bench-results/"
            );
        }
        assert!(tables >= 1, "{doc}: no measured table found");
    }
}

#[test]
fn the_index_names_every_raw_path_a_doc_names() {
    let docs = documents();
    let index = &docs
        .iter()
        .find(|(name, _)| name == INDEX)
        .expect("docs/results.md exists")
        .1;
    let indexed = raw_paths(index);
    let mut missing: Vec<String> = Vec::new();
    for (name, text) in docs.iter().filter(|(name, _)| name != INDEX) {
        for raw in raw_paths(text) {
            if !indexed.contains(&raw) && !missing.iter().any(|m| m.ends_with(&format!(": {raw}")))
            {
                missing.push(format!("{name}: {raw}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{INDEX} does not name these raw paths (run `python3 scripts/results-index.py`): \
         {missing:#?}"
    );
}

/// Whether `named` (a raw path as a doc writes it) covers the file `file`:
/// the same path, a glob matching it in its folder, or a folder holding it.
fn covers(named: &str, file: &str) -> bool {
    if named == file {
        return true;
    }
    let folder = named.trim_end_matches('/');
    if named.ends_with('/') || repo().join(folder).is_dir() {
        return file.starts_with(&format!("{folder}/"));
    }
    match (named.rsplit_once('/'), file.rsplit_once('/')) {
        (Some((named_dir, pattern)), Some((file_dir, name))) => {
            named_dir == file_dir && pattern.contains('*') && glob_match(pattern, name)
        }
        _ => false,
    }
}

/// Every file under `dir` (relative to the repository), recursively.
fn files_under(dir: &str, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(repo().join(dir)).expect("read a results folder");
    for entry in entries {
        let entry = entry.expect("a results entry");
        let path = format!("{dir}/{}", entry.file_name().to_string_lossy());
        if entry.file_type().expect("a file type").is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn every_raw_file_is_named_by_a_doc_or_the_index() {
    let named: Vec<String> = documents()
        .iter()
        .flat_map(|(_, text)| raw_paths(text))
        .collect();
    let mut files = Vec::new();
    for dir in RESULT_DIRS {
        files_under(dir, &mut files);
    }
    files.sort();
    assert!(files.len() > 10, "found only {} raw files", files.len());
    let orphans: Vec<&String> = files
        .iter()
        .filter(|file| !named.iter().any(|n| covers(n, file)))
        .collect();
    assert!(
        orphans.is_empty(),
        "raw files named neither by a doc nor by {INDEX} (name each where its figure is published, \
         then run `python3 scripts/results-index.py`; or delete a superseded run: git keeps \
         it): {orphans:#?}"
    );
}

#[test]
fn every_raw_file_named_in_docs_exists() {
    let mut missing = Vec::new();
    for (name, text) in documents() {
        for raw in raw_paths(&text) {
            if !exists(&raw) {
                missing.push(format!("{name}: {raw}"));
            }
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs name missing raw files: {missing:?}"
    );
}

#[test]
fn raw_path_scanner() {
    let text = "raw: `bench-results/2026*-x.json`, lab-results/a.json. and lab-results/ alone";
    assert_eq!(
        raw_paths(text),
        ["lab-results/a.json", "bench-results/2026*-x.json"]
    );
    assert!(glob_match("2026*-x.json", "20261124-x.json"));
    assert!(!glob_match("2026*-x.json", "20261124-y.json"));
    assert!(glob_match("a*", "a"));
    assert!(covers(
        "bench-results/2026*-x.json",
        "bench-results/20261124-x.json"
    ));
    assert!(!covers(
        "bench-results/2026*-x.json",
        "bench-results/sub/20261124-x.json"
    ));
    assert!(covers("lab-results/run-1/", "lab-results/run-1/a.json"));
    assert!(!covers("lab-results/run-1/", "lab-results/run-10/a.json"));
    assert!(!covers("lab-results/a.json", "lab-results/a.json.bak"));
}

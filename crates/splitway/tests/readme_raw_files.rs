//! Every measured figure in the README comes from a committed raw file:
//! each table under `## Measured` must sit in a section that names a raw
//! result file (`lab-results/…` or `bench-results/…`), and every raw file
//! the README or `docs/` names must exist in the repository.

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

#[test]
fn every_readme_figure_names_a_raw_file_that_exists() {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let mut missing: Vec<String> = raw_paths(&text)
        .into_iter()
        .filter(|p| !exists(p))
        .collect();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "README names missing raw files: {missing:?}"
    );

    let mut measured = false;
    let mut tables = 0;
    for (heading, body) in sections(&text) {
        if heading.starts_with("## ") {
            measured = heading == "## Measured";
        }
        if !measured || !body.lines().any(|l| l.starts_with("|---")) {
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
            "README section {heading:?} has a measured table but names no raw file \
             (.json, .txt or a glob) in lab-results/ or bench-results/"
        );
    }
    assert!(tables >= 1, "no measured table found under ## Measured");
}

#[test]
fn every_raw_file_named_in_docs_exists() {
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(repo().join("docs")).expect("read docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&path).expect("read a doc");
            for raw in raw_paths(&text) {
                if !exists(&raw) {
                    missing.push(format!("{}: {raw}", path.display()));
                }
            }
        }
    }
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
}

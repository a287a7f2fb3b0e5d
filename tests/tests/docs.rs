//! The README and the operator's book (docs/, built by mdBook from
//! docs/book/book.toml): the README stays short, every chapter is in the
//! book's table of contents, every link between them and into the tree
//! resolves (file and heading), and `mdbook build` succeeds without a
//! warning.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// The README and every chapter of the book.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    chapters.sort();
    files.extend(chapters);
    files
}

/// The anchor GitHub and mdBook give a heading: lower case, spaces to `-`,
/// everything but letters, digits, `-` and `_` dropped.
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

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors of every heading in `text`.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|l| {
            let hashes = l.chars().take_while(|c| *c == '#').count();
            (1..=6).contains(&hashes).then(|| l[hashes..].strip_prefix(' ')).flatten().map(slug)
        })
        .collect()
}

/// Every `[label](target)` link in `text` outside code (fenced blocks and
/// inline code spans).
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        // Inline code spans never hold links: drop them first.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            found.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    found
}

#[test]
fn the_readme_is_under_250_lines() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let n = readme.lines().count();
    assert!(n < 250, "README.md has {n} lines: move the detail into a chapter of the book (docs/) and link it");
}

#[test]
fn every_link_in_the_readme_and_the_book_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let file = if path.is_empty() { doc.clone() } else { doc.parent().unwrap().join(path) };
            if !file.exists() {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            if !fragment.is_empty() {
                if file.extension().is_none_or(|x| x != "md") {
                    broken.push(format!("{name}: {target}: an anchor into a file that is not Markdown"));
                } else if !anchors(&std::fs::read_to_string(&file).unwrap()).contains(fragment) {
                    broken.push(format!("{name}: {target}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found: the link reader is broken");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_fails_on_a_broken_link() {
    let text = "See [x](nowhere.md) and [y](#no-such-heading) but not `[z](code.md)`.\n```\n[w](fenced.md)\n```\n# A heading — here\n";
    assert_eq!(links(text), ["nowhere.md", "#no-such-heading"]);
    assert!(anchors(text).contains("a-heading--here"), "{:?}", anchors(text));
}

#[test]
fn every_chapter_is_in_the_books_table_of_contents() {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let chapters: Vec<String> = documents()
        .iter()
        .filter(|p| p.parent() == Some(root().join("docs").as_path()))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "SUMMARY.md")
        .collect();
    let missing: Vec<&String> = chapters.iter().filter(|c| !listed.contains(*c)).collect();
    assert!(missing.is_empty(), "docs/SUMMARY.md does not list {missing:?}: add each where it belongs in the book");
}

/// mdbook: on PATH, else where `cargo install` (scripts/install-deps) puts it.
fn mdbook() -> PathBuf {
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|c| c.join("bin/mdbook"));
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("mdbook"))
        .chain(cargo_bin)
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("mdbook is not installed: run scripts/install-deps"))
}

#[test]
fn the_book_builds_without_a_warning() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(mdbook()).args(["build", "docs/book", "--dest-dir"]).arg(out_dir.path()).current_dir(root()).output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "mdbook build docs/book failed:\n{log}");
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "mdbook build docs/book warned:\n{log}");
    for page in ["index.html", "install.html", "configuration.html", "correctness-gate.html", "benchmarks.html"] {
        assert!(out_dir.path().join(page).is_file(), "the built book has no {page}");
    }
}

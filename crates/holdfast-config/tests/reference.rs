//! The operator's book lists every key each daemon's config file accepts
//! (docs/configuration.md): a key the structs gain without a row there
//! fails here, naming it.
//!
//! The keys come from the structs themselves: each refuses unknown keys
//! (`deny_unknown_fields`), and serde's refusal lists every key the struct
//! accepts. A key whose value is a table of its own is found the same way,
//! one level down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use serde::de::DeserializeOwned;
use std::collections::BTreeSet;

/// A key no struct accepts.
const PROBE: &str = "zz_not_a_key";

/// The keys serde says a table at `path` accepts, or `None` when the
/// value at `path` is not a table of known keys (a scalar, a list, a map).
fn accepted<T: DeserializeOwned>(path: &[String]) -> Option<Vec<String>> {
    let mut doc = toml::Table::new();
    doc.insert(PROBE.into(), toml::Value::Integer(1));
    for segment in path.iter().rev() {
        let mut outer = toml::Table::new();
        outer.insert(segment.clone(), toml::Value::Table(doc));
        doc = outer;
    }
    let text = toml::to_string(&doc).unwrap();
    let err = toml::from_str::<T>(&text).err()?.to_string();
    let unknown = format!("unknown field `{PROBE}`");
    if !err.contains(&unknown) {
        return None;
    }
    let (_, list) = err.split_once("expected one of ").or_else(|| err.split_once("expected "))?;
    Some(list.split('`').skip(1).step_by(2).map(str::to_string).collect())
}

/// Every key of `T`, dotted (`tls.cert_file`), tables included.
fn keys<T: DeserializeOwned>() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let Some(fields) = accepted::<T>(&path) else { continue };
        for f in fields {
            let mut child = path.clone();
            child.push(f);
            found.insert(child.join("."));
            todo.push(child);
        }
    }
    found
}

fn chapter() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of the chapter's section `heading`, up to the next `## `.
fn section(heading: &str) -> String {
    let text = chapter();
    let start = text.find(heading).unwrap_or_else(|| panic!("docs/configuration.md has no heading {heading:?}"));
    let rest = &text[start + heading.len()..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
}

/// The section every file's `[etcd]` (and `[coord]`) keys are listed in.
const ETCD_SECTION: &str = "## The `[etcd]` table, in every file";

/// The keys of `T` that the chapter's section `heading` does not name in
/// backticks (a table as `[name]` too). The keys of an `[etcd]` or
/// `[coord]` table are looked up, as `etcd.KEY`, in [`ETCD_SECTION`].
fn missing<T: DeserializeOwned>(heading: &str) -> Vec<String> {
    let own = section(heading);
    let shared = section(ETCD_SECTION);
    let all = keys::<T>();
    assert!(all.len() > 3, "found only {all:?}: the key probe no longer reads serde's refusal");
    let named = |text: &str, k: &str| text.contains(&format!("`{k}`")) || text.contains(&format!("`[{k}]`"));
    all.into_iter()
        .filter(|k| match k.split_once('.') {
            Some(("etcd" | "coord", rest)) => !named(&shared, &format!("etcd.{rest}")),
            _ => !named(&own, k),
        })
        .collect()
}

#[test]
fn the_probe_finds_nested_keys() {
    let keys = keys::<holdfast_config::ArbiterConfig>();
    for k in ["listen", "tls", "tls.cert_file", "etcd.endpoints", "fail_open.after"] {
        assert!(keys.contains(k), "{k} not among {keys:?}");
    }
}

#[test]
fn every_arbiter_key_is_in_the_reference() {
    let missing = missing::<holdfast_config::ArbiterConfig>("## arbiter.toml");
    assert!(missing.is_empty(), "docs/configuration.md lists no row for arbiter.toml's {missing:?}");
}

#[test]
fn every_controller_key_is_in_the_reference() {
    let missing = missing::<holdfast_config::ControllerConfig>("## controller.toml");
    assert!(missing.is_empty(), "docs/configuration.md lists no row for controller.toml's {missing:?}");
}

#[test]
fn every_tailer_key_is_in_the_reference() {
    let missing = missing::<holdfast_config::TailerConfig>("## tailer.toml");
    assert!(missing.is_empty(), "docs/configuration.md lists no row for tailer.toml's {missing:?}");
}

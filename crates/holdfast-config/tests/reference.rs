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
use std::collections::{BTreeMap, BTreeSet};

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

/// The keys of `T` that the chapter's section `heading` does not name in
/// backticks (a table as `[name]` too).
fn missing<T: DeserializeOwned>(heading: &str) -> Vec<String> {
    let own = section(heading);
    let all = keys::<T>();
    assert!(all.len() > 3, "found only {all:?}: the key probe no longer reads serde's refusal");
    all.into_iter().filter(|k| !own.contains(&format!("`{k}`")) && !own.contains(&format!("`[{k}]`"))).collect()
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

// ---------- The reference generated from the structs' doc comments ----------

/// The config crate's sources: every struct a config file is made of.
const SOURCES: [&str; 5] = [
    include_str!("../src/arbiter.rs"),
    include_str!("../src/controller.rs"),
    include_str!("../src/tailer.rs"),
    include_str!("../src/etcd.rs"),
    include_str!("../src/sinks.rs"),
];

/// One field of a config struct, as its source declares it.
#[derive(Debug, Clone)]
struct Field {
    name: String,
    ty: String,
    doc: String,
    /// `#[serde(default…)]`: the key may be left out.
    defaulted: bool,
}

/// Every `pub struct NAME { … }` in the sources, with its fields.
fn structs() -> BTreeMap<String, Vec<Field>> {
    let mut found = BTreeMap::new();
    for source in SOURCES {
        let mut current: Option<(String, Vec<Field>)> = None;
        let (mut doc, mut defaulted) = (Vec::<String>::new(), false);
        for line in source.lines() {
            if let Some(rest) = line.strip_prefix("pub struct ") {
                let name = rest.split([' ', '{', '(', ';']).next().unwrap().to_string();
                current = rest.trim_end().ends_with('{').then(|| (name, Vec::new()));
                (doc, defaulted) = (Vec::new(), false);
                continue;
            }
            let Some((_, fields)) = current.as_mut() else { continue };
            let t = line.trim();
            if line == "}" {
                let (name, fields) = current.take().unwrap();
                found.insert(name, fields);
            } else if let Some(d) = t.strip_prefix("///") {
                doc.push(d.trim().to_string());
            } else if t.starts_with("#[serde(") {
                defaulted |= t.contains("default");
            } else if let Some(decl) = t.strip_prefix("pub ") {
                let (name, ty) = decl.split_once(':').unwrap();
                let ty = ty.trim().trim_end_matches(',').to_string();
                fields.push(Field { name: name.trim().to_string(), ty, doc: doc.join(" "), defaulted });
                (doc, defaulted) = (Vec::new(), false);
            }
        }
    }
    found
}

/// A config file with every table present (so each table's defaults show)
/// and only its required keys set.
fn rendered<T: DeserializeOwned + serde::Serialize>(required: &str) -> toml::Table {
    let config: T = toml::from_str(required).unwrap_or_else(|e| panic!("the minimal file does not parse: {e}\n{required}"));
    toml::from_str(&toml::to_string(&config).unwrap()).unwrap()
}

fn lookup<'a>(table: &'a toml::Table, path: &[String]) -> Option<&'a toml::Value> {
    let (last, parents) = path.split_last()?;
    let mut t = table;
    for p in parents {
        t = t.get(p)?.as_table()?;
    }
    t.get(last)
}

fn value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("`{s}`"),
        toml::Value::Array(a) if a.is_empty() => "none".into(),
        other => format!("`{other}`"),
    }
}

/// The markdown rows of a config file whose root struct is `root`: one per
/// key, tables first as `[name]` rows, with the default `defaults` shows
/// (a key set there only because it is required shows "required").
fn rows(root: &str, defaults: &toml::Table) -> String {
    let all = structs();
    let mut out = String::from("| key | default | meaning |\n|---|---|---|\n");
    let mut todo: Vec<(Vec<String>, &str)> = vec![(Vec::new(), root)];
    while let Some((prefix, name)) = todo.pop() {
        let fields = all.get(name).unwrap_or_else(|| panic!("no struct {name} in the config sources"));
        let mut tables = Vec::new();
        for f in fields {
            let mut path = prefix.clone();
            path.push(f.name.clone());
            let key = path.join(".");
            assert!(!f.doc.is_empty(), "{name}.{} has no doc comment: the reference is made of them", f.name);
            let optional = f.ty.starts_with("Option<");
            let inner = f.ty.trim_start_matches("Option<").trim_end_matches('>');
            let doc = f.doc.replace('|', "\\|");
            if all.contains_key(inner) {
                let default = if optional {
                    "none"
                } else if f.defaulted {
                    ""
                } else {
                    "required"
                };
                out.push_str(&format!("| `[{key}]` | {default} | {doc} |\n"));
                tables.push((path, inner));
                continue;
            }
            let default = if !f.defaulted && !optional {
                "required".to_string()
            } else if let Some(v) = lookup(defaults, &path) {
                value(v)
            } else if optional || inner.starts_with("std::collections::BTreeMap") || inner.starts_with("BTreeMap") {
                "none".to_string()
            } else if inner == "bool" {
                "`false`".to_string()
            } else {
                panic!("{key}: no default found for a defaulted key of type {inner}")
            };
            out.push_str(&format!("| `{key}` | {default} | {doc} |\n"));
        }
        // Tables in declaration order, after their parent's own keys.
        todo.extend(tables.into_iter().rev());
    }
    out
}

const ARBITER_REQUIRED: &str = r#"
[tls]
cert_file = "server.pem"
key_file = "server-key.pem"
client_ca_file = "clients-ca.pem"
trust_domain = "example.org"
[etcd]
endpoints = ["https://10.0.0.1:2379"]
[coord]
endpoints = ["https://10.0.1.1:2379"]
"#;

const CONTROLLER_REQUIRED: &str = r#"
[etcd]
endpoints = ["https://10.0.0.1:2379"]
"#;

const TAILER_REQUIRED: &str = r#"
[etcd]
endpoints = ["https://10.0.0.1:2379"]
[coord]
endpoints = ["https://10.0.1.1:2379"]
[clickhouse]
url = "https://clickhouse.example:8443"
[archive]
endpoint = "https://s3.example"
bucket = "holdfast-audit"
"#;

/// Every file's generated table: (marker name, rows).
fn generated() -> Vec<(&'static str, String)> {
    vec![
        ("arbiter.toml", rows("ArbiterConfig", &rendered::<holdfast_config::ArbiterConfig>(ARBITER_REQUIRED))),
        ("controller.toml", rows("ControllerConfig", &rendered::<holdfast_config::ControllerConfig>(CONTROLLER_REQUIRED))),
        ("tailer.toml", rows("TailerConfig", &rendered::<holdfast_config::TailerConfig>(TAILER_REQUIRED))),
    ]
}

/// The chapter's tables are the structs' doc comments and defaults, as
/// [`rows`] writes them. `HOLDFAST_WRITE_REFERENCE=1` rewrites them (that
/// run fails; review the diff, then run again without it).
#[test]
fn the_reference_tables_are_generated_from_the_structs() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let mut text = chapter();
    let mut stale = Vec::new();
    for (file, table) in generated() {
        let start = format!("<!-- generated from crates/holdfast-config: {file} -->\n");
        let end = format!("<!-- end of generated {file} -->");
        let from = text.find(&start).unwrap_or_else(|| panic!("docs/configuration.md has no line {start:?}")) + start.len();
        let to = text[from..].find(&end).unwrap_or_else(|| panic!("docs/configuration.md has no line {end:?}")) + from;
        if text[from..to] != table {
            stale.push(file);
            text.replace_range(from..to, &table);
        }
    }
    if stale.is_empty() {
        return;
    }
    if std::env::var_os("HOLDFAST_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, &text).unwrap();
        panic!("docs/configuration.md's tables for {stale:?} rewritten; review the diff, then run again without HOLDFAST_WRITE_REFERENCE");
    }
    panic!(
        "docs/configuration.md's tables for {stale:?} are not what the config structs' doc comments say: edit the doc \
         comments (not the table), then HOLDFAST_WRITE_REFERENCE=1 cargo test -p holdfast-config --test reference"
    );
}

/// The source reader sees every key serde accepts, so a generated table
/// cannot leave one out.
#[test]
fn every_key_serde_accepts_is_a_generated_row() {
    let tables = generated();
    for (file, found) in [
        ("arbiter.toml", keys::<holdfast_config::ArbiterConfig>()),
        ("controller.toml", keys::<holdfast_config::ControllerConfig>()),
        ("tailer.toml", keys::<holdfast_config::TailerConfig>()),
    ] {
        let table = &tables.iter().find(|(f, _)| *f == file).unwrap().1;
        let missing: Vec<&String> =
            found.iter().filter(|k| !table.contains(&format!("| `{k}` |")) && !table.contains(&format!("| `[{k}]` |"))).collect();
        assert!(missing.is_empty(), "{file}: the generated table has no row for {missing:?}");
    }
}

//! Fuzz targets for every parser that takes outside input, as proptest
//! properties on stable Rust (issue #14, "Bad input").
//!
//! Each file in `tests/` is one target (the test target `fuzz_<file>`):
//!
//! - `keys`: lock keys (`LockKey::new`, `LockKey::parse`), the etcd keys built
//!   from them, and fencing tokens read from the wire (`Token::from_wire`);
//! - `config`: `arbiter.toml` and `controller.toml`;
//! - `policy`: class and grant files (`holdfast_policy::validate`), the
//!   compiled set as arbiters read it, and the enforcement index built from it;
//! - `requests`: the `lock.v1` request messages as bytes, and the checks the
//!   arbiter applies to their fields.
//!
//! Inputs are arbitrary text or bytes, text biased toward each grammar, and
//! edits of the real example files in `config/`. The properties: nothing
//! panics, and what is accepted obeys the documented rules and reads back
//! the same.
//!
//! # Running
//!
//! `cargo test -p holdfast-fuzz` (and so the unit-test stage of
//! `scripts/test`) runs [`DEFAULT_CASES`] inputs per property: a few seconds
//! per target in a debug build. To search longer, set `HOLDFAST_FUZZ_CASES`
//! and build optimised:
//!
//! ```sh
//! HOLDFAST_FUZZ_CASES=200000 cargo test -p holdfast-fuzz --release
//! HOLDFAST_FUZZ_CASES=1000000 cargo test -p holdfast-fuzz --release --test fuzz_policy
//! ```
//!
//! # When a target fails
//!
//! proptest shrinks the input to a small one, prints it, and appends its
//! seed to `proptest-regressions/<file>.txt` in this crate (`policy.txt`
//! for `tests/policy.rs`); every later run replays the seeds in that file
//! first, so commit it. Then copy the shrunk input into the target as a
//! named `#[test]` at the end of the file: the seed
//! replays only while the strategies stay the same, the named test for good.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FailurePersistence, FileFailurePersistence, PersistedSeed};
use std::any::Any;
use std::fmt::Debug;
use std::path::Path;

/// The environment variable that sets the number of cases per property.
pub const CASES_VAR: &str = "HOLDFAST_FUZZ_CASES";

/// Cases per property when [`CASES_VAR`] is not set: enough to cover each
/// strategy's shapes, few enough that the whole crate runs in well under
/// 30 s in a debug build on two cores.
pub const DEFAULT_CASES: u32 = 4096;

/// The number of cases per property: [`CASES_VAR`] if set to a positive
/// number, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    match std::env::var(CASES_VAR) {
        Err(_) => DEFAULT_CASES,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("holdfast-fuzz: {CASES_VAR}={v:?} is not a positive number of cases; running {DEFAULT_CASES}");
                DEFAULT_CASES
            }
        },
    }
}

/// The proptest configuration of every target: [`cases`] cases (proptest's
/// own `PROPTEST_CASES` is not read), failures persisted in this crate's
/// `proptest-regressions/<target>.txt` (unless
/// `PROPTEST_DISABLE_FAILURE_PERSISTENCE` is set), and shrinking bounded so
/// a failure is reported within a minute.
pub fn config() -> Config {
    let defaults = Config::default();
    let persist = defaults.failure_persistence.is_some();
    Config {
        cases: cases(),
        failure_persistence: persist.then(|| Box::new(CrateRegressions) as Box<dyn FailurePersistence>),
        max_shrink_time: 60_000,
        ..defaults
    }
}

/// Failure persistence in `proptest-regressions/<target>.txt` of this crate.
///
/// proptest's own `SourceParallel` looks for a `lib.rs` above the test's
/// source file and, for a file in `tests/`, finds none; this names the file
/// after the target instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CrateRegressions;

impl CrateRegressions {
    fn file(source_file: Option<&'static str>) -> FileFailurePersistence {
        let target = source_file.and_then(|s| Path::new(s).file_stem()).and_then(|s| s.to_str()).unwrap_or("unknown");
        let path = format!("{}/proptest-regressions/{target}.txt", env!("CARGO_MANIFEST_DIR"));
        // `Direct` takes a `&'static str`: a few dozen bytes per property run.
        FileFailurePersistence::Direct(Box::leak(path.into_boxed_str()))
    }
}

impl FailurePersistence for CrateRegressions {
    fn load_persisted_failures2(&self, source_file: Option<&'static str>) -> Vec<PersistedSeed> {
        Self::file(source_file).load_persisted_failures2(None)
    }

    fn save_persisted_failure2(&mut self, source_file: Option<&'static str>, seed: PersistedSeed, shrunken_value: &dyn Debug) {
        Self::file(source_file).save_persisted_failure2(None, seed, shrunken_value);
    }

    fn box_clone(&self) -> Box<dyn FailurePersistence> {
        Box::new(*self)
    }

    fn eq(&self, other: &dyn FailurePersistence) -> bool {
        other.as_any().downcast_ref::<Self>().is_some()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Any characters at all, control characters and non-ASCII included.
pub fn any_text(max_chars: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..=max_chars).prop_map(String::from_iter)
}

/// Text made of a grammar's tokens (and now and then any character): close
/// enough to the grammar to get past its first character.
pub fn soup(tokens: &'static [&'static str], max_tokens: usize) -> impl Strategy<Value = String> {
    let token = prop_oneof![
        8 => prop::sample::select(tokens).prop_map(str::to_string),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(token, 0..=max_tokens).prop_map(|t| t.concat())
}

/// One edit of a text file, line by line.
#[derive(Debug, Clone)]
enum Edit {
    /// Delete a line.
    Delete(Index),
    /// Repeat a line right after itself.
    Duplicate(Index),
    /// Replace what follows the `=` of a `key = value` line.
    Value(Index, Index),
    /// Drop the `#` of a commented-out `key = value` or `[table]` line
    /// (the example files show optional keys that way).
    Uncomment(Index),
    /// Insert a `key = value` line, with a key of the file and a value from
    /// the list.
    Insert(Index, Index, Index),
    /// Swap two lines.
    Swap(Index, Index),
    /// Insert characters at a character position.
    Splice(Index, String),
    /// Cut the text at a character position.
    Truncate(Index),
}

/// `base` after one to four random edits: lines deleted, duplicated,
/// swapped or uncommented, values replaced by ones from `values`, `key =
/// value` lines inserted, characters spliced in, or the text cut short.
pub fn edited(base: impl Into<String>, values: &'static [&'static str]) -> impl Strategy<Value = String> {
    let base: String = base.into();
    let edit = prop_oneof![
        1 => any::<Index>().prop_map(Edit::Delete),
        1 => any::<Index>().prop_map(Edit::Duplicate),
        4 => (any::<Index>(), any::<Index>()).prop_map(|(l, v)| Edit::Value(l, v)),
        2 => any::<Index>().prop_map(Edit::Uncomment),
        2 => (any::<Index>(), any::<Index>(), any::<Index>()).prop_map(|(l, k, v)| Edit::Insert(l, k, v)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Swap(a, b)),
        1 => (any::<Index>(), any_text(4)).prop_map(|(i, s)| Edit::Splice(i, s)),
        1 => any::<Index>().prop_map(Edit::Truncate),
    ];
    prop::collection::vec(edit, 1..=4).prop_map(move |edits| edits.iter().fold(base.clone(), |text, e| apply(&text, e, values)))
}

/// The TOML of a commented-out `# key = value` or `# [table]` line.
fn commented_out(line: &str) -> Option<&str> {
    let toml = line.strip_prefix('#')?.trim_start();
    let key = toml.split_once(" = ").map(|(k, _)| k);
    let is_key = key.is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')));
    (is_key || (toml.starts_with('[') && toml.ends_with(']'))).then_some(toml)
}

/// `text` with every commented-out `# key = value` and `# [table]` line
/// uncommented: an example file with its optional keys set.
pub fn uncommented(text: &str) -> String {
    text.lines().map(|l| commented_out(l).unwrap_or(l)).collect::<Vec<_>>().join("\n") + "\n"
}

/// The keys of `key = value` lines, commented out or not.
fn keys_of(text: &str) -> Vec<String> {
    let mut keys: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim_start_matches(['#', ' ']).split_once('='))
        .map(|(k, _)| k.trim().to_string())
        .filter(|k| !k.is_empty() && !k.contains(' '))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn apply(text: &str, edit: &Edit, values: &[&str]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let pick = |i: &Index, n: usize| (n > 0).then(|| i.index(n));
    let value = |i: &Index| pick(i, values.len()).map_or("", |v| values[v]);
    match edit {
        Edit::Delete(i) => {
            if let Some(l) = pick(i, lines.len()) {
                lines.remove(l);
            }
        }
        Edit::Duplicate(i) => {
            if let Some(l) = pick(i, lines.len()) {
                lines.insert(l, lines[l].clone());
            }
        }
        Edit::Value(l, v) => {
            let assignments: Vec<usize> = (0..lines.len()).filter(|&n| !lines[n].starts_with('#') && lines[n].contains('=')).collect();
            if let Some(n) = pick(l, assignments.len()).map(|a| assignments[a]) {
                let key = lines[n].split_once('=').map_or("", |(k, _)| k).to_string();
                lines[n] = format!("{key}= {}", value(v));
            }
        }
        Edit::Uncomment(i) => {
            let commented: Vec<usize> = (0..lines.len()).filter(|&n| commented_out(&lines[n]).is_some()).collect();
            if let Some(n) = pick(i, commented.len()).map(|c| commented[c]) {
                lines[n] = commented_out(&lines[n]).unwrap_or_default().to_string();
            }
        }
        Edit::Insert(l, k, v) => {
            let keys = keys_of(text);
            if let Some(key) = pick(k, keys.len()).map(|k| &keys[k]) {
                let at = pick(l, lines.len() + 1).unwrap_or(0);
                lines.insert(at, format!("{key} = {}", value(v)));
            }
        }
        Edit::Swap(a, b) => {
            if let (Some(a), Some(b)) = (pick(a, lines.len()), pick(b, lines.len())) {
                lines.swap(a, b);
            }
        }
        Edit::Splice(i, s) => {
            let mut t = text.to_string();
            let at = char_boundary(text, i);
            t.insert_str(at, s);
            return t;
        }
        Edit::Truncate(i) => return text[..char_boundary(text, i)].to_string(),
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// A byte offset of `text` on a character boundary (its length included).
fn char_boundary(text: &str, i: &Index) -> usize {
    let bounds: Vec<usize> = text.char_indices().map(|(b, _)| b).chain([text.len()]).collect();
    bounds[i.index(bounds.len())]
}

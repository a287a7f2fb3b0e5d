//! Fuzz target: class and grant files (`holdfast_policy::validate`), the
//! compiled set as arbiters read it (JSON from etcd), and the enforcement
//! index built from it (`Access`).
//!
//! Inputs: any text, TOML-shaped token soup, and edits of the dev set in
//! `config/classes.d` and `config/grants.d` and of one fenced class. Every
//! problem must name one of the input files, a line inside it, and say
//! something; a set that compiles must build an index whose answers match
//! the rules written in `holdfast_policy::access` (checked here by a plain
//! scan over the grants).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_fuzz::{any_text, config, edited, soup};
use holdfast_model::layout::{PauseTestOutcome, PauseTestRecord};
use holdfast_policy::{
    Access, Action, Checks, Class, CompiledSet, Date, Enforcement, Fairness, Grant, OnQuorumLoss, PauseTests, Purpose, SourceFile, Sources,
    Tier, validate,
};
use proptest::prelude::*;
use std::time::Duration;

const CLASSES: &str = include_str!("../../../config/classes.d/dev.toml");
const GRANTS: &str = include_str!("../../../config/grants.d/dev.toml");

/// A fenced class with a prefix grant, to reach the pause-test rule and
/// identity prefixes beside the dev set's advisory classes.
const FENCED: &str = r#"[class.orders-fenced]
namespace = "fenced"
purpose = "correctness"
enforcement = "fenced"
ttl = "10s"
tier = "entity"
on_quorum_loss = "closed"
fairness = "durable"
resource = "postgresql://db:5432/orders?table=fence"
resource_schema_version = 4
"#;

const FENCED_GRANT: &str = r#"[grant.fenced-writers]
identity = "spiffe://holdfast.dev/ns/fenced/"
lock = ["fenced/", "fenced/ledger-"]
inspect = ["fenced/"]
force_release = ["fenced/ledger-7"]
"#;

/// Values that have broken validators: wrong types, out-of-range TTLs and
/// dates, names and prefixes at the edges of their grammars.
const HOSTILE: &[&str] = &[
    "",
    "\"\"",
    "\" \"",
    "-1",
    "0",
    "1e400",
    "nan",
    "true",
    "[]",
    "{}",
    "[[]]",
    "[\"\"]",
    "[\"/\"]",
    "[\"demo\"]",
    "[\"demo//\"]",
    "[\"demo/a//\"]",
    "[\"demo/../x\"]",
    "[\"demo/.\"]",
    "[\"DEMO/\"]",
    "[\"-demo/\"]",
    "[\"nope/\"]",
    "[\"demo/\", 1]",
    "[\"demo/\", \"demo/\"]",
    "[\"caf\u{e9}/\"]",
    "\"0s\"",
    "\"4s\"",
    "\"5s\"",
    "\"5500ms\"",
    "\"29s\"",
    "\"30s\"",
    "\"300s\"",
    "\"301s\"",
    "\"99999999999999h\"",
    "\"18446744073709551616s\"",
    "\"1y\"",
    "0000-01-01",
    "1970-01-01",
    "2026-05-31",
    "2026-06-01",
    "9999-12-31",
    "2024-02-29",
    "2023-02-29",
    "\"2099-12-31\"",
    "2099-12-31T00:00:00",
    "2099-12-31T00:00:00Z",
    "00:00:00",
    "\"advisory\"",
    "\"fenced\"",
    "\"efficiency\"",
    "\"correctness\"",
    "\"open\"",
    "\"closed\"",
    "\"durable\"",
    "\"best-effort\"",
    "\"coord\"",
    "\"entity\"",
    "\"demo\"",
    "\"jobs\"",
    "\"hall-a\"",
    "\"-a\"",
    "\"a/b\"",
    "\"spiffe://\"",
    "\"spiffe://holdfast.dev\"",
    "\"spiffe://holdfast.dev/\"",
    "\"spiffe://holdfast.dev//\"",
    "\"spiffe://holdfast.dev/a//b\"",
    "\"spiffe://holdfast.dev/./a\"",
    "\"spiffe://HOLDFAST.dev/a\"",
    "\"spiffe://holdfast.dev/a b\"",
    "\"spiffe://holdfast.dev/dev/operator/\"",
    "\"spiffe://holdfast.dev/team/\"",
    "\"\\u0000\"",
    "\"caf\u{e9} \u{1f512}\"",
    "'''multi\nline'''",
];

const TOKENS: &[&str] = &[
    "\n",
    "\n",
    " ",
    "=",
    " = ",
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    ",",
    ".",
    "\"",
    "'",
    "#",
    "class",
    "grant",
    "class.demo",
    "grant.g",
    "namespace",
    "purpose",
    "enforcement",
    "resource",
    "resource_schema_version",
    "risk_owner",
    "waiver_expires",
    "ttl",
    "tier",
    "on_quorum_loss",
    "fairness",
    "home_region",
    "identity",
    "lock",
    "inspect",
    "force_release",
    "\"demo\"",
    "\"demo/\"",
    "\"advisory\"",
    "\"30s\"",
    "2099-12-31",
    "\"spiffe://holdfast.dev/\"",
    "1",
    "true",
];

/// One class or grant file's text.
fn file_text(bases: &'static [&'static str], tokens: &'static [&'static str]) -> impl Strategy<Value = Result<String, String>> {
    prop_oneof![
        6 => prop::sample::select(bases).prop_flat_map(|base| edited(base, HOSTILE)).prop_map(Ok),
        2 => prop::sample::select(bases).prop_map(|base| Ok(base.to_string())),
        1 => any_text(48).prop_map(Ok),
        2 => soup(tokens, 40).prop_map(Ok),
        1 => Just(Err("is not UTF-8 text (invalid utf-8 sequence of 1 bytes from index 0); save it as UTF-8".to_string())),
    ]
}

fn sources() -> impl Strategy<Value = Sources> {
    let classes = prop::collection::vec(file_text(&[CLASSES, FENCED], TOKENS), 0..3);
    let grants = prop::collection::vec(file_text(&[GRANTS, FENCED_GRANT], TOKENS), 0..3);
    let ignored = prop::collection::vec(any_text(8), 0..2);
    (classes, grants, ignored).prop_map(|(classes, grants, ignored)| {
        let files = |dir: &str, texts: Vec<Result<String, String>>| {
            texts.into_iter().enumerate().map(|(i, text)| SourceFile { name: format!("{dir}/f{i}.toml"), text }).collect()
        };
        Sources { classes: files("classes.d", classes), grants: files("grants.d", grants), ignored }
    })
}

fn record() -> impl Strategy<Value = PauseTestRecord> {
    let class = prop_oneof![Just("orders-fenced".to_string()), Just("demo".to_string()), any_text(6)];
    let resource = prop_oneof![Just("postgresql://db:5432/orders?table=fence".to_string()), any_text(6)];
    let schema_version = prop_oneof![Just(4u32), any::<u32>()];
    let outcome = prop_oneof![Just(PauseTestOutcome::Pass), Just(PauseTestOutcome::Fail)];
    (class, outcome, any::<u64>(), any::<u64>(), schema_version, resource).prop_map(
        |(class, outcome, time_unix_ms, expires_unix_ms, schema_version, resource)| PauseTestRecord {
            class,
            resource,
            schema_version,
            time_unix_ms,
            expires_unix_ms,
            etcd_version: "3.6.5".into(),
            outcome,
            reason: "fuzz".into(),
            fence_mode: "correct".into(),
        },
    )
}

fn checks() -> impl Strategy<Value = Checks> {
    let today = prop_oneof![
        Just(Date::new(2026, 6, 1).unwrap()),
        (any::<u16>(), 1u8..=12, 1u8..=31).prop_map(|(y, m, d)| Date::new(y, m, d).unwrap_or(Date::MIN)),
    ];
    let pause_tests = prop_oneof![
        any_text(8).prop_map(|reason| PauseTests::NotAvailable { reason }),
        (prop::collection::vec(record(), 0..3), any::<u64>()).prop_map(|(records, now_unix_ms)| PauseTests::Read { records, now_unix_ms }),
    ];
    (today, pause_tests).prop_map(|(today, pause_tests)| Checks { today, pause_tests })
}

/// A caller's question: identity, namespace and key, each either picked
/// from the set (so that grants match) or arbitrary.
#[derive(Debug, Clone)]
struct Probe {
    identity: (Option<prop::sample::Index>, String),
    namespace: (Option<prop::sample::Index>, String),
    key: String,
}

fn probes() -> impl Strategy<Value = Vec<Probe>> {
    let part =
        |max| (prop::option::weighted(0.8, any::<prop::sample::Index>()), prop_oneof![Just(String::new()), any_text(max), "[a-z/]{1,6}"]);
    let key = prop_oneof!["[a-z0-9-]{1,8}(/[a-z0-9-]{1,4})?", "ledger-[0-9]", "[ab/]{0,4}", any_text(8)];
    prop::collection::vec((part(6), part(3), key).prop_map(|(identity, namespace, key)| Probe { identity, namespace, key }), 1..8)
}

/// Picks `(index, suffix)` from `names` (the suffix appended), or the
/// suffix alone.
fn pick(names: &[String], (index, suffix): &(Option<prop::sample::Index>, String)) -> String {
    match index {
        Some(i) if !names.is_empty() => format!("{}{suffix}", names[i.index(names.len())]),
        _ => suffix.clone(),
    }
}

/// What `Access::check` must answer, by the rules of its documentation,
/// without the trie: the longest matching identity's unioned prefixes.
fn expected(set: &CompiledSet, id: &str, ns: &str, key: &str, action: Action) -> bool {
    let Some(longest) = set.grants.values().filter(|g| g.matches(id)).map(|g| g.identity.len()).max() else { return false };
    let full = format!("{ns}/{key}");
    set.classes.contains_key(ns)
        && set.grants.values().filter(|g| g.matches(id) && g.identity.len() == longest).any(|g| {
            let prefixes = match action {
                Action::Lock => &g.lock,
                Action::Inspect => &g.inspect,
                Action::ForceRelease => &g.force_release,
            };
            prefixes.iter().any(|p| full.starts_with(p.as_str()))
        })
}

/// What `Access::namespace_class` must answer: some applicable lock prefix
/// covers some key of the namespace, i.e. [`expected`] grants Lock on
/// `ns/k` for some `k`: the prefix is a prefix of `ns/`, or starts with it.
fn expected_namespace(set: &CompiledSet, id: &str, ns: &str) -> bool {
    let Some(longest) = set.grants.values().filter(|g| g.matches(id)).map(|g| g.identity.len()).max() else { return false };
    let dir = format!("{ns}/");
    set.classes.contains_key(ns)
        && set
            .grants
            .values()
            .filter(|g| g.matches(id) && g.identity.len() == longest)
            .any(|g| g.lock.iter().any(|p| dir.starts_with(p.as_str()) || p.starts_with(&dir)))
}

/// `Access` answers as [`expected`] says, for every probe. A compiled set
/// files each class under its own namespace; a set read as JSON need not.
fn check_access(set: &CompiledSet, probes: &[Probe]) -> Result<(), TestCaseError> {
    let access = Access::new(set);
    let identities: Vec<String> = set.grants.values().map(|g| g.identity.clone()).collect();
    let namespaces: Vec<String> = set.classes.keys().cloned().collect();
    for p in probes {
        let (id, ns) = (pick(&identities, &p.identity), pick(&namespaces, &p.namespace));
        for action in [Action::Lock, Action::Inspect, Action::ForceRelease] {
            let got = access.check(&id, &ns, &p.key, action);
            prop_assert_eq!(got.is_some(), expected(set, &id, &ns, &p.key, action), "check({:?}, {:?}, {:?}, {:?})", id, ns, p.key, action);
            if let Some(class) = got {
                prop_assert_eq!(Some(class), set.classes.get(&ns));
            }
        }
        let got = access.namespace_class(&id, &ns);
        prop_assert_eq!(got.is_some(), expected_namespace(set, &id, &ns), "namespace_class({:?}, {:?})", id, ns);
        // A session without a namespace: some class it may lock in.
        let anywhere = set.classes.keys().any(|n| expected_namespace(set, &id, n));
        prop_assert_eq!(access.any_lock_class(&id).is_some(), anywhere, "any_lock_class({:?})", id);
    }
    Ok(())
}

fn check_report(sources: &Sources, checks: &Checks, probes: &[Probe]) -> Result<(), TestCaseError> {
    let report = validate(sources, checks);
    let lines = |name: &str| {
        sources.classes.iter().chain(&sources.grants).find(|f| f.name == name).map(|f| match &f.text {
            Ok(t) => t.matches('\n').count() + 1,
            Err(_) => 1,
        })
    };
    for p in report.problems.iter().chain(&report.unchecked) {
        prop_assert!(!p.message.trim().is_empty(), "{p:?}");
        let Some(n) = lines(&p.file) else {
            return Err(TestCaseError::fail(format!("problem names a file that is not an input: {p:?}")));
        };
        prop_assert!((1..=n).contains(&p.line), "line {} of a {n}-line file: {p:?}", p.line);
        prop_assert!(!p.rule.code().is_empty());
    }
    prop_assert_eq!(report.is_valid(), report.set.is_some());
    let text = report.to_text("DIR", "run again");
    for p in &report.problems {
        prop_assert!(text.contains(&p.message));
    }
    if let Some(set) = &report.set {
        prop_assert!(set.hash_is_valid());
        prop_assert_eq!(set.classes.len() + set.grants.len(), report.class_count + report.grant_count);
        // Arbiters read the set as JSON from etcd.
        let json = serde_json::to_string(set).expect("a set serialises");
        let back: CompiledSet = serde_json::from_str(&json).expect("a set reads back");
        prop_assert_eq!(&back, set);
        check_access(set, probes)?;
        // The pause-test rule, restated: with the results read, a class is
        // fenced in force exactly when a passing, unexpired result for its
        // name, resource and schema version exists; otherwise demoted, and
        // reported. Offline, a declared fence stands (reported unchecked).
        for c in set.classes.values() {
            let (resource, version) = match &c.enforcement {
                Enforcement::Fenced { resource, schema_version } | Enforcement::Demoted { resource, schema_version, .. } => {
                    (resource, *schema_version)
                }
                Enforcement::Advisory { .. } => continue,
            };
            match &checks.pause_tests {
                PauseTests::Read { records, now_unix_ms } => {
                    let counts = records.iter().any(|r| {
                        r.class == c.name
                            && r.resource == *resource
                            && r.schema_version == version
                            && r.outcome == PauseTestOutcome::Pass
                            && *now_unix_ms < r.expires_unix_ms
                    });
                    prop_assert_eq!(c.enforcement.is_fenced(), counts, "{:?}", c);
                    prop_assert_eq!(
                        report.demoted.iter().filter(|d| d.message.contains(&format!("class {:?} ", c.name))).count(),
                        usize::from(!counts)
                    );
                }
                PauseTests::NotAvailable { .. } => prop_assert!(c.enforcement.is_fenced(), "{:?}", c),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn class_and_grant_files(sources in sources(), checks in checks(), probes in probes()) {
        check_report(&sources, &checks, &probes)?;
    }

    #[test]
    fn edited_dev_set(classes in edited(CLASSES, HOSTILE), grants in edited(GRANTS, HOSTILE), probes in probes()) {
        let sources = Sources {
            classes: vec![SourceFile::new("classes.d/dev.toml", classes), SourceFile::new("classes.d/fenced.toml", FENCED)],
            grants: vec![SourceFile::new("grants.d/dev.toml", grants), SourceFile::new("grants.d/fenced.toml", FENCED_GRANT)],
            ignored: Vec::new(),
        };
        let checks = Checks { today: Date::new(2026, 6, 1).unwrap(), pause_tests: PauseTests::NotAvailable { reason: "offline".into() } };
        check_report(&sources, &checks, &probes)?;
    }

    #[test]
    fn any_set_indexes_by_its_rules(set in any_set(), probes in probes()) {
        // Identities, namespaces and prefixes from a tiny alphabet, so that
        // they are prefixes of each other in every way.
        let json = serde_json::to_string(&set).expect("a set serialises");
        let back = serde_json::from_str::<CompiledSet>(&json).ok();
        prop_assert_eq!(back.as_ref(), Some(&set));
        check_access(&set, &probes)?;
    }

    #[test]
    fn any_json_as_a_published_set(text in prop_oneof![any_text(48), soup(JSON_TOKENS, 48)], probes in probes()) {
        // An arbiter reads the set from etcd; whatever decodes must index.
        if let Ok(set) = serde_json::from_str::<CompiledSet>(&text) {
            check_access(&set, &probes)?;
        }
    }
}

fn class(name: String, namespace: String) -> Class {
    Class {
        name,
        namespace,
        purpose: Purpose::Efficiency,
        enforcement: Enforcement::Fenced { resource: "fixture:r".into(), schema_version: 1 },
        ttl: Duration::from_secs(15),
        tier: Tier::Entity,
        on_quorum_loss: OnQuorumLoss::Closed,
        fairness: Fairness::BestEffort,
        home_region: None,
    }
}

/// A set that need not have passed `validate`: what a reader of etcd may
/// be handed.
fn any_set() -> impl Strategy<Value = CompiledSet> {
    let word = |re: &'static str| proptest::string::string_regex(re).expect("a regex");
    let prefixes = || prop::collection::vec(word("[ab/]{0,5}"), 0..3);
    let grant = (word("[ab/]{0,6}"), prefixes(), prefixes(), prefixes());
    let classes = prop::collection::btree_set(word("[ab/]{0,3}"), 0..4);
    (classes, prop::collection::vec(grant, 0..6)).prop_map(|(namespaces, grants)| {
        let classes = namespaces.into_iter().map(|ns| (ns.clone(), class(format!("c-{ns}"), ns))).collect();
        let grants = grants
            .into_iter()
            .enumerate()
            .map(|(i, (identity, lock, inspect, force_release))| {
                let name = format!("g{i}");
                (name.clone(), Grant { name, identity, lock, inspect, force_release })
            })
            .collect();
        CompiledSet::new(classes, grants)
    })
}

const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"classes\"",
    "\"grants\"",
    "\"hash\"",
    "\"g\"",
    "\"name\"",
    "\"identity\"",
    "\"lock\"",
    "\"inspect\"",
    "\"force_release\"",
    "\"\"",
    "\"/\"",
    "\"a/\"",
    "\"spiffe://a/\"",
    "{}",
    "[]",
    "\"sha256:\"",
];

// Named cases: edges worth running whatever the strategies draw. An input a
// target fails on is added here as its own #[test] (see src/lib.rs).

#[test]
fn the_dev_set_compiles_and_indexes() {
    let sources = Sources {
        classes: vec![SourceFile::new("classes.d/dev.toml", CLASSES)],
        grants: vec![SourceFile::new("grants.d/dev.toml", GRANTS)],
        ignored: Vec::new(),
    };
    let checks = Checks { today: Date::new(2026, 6, 1).unwrap(), pause_tests: PauseTests::NotAvailable { reason: "offline".into() } };
    assert!(validate(&sources, &checks).set.is_some());
    let probe = |id: &str, ns: &str| Probe { identity: (None, id.into()), namespace: (None, ns.into()), key: "report".into() };
    let probes = [probe("spiffe://holdfast.dev/dev/operator", "demo"), probe("spiffe://holdfast.dev/team/a", "orders"), probe("x", "demo")];
    check_report(&sources, &checks, &probes).unwrap();
}

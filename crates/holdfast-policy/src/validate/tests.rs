//! Every rule, each with a failing example and its exact message.

use super::*;
use crate::source::LoadError;
use holdfast_model::layout::PAUSETEST_VALIDITY;

/// A valid advisory class (line 1 is its header).
const ADVISORY: &str = r#"[class.ledger]
namespace = "payments"
purpose = "correctness"
enforcement = "advisory"
risk_owner = "team-ledger"
waiver_expires = 2027-03-31
ttl = "30s"
tier = "entity"
"#;

/// A valid fenced class.
const FENCED: &str = r#"[class.orders]
namespace = "orders"
purpose = "correctness"
enforcement = "fenced"
ttl = "10s"
tier = "entity"
resource = "postgresql://db:5432/app?table=fence"
resource_schema_version = 1
"#;

const GRANT: &str = r#"[grant.ledger-writers]
identity = "spiffe://holdfast.dev/ns/payments/sa/ledger"
lock = ["payments/"]
inspect = ["payments/"]
"#;

fn today() -> Date {
    Date::new(2026, 6, 1).unwrap()
}

fn offline() -> Checks {
    Checks { today: today(), pause_tests: PauseTests::NotAvailable { reason: "offline".into() } }
}

const NOW_MS: u64 = 1_780_000_000_000;

fn with_records(records: Vec<PauseTestRecord>) -> Checks {
    Checks { today: today(), pause_tests: PauseTests::Read { records, now_unix_ms: NOW_MS } }
}

fn record(class: &str, outcome: PauseTestOutcome, expires_unix_ms: u64) -> PauseTestRecord {
    PauseTestRecord {
        class: class.into(),
        resource: "postgresql://db:5432/app?table=fence".into(),
        schema_version: 1,
        time_unix_ms: expires_unix_ms - PAUSETEST_VALIDITY.as_millis() as u64,
        expires_unix_ms,
        etcd_version: "3.6.5".into(),
        outcome,
        reason: "the stale write was rejected".into(),
        fence_mode: "correct".into(),
    }
}

fn sources(classes: &[&str], grants: &[&str]) -> Sources {
    let name = |dir: &str, i: usize| if i == 0 { format!("{dir}/{}.toml", &dir[..1]) } else { format!("{dir}/{}{i}.toml", &dir[..1]) };
    Sources {
        classes: classes.iter().enumerate().map(|(i, t)| SourceFile::new(name("classes.d", i), *t)).collect(),
        grants: grants.iter().enumerate().map(|(i, t)| SourceFile::new(name("grants.d", i), *t)).collect(),
        ignored: Vec::new(),
    }
}

fn run(classes: &str, grants: &str, checks: &Checks) -> Report {
    validate(&sources(&[classes], &[grants]), checks)
}

/// The problems as `FILE:LINE: message`.
fn shown(r: &Report) -> Vec<String> {
    r.problems.iter().map(ToString::to_string).collect()
}

/// The one problem of a class file (with the valid grant beside it).
fn only_problem(classes: &str) -> (Rule, String) {
    let r = run(classes, GRANT, &offline());
    assert_eq!(r.problems.len(), 1, "expected exactly one problem, got {:#?}", shown(&r));
    assert!(r.set.is_none(), "no set is compiled from an invalid directory");
    (r.problems[0].rule, r.problems[0].to_string())
}

#[test]
fn a_valid_set_compiles_with_defaults_and_a_stable_hash() {
    let r = run(ADVISORY, GRANT, &offline());
    assert_eq!(shown(&r), Vec::<String>::new());
    assert!(r.unchecked.is_empty() && r.is_valid());
    let set = r.publishable().expect("valid and fully checked");
    let class = set.class_for("payments").unwrap();
    assert_eq!(class.name, "ledger");
    assert_eq!(class.ttl, Duration::from_secs(30));
    assert_eq!(class.on_quorum_loss, OnQuorumLoss::Closed, "closed by default");
    assert_eq!(class.fairness, Fairness::BestEffort, "best-effort by default");
    assert_eq!(
        class.enforcement,
        Enforcement::Advisory { risk_owner: "team-ledger".into(), waiver_expires: "2027-03-31".parse().unwrap() }
    );
    let grant = &set.grants["ledger-writers"];
    assert_eq!(grant.lock, ["payments/"]);
    assert!(grant.force_release.is_empty());
    assert!(grant.matches("spiffe://holdfast.dev/ns/payments/sa/ledger"));
    assert!(!grant.matches("spiffe://holdfast.dev/ns/payments/sa/ledger2"));
    assert!(set.hash.starts_with("sha256:") && set.hash.len() == 7 + 64, "{}", set.hash);
    assert!(set.hash_is_valid());

    // The same content split, reordered and commented differently hashes the same.
    let reordered = format!(
        "# comment\n[class.ledger]\ntier = \"entity\"\n{}",
        ADVISORY.replace("[class.ledger]\n", "").replace("tier = \"entity\"\n", "")
    );
    let again = run(&reordered, GRANT, &offline());
    assert_eq!(again.set.unwrap().hash, set.hash);
    // Any change changes it.
    let changed = run(&ADVISORY.replace("30s", "31s"), GRANT, &offline());
    assert_ne!(changed.set.unwrap().hash, set.hash);

    // The set round-trips through JSON (what the controller publishes).
    let json = serde_json::to_string(set).unwrap();
    assert!(json.contains(r#""ttl":"30s""#) && json.contains(r#""mode":"advisory""#), "{json}");
    let back: CompiledSet = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, set);
    assert!(back.hash_is_valid());
}

#[test]
fn missing_enforcement() {
    let (rule, msg) =
        only_problem(&ADVISORY.replace("enforcement = \"advisory\"\nrisk_owner = \"team-ledger\"\nwaiver_expires = 2027-03-31\n", ""));
    assert_eq!(rule, Rule::MissingEnforcement);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" has no enforcement; add enforcement = \"advisory\" (with risk_owner and waiver_expires), \
         or enforcement = \"fenced\" once holdfast-pausetest has passed against the resource it guards"
    );
}

#[test]
fn advisory_without_risk_owner() {
    let (rule, msg) = only_problem(&ADVISORY.replace("risk_owner = \"team-ledger\"\n", ""));
    assert_eq!(rule, Rule::AdvisoryWithoutRiskOwner);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" is advisory but names no risk_owner; add risk_owner = \"TEAM\", the team that accepts \
         the risk of two holders acting at once until the class is fenced"
    );
    let (rule, msg) = only_problem(&ADVISORY.replace("\"team-ledger\"", "\" \""));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(
        msg,
        "classes.d/c.toml:5: class \"ledger\": risk_owner is empty; name the team that accepts the risk, e.g. risk_owner = \"team-ledger\""
    );
}

#[test]
fn advisory_without_waiver_expires() {
    let (rule, msg) = only_problem(&ADVISORY.replace("waiver_expires = 2027-03-31\n", ""));
    assert_eq!(rule, Rule::AdvisoryWithoutWaiver);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" is advisory but has no waiver_expires; add waiver_expires = YYYY-MM-DD (a TOML date, \
         no quotes): the day the risk owner must fence the class or renew the waiver"
    );
    // A quoted date is a string, not a date.
    let (rule, msg) = only_problem(&ADVISORY.replace("2027-03-31", "\"2027-03-31\""));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(
        msg,
        "classes.d/c.toml:6: class \"ledger\": waiver_expires must be a TOML date without quotes or time, e.g. waiver_expires = 2027-03-31"
    );
}

#[test]
fn advisory_with_an_expired_waiver() {
    let (rule, msg) = only_problem(&ADVISORY.replace("2027-03-31", "2026-05-31"));
    assert_eq!(rule, Rule::WaiverExpired);
    assert_eq!(
        msg,
        "classes.d/c.toml:6: class \"ledger\": the advisory waiver expired on 2026-05-31 (today is 2026-06-01); fence the class, \
         or have the risk owner renew the waiver with a later waiver_expires"
    );
    // A waiver expiring today still counts.
    assert!(run(&ADVISORY.replace("2027-03-31", "2026-06-01"), GRANT, &offline()).is_valid());
}

#[test]
fn ttl_outside_5s_to_300s() {
    for ttl in ["4s", "301s", "10m"] {
        let (rule, msg) = only_problem(&ADVISORY.replace("\"30s\"", &format!("{ttl:?}")));
        assert_eq!(rule, Rule::TtlOutOfRange);
        assert_eq!(
            msg,
            format!(
                "classes.d/c.toml:7: class \"ledger\": ttl = {ttl:?} is outside 5s..300s; pick a TTL in that range, or leave ttl out for the 15s default"
            )
        );
    }
    assert!(run(&ADVISORY.replace("\"30s\"", "\"300s\""), GRANT, &offline()).is_valid());
    assert!(run(&FENCED.replace("\"10s\"", "\"5s\""), "", &offline()).is_valid());
    let (rule, msg) = only_problem(&ADVISORY.replace("\"30s\"", "\"30500ms\""));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(
        msg,
        "classes.d/c.toml:7: class \"ledger\": ttl = \"30500ms\" is not a whole number of seconds; etcd leases count whole seconds"
    );
    let (rule, msg) = only_problem(&ADVISORY.replace("\"30s\"", "30"));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(msg, "classes.d/c.toml:7: class \"ledger\": ttl must be a string in quotes, not an integer");
    let (_, msg) = only_problem(&ADVISORY.replace("\"30s\"", "\"30\""));
    assert!(msg.starts_with("classes.d/c.toml:7: class \"ledger\": ttl = \"30\" is not a duration ("), "{msg}");
    assert!(msg.ends_with("); write e.g. ttl = \"30s\""), "{msg}");
}

#[test]
fn advisory_ttl_under_30s() {
    let (rule, msg) = only_problem(&ADVISORY.replace("\"30s\"", "\"29s\""));
    assert_eq!(rule, Rule::AdvisoryTtlTooShort);
    assert_eq!(
        msg,
        "classes.d/c.toml:7: class \"ledger\" is advisory with ttl = \"29s\"; advisory classes need at least 30s, because a false \
         expiry there can produce a duplicate write: set ttl = \"30s\" or more"
    );
    // The 15s default is too short for an advisory class.
    let (rule, msg) = only_problem(&ADVISORY.replace("ttl = \"30s\"\n", ""));
    assert_eq!(rule, Rule::AdvisoryTtlTooShort);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" is advisory and has no ttl, so it would get the 15s default; advisory classes need at \
         least 30s, because a false expiry there can produce a duplicate write: set ttl = \"30s\" or more"
    );
    // A fenced class may go short, and gets 15s by default.
    let r = run(&FENCED.replace("ttl = \"10s\"\n", ""), "", &offline());
    assert!(r.is_valid(), "{:?}", shown(&r));
    assert_eq!(r.set.unwrap().classes["orders"].ttl, Duration::from_secs(15));
}

#[test]
fn open_on_quorum_loss_on_a_correctness_or_fenced_class() {
    let (rule, msg) = only_problem(&format!("{ADVISORY}on_quorum_loss = \"open\"\n"));
    assert_eq!(rule, Rule::OpenOnCorrectness);
    assert_eq!(
        msg,
        "classes.d/c.toml:9: class \"ledger\" has on_quorum_loss = \"open\" but purpose = \"correctness\": a correctness class must \
         never grant without a majority; set on_quorum_loss = \"closed\" (or purpose = \"efficiency\" if two holders only waste work)"
    );
    let efficiency_fenced = FENCED.replace("correctness", "efficiency") + "on_quorum_loss = \"open\"\n";
    let r = run(&efficiency_fenced, "", &with_records(vec![record("orders", PauseTestOutcome::Pass, NOW_MS + 1)]));
    assert_eq!(
        shown(&r),
        ["classes.d/c.toml:9: class \"orders\" has on_quorum_loss = \"open\" but is fenced: grants made without a majority carry \
          token 0, which a fenced resource must refuse; set on_quorum_loss = \"closed\""]
    );
    assert_eq!(r.problems[0].rule, Rule::OpenOnFenced);
    // Open is allowed on an advisory efficiency class.
    let ok = ADVISORY.replace("correctness", "efficiency") + "on_quorum_loss = \"open\"\n";
    let r = run(&ok, GRANT, &offline());
    assert!(r.is_valid(), "{:?}", shown(&r));
    assert_eq!(r.set.unwrap().classes["payments"].on_quorum_loss, OnQuorumLoss::Open);
}

#[test]
fn fenced_needs_a_passing_unexpired_pause_test_result() {
    // Not read: reported as not checked, neither a pass nor a problem.
    let r = run(FENCED, "", &offline());
    assert!(r.is_valid());
    assert!(r.set.is_some() && r.publishable().is_none(), "a set with an unchecked rule is valid but not publishable");
    assert_eq!(r.pause_tests_not_checked.as_deref(), Some("offline"));
    let unchecked: Vec<String> = r.unchecked.iter().map(ToString::to_string).collect();
    assert_eq!(
        unchecked,
        ["classes.d/c.toml:1: class \"orders\" is fenced; whether a passing pause-test result is recorded for it was NOT checked: offline"]
    );

    // Read, and absent: valid, and the class is demoted, with the reason.
    let r = run(FENCED, "", &with_records(vec![record("other", PauseTestOutcome::Pass, NOW_MS + 1)]));
    assert!(r.is_valid() && r.unchecked.is_empty() && r.pause_tests_not_checked.is_none(), "{:?}", shown(&r));
    let demoted = |r: &Report| r.demoted.iter().map(ToString::to_string).collect::<Vec<_>>();
    let until = "it is DEMOTED, published as advisory with no risk owner, until `holdfast-pausetest run --class orders --resource \
                 URL ...` passes against \"postgresql://db:5432/app?table=fence\" at schema version 1";
    assert_eq!(
        demoted(&r),
        [format!(
            "classes.d/c.toml:1: class \"orders\" is fenced, but no pause-test result is recorded for it (nothing under \
             /sys/pausetest/orders/): {until}"
        )]
    );
    assert_eq!(r.demoted[0].rule, Rule::FencedWithoutPauseTest);
    let class = &r.publishable().expect("a demotion does not stop the set").classes["orders"];
    assert_eq!(
        class.enforcement,
        Enforcement::Demoted {
            resource: "postgresql://db:5432/app?table=fence".into(),
            schema_version: 1,
            reason: "no pause-test result is recorded for it (nothing under /sys/pausetest/orders/)".into(),
        }
    );
    assert!(!class.enforcement.is_fenced());
    assert!(r.to_text("policy", "rerun").contains("1 fenced class(es) DEMOTED to advisory"), "{}", r.to_text("policy", "rerun"));

    // Read, and expired or failed.
    let r = run(
        FENCED,
        "",
        &with_records(vec![record("orders", PauseTestOutcome::Pass, NOW_MS), record("orders", PauseTestOutcome::Fail, NOW_MS + 1)]),
    );
    let expired =
        format!("the result expired (it was recorded at {} ms, valid until {NOW_MS} ms)", NOW_MS - PAUSETEST_VALIDITY.as_millis() as u64);
    assert!(r.is_valid(), "{:?}", shown(&r));
    assert_eq!(
        demoted(&r),
        [format!(
            "classes.d/c.toml:1: class \"orders\" is fenced, but no pause-test result for it counts \
             (postgresql://db:5432/app?table=fence: {expired} (the class declares resource_schema_version = 1); \
             postgresql://db:5432/app?table=fence: the test failed (the stale write was rejected)): {until}"
        )]
    );
    assert!(r.set.unwrap().classes["orders"].enforcement.is_demoted());

    // Read, passing, but for another resource, or for the schema version
    // the resource had before the class declared a new one.
    let mut elsewhere = record("orders", PauseTestOutcome::Pass, NOW_MS + 1);
    elsewhere.resource = "postgresql://other:5432/app?table=fence".into();
    let r = run(FENCED, "", &with_records(vec![elsewhere]));
    assert_eq!(
        demoted(&r),
        [format!(
            "classes.d/c.toml:1: class \"orders\" is fenced, but no pause-test result for it counts \
             (postgresql://other:5432/app?table=fence: the result is for another resource than the class names \
             (\"postgresql://db:5432/app?table=fence\")): {until}"
        )]
    );
    let migrated = FENCED.replace("resource_schema_version = 1", "resource_schema_version = 2");
    let r = run(&migrated, "", &with_records(vec![record("orders", PauseTestOutcome::Pass, NOW_MS + 1)]));
    assert_eq!(r.demoted.len(), 1, "{:?}", demoted(&r));
    assert!(
        r.demoted[0].message.contains(
            "the result is for schema version 1, and the resource is now at schema version 2 (the class declares resource_schema_version = 2)"
        ),
        "{}",
        r.demoted[0]
    );
    assert!(r.set.unwrap().classes["orders"].enforcement.is_demoted());

    // Read, and passing for this resource at this version: fenced.
    let r = run(FENCED, "", &with_records(vec![record("orders", PauseTestOutcome::Pass, NOW_MS + 1)]));
    assert!(r.is_valid() && r.unchecked.is_empty() && r.demoted.is_empty(), "{:?}", shown(&r));
    assert_eq!(
        r.publishable().unwrap().classes["orders"].enforcement,
        Enforcement::Fenced { resource: "postgresql://db:5432/app?table=fence".into(), schema_version: 1 }
    );
}

#[test]
fn a_fenced_class_names_its_resource_and_schema_version_and_an_advisory_one_does_not() {
    let pass = || with_records(vec![record("orders", PauseTestOutcome::Pass, NOW_MS + 1)]);
    let bare = FENCED.replace("resource = \"postgresql://db:5432/app?table=fence\"\nresource_schema_version = 1\n", "");
    let r = run(&bare, "", &pass());
    assert_eq!(r.problems.iter().map(|p| p.rule).collect::<Vec<_>>(), [Rule::FencedWithoutResource, Rule::FencedWithoutResource]);
    assert_eq!(
        shown(&r)[0],
        "classes.d/c.toml:1: class \"orders\" is fenced but has no resource; add resource = \"NAME\" and resource_schema_version = N \
         as `holdfast-pausetest status --class orders --resource URL --json` prints them (\"resource\" and \"current_schema_version\"): \
         a pause-test result counts only for that resource at that schema version"
    );
    assert!(shown(&r)[1].contains("is fenced but has no resource_schema_version;"), "{:?}", shown(&r));

    let r = run(&format!("{ADVISORY}resource = \"postgresql://db:5432/app\"\nresource_schema_version = 3\n"), GRANT, &offline());
    assert_eq!(r.problems.iter().map(|p| p.rule).collect::<Vec<_>>(), [Rule::ResourceOnAdvisory, Rule::ResourceOnAdvisory]);
    assert_eq!(
        shown(&r)[0],
        "classes.d/c.toml:9: class \"ledger\" is advisory, so no fence and no pause test is checked against resource; remove it, \
         or make the class fenced (enforcement = \"fenced\") once holdfast-pausetest has passed against that resource"
    );

    for (value, says) in [
        ("\"\"", "resource is empty;"),
        ("\"a b\"", "resource \"a b\" contains whitespace;"),
        ("\"postgresql://app:s3cret@db:5432/app\"", "resource (a postgresql:// URL) carries credentials; leave out USER:PASSWORD@"),
        ("7", "resource must be a string in quotes"),
    ] {
        let text = FENCED.replace("\"postgresql://db:5432/app?table=fence\"", value);
        let shown = shown(&run(&text, "", &pass()));
        assert!(shown.iter().any(|m| m.contains(says)), "{value}: {shown:?}");
        assert!(shown.iter().all(|m| !m.contains("s3cret")), "a credential is never repeated: {shown:?}");
    }
    for value in ["-1", "4294967296", "\"1\"", "1.5"] {
        let text = FENCED.replace("resource_schema_version = 1", &format!("resource_schema_version = {value}"));
        let shown = shown(&run(&text, "", &pass()));
        assert_eq!(shown.len(), 1, "{value}: {shown:?}");
        assert!(
            shown[0]
                .starts_with("classes.d/c.toml:8: class \"orders\": resource_schema_version must be a whole number from 0 to 4294967295"),
            "{shown:?}"
        );
    }
    // Hexadecimal is a TOML integer too.
    let hex = FENCED.replace("resource_schema_version = 1", "resource_schema_version = 0x1");
    assert!(run(&hex, "", &pass()).demoted.is_empty());
}

#[test]
fn waiver_keys_on_a_fenced_class() {
    let r = run(&format!("{FENCED}risk_owner = \"t\"\n"), "", &with_records(vec![record("orders", PauseTestOutcome::Pass, NOW_MS + 1)]));
    assert_eq!(
        shown(&r),
        [
            "classes.d/c.toml:9: class \"orders\" is fenced, so risk_owner does not apply; remove it (risk_owner and waiver_expires are for advisory classes)"
        ]
    );
    assert_eq!(r.problems[0].rule, Rule::WaiverOnFenced);
}

#[test]
fn missing_tier() {
    let (rule, msg) = only_problem(&ADVISORY.replace("tier = \"entity\"\n", ""));
    assert_eq!(rule, Rule::MissingTier);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" has no tier; add tier = \"entity\" (per-entity locks on the sharded entity clusters) \
         or tier = \"coord\" (coordination locks on the coord cluster)"
    );
    let (rule, msg) = only_problem(&ADVISORY.replace("\"entity\"", "\"global\""));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(msg, "classes.d/c.toml:8: class \"ledger\": tier = \"global\" is not allowed; write tier = \"coord\" or tier = \"entity\"");
}

#[test]
fn missing_purpose_and_namespace() {
    let (rule, msg) = only_problem(&ADVISORY.replace("purpose = \"correctness\"\n", ""));
    assert_eq!(rule, Rule::MissingPurpose);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" has no purpose; add purpose = \"correctness\" (two holders at once would corrupt data) \
         or purpose = \"efficiency\" (two holders at once only waste work)"
    );
    // The grant's "payments/" is not called unknown: the fix is in the class.
    let (rule, msg) = only_problem(&ADVISORY.replace("namespace = \"payments\"\n", ""));
    assert_eq!(rule, Rule::MissingNamespace);
    assert_eq!(
        msg,
        "classes.d/c.toml:1: class \"ledger\" has no namespace; add namespace = \"NAME\", the first segment of the keys it governs (NAME/KEY)"
    );
}

#[test]
fn unknown_keys_with_a_suggestion() {
    let r = run(&ADVISORY.replace("enforcement", "enforcment"), GRANT, &offline());
    assert_eq!(
        shown(&r),
        [
            "classes.d/c.toml:1: class \"ledger\" has no enforcement; add enforcement = \"advisory\" (with risk_owner and \
             waiver_expires), or enforcement = \"fenced\" once holdfast-pausetest has passed against the resource it guards",
            "classes.d/c.toml:4: class \"ledger\": unknown key \"enforcment\" (did you mean \"enforcement\"?); the keys are namespace, \
             purpose, enforcement, resource, resource_schema_version, risk_owner, waiver_expires, ttl, tier, on_quorum_loss, fairness, home_region",
        ]
    );
    assert_eq!(r.problems[1].rule, Rule::UnknownKey);
    let r = run(ADVISORY, &format!("{GRANT}locks = [\"payments/\"]\n"), &offline());
    assert_eq!(
        shown(&r),
        [
            "grants.d/g.toml:5: grant \"ledger-writers\": unknown key \"locks\" (did you mean \"lock\"?); the keys are identity, lock, inspect, force_release"
        ]
    );
    // Tables that do not belong in the file.
    let r = run(&format!("{ADVISORY}[grant.x]\nidentity = \"spiffe://a/b\"\n[clas.y]\n"), GRANT, &offline());
    assert_eq!(
        shown(&r),
        [
            "classes.d/c.toml:9: unknown key \"grant\"; [grant.NAME] tables belong in grants.d/, not classes.d/: move it",
            "classes.d/c.toml:11: unknown key \"clas\" (did you mean \"class\"?); a classes.d file holds only [class.NAME] tables",
        ]
    );
}

#[test]
fn invalid_toml_is_reported_with_its_line() {
    let r = run(&ADVISORY.replace("tier = \"entity\"", "tier = entity"), GRANT, &offline());
    assert_eq!(r.problems.len(), 1, "{:?}", shown(&r));
    assert_eq!(r.problems[0].rule, Rule::Syntax);
    assert!(r.problems[0].to_string().starts_with("classes.d/c.toml:8: invalid TOML: "), "{}", r.problems[0]);
    assert!(r.problems[0].message.ends_with("; fix the syntax"), "{}", r.problems[0]);
    // The grant's namespace is not called unknown: its class may be in the broken file.
    assert!(r.problems.iter().all(|p| p.rule != Rule::UnknownNamespace));
    // A table defined twice in one file is a TOML error.
    let r = run(&format!("{ADVISORY}{ADVISORY}"), GRANT, &offline());
    assert_eq!(r.problems[0].rule, Rule::Syntax);
    assert_eq!(r.problems[0].line, 9);
    // Not UTF-8.
    let mut s = sources(&[ADVISORY], &[GRANT]);
    s.grants[0].text = Err("is not UTF-8 text (x); save it as UTF-8".into());
    let r = validate(&s, &offline());
    assert_eq!(shown(&r), ["grants.d/g.toml:1: is not UTF-8 text (x); save it as UTF-8"]);
}

#[test]
fn duplicate_class_names_across_files() {
    let other = ADVISORY.replace("\"payments\"", "\"billing\"");
    let r = validate(&sources(&[ADVISORY, &other], &[GRANT]), &offline());
    assert_eq!(
        shown(&r),
        ["classes.d/c1.toml:1: class \"ledger\" is already defined at classes.d/c.toml:1; class names are unique across classes.d/: \
          rename or remove one of them"]
    );
    assert_eq!(r.problems[0].rule, Rule::DuplicateClass);
}

#[test]
fn overlapping_namespaces() {
    let other = ADVISORY.replace("[class.ledger]", "\n[class.payouts]");
    let r = validate(&sources(&[ADVISORY, &other], &[GRANT]), &offline());
    assert_eq!(
        shown(&r),
        ["classes.d/c1.toml:3: class \"payouts\" governs namespace \"payments\", which class \"ledger\" (classes.d/c.toml:2) already \
          governs; a namespace belongs to exactly one class: give one of them another namespace"]
    );
    assert_eq!(r.problems[0].rule, Rule::OverlappingNamespace);
    // Namespaces cannot nest (no '/'), so "pay" and "payments" do not overlap.
    let pay = ADVISORY.replace("[class.ledger]", "[class.pay]").replace("\"payments\"", "\"pay\"");
    assert!(validate(&sources(&[ADVISORY, &pay], &[GRANT]), &offline()).is_valid());
}

#[test]
fn invalid_namespace_and_names() {
    let (rule, msg) = only_problem(&ADVISORY.replace("\"payments\"", "\"Payments\""));
    assert_eq!(rule, Rule::InvalidNamespace);
    assert_eq!(msg, "classes.d/c.toml:2: class \"ledger\": namespace \"Payments\" may contain only a-z, 0-9 and '-'");
    let r = run(&ADVISORY.replace("\"payments\"", "\"payments/ledger\""), "", &offline());
    assert_eq!(
        shown(&r),
        ["classes.d/c.toml:2: class \"ledger\": namespace \"payments/ledger\" may contain only a-z, 0-9 and '-'; namespaces do not \
          nest: use the first segment as the namespace and grant key prefixes below it"]
    );
    let r = run(&ADVISORY.replace("\"payments\"", "\"\""), "", &offline());
    assert_eq!(
        shown(&r),
        ["classes.d/c.toml:2: class \"ledger\": namespace is empty; every key lives in a namespace such as \"payments\""]
    );
    let r = run(&ADVISORY.replace("[class.ledger]", "[class.Ledger]"), GRANT, &offline());
    assert_eq!(
        shown(&r),
        [
            "classes.d/c.toml:1: [class.Ledger]: \"Ledger\" is not a class name; use 1..=63 of a-z, 0-9 and '-', not starting or ending with '-'"
        ]
    );
    assert_eq!(r.problems[0].rule, Rule::InvalidName);
    let r = run(ADVISORY, &GRANT.replace("[grant.ledger-writers]", "[grant.\"ledger writers\"]"), &offline());
    assert_eq!(
        shown(&r),
        [
            "grants.d/g.toml:1: [grant.ledger writers]: \"ledger writers\" is not a grant name; use 1..=63 of a-z, 0-9 and '-', not starting or ending with '-'"
        ]
    );
    let (rule, msg) = only_problem(&format!("{ADVISORY}home_region = \"Hall A\"\n"));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(
        msg,
        "classes.d/c.toml:9: class \"ledger\": home_region \"Hall A\" is not a region name; use 1..=63 of a-z, 0-9 and '-', e.g. \"hall-a\", or leave it out"
    );
    let r = run(&format!("{ADVISORY}home_region = \"hall-a\"\n"), GRANT, &offline());
    assert_eq!(r.set.unwrap().classes["payments"].home_region.as_deref(), Some("hall-a"));
}

#[test]
fn wrong_words_and_wrong_shapes() {
    let (rule, msg) = only_problem(&ADVISORY.replace("\"advisory\"", "\"fence\""));
    assert_eq!(rule, Rule::InvalidValue);
    assert_eq!(
        msg,
        "classes.d/c.toml:4: class \"ledger\": enforcement = \"fence\" is not allowed; write enforcement = \"fenced\" or enforcement = \"advisory\""
    );
    let (_, msg) = only_problem(&format!("{ADVISORY}fairness = \"fifo\"\n"));
    assert_eq!(
        msg,
        "classes.d/c.toml:9: class \"ledger\": fairness = \"fifo\" is not allowed; write fairness = \"best-effort\" or fairness = \"durable\""
    );
    let r = run("class = 1\n[other]\n", "", &offline());
    assert_eq!(
        shown(&r),
        [
            "classes.d/c.toml:1: class must be a table; write [class.NAME] headers",
            "classes.d/c.toml:2: unknown key \"other\"; a classes.d file holds only [class.NAME] tables",
        ]
    );
    let r = run("[class]\nnamespace = \"x\"\n", "", &offline());
    assert_eq!(
        shown(&r),
        ["classes.d/c.toml:2: class \"namespace\" must be a table; write [class.namespace] and put its keys on the lines below it"]
    );
}

#[test]
fn grant_naming_a_namespace_no_class_declares() {
    let r = run(ADVISORY, &GRANT.replace("inspect = [\"payments/\"]", "inspect = [\"payments/\", \"billing/reports\"]"), &offline());
    assert_eq!(
        shown(&r),
        ["grants.d/g.toml:4: grant \"ledger-writers\": inspect prefix \"billing/reports\" names namespace \"billing\", which no class \
          declares; add a class with namespace = \"billing\" to classes.d/, or fix the prefix"]
    );
    assert_eq!(r.problems[0].rule, Rule::UnknownNamespace);
}

#[test]
fn grant_with_an_invalid_key_prefix() {
    let r = run(
        ADVISORY,
        &GRANT.replace("lock = [\"payments/\"]", "lock = [\n  \"payments\",\n  \"payments/../billing\",\n  \"payments//\",\n]"),
        &offline(),
    );
    let tail = "; write \"NAMESPACE/\" for a whole namespace or \"NAMESPACE/KEY-PREFIX\", e.g. \"payments/\" or \"payments/ledger-\"";
    assert_eq!(
        shown(&r),
        [
            format!(
                "grants.d/g.toml:4: grant \"ledger-writers\": lock prefix \"payments\" is not a key prefix: it has no \"/\" (for the whole namespace write \"payments/\"){tail}"
            ),
            format!(
                "grants.d/g.toml:5: grant \"ledger-writers\": lock prefix \"payments/../billing\" is not a key prefix: the key part contains a \"..\" path segment, which could leave the namespace{tail}"
            ),
            format!(
                "grants.d/g.toml:6: grant \"ledger-writers\": lock prefix \"payments//\" is not a key prefix: it has an empty key segment (\"//\"){tail}"
            ),
        ]
    );
    assert!(r.problems.iter().all(|p| p.rule == Rule::InvalidKeyPrefix));
    let ok = GRANT.replace("lock = [\"payments/\"]", "lock = [\"payments/ledger-\", \"payments/ledger/\"]");
    assert!(run(ADVISORY, &ok, &offline()).is_valid());
}

#[test]
fn grant_with_an_invalid_identity() {
    let tail = "; write one ID, e.g. \"spiffe://holdfast.dev/ns/payments/sa/ledger\", or a prefix ending in \"/\", e.g. \"spiffe://holdfast.dev/ns/payments/\"";
    for (id, why) in [
        ("https://holdfast.dev/x", "it does not start with \"spiffe://\""),
        ("spiffe:///x", "it names no trust domain"),
        ("spiffe://Holdfast.dev/x", "the trust domain \"Holdfast.dev\" may contain only a-z, 0-9, '.', '-' and '_'"),
        (
            "spiffe://holdfast.dev",
            "it names only a trust domain; add the workload's path, or write \"spiffe://holdfast.dev/\" to match every ID in the trust domain",
        ),
        ("spiffe://holdfast.dev/ns//x", "its path has an empty segment (\"//\")"),
        ("spiffe://holdfast.dev/ns/../x", "its path has a \"..\" segment"),
        ("spiffe://holdfast.dev/ns/a b", "the path segment \"a b\" may contain only letters, digits, '.', '-' and '_'"),
    ] {
        let r = run(ADVISORY, &GRANT.replace("spiffe://holdfast.dev/ns/payments/sa/ledger", id), &offline());
        assert_eq!(
            shown(&r),
            [format!("grants.d/g.toml:2: grant \"ledger-writers\": identity {id:?} is not a SPIFFE ID or ID prefix: {why}{tail}")],
            "{id}"
        );
        assert_eq!(r.problems[0].rule, Rule::InvalidIdentity);
    }
    for ok in ["spiffe://holdfast.dev/", "spiffe://holdfast.dev/ns/payments/", "spiffe://a.b-c_d/x.y/Z-1"] {
        let r = run(ADVISORY, &GRANT.replace("spiffe://holdfast.dev/ns/payments/sa/ledger", ok), &offline());
        assert!(r.is_valid(), "{ok}: {:?}", shown(&r));
    }
    let r = run(ADVISORY, &GRANT.replace("identity = \"spiffe://holdfast.dev/ns/payments/sa/ledger\"\n", ""), &offline());
    assert_eq!(
        shown(&r),
        [
            "grants.d/g.toml:1: grant \"ledger-writers\" has no identity; add identity = \"spiffe://TRUST-DOMAIN/PATH\" (one workload) or a prefix ending in \"/\" (every workload under it)"
        ]
    );
}

#[test]
fn duplicate_grant_names_across_files() {
    let r = validate(&sources(&[ADVISORY], &[GRANT, GRANT]), &offline());
    assert_eq!(
        shown(&r),
        ["grants.d/g1.toml:1: grant \"ledger-writers\" is already defined at grants.d/g.toml:1; grant names are unique across grants.d/: \
          rename or remove one of them"]
    );
    assert_eq!(r.problems[0].rule, Rule::DuplicateGrant);
}

#[test]
fn grant_with_no_permission() {
    for body in ["", "lock = []\ninspect = []\nforce_release = []\n"] {
        let r = run(ADVISORY, &format!("[grant.idle]\nidentity = \"spiffe://holdfast.dev/x\"\n{body}"), &offline());
        assert_eq!(
            shown(&r),
            [
                "grants.d/g.toml:1: grant \"idle\" gives no permission; list key prefixes under lock, inspect or force_release (e.g. lock = [\"payments/\"]), or delete the grant"
            ]
        );
        assert_eq!(r.problems[0].rule, Rule::GrantWithoutPermission);
    }
    let r = run(ADVISORY, "[grant.x]\nidentity = \"spiffe://holdfast.dev/x\"\nlock = \"payments/\"\n", &offline());
    assert_eq!(
        shown(&r),
        ["grants.d/g.toml:3: grant \"x\": lock must be a list of key prefixes, e.g. lock = [\"payments/\"], not a string"]
    );
}

#[test]
fn every_problem_is_reported_in_one_pass() {
    let classes = r#"[class.a]
namespace = "payments"
purpose = "correctness"
enforcement = "advisory"
ttl = "2s"
on_quorum_loss = "open"
colour = "red"

[class.b]
namespace = "payments"
purpose = "efficiency"
"#;
    let grants = "[grant.g]\nidentity = \"spiffe:/x\"\nlock = [\"billing/\"]\n";
    let r = run(classes, grants, &offline());
    let rules: Vec<(usize, Rule)> = r.problems.iter().map(|p| (p.line, p.rule)).collect();
    assert_eq!(
        rules,
        [
            (1, Rule::MissingTier),
            (1, Rule::AdvisoryWithoutRiskOwner),
            (1, Rule::AdvisoryWithoutWaiver),
            (5, Rule::TtlOutOfRange),
            (6, Rule::OpenOnCorrectness),
            (7, Rule::UnknownKey),
            (9, Rule::MissingEnforcement),
            (9, Rule::MissingTier),
            (10, Rule::OverlappingNamespace),
            (2, Rule::InvalidIdentity),
            (3, Rule::UnknownNamespace),
        ],
        "{:#?}",
        shown(&r)
    );
    assert_eq!(r.class_count, 2);
    assert_eq!(r.grant_count, 1);
}

#[test]
fn reads_a_directory_and_ignores_files_that_are_not_toml() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(Sources::read(dir.path()), Err(LoadError::Missing { .. })));
    std::fs::create_dir(dir.path().join("classes.d")).unwrap();
    std::fs::create_dir(dir.path().join("grants.d")).unwrap();
    std::fs::write(dir.path().join("classes.d/b.toml"), ADVISORY).unwrap();
    std::fs::write(dir.path().join("classes.d/a.toml"), FENCED).unwrap();
    std::fs::write(dir.path().join("classes.d/README"), "notes").unwrap();
    std::fs::write(dir.path().join("classes.d/.b.toml.swp"), "x").unwrap();
    std::fs::write(dir.path().join("grants.d/g.toml"), GRANT).unwrap();
    let s = Sources::read(dir.path()).unwrap();
    let names: Vec<&str> = s.classes.iter().map(|f| f.name.rsplit('/').next().unwrap()).collect();
    assert_eq!(names, ["a.toml", "b.toml"]);
    assert_eq!(s.ignored.len(), 2);
    let r = validate(&s, &offline());
    assert!(r.is_valid(), "{:?}", shown(&r));
    assert_eq!(r.set.unwrap().classes.len(), 2);
    let missing = Sources::read(&dir.path().join("nope")).unwrap_err().to_string();
    assert!(missing.starts_with("cannot read ") && missing.contains("pass the directory that holds classes.d/ and grants.d/"), "{missing}");
}

#[test]
fn the_shipped_config_directory_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
    let s = Sources::read(&dir).unwrap();
    assert!(!s.classes.is_empty() && !s.grants.is_empty());
    let r = validate(&s, &Checks { today: Date::today_utc(), pause_tests: PauseTests::Read { records: Vec::new(), now_unix_ms: 0 } });
    assert_eq!(shown(&r), Vec::<String>::new());
    assert!(r.publishable().is_some(), "the dev set has no fenced class, so it needs no pause-test result");
}

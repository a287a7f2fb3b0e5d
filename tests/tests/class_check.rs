//! `holdfastctl class check DIR`: the real binary on the shipped dev set in
//! config/, on a broken directory, and with the pause-test rule checked
//! against a real etcd (and reported as not checked when etcd is away).

use holdfast_devkit::ports::free_port;
use holdfast_model::layout::{self, PAUSETEST_VALIDITY, PauseTestOutcome, PauseTestRecord};
use holdfast_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn check(dir: &Path, extra: &[&str]) -> Ran {
    Ran::of(Command::new(bin("holdfastctl")).args(["class", "check"]).arg(dir).args(extra))
}

/// A policy directory with the given class and grant files.
fn policy(root: &Path, classes: &[(&str, &str)], grants: &[(&str, &str)]) -> PathBuf {
    let dir = root.join("policy");
    for (sub, files) in [("classes.d", classes), ("grants.d", grants)] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(sub).join(name), text).unwrap();
        }
    }
    dir
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

const ADVISORY: &str = r#"[class.ledger]
namespace = "payments"
purpose = "correctness"
enforcement = "advisory"
risk_owner = "team-ledger"
waiver_expires = 2099-12-31
ttl = "30s"
tier = "entity"
"#;

const FENCED: &str = r#"[class.orders]
namespace = "orders"
purpose = "correctness"
enforcement = "fenced"
ttl = "10s"
tier = "entity"
resource = "postgresql://127.0.0.1:5432/app?table=holdfast_fence"
resource_schema_version = 1
"#;

const GRANTS: &str = r#"[grant.ledger]
identity = "spiffe://holdfast.dev/ns/payments/"
lock = ["payments/", "orders/"]
"#;

#[test]
fn every_file_in_config_passes() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let out = check(&config, &[]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains(": valid: ") && out.stdout.contains("sha256:"), "{out}");
    assert!(out.stdout.contains("no fenced class, so the pause-test rule does not apply"), "{out}");

    let json = check(&config, &["--json"]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap_or_else(|e| panic!("no JSON ({e}):\n{json}"));
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(v["problems"], serde_json::json!([]));
    assert!(v["classes"].as_u64().unwrap() >= 1 && v["grants"].as_u64().unwrap() >= 1, "{v}");
}

#[test]
fn a_broken_directory_exits_65_with_every_problem_at_its_file_and_line() {
    let dir = TestDir::new("class-check-bad");
    let typo = ADVISORY.replace("enforcement", "enforcment");
    let short = ADVISORY.replace("[class.ledger]", "[class.cache]").replace("\"payments\"", "\"cache\"").replace("\"30s\"", "\"2s\"");
    let grant = "[grant.nobody]\nidentity = \"https://example.org/x\"\nlock = [\"billing/\"]\n";
    let p = policy(&dir.path, &[("a.toml", &typo), ("b.toml", &short)], &[("g.toml", grant)]);
    let out = check(&p, &[]);
    assert_eq!(out.code, 65, "{out}");
    let a = p.join("classes.d/a.toml").display().to_string();
    let b = p.join("classes.d/b.toml").display().to_string();
    let g = p.join("grants.d/g.toml").display().to_string();
    for expected in [
        format!("{a}:1: class \"ledger\" has no enforcement; add enforcement = \"advisory\""),
        format!("{a}:4: class \"ledger\": unknown key \"enforcment\" (did you mean \"enforcement\"?)"),
        format!("{b}:7: class \"cache\": ttl = \"2s\" is outside 5s..300s"),
        format!("{g}:2: grant \"nobody\": identity \"https://example.org/x\" is not a SPIFFE ID or ID prefix"),
        format!("{g}:3: grant \"nobody\": lock prefix \"billing/\" names namespace \"billing\", which no class declares"),
    ] {
        assert!(out.stdout.lines().any(|l| l.starts_with(&expected)), "missing {expected:?} in:\n{out}");
    }
    assert!(out.stdout.contains("INVALID: 5 problem(s) in 2 class(es), 1 grant(s)"), "{out}");

    let json = check(&p, &["--json"]);
    assert_eq!(json.code, 65, "{json}");
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["hash"], serde_json::Value::Null);
    let rules: Vec<&str> = v["problems"].as_array().unwrap().iter().map(|p| p["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, ["missing-enforcement", "unknown-key", "ttl-out-of-range", "invalid-identity", "unknown-namespace"], "{v}");
    assert_eq!(v["problems"][0]["file"], a);
    assert_eq!(v["problems"][0]["line"], 1);

    // An unreadable directory is a configuration error, not a problem in a set.
    let out = check(&dir.path.join("nope"), &[]);
    assert_eq!(out.code, 78, "{out}");
    assert!(out.stderr.contains("pass the directory that holds classes.d/ and grants.d/"), "{out}");
    std::fs::create_dir(dir.path.join("half")).unwrap();
    std::fs::create_dir(dir.path.join("half/classes.d")).unwrap();
    let out = check(&dir.path.join("half"), &[]);
    assert_eq!(out.code, 78, "{out}");
    assert!(out.stderr.contains("half/grants.d/ is missing"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_class_without_a_counting_pause_test_is_demoted_and_the_risk_register_lists_it() {
    let dir = TestDir::new("class-check-pausetest");
    let etcd = Etcd::start(&dir.path, 1).await;
    let url = etcd.endpoints().join(",");
    let p = policy(&dir.path, &[("a.toml", ADVISORY), ("b.toml", FENCED)], &[("g.toml", GRANTS)]);
    let b = p.join("classes.d/b.toml").display().to_string();

    // Offline: valid, and the rule is NOT checked (neither passed nor failed).
    let out = check(&p, &[]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains(&format!(
            "{b}:1: class \"orders\" is fenced; whether a passing pause-test result is recorded for it was NOT checked: offline"
        )),
        "{out}"
    );
    assert!(out.stdout.contains("the pause-test rule was NOT checked for 1 fenced class(es)"), "{out}");

    // etcd on a closed port: still NOT checked, and why.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let out = check(&p, &["--etcd-endpoint", &closed]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains(&format!("was NOT checked: etcd at {closed} could not be read (")), "{out}");
    let json = check(&p, &["--etcd", &closed, "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(v["pause_tests"]["checked"], false, "{v}");
    assert_eq!(v["unchecked"][0]["rule"], "fenced-without-pause-test", "{v}");

    // A real etcd without a result: valid, but the class is DEMOTED, and
    // the risk register lists it (exit 1) while offline it cannot know.
    let demoted_line = format!(
        "{b}:1: class \"orders\" is fenced, but no pause-test result is recorded for it (nothing under /sys/pausetest/orders/): \
         it is DEMOTED, published as advisory with no risk owner, until `holdfast-pausetest run --class orders --resource URL ...` \
         passes against \"postgresql://127.0.0.1:5432/app?table=holdfast_fence\" at schema version 1"
    );
    let out = check(&p, &["--etcd-endpoint", &url]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.lines().any(|l| l == demoted_line), "missing {demoted_line:?} in:\n{out}");
    assert!(out.stdout.contains("1 fenced class(es) DEMOTED to advisory"), "{out}");
    let json = check(&p, &["--etcd", &url, "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!((v["valid"].clone(), v["demoted"][0]["rule"].clone()), (true.into(), "fenced-without-pause-test".into()), "{v}");
    let risk = |extra: &[&str]| {
        let mut args = vec!["risk-register".to_string(), "--dir".into(), p.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Ran::of(Command::new(bin("holdfastctl")).args(&args))
    };
    let out = risk(&["--etcd-endpoint", &url]);
    assert_eq!(out.code, 1, "a demoted class fails the register:\n{out}");
    let row = out.stdout.lines().find(|l| l.starts_with("orders ")).unwrap_or_else(|| panic!("no row for orders:\n{out}"));
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["orders", "orders", "-", "-", "-", "demoted"], "{out}");
    assert!(out.stdout.contains("1 fenced class(es) DEMOTED to advisory, with no risk owner"), "{out}");
    let json = risk(&["--etcd-endpoint", &url, "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(v[0]["class"], "orders", "demoted classes come first: {v}");
    assert_eq!(v[0]["status"], "demoted", "{v}");
    assert_eq!(v[0]["risk_owner"], serde_json::Value::Null, "{v}");
    assert_eq!(v[0]["resource_schema_version"], 1, "{v}");
    let out = risk(&[]);
    assert_eq!(out.code, 0, "offline the register lists only the advisory class:\n{out}");
    assert!(out.stdout.contains("demoted classes NOT checked: offline"), "{out}");

    // An expired result does not count.
    let resource = "postgresql://127.0.0.1:5432/app?table=holdfast_fence";
    let mut record = PauseTestRecord {
        class: "orders".into(),
        resource: resource.into(),
        schema_version: 1,
        time_unix_ms: now_ms() - PAUSETEST_VALIDITY.as_millis() as u64 - 1000,
        expires_unix_ms: now_ms() - 1000,
        etcd_version: etcd.bin.version_string(),
        outcome: PauseTestOutcome::Pass,
        reason: "the paused holder's write was rejected".into(),
        fence_mode: "correct".into(),
    };
    let key = layout::pausetest_key("orders", resource);
    let mut client = etcd.client().await;
    client.put(key.as_str(), layout::encode(&record), None).await.unwrap();
    let out = check(&p, &["--etcd-endpoint", &url]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains(&format!("no pause-test result for it counts ({resource}: the result expired")), "{out}");
    assert!(out.stdout.contains("it is DEMOTED"), "{out}");

    // A passing, unexpired result at /sys/pausetest/<class>/<resource>: fenced.
    record.time_unix_ms = now_ms();
    record.expires_unix_ms = now_ms() + PAUSETEST_VALIDITY.as_millis() as u64;
    client.put(key.as_str(), layout::encode(&record), None).await.unwrap();
    let out = check(&p, &["--etcd-endpoint", &url]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains(": valid: 2 class(es), 1 grant(s), sha256:"), "{out}");
    assert!(out.stdout.contains("pause-test results read from etcd"), "{out}");
    assert!(!out.stdout.contains("NOT checked") && !out.stdout.contains("DEMOTED"), "{out}");
    let out = risk(&["--etcd-endpoint", &url]);
    assert_eq!(out.code, 0, "{out}");
    assert!(!out.stdout.contains("orders ") && out.stdout.contains("checked against the pause-test results in etcd"), "{out}");

    // The resource's schema migrated and the class says so: the result, for
    // the old version, no longer counts.
    std::fs::write(p.join("classes.d/b.toml"), FENCED.replace("resource_schema_version = 1", "resource_schema_version = 2")).unwrap();
    let out = check(&p, &["--etcd-endpoint", &url]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains("the result is for schema version 1, and the resource is now at schema version 2")
            && out.stdout.contains("it is DEMOTED"),
        "{out}"
    );
    assert_eq!(risk(&["--etcd-endpoint", &url]).code, 1);
}

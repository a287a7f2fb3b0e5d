//! `holdfastctl class cost` and `holdfastctl risk-register`: the real binary
//! on the shipped dev set in config/ and on crafted policy directories.

use holdfast_tests::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

fn holdfastctl(args: &[&str]) -> Ran {
    Ran::of(Command::new(bin("holdfastctl")).args(args))
}

fn config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config").display().to_string()
}

/// A policy directory with the given class files and no grant.
fn policy(root: &Path, name: &str, classes: &[(&str, &str)]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("classes.d")).unwrap();
    std::fs::create_dir_all(dir.join("grants.d")).unwrap();
    for (file, text) in classes {
        std::fs::write(dir.join("classes.d").join(file), text).unwrap();
    }
    dir
}

fn advisory(name: &str, namespace: &str, expires: &str, extra: &str) -> String {
    format!(
        "[class.{name}]\nnamespace = \"{namespace}\"\npurpose = \"efficiency\"\nenforcement = \"advisory\"\n\
         risk_owner = \"team-{name}\"\nwaiver_expires = {expires}\nttl = \"30s\"\ntier = \"entity\"\n{extra}"
    )
}

const FENCED: &str = r#"[class.ledger]
namespace = "payments"
purpose = "correctness"
enforcement = "fenced"
ttl = "10s"
tier = "entity"
resource = "postgresql://db:5432/payments?table=holdfast_fence"
resource_schema_version = 1
"#;

#[test]
fn cost_of_a_shipped_class() {
    let dir = config();
    // jobs: ttl 30s, durable fairness.
    let out = holdfastctl(&["class", "cost", "jobs", "--sessions", "3000", "--dir", &dir]);
    assert_eq!(out.code, 0, "{out}");
    let expected = "\
class jobs (namespace jobs): ttl 30s, tier coord, advisory, fairness durable
  sessions          3000
  renewal period    10s: each session renews every TTL/3
  keepalives/s      300: keepalive requests at the etcd leader (one LeaseKeepAlive per renewal; not Raft writes)
  liveness bound    31s = ttl 30s + election timeout 1s: worst case from a holder's death until another session may acquire
  durable fairness  2 consensus writes per waiter (its record under /q/), on top of the keepalives
";
    assert_eq!(out.stdout, expected, "{out}");

    let v = holdfastctl(&["class", "cost", "jobs", "--sessions", "3000", "--dir", &dir, "--json"]).json();
    assert_eq!(
        v,
        json!({
            "class": "jobs", "namespace": "jobs", "tier": "coord", "enforcement": "advisory", "fairness": "durable",
            "ttl_ms": 30000, "sessions": 3000, "renewal_period_ms": 10000, "keepalives_per_second": 300.0,
            "election_timeout_ms": 1000, "liveness_bound_ms": 31000, "durable_writes_per_waiter": 2,
        })
    );

    // demo: best-effort, so no durable line.
    let out = holdfastctl(&["class", "cost", "demo", "--sessions", "1", "--dir", &dir]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains("  keepalives/s      0.1: "), "{out}");
    assert!(!out.stdout.contains("durable"), "{out}");
}

#[test]
fn cost_by_namespace_with_another_election_timeout() {
    let root = TestDir::new("class-cost");
    let p = policy(&root.path, "policy", &[("a.toml", FENCED), ("b.toml", &advisory("orders", "payments-old", "2099-12-31", ""))]);
    let p = p.display().to_string();

    // "payments" is ledger's namespace; "ledger" its name: the same class.
    for class in ["payments", "ledger"] {
        let out = holdfastctl(&["class", "cost", class, "--sessions", "3000", "--dir", &p, "--election-timeout", "500ms"]);
        assert_eq!(out.code, 0, "{out}");
        assert!(out.stdout.starts_with("class ledger (namespace payments): ttl 10s, tier entity, fenced, fairness best-effort\n"), "{out}");
        assert!(out.stdout.contains("  renewal period    3.333s: "), "{out}");
        assert!(out.stdout.contains("  keepalives/s      900: "), "{out}");
        assert!(out.stdout.contains("  liveness bound    10.5s = ttl 10s + election timeout 0.5s: "), "{out}");
    }
    let v = holdfastctl(&["class", "cost", "payments", "--sessions", "7", "--dir", &p, "--election-timeout", "2s", "--json"]).json();
    assert_eq!(v["class"], "ledger");
    assert_eq!(v["enforcement"], "fenced");
    assert_eq!(v["renewal_period_ms"], 3333);
    assert_eq!(v["keepalives_per_second"], 2.1);
    assert_eq!(v["liveness_bound_ms"], 12000);
    assert_eq!(v["durable_writes_per_waiter"], 0);

    // A name wins over a namespace: "orders" is a class name here.
    let v = holdfastctl(&["class", "cost", "orders", "--sessions", "1", "--dir", &p, "--json"]).json();
    assert_eq!(v["namespace"], "payments-old");

    // Unknown class: 64, with the classes there are.
    let out = holdfastctl(&["class", "cost", "billing", "--sessions", "10", "--dir", &p]);
    assert_eq!(out.code, 64, "{out}");
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.contains(&format!(
            "no class or namespace \"billing\" in {p}; the classes are: ledger (namespace payments), orders (namespace payments-old)"
        )),
        "{out}"
    );

    // No sessions: 64. Not a duration: clap's usage error.
    let out = holdfastctl(&["class", "cost", "ledger", "--sessions", "0", "--dir", &p]);
    assert_eq!(out.code, 64, "{out}");
    assert!(out.stderr.contains("--sessions must be at least 1"), "{out}");
    let out = holdfastctl(&["class", "cost", "ledger", "--sessions", "1", "--dir", &p, "--election-timeout", "soon"]);
    assert_ne!(out.code, 0, "{out}");
}

#[test]
fn cost_needs_a_valid_set() {
    let root = TestDir::new("class-cost-invalid");
    let expired = advisory("old", "old", "2001-01-01", "");
    let p = policy(&root.path, "policy", &[("a.toml", FENCED), ("b.toml", &expired)]);
    let out = holdfastctl(&["class", "cost", "ledger", "--sessions", "10", "--dir", &p.display().to_string()]);
    assert_eq!(out.code, 65, "{out}");
    assert_eq!(out.stdout, "");
    let b = p.join("classes.d/b.toml").display().to_string();
    assert!(out.stderr.contains(&format!("{b}:6: class \"old\": the advisory waiver expired on 2001-01-01")), "{out}");
    assert!(out.stderr.contains("INVALID: 1 problem(s) in 2 class(es), 0 grant(s)"), "{out}");

    let out = holdfastctl(&["class", "cost", "ledger", "--sessions", "10", "--dir", &root.path.join("nope").display().to_string()]);
    assert_eq!(out.code, 78, "{out}");
}

#[test]
fn risk_register_orders_by_expiry_and_exits_1_on_an_expired_waiver() {
    let root = TestDir::new("risk-register");
    let p = policy(
        &root.path,
        "policy",
        &[
            ("a.toml", &advisory("late", "late", "2099-01-01", "")),
            ("b.toml", &(advisory("soon", "soon", "2026-06-10", "") + "\n" + &advisory("gone", "gone", "2001-01-01", ""))),
            ("c.toml", FENCED),
        ],
    );
    let p = p.display().to_string();

    // The set does not validate (gone's waiver expired), yet the register reads it.
    assert_eq!(holdfastctl(&["class", "check", &p]).code, 65);
    let out = holdfastctl(&["risk-register", "--dir", &p, "--today", "2026-06-01"]);
    assert_eq!(out.code, 1, "{out}");
    let expected = format!(
        "\
CLASS  NAMESPACE  RISK OWNER  WAIVER EXPIRES  DAYS LEFT  STATUS
gone   gone       team-gone   2001-01-01      -9282      expired
soon   soon       team-soon   2026-06-10      9          expiring
late   late       team-late   2099-01-01      26512      ok
{p}: 3 advisory class(es) on 2026-06-01 (UTC): 1 expired, 1 expiring within 30 day(s), 1 ok; for each expired class: fence it, or have its risk owner renew the waiver with a later waiver_expires
demoted classes NOT checked: offline; pass --etcd-endpoint URL[,URL] to read the results under /sys/pausetest/
"
    );
    assert_eq!(out.stdout, expected, "{out}");

    let out = holdfastctl(&["risk-register", "--dir", &p, "--today", "2026-06-01", "--json"]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(
        out.json(),
        json!([
            {"class": "gone", "namespace": "gone", "risk_owner": "team-gone", "waiver_expires": "2001-01-01", "days_left": -9282, "status": "expired"},
            {"class": "soon", "namespace": "soon", "risk_owner": "team-soon", "waiver_expires": "2026-06-10", "days_left": 9, "status": "expiring"},
            {"class": "late", "namespace": "late", "risk_owner": "team-late", "waiver_expires": "2099-01-01", "days_left": 26512, "status": "ok"},
        ])
    );

    // Before gone's expiry: nothing expired, exit 0; the window decides "expiring".
    let statuses = |extra: &[&str]| {
        let mut args = vec!["risk-register", "--dir", &p, "--json"];
        args.extend_from_slice(extra);
        let out = holdfastctl(&args);
        let v = out.json();
        let s: Vec<String> = v.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap().to_string()).collect();
        (out.code, s)
    };
    assert_eq!(statuses(&["--today", "2000-12-15"]), (0, vec!["expiring".into(), "ok".into(), "ok".into()]));
    assert_eq!(statuses(&["--today", "2000-12-15", "--warn-days", "10"]), (0, vec!["ok".into(), "ok".into(), "ok".into()]));
    assert_eq!(statuses(&["--today", "2001-01-01", "--warn-days", "0"]), (0, vec!["expiring".into(), "ok".into(), "ok".into()]));
    assert_eq!(statuses(&["--today", "2001-01-02"]), (1, vec!["expired".into(), "ok".into(), "ok".into()]));
}

#[test]
fn risk_register_on_config_on_an_empty_set_and_on_a_broken_one() {
    let out = holdfastctl(&["risk-register", "--dir", &config(), "--json"]);
    assert_eq!(out.code, 0, "{out}");
    let v = out.json();
    let names: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["class"].as_str().unwrap()).collect();
    assert_eq!(names, ["bench", "demo", "gate", "jobs", "orders"], "{v}");
    for r in v.as_array().unwrap() {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["class", "days_left", "namespace", "risk_owner", "status", "waiver_expires"], "{r}");
        assert_eq!(r["status"], "ok");
    }

    let root = TestDir::new("risk-register-edge");
    let empty = policy(&root.path, "empty", &[("a.toml", FENCED)]).display().to_string();
    let out = holdfastctl(&["risk-register", "--dir", &empty, "--today", "2026-06-01"]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(
        out.stdout,
        format!(
            "{empty}: no advisory or demoted class, so the risk register is empty (today is 2026-06-01, UTC)\n\
             demoted classes NOT checked: offline; pass --etcd-endpoint URL[,URL] to read the results under /sys/pausetest/\n"
        )
    );
    assert_eq!(holdfastctl(&["risk-register", "--dir", &empty, "--json"]).json(), json!([]));

    // Another problem besides an expired waiver: 65, each problem on stderr.
    let broken = advisory("gone", "gone", "2001-01-01", "colour = \"red\"\n");
    let p = policy(&root.path, "broken", &[("a.toml", &broken), ("b.toml", "[class.x\n")]);
    let out = holdfastctl(&["risk-register", "--dir", &p.display().to_string(), "--today", "2026-06-01"]);
    assert_eq!(out.code, 65, "{out}");
    assert_eq!(out.stdout, "");
    let a = p.join("classes.d/a.toml").display().to_string();
    let b = p.join("classes.d/b.toml").display().to_string();
    assert!(out.stderr.contains(&format!("{a}:9: class \"gone\": unknown key \"colour\"")), "{out}");
    assert!(out.stderr.contains(&format!("{b}:1: invalid TOML")), "{out}");
    assert!(!out.stderr.contains("waiver expired"), "{out}");
    assert!(out.stderr.contains("INVALID: 2 problem(s) besides expired waivers"), "{out}");

    let out = holdfastctl(&["risk-register", "--dir", &root.path.join("nope").display().to_string()]);
    assert_eq!(out.code, 78, "{out}");
}

//! The pause-test kit (`holdfast-pausetest`) against real resources: the
//! PostgreSQL reference fence on a throwaway PostgreSQL cluster and the S3
//! reference fence on a real S3-compatible server (versitygw), with a real
//! arbiter and etcd. Correct fences pass; deliberately wrong ones fail, and
//! both outcomes are recorded under /sys/pausetest/. A real controller
//! refuses a fenced class until the kit has passed for it.

use holdfast_config::{ControllerConfig, EtcdConfig};
use holdfast_devkit::controller::{ControllerLaunch, ControllerProcess};
use holdfast_devkit::ports::free_port;
use holdfast_model::layout::{self, POLICY_KEY, POLICY_STATUS_KEY, PauseTestOutcome, PauseTestRecord};
use holdfast_policy::Enforcement;
use holdfast_store::policy::{PolicyStatus, PublishedPolicy};
use holdfast_tests::*;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
enum Resource {
    Postgres,
    S3,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl fmt::Display for Out {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// Runs holdfast-pausetest against one appliance, one PostgreSQL and one S3
/// server.
struct Kit<'a> {
    app: &'a Appliance,
    pg: &'a Postgres,
    s3: &'a S3,
    /// A separate coord cluster the kit is told of (HOLDFAST_COORD_ENDPOINT).
    coord: Option<&'a Etcd>,
}

impl Kit<'_> {
    fn resource_args(&self, r: Resource) -> Vec<String> {
        match r {
            Resource::Postgres => vec!["--resource".into(), self.pg.url()],
            Resource::S3 => vec!["--resource".into(), "s3://fences/kit".into(), "--s3-endpoint".into(), self.s3.endpoint()],
        }
    }

    /// The resource as the kit describes (and records) it.
    fn describe(&self, r: Resource) -> String {
        match r {
            Resource::Postgres => format!("postgresql://127.0.0.1:{}/holdfast?table=holdfast_fence", self.pg.0.port),
            Resource::S3 => format!("s3://fences/kit?endpoint={}", self.s3.endpoint()),
        }
    }

    async fn kit(&self, args: Vec<String>) -> Out {
        let out = tokio::process::Command::new(bin("holdfast-pausetest"))
            .envs(self.app.ctl_env("teams/pausetest"))
            .env("HOLDFAST_ETCD_ENDPOINT", self.app.etcd.endpoints().join(","))
            .envs(self.coord.map(|c| ("HOLDFAST_COORD_ENDPOINT", c.endpoints().join(","))))
            .envs(self.s3.env())
            .args(args)
            .output()
            .await
            .expect("run holdfast-pausetest");
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn run(&self, class: &str, lock: &str, r: Resource, mode: &str) -> Out {
        let mut args: Vec<String> = ["run", "--class", class, "--lock", lock, "--ttl", "5s", "--fence-mode", mode].map(String::from).into();
        args.extend(self.resource_args(r));
        self.kit(args).await
    }

    async fn status(&self, class: &str, r: Resource) -> (Out, serde_json::Value) {
        let mut args: Vec<String> = ["status", "--class", class, "--json"].map(String::from).into();
        args.extend(self.resource_args(r));
        let out = self.kit(args).await;
        let json = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("status printed no JSON ({e}):\n{out}"));
        (out, json)
    }

    /// The record in etcd, read behind the kit's back, and its lease's TTL.
    async fn record(&self, class: &str, r: Resource) -> (PauseTestRecord, i64) {
        let key = layout::pausetest_key(class, &self.describe(r));
        let mut etcd = self.app.etcd.client().await;
        let resp = etcd.get(key.as_str(), None).await.unwrap();
        let kv = resp.kvs().first().unwrap_or_else(|| panic!("no result at {key}"));
        let record = layout::decode(&key, kv.value()).unwrap();
        let ttl = etcd.lease_time_to_live(kv.lease(), None).await.unwrap().ttl();
        (record, ttl)
    }

    /// Every token either resource ever accepted: none may appear in the
    /// kit's output.
    async fn all_tokens(&self) -> Vec<u64> {
        let (db, conn) = tokio_postgres::connect(&self.pg.url(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let mut tokens = Vec::new();
        for row in db.query("SELECT accepted FROM holdfast_fence", &[]).await.unwrap() {
            tokens.extend(row.get::<_, Vec<i64>>(0).into_iter().map(|t| t as u64));
        }
        let records = self.s3.0.root.join("fences/kit/records");
        for entry in std::fs::read_dir(&records).into_iter().flatten().flatten() {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
            tokens.extend(v["accepted"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()));
        }
        tokens
    }
}

fn assert_no_token_in(outs: &[&Out], tokens: &[u64]) {
    assert!(!tokens.is_empty());
    for out in outs {
        for t in tokens {
            assert!(
                !out.stdout.contains(&t.to_string()) && !out.stderr.contains(&t.to_string()),
                "a token leaked into the kit's output:\n{out}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kit_passes_on_the_reference_fences_and_status_honours_expiry_and_schema_version() {
    let app = Appliance::start("pausetest-pass", 1).await;
    let pg = Postgres::start(&app.dir.path);
    let s3 = S3::start(&app.dir.path, &["fences"]);
    let kit = Kit { app: &app, pg: &pg, s3: &s3, coord: None };

    let (on_pg, on_s3) = tokio::join!(
        kit.run("ledger", "pausetest/pg", Resource::Postgres, "correct"),
        kit.run("media", "pausetest/s3", Resource::S3, "correct")
    );
    for (class, r, out) in [("ledger", Resource::Postgres, &on_pg), ("media", Resource::S3, &on_s3)] {
        assert_eq!(out.code, 0, "the correct fence must pass:\n{out}");
        assert!(out.stdout.starts_with("PASS: "), "{out}");
        assert!(out.stderr.contains("4. resumed the first holder (SIGCONT): its pending write was rejected"), "{out}");
        let (record, lease_ttl) = kit.record(class, r).await;
        assert_eq!(record.outcome, PauseTestOutcome::Pass);
        assert_eq!((record.class.as_str(), record.resource.as_str()), (class, kit.describe(r).as_str()));
        assert_eq!(record.schema_version, holdfast_fence::SCHEMA_VERSION);
        assert_eq!(record.etcd_version, app.etcd.bin.version_string(), "the record names the etcd it ran on");
        assert_eq!(record.fence_mode, "correct");
        assert_eq!(record.expires_unix_ms - record.time_unix_ms, layout::PAUSETEST_VALIDITY.as_millis() as u64);
        assert!(lease_ttl > 364 * 24 * 3600, "the record sits on a one-year lease (ttl {lease_ttl}s)");

        let (out, status) = kit.status(class, r).await;
        assert_eq!(out.code, 0, "{out}");
        assert_eq!(status["present"], true, "{status}");
        assert_eq!(status["fenced"], true, "{status}");
        assert_eq!(status["record"]["outcome"], "pass", "{status}");
    }
    assert_no_token_in(&[&on_pg, &on_s3], &kit.all_tokens().await);

    // Running again replaces the result (and its lease).
    let (first, _) = kit.record("ledger", Resource::Postgres).await;
    let again = kit.run("ledger", "pausetest/pg", Resource::Postgres, "correct").await;
    assert_eq!(again.code, 0, "{again}");
    assert!(kit.record("ledger", Resource::Postgres).await.0.time_unix_ms > first.time_unix_ms);

    // The resource's schema changes: the PostgreSQL result no longer counts.
    let (db, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    db.execute("UPDATE holdfast_fence_schema SET version = version + 1 WHERE table_name = 'holdfast_fence'", &[]).await.unwrap();
    let (out, status) = kit.status("ledger", Resource::Postgres).await;
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(status["present"], false, "{status}");
    assert!(status["absent_because"].as_str().unwrap().contains("now at schema version 2"), "{status}");

    // An expired result does not count either, even while etcd still has it.
    let (mut expired, _) = kit.record("media", Resource::S3).await;
    expired.expires_unix_ms = expired.time_unix_ms - 1;
    let key = layout::pausetest_key("media", &kit.describe(Resource::S3));
    app.etcd.client().await.put(key.as_str(), layout::encode(&expired), None).await.unwrap();
    let (out, status) = kit.status("media", Resource::S3).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(status["absent_because"].as_str().unwrap().contains("expired"), "{status}");

    // Nothing recorded for another class.
    let (out, status) = kit.status("other-class", Resource::S3).await;
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(status["absent_because"], "no result is recorded", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kit_fails_and_records_the_failure_on_wrong_fences() {
    let app = Appliance::start("pausetest-fail", 1).await;
    let pg = Postgres::start(&app.dir.path);
    let s3 = S3::start(&app.dir.path, &["fences"]);
    let kit = Kit { app: &app, pg: &pg, s3: &s3, coord: None };

    let cases = [
        ("ledger-lte", "pausetest/pg-lte", Resource::Postgres, "less-or-equal", "compares with <= instead of <"),
        ("ledger-two", "pausetest/pg-two", Resource::Postgres, "two-statements", "not one atomic step"),
        ("media-two", "pausetest/s3-two", Resource::S3, "two-statements", "not one atomic step"),
    ];
    let (a, b, c) = tokio::join!(
        kit.run(cases[0].0, cases[0].1, cases[0].2, cases[0].3),
        kit.run(cases[1].0, cases[1].1, cases[1].2, cases[1].3),
        kit.run(cases[2].0, cases[2].1, cases[2].2, cases[2].3),
    );
    for ((class, _, r, mode, why), out) in cases.into_iter().zip([&a, &b, &c]) {
        assert_eq!(out.code, 1, "the {mode} fence must fail:\n{out}");
        assert!(out.stdout.starts_with("FAIL: ") && out.stdout.contains(why), "{mode}:\n{out}");
        let (record, _) = kit.record(class, r).await;
        assert_eq!(record.outcome, PauseTestOutcome::Fail, "the failure is recorded");
        assert_eq!(record.fence_mode, mode);
        assert!(record.reason.contains(why), "{}", record.reason);
        let (out, status) = kit.status(class, r).await;
        assert_eq!(out.code, 1, "a recorded failure does not make the class fenced:\n{out}");
        assert_eq!((&status["present"], &status["fenced"]), (&serde_json::json!(true), &serde_json::json!(false)), "{status}");
    }
    // Which step caught which mistake.
    assert!(a.stderr.contains("its pending write was rejected") && a.stderr.contains("expired token: ACCEPTED"), "{a}");
    assert!(b.stderr.contains("its pending write was ACCEPTED"), "{b}");
    assert!(c.stderr.contains("its pending write was ACCEPTED"), "{c}");
    assert_no_token_in(&[&a, &b, &c], &kit.all_tokens().await);
}

#[tokio::test]
async fn kit_refuses_bad_input_before_touching_anything() {
    let app = Appliance::start("pausetest-usage", 1).await;
    let pg = Postgres::start(&app.dir.path);
    let s3 = S3::start(&app.dir.path, &["fences"]);
    let kit = Kit { app: &app, pg: &pg, s3: &s3, coord: None };
    for (args, needle) in [
        (vec!["--class", "Bad_Class", "--lock", "a/b", "--resource", "s3://fences/x"], "class"),
        (vec!["--class", "c", "--lock", "nokey", "--resource", "s3://fences/x"], "--lock"),
        (vec!["--class", "c", "--lock", "a/b", "--ttl", "2s", "--resource", "s3://fences/x"], "--ttl"),
        (vec!["--class", "c", "--lock", "a/b", "--resource", "ftp://x"], "postgres://"),
        (vec!["--class", "c", "--lock", "a/b", "--resource", "postgres://u:pw@127.0.0.1/db"], "--pg-password-file"),
    ] {
        let mut full = vec!["run".to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        let out = kit.kit(full).await;
        assert_eq!(out.code, 64, "{args:?}:\n{out}");
        assert!(out.stderr.contains(needle), "{args:?}:\n{out}");
    }
    let mut etcd = app.etcd.client().await;
    let resp = etcd.get(layout::PAUSETEST_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    // Only the harness's fixture records (for its fenced lab classes) are there.
    let fixture = percent_fixture();
    let recorded: Vec<String> = resp.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).filter(|k| !k.ends_with(&fixture)).collect();
    assert!(recorded.is_empty(), "nothing was recorded: {recorded:?}");
}

/// A holdfast-controller publishing `policy` to the appliance's etcd,
/// rescanning every [`RESCAN`]; prints its log if the test fails.
struct Controller(ControllerProcess, u16);

const RESCAN: Duration = Duration::from_millis(300);

impl Controller {
    fn start(dir: &Path, etcd: &Etcd, policy: &Path) -> Self {
        let mut config = ControllerConfig::new(EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config() });
        config.policy_dir = policy.to_path_buf();
        let metrics = free_port();
        config.metrics_listen = ([127, 0, 0, 1], metrics).into();
        config.cluster_name = "test".into();
        config.rescan_interval = RESCAN;
        config.election.ttl = Duration::from_secs(3);
        let mut launch = ControllerLaunch::new(bin("holdfast-controller"), config, dir, "ledger-controller");
        launch.env.push(("HOLDFAST_LOG".into(), "info,holdfast_controller=debug".into()));
        let mut process = ControllerProcess::spawn(&launch).expect("start holdfast-controller");
        process.wait_ready(Duration::from_secs(20)).expect("controller READY=1");
        Controller(process, metrics)
    }

    /// `holdfast_controller_demoted_classes` as the controller serves it.
    async fn demoted_gauge(&self) -> String {
        let text = scrape(self.1).await;
        let line = text.lines().find(|l| l.starts_with("holdfast_controller_demoted_classes{"));
        line.and_then(|l| l.rsplit(' ').next()).unwrap_or_else(|| panic!("no demoted_classes gauge in:\n{text}")).to_string()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- controller log {} -----\n{}", self.0.log.display(), holdfast_devkit::daemon::tail(&self.0.log, 60));
        }
    }
}

/// `/sys/policy` and its mod revision.
async fn published(etcd: &mut etcd_client::Client) -> Option<(PublishedPolicy, i64)> {
    let resp = etcd.get(POLICY_KEY, None).await.unwrap();
    resp.kvs().first().map(|kv| (serde_json::from_slice(kv.value()).expect("a PublishedPolicy"), kv.mod_revision()))
}

async fn policy_status(etcd: &mut etcd_client::Client) -> Option<PolicyStatus> {
    let resp = etcd.get(POLICY_STATUS_KEY, None).await.unwrap();
    resp.kvs().first().map(|kv| serde_json::from_slice(kv.value()).expect("a PolicyStatus"))
}

/// The published set once `done` holds for it, within 5 s.
async fn published_when(kv: &mut etcd_client::Client, what: &str, done: impl Fn(&PublishedPolicy) -> bool) -> PublishedPolicy {
    let start = Instant::now();
    loop {
        if let Some((p, _)) = published(kv).await
            && done(&p)
        {
            eprintln!("published version {} ({what}) after {:?}", p.version, start.elapsed());
            return p;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "not published within 5s: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_class_is_demoted_until_a_pause_test_for_its_resource_and_schema_passes_on_postgres() {
    let mut app = Appliance::start("pausetest-policy", 1).await;
    // The harness's controller published the lab set (whose `pausetest`
    // class and grant let the kit lock below); it resigns, so the controller
    // under test leads at once.
    app.controller.stop(Duration::from_secs(10));
    let pg = Postgres::start(&app.dir.path);
    let s3 = S3::start(&app.dir.path, &["fences"]);
    let kit = Kit { app: &app, pg: &pg, s3: &s3, coord: None };
    let mut kv = app.etcd.client().await;

    // A class set whose one class is fenced, naming the reference
    // PostgreSQL fence and its schema version, and otherwise valid.
    let resource = kit.describe(Resource::Postgres);
    let policy = app.dir.path.join("ledger-policy");
    for sub in ["classes.d", "grants.d"] {
        std::fs::create_dir_all(policy.join(sub)).unwrap();
    }
    let class_file = policy.join("classes.d/ledger.toml");
    let class = |version: u32| {
        format!(
            "[class.ledger]\nnamespace = \"ledger\"\npurpose = \"correctness\"\nenforcement = \"fenced\"\nttl = \"10s\"\n\
             tier = \"entity\"\nresource = \"{resource}\"\nresource_schema_version = {version}\n"
        )
    };
    let v1 = holdfast_fence::SCHEMA_VERSION;
    std::fs::write(&class_file, class(v1)).unwrap();
    // The lab's `pausetest` class and grant, which the kit locks in, as
    // the lab set has them (its fixture pause-test record is in etcd).
    std::fs::write(
        policy.join("classes.d/kit.toml"),
        format!(
            "[class.pausetest]\nnamespace = \"pausetest\"\npurpose = \"correctness\"\nenforcement = \"fenced\"\nttl = \"5s\"\n\
             tier = \"entity\"\nresource = \"{}\"\nresource_schema_version = {}\n",
            holdfast_fixtures::policy::FIXTURE_RESOURCE,
            holdfast_fixtures::policy::FIXTURE_SCHEMA_VERSION
        ),
    )
    .unwrap();
    std::fs::write(
        policy.join("grants.d/kit.toml"),
        format!("[grant.kit]\nidentity = \"{LAB_IDENTITIES}teams/pausetest\"\nlock = [\"pausetest/\"]\n"),
    )
    .unwrap();
    std::fs::write(
        policy.join("grants.d/ledger.toml"),
        "[grant.ledger-writers]\nidentity = \"spiffe://holdfast.dev/svc/ledger\"\nlock = [\"ledger/\"]\ninspect = [\"ledger/\"]\n",
    )
    .unwrap();
    let before_version = published(&mut kv).await.map_or(0, |(p, _)| p.version);
    let ctl = Controller::start(&app.dir.path, &app.etcd, &policy);
    let demoted = |p: &PublishedPolicy| p.set.classes.get("ledger").is_some_and(|c| c.enforcement.is_demoted());
    let fenced = |p: &PublishedPolicy| p.set.classes.get("ledger").is_some_and(|c| c.enforcement.is_fenced());

    // No pause-test result: published, but DEMOTED, with the reason; no
    // refusal, and the gauge the alert reads says so.
    let p = published_when(&mut kv, "ledger demoted, no result", demoted).await;
    assert_eq!(p.version, before_version + 1);
    match &p.set.classes["ledger"].enforcement {
        Enforcement::Demoted { resource: r, schema_version, reason } => {
            assert_eq!((r.as_str(), *schema_version), (resource.as_str(), v1));
            assert_eq!(reason, "no pause-test result is recorded for it (nothing under /sys/pausetest/ledger/)");
        }
        other => panic!("{other:?}"),
    }
    let s = policy_status(&mut kv).await.expect("/sys/policy-status");
    assert!(s.last_refusal.is_none(), "a demotion is not a refusal: {s:?}");
    assert_eq!(ctl.demoted_gauge().await, "1");
    let log = std::fs::read_to_string(&ctl.0.log).unwrap();
    assert!(log.contains("class ledger is declared fenced but published DEMOTED to advisory: no pause-test result"), "{log}");

    // The kit passes on the reference fence, for class ledger (locking in
    // the lab set's `pausetest` namespace): the next publication fences it.
    let out = kit.run("ledger", "pausetest/ledger", Resource::Postgres, "correct").await;
    assert_eq!(out.code, 0, "the correct fence must pass:\n{out}");
    assert!(out.stdout.starts_with("PASS: "), "{out}");
    let p = published_when(&mut kv, "ledger fenced after the pass", fenced).await;
    assert_eq!(p.set.classes["ledger"].enforcement, Enforcement::Fenced { resource: resource.clone(), schema_version: v1 });
    assert!(p.set.grants.contains_key("ledger-writers"));
    let s = policy_status(&mut kv).await.expect("/sys/policy-status");
    assert_eq!((s.version, s.hash.as_deref()), (p.version, Some(p.hash.as_str())), "{s:?}");
    assert_eq!(ctl.demoted_gauge().await, "0");

    // The resource's schema migrates and the class owner declares it: the
    // result, for the old version, no longer counts.
    let (db, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    db.execute("UPDATE holdfast_fence_schema SET version = version + 1 WHERE table_name = 'holdfast_fence'", &[]).await.unwrap();
    std::fs::write(&class_file, class(v1 + 1)).unwrap();
    let p = published_when(&mut kv, "ledger demoted, schema moved", demoted).await;
    let Enforcement::Demoted { reason, .. } = &p.set.classes["ledger"].enforcement else { unreachable!() };
    assert!(
        reason.contains(&format!("the result is for schema version {v1}, and the resource is now at schema version {}", v1 + 1)),
        "{reason}"
    );
    // Passing again at the new version fences it again.
    let out = kit.run("ledger", "pausetest/ledger", Resource::Postgres, "correct").await;
    assert_eq!(out.code, 0, "{out}");
    published_when(&mut kv, "ledger fenced at the new schema version", fenced).await;

    // The result expires, with no file changed: demoted at the next round
    // (before, the last good set kept the class fenced).
    let (mut record, _) = kit.record("ledger", Resource::Postgres).await;
    record.expires_unix_ms = record.time_unix_ms + 1;
    kv.put(layout::pausetest_key("ledger", &resource), layout::encode(&record), None).await.unwrap();
    let p = published_when(&mut kv, "ledger demoted, result expired", demoted).await;
    let Enforcement::Demoted { reason, .. } = &p.set.classes["ledger"].enforcement else { unreachable!() };
    assert!(reason.contains("the result expired"), "{reason}");
    assert_eq!(ctl.demoted_gauge().await, "1");
}

/// The last segment of a fixture record's key (the resource, escaped).
fn percent_fixture() -> String {
    let key = layout::pausetest_key("x", holdfast_fixtures::policy::FIXTURE_RESOURCE);
    key.rsplit('/').next().unwrap().to_string()
}

/// With a separate coord cluster named, the result is recorded there (where
/// the controller reads it), not on the lock cluster, and `status` reads it
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kit_records_on_the_coord_cluster_when_one_is_named() {
    let app = Appliance::start("pausetest-coord", 1).await;
    let pg = Postgres::start(&app.dir.path);
    let s3 = S3::start(&app.dir.path, &["fences"]);
    let coord = Etcd::start(&app.dir.path.join("coord"), 1).await;
    let kit = Kit { app: &app, pg: &pg, s3: &s3, coord: Some(&coord) };
    let out = kit.run("ledger", "pausetest/pg", Resource::Postgres, "correct").await;
    assert_eq!(out.code, 0, "{out}");
    let key = layout::pausetest_key("ledger", &kit.describe(Resource::Postgres));
    let on_coord = coord.client().await.get(key.as_str(), None).await.unwrap().count();
    let on_entity = app.etcd.client().await.get(key.as_str(), None).await.unwrap().count();
    assert_eq!((on_coord, on_entity), (1, 0), "the result is on the coord cluster only");
    let (out, status) = kit.status("ledger", Resource::Postgres).await;
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(status["present"], true, "{status}");
}

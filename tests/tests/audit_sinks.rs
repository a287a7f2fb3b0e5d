//! The tailer's optional sinks end to end: a tailer with `[clickhouse]`
//! (a real ClickHouse server) and `[archive]` (a real versitygw bucket
//! created with object lock), against a real etcd over mTLS with
//! authentication on, a real controller and arbiter, and a scripted
//! workload with two two-person force-releases. The tailer is killed with
//! SIGKILL before its first checkpoint, so its restart replays every
//! earlier batch into both sinks.
//!
//! ClickHouse (read with FINAL) then holds exactly the embedded store's
//! events; the archive holds each force-release once — the raw record and
//! the event — under a COMPLIANCE retention of seven years.
//!
//! Fails, never skips, without clickhouse-server or versitygw: run
//! `scripts/install-deps`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_audit::event::TimeSource;
use holdfast_audit::{Event, Kind};
use holdfast_audit_sinks::archive::{Archive, ArchivedRecord, DEFAULT_RETENTION, LOCK_MODE};
use holdfast_audit_sinks::clickhouse::ClickHouse;
use holdfast_config::{ArchiveConfig, ClickHouseConfig, EtcdConfig};
use holdfast_devkit::ports::free_port;
use holdfast_fixtures::clickhouse::ClickHouseServer;
use holdfast_fixtures::s3::S3Server;
use holdfast_model::LockKey;
use holdfast_model::layout::{self, ForceRecord};
use holdfast_store::roles::{ARBITER, TAILER};
use holdfast_tests::*;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::HttpRequestBody;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};
use ureq::http::{self, Method};

const BUCKET: &str = "force-archive";

fn key(k: &str) -> LockKey {
    LockKey::parse(k).unwrap()
}

/// ClickHouse and versitygw; their logs are printed if the test fails.
struct Sinks {
    clickhouse: ClickHouseServer,
    s3: S3Server,
    key_id_file: PathBuf,
    secret_file: PathBuf,
}

impl Sinks {
    fn start(dir: &Path) -> Self {
        let log = dir.join("clickhouse.log");
        let clickhouse = ClickHouseServer::start(&dir.join("clickhouse"), &log).unwrap_or_else(|e| {
            eprintln!("{}", holdfast_devkit::arbiter::tail(&log, 40));
            panic!("{e:#}")
        });
        let log = dir.join("versitygw.log");
        let s3 = S3Server::start_versioned(&dir.join("s3"), &dir.join("s3-versions"), &log, &[]).unwrap_or_else(|e| {
            eprintln!("{}", holdfast_devkit::arbiter::tail(&log, 40));
            panic!("{e:#}")
        });
        let key_id_file = dir.join("s3-access-key-id");
        let secret_file = dir.join("s3-secret-access-key");
        write_private(&key_id_file, &format!("{}\n", s3.access_key_id));
        write_private(&secret_file, &format!("{}\n", s3.secret_access_key));
        let sinks = Sinks { clickhouse, s3, key_id_file, secret_file };
        // As an operator creates it: with object lock (which also makes it
        // versioned).
        let (status, body) = sinks.raw(Method::PUT, &format!("/{BUCKET}"), &[("x-amz-bucket-object-lock-enabled", "true")]);
        assert_eq!(status, 200, "CreateBucket with object lock: {body}");
        sinks
    }

    fn clickhouse_config(&self) -> ClickHouseConfig {
        ClickHouseConfig { timeout: Duration::from_secs(5), ..ClickHouseConfig::new(self.clickhouse.url()) }
    }

    fn archive_config(&self) -> ArchiveConfig {
        ArchiveConfig {
            allow_http: true,
            access_key_id_file: Some(self.key_id_file.clone()),
            secret_access_key_file: Some(self.secret_file.clone()),
            require_object_lock: true,
            timeout: Duration::from_secs(5),
            ..ArchiveConfig::new(self.s3.endpoint(), BUCKET)
        }
    }

    fn clickhouse(&self) -> ClickHouse {
        ClickHouse::connect(&self.clickhouse_config()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn archive(&self) -> Archive {
        Archive::connect(&self.archive_config()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// One request signed with the server's root key, sent by the test
    /// itself: the status and the body.
    fn raw(&self, method: Method, path_and_query: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let credential =
            AwsCredential { key_id: self.s3.access_key_id.clone(), secret_key: self.s3.secret_access_key.clone(), token: None };
        let mut builder = http::Request::builder().method(method).uri(format!("{}{path_and_query}", self.s3.endpoint()));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(HttpRequestBody::from(Vec::new())).unwrap();
        AwsAuthorizer::new(&credential, "s3", "us-east-1").try_authorize(&mut request, None).unwrap();
        let (parts, _) = request.into_parts();
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let mut response = agent.run(http::Request::from_parts(parts, ())).unwrap();
        (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default())
    }

    /// The version IDs of `key`, from ListObjectVersions.
    fn versions(&self, key: &str) -> Vec<String> {
        let (status, xml) = self.raw(Method::GET, &format!("/{BUCKET}?versions&prefix={key}"), &[]);
        assert_eq!(status, 200, "ListObjectVersions: {xml}");
        elements(&xml, "Version")
            .iter()
            .filter(|v| elements(v, "Key").first().map(String::as_str) == Some(key))
            .map(|v| elements(v, "VersionId").into_iter().next().expect("a version has an ID"))
            .collect()
    }
}

impl Drop for Sinks {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in [&self.clickhouse.log, &self.s3.log] {
                eprintln!("----- last lines of {} -----\n{}", log.display(), holdfast_devkit::arbiter::tail(log, 40));
            }
        }
    }
}

fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The contents of every `<tag>…</tag>` (no nesting of the same tag in
/// S3's answers).
fn elements(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(&open).skip(1).filter_map(|part| part.split_once(&close).map(|(inside, _)| inside.to_string())).collect()
}

/// Waits until `done` holds, polling every 100 ms for up to 30 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < end, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn positions(events: &[Event]) -> BTreeSet<(String, i64, u32)> {
    events.iter().map(|e| (e.cluster_id.clone(), e.revision.expect("a stored event has a revision"), e.index)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn clickhouse_and_the_archive_hold_what_the_store_holds_across_a_kill() {
    let dir = TestDir::new("audit-sinks");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    // au: fenced (10 s, a fixture pause-test result); aua: advisory (30 s).
    let _controller = etcd.publish_policy(&dir.path, &[("au", 10), ("aua", 30)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    let sinks = Sinks::start(&dir.path);
    let (clickhouse_config, archive_config) = (sinks.clickhouse_config(), sinks.archive_config());

    let store = dir.path.join("audit");
    let port = free_port();
    // The first run never checkpoints (1 m interval): everything it stored
    // is replayed into the sinks by the restart.
    let tailer_with = |interval: Duration| {
        start_tailer_with(&dir.path, "tailer", etcd.config_as(TAILER.name), &store, port, &|c| {
            c.checkpoint_interval = interval;
            c.clickhouse = Some(clickhouse_config.clone());
            c.archive = Some(archive_config.clone());
        })
    };
    let tailer = tailer_with(Duration::from_secs(60));
    let a = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let ops = ForceOps::new(&dir.path, &etcd);

    // Grants and a release, then the session closed; a session closed while
    // holding; a force-release of a live hold.
    let s1 = a.open_session_for("au", None).await.unwrap();
    for i in 0..3 {
        assert!(s1.acquire(&key(&format!("au/released{i}")), Duration::ZERO).await.unwrap().release().await.unwrap());
    }
    s1.close().await.unwrap();
    let s2 = a.open_session_for("au", None).await.unwrap();
    let _closed = s2.acquire(&key("au/closed"), Duration::ZERO).await.unwrap();
    s2.close().await.unwrap();
    let s3 = a.open_session_for("aua", None).await.unwrap();
    let _forced1 = s3.acquire(&key("aua/forced1"), Duration::ZERO).await.unwrap();
    ops.release("aua/forced1");

    // Both sinks got the first run's batches, the force-release included.
    let ch = sinks.clickhouse();
    let archive = sinks.archive();
    until("the first force-release in ClickHouse and the archive", || {
        ch.events().unwrap().iter().any(|e| e.kind == Kind::ForceRelease && e.key.as_deref() == Some("aua/forced1"))
            && archive.list().unwrap().len() == 2
    })
    .await;
    let before_kill = ch.positions().unwrap();
    assert!(holdfast_audit::store::read_checkpoint(&store).unwrap().is_none(), "the first run must not have checkpointed");

    // kill -9: no last checkpoint, no resignation.
    sigkill_group(tailer.pid().unwrap());
    drop(tailer);
    // Changes while no tailer runs.
    let s4 = a.open_session_for("aua", None).await.unwrap();
    for i in 0..3 {
        assert!(s4.acquire(&key(&format!("aua/down{i}")), Duration::ZERO).await.unwrap().release().await.unwrap());
    }
    let killed_at = etcd.revision().await;

    // The restart replays from revision 1 into both sinks.
    let _tailer = tailer_with(Duration::from_millis(500));
    let _forced2 = s4.acquire(&key("aua/forced2"), Duration::ZERO).await.unwrap();
    ops.release("aua/forced2");
    for i in 0..3 {
        assert!(s4.acquire(&key(&format!("aua/after{i}")), Duration::ZERO).await.unwrap().release().await.unwrap());
    }
    let _live = s4.acquire(&key("aua/live"), Duration::ZERO).await.unwrap();
    let through = tailer_caught_up(&etcd, &store).await;

    // ClickHouse (FINAL) holds exactly the store's events, each once.
    // (Both may already hold changes after `through`: the store is read
    // first, and ClickHouse is written after it.)
    let stored: Vec<Event> =
        holdfast_audit::store::read_events(&store).unwrap().into_iter().filter(|e| e.revision.is_some_and(|r| r <= through)).collect();
    assert!(stored.iter().all(|e| e.kind != Kind::Gap), "no gap expected");
    let in_store = positions(&stored);
    let in_clickhouse: BTreeSet<_> = ch.positions().unwrap().into_iter().filter(|p| p.1 <= through).collect();
    let listed = ch.positions().unwrap();
    assert_eq!(listed.len(), listed.iter().collect::<BTreeSet<_>>().len(), "FINAL returns each position once");
    let missing: Vec<_> = in_store.difference(&in_clickhouse).take(10).collect();
    let extra: Vec<_> = in_clickhouse.difference(&in_store).take(10).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing from ClickHouse {missing:?}; not in the store {extra:?}");
    let replayed = before_kill.iter().filter(|p| p.1 <= killed_at).count();
    assert!(replayed > 0, "the restart had nothing to replay");

    // And equal events. A replayed event stamped with the tailer's own
    // observation (its time, and the hold time measured to it) keeps its
    // first copy in the store (a replay is skipped) and its last in
    // ClickHouse (the last insert replaces): only those two fields may
    // differ, later in ClickHouse, and only for what the first run sent.
    let from_clickhouse: BTreeMap<_, _> =
        ch.events().unwrap().into_iter().filter(|e| e.revision.is_some_and(|r| r <= through)).map(|e| (e.position(), e)).collect();
    let mut retimed = 0;
    for e in &stored {
        let c = &from_clickhouse[&e.position()];
        if c != e && e.time_source == TimeSource::Observed && e.revision.is_some_and(|r| r <= killed_at) {
            assert!(c.time_unix_ms > e.time_unix_ms && c.held_ms >= e.held_ms, "a replay observes later: {e:?} vs {c:?}");
            assert_eq!(&Event { time_unix_ms: e.time_unix_ms, held_ms: e.held_ms, ..c.clone() }, e);
            retimed += 1;
        } else {
            assert_eq!(c, e, "ClickHouse's copy of {:?} differs from the store's", e.position());
        }
    }
    let rows = sinks.clickhouse.query("SELECT count() FROM `holdfast`.`audit_events`").unwrap();
    println!(
        "{} events; {replayed} replayed into ClickHouse ({retimed} with a later observed time); {} rows before merges",
        stored.len(),
        rows.trim()
    );

    // The archive: both force-releases, each as its raw record and its
    // event, each once, each under COMPLIANCE for seven years.
    let releases: Vec<&Event> = stored.iter().filter(|e| e.kind == Kind::ForceRelease).collect();
    assert_eq!(releases.iter().map(|e| e.key.as_deref()).collect::<Vec<_>>(), [Some("aua/forced1"), Some("aua/forced2")], "{releases:?}");
    let records: Vec<&Event> = stored.iter().filter(|e| e.kind == Kind::Record && e.etcd_key.starts_with(layout::FORCE_PREFIX)).collect();
    assert_eq!(records.len(), 2, "{records:?}");
    let mut expected = Vec::new();
    for r in &records {
        let nonce = r.etcd_key.strip_prefix(layout::FORCE_PREFIX).unwrap();
        expected.push(archive.record_key(&r.cluster_id, r.revision.unwrap(), nonce).unwrap());
    }
    for e in &releases {
        expected.push(archive.event_key(e).unwrap());
    }
    expected.sort();
    let listed = archive.list().unwrap();
    assert_eq!(listed, expected, "the archive holds exactly the two records and the two events");
    let now = SystemTime::now();
    for k in &listed {
        assert_eq!(sinks.versions(k).len(), 1, "{k}: one version, however often it was replayed");
        let retention = archive.object_retention(k).unwrap().unwrap_or_else(|| panic!("{k} has no retention"));
        assert_eq!(retention.mode, LOCK_MODE, "{k}");
        let left = retention.retain_until.duration_since(now).unwrap();
        assert!(left > DEFAULT_RETENTION - Duration::from_secs(3600) && left <= DEFAULT_RETENTION, "{k}: {left:?} left");
    }
    for (r, forced) in records.iter().zip(["aua/forced1", "aua/forced2"]) {
        let nonce = r.etcd_key.strip_prefix(layout::FORCE_PREFIX).unwrap();
        let k = archive.record_key(&r.cluster_id, r.revision.unwrap(), nonce).unwrap();
        let archived: ArchivedRecord = serde_json::from_slice(&archive.get(&k).unwrap()).unwrap();
        assert_eq!(
            (archived.cluster_id.as_str(), archived.revision, archived.etcd_key.as_str()),
            (r.cluster_id.as_str(), r.revision.unwrap(), r.etcd_key.as_str())
        );
        let ForceRecord { namespace, key, requester, reason, .. } = &archived.record;
        assert_eq!(format!("{namespace}/{key}"), forced);
        assert_eq!((requester.as_str(), reason.as_str()), ("alice", "a stuck batch job"));
        assert!(!archived.record.approver.is_empty(), "{archived:?}");
    }
    for e in &releases {
        let archived: Event = serde_json::from_slice(&archive.get(&archive.event_key(e).unwrap()).unwrap()).unwrap();
        assert_eq!(&archived, *e, "the archive's copy of the force-release is the store's");
    }
}

/// Whether `n` appears in `text` as a whole token: a run of letters and
/// digits equal to its decimal form (so a hex ID or a timestamp that
/// happens to contain its digits does not count).
fn mentions(text: &str, n: u64) -> bool {
    let n = n.to_string();
    text.split(|c: char| !c.is_ascii_alphanumeric()).any(|t| t == n)
}

/// Every place a reader can see the tailer's work, as text: the store's
/// segment lines, ClickHouse's rows, the Parquet export's rows, the
/// tailer's metrics and log, and `holdfastctl audit` in each of its forms.
async fn outputs(dir: &Path, store: &Path, clickhouse: &ClickHouseServer, port: u16) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in std::fs::read_dir(store.join("segments")).unwrap() {
        let path = f.unwrap().path();
        out.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
    }
    let rows = clickhouse.query("SELECT * FROM `holdfast`.`audit_events` FINAL FORMAT JSONEachRow").unwrap();
    out.push(("ClickHouse rows".into(), rows));
    let parquet_file = dir.join("grants.parquet");
    let ran = Ran::of(
        std::process::Command::new(bin("holdfastctl")).args(["audit", "export", "--out"]).arg(&parquet_file).arg("--store").arg(store),
    );
    assert_eq!(ran.code, 0, "{ran}");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&parquet_file).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<String> = reader.map(|b| format!("{:?}", b.unwrap())).collect();
    out.push(("Parquet rows".into(), batches.join("\n")));
    out.push(("tailer metrics".into(), scrape(port).await));
    out.push(("tailer log".into(), std::fs::read_to_string(dir.join("tailer.log")).unwrap()));
    let held_key = format!("{DURABLE_CLASSES}q/k");
    for args in [
        &["--all"][..],
        &["--all", "--json"],
        &["--all", "--csv"],
        &[held_key.as_str()],
        &["--kind", "grant,wait-end", "--json"],
        &["--report", "longest", "--json"],
        &["--report", "expiries"],
    ] {
        let ran = Ran::of(std::process::Command::new(bin("holdfastctl")).arg("audit").arg("--store").arg(store).args(args));
        assert_eq!(ran.code, 0, "{ran}");
        out.push((format!("holdfastctl audit {}", args.join(" ")), format!("{}\n{}", ran.stdout, ran.stderr)));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_holds_revision_is_in_no_output_until_the_hold_ends() {
    let dir = TestDir::new("audit-live-token");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    // durableq: a durable class (a waiter is queued in etcd, and its grant ends
    // the wait in the same revision).
    let _controller = etcd.publish_policy(&dir.path, &[(&format!("{DURABLE_CLASSES}q"), 30)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = etcd.config_as(ARBITER.name);
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    let log = dir.path.join("clickhouse.log");
    let clickhouse = ClickHouseServer::start(&dir.path.join("clickhouse"), &log).unwrap_or_else(|e| panic!("{e:#}"));
    let config = ClickHouseConfig { timeout: Duration::from_secs(5), ..ClickHouseConfig::new(clickhouse.url()) };
    let store = dir.path.join("audit");
    let port = free_port();
    let _tailer = start_tailer_with(&dir.path, "tailer", etcd.config_as(TAILER.name), &store, port, &|c| {
        c.clickhouse = Some(config.clone());
    });
    let withheld = || async { sample(&scrape(port).await, "holdfast_tailer_withheld_revisions{cluster=\"tailer\"}") };

    // Past a thousand revisions, so the one looked for is not a small
    // number that other fields hold by chance.
    let mut root = etcd.client().await;
    for i in 0..1200 {
        root.put("/test/pad", i.to_string(), None).await.unwrap();
    }
    let ns = format!("{DURABLE_CLASSES}q");
    let k = key(&format!("{ns}/k"));
    let a = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let b = arbiter.client(&pki, &pki.workload("b", "svc/b")).await;
    let sa = a.open_session_for(&ns, None).await.unwrap();
    let sb = b.open_session_for(&ns, None).await.unwrap();
    // a holds; b waits (queued in etcd); a's release grants b in the
    // revision that also ends b's wait.
    let first = sa.acquire(&k, Duration::ZERO).await.unwrap();
    let waiting = tokio::spawn(async move { sb.acquire(&k, Duration::from_secs(20)).await.map(|h| (sb, h)) });
    let end = Instant::now() + Duration::from_secs(10);
    while root.get("/q/", Some(etcd_client::GetOptions::new().with_prefix().with_count_only())).await.unwrap().count() == 0 {
        assert!(Instant::now() < end, "b's wait was not queued in etcd within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_revision = first.token().revision();
    assert!(first.release().await.unwrap());
    let (sb, live) = waiting.await.unwrap().unwrap();
    let r = live.token().revision();
    assert!(r > 1000 && r > first_revision, "{r}");
    // Later changes, stored while the hold lives.
    let later = sa.acquire(&key(&format!("{ns}/other")), Duration::ZERO).await.unwrap();
    let later_revision = later.token().revision() as i64;
    assert!(later.release().await.unwrap());
    let through = tailer_caught_up(&etcd, &store).await;
    assert!(through > later_revision);
    let ch = ClickHouse::connect(&config).unwrap();
    until("the later release in ClickHouse", || ch.positions().unwrap().iter().any(|p| p.1 > later_revision)).await;

    // The wait-end shares the grant's revision: both withheld.
    let held = holdfast_audit::store::read_withheld(&store).unwrap();
    let kinds: Vec<Kind> = held.get(&(r as i64)).map(|w| w.events.iter().map(|e| e.kind).collect()).unwrap_or_default();
    assert!(kinds.contains(&Kind::Grant) && kinds.contains(&Kind::WaitEnd), "withheld at {r}: {held:?}");
    assert_eq!(withheld().await, 1.0);
    let seen = outputs(&dir.path, &store, &clickhouse, port).await;
    for (what, text) in &seen {
        assert!(!mentions(text, r), "the live hold's revision {r} is in the {what}:\n{text}");
    }
    // The scan finds revisions where they are: the first hold's (ended),
    // in the store, ClickHouse and the CLI.
    for what in ["segments", "ClickHouse rows", "holdfastctl audit --all --json"] {
        let (_, text) = seen.iter().find(|(w, _)| w.contains(what)).unwrap();
        assert!(mentions(text, first_revision), "the ended hold's revision {first_revision} is not in the {what}");
    }

    // The hold ends: its revision is recorded everywhere the others are.
    assert!(live.release().await.unwrap());
    sb.close().await.unwrap();
    tailer_caught_up(&etcd, &store).await;
    until("the withheld revision stored", || holdfast_audit::store::read_withheld(&store).unwrap().is_empty()).await;
    until("the grant in ClickHouse", || ch.positions().unwrap().iter().any(|p| p.1 == r as i64)).await;
    assert_eq!(withheld().await, 0.0);
    let seen = outputs(&dir.path, &store, &clickhouse, port).await;
    for what in ["segments", "ClickHouse rows", "holdfastctl audit --all --json", &format!("holdfastctl audit {ns}/k")] {
        let (_, text) = seen.iter().find(|(w, _)| w.contains(what)).unwrap();
        assert!(mentions(text, r), "after the release, revision {r} is not in the {what}:\n{text}");
    }
    let (_, parquet) = seen.iter().find(|(w, _)| w == "Parquet rows").unwrap();
    assert_eq!(parquet.matches(&format!("\"{ns}/k\"")).count(), 2, "both holds of dq/k are rows once ended:\n{parquet}");
    let events = holdfast_audit::store::read_events(&store).unwrap();
    let at_r: Vec<Kind> = events.iter().filter(|e| e.revision == Some(r as i64)).map(|e| e.kind).collect();
    assert!(at_r.contains(&Kind::Grant) && at_r.contains(&Kind::WaitEnd), "{at_r:?}");
    let lines: usize = std::fs::read_dir(store.join("segments"))
        .unwrap()
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap().lines().count())
        .sum();
    assert_eq!(lines, events.len(), "each change stored once");
}

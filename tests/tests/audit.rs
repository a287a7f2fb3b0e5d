//! The audit trail (holdfast-tailer and `holdfastctl audit`) against a real
//! etcd over mTLS with authentication on, a real controller and arbiter,
//! and the tailer's own read-only role: a scripted workload is recorded
//! once per change with the right kinds; kill -9 of the active tailer loses
//! and duplicates nothing and a standby takes over; compaction past the
//! checkpoint is a gap event and an alarm.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_audit::{Event, Kind};
use holdfast_config::EtcdConfig;
use holdfast_devkit::ports::free_port;
use holdfast_model::LockKey;
use holdfast_store::roles::{ARBITER, TAILER};
use holdfast_tests::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn key(k: &str) -> LockKey {
    LockKey::parse(k).unwrap()
}

/// Every `(revision, index)` etcd's log holds from revision 1 to `through`:
/// the reference the tailer's store is compared with.
async fn etcd_positions(etcd: &Etcd, through: i64) -> BTreeSet<(i64, u32)> {
    let mut client = etcd.client().await;
    let opts = etcd_client::WatchOptions::new().with_range(vec![0]).with_start_revision(1);
    let mut stream = client.watch(vec![0], Some(opts)).await.unwrap();
    let mut positions = BTreeSet::new();
    let (mut revision, mut index) = (0, 0);
    while revision < through {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.unwrap().unwrap().unwrap();
        assert_eq!(resp.compact_revision(), 0, "the reference history was compacted");
        for ev in resp.events() {
            let r = ev.kv().unwrap().mod_revision();
            index = if r == revision { index + 1 } else { 0 };
            revision = r;
            if r <= through {
                positions.insert((r, index));
            }
        }
    }
    positions
}

/// Asserts the store holds exactly etcd's positions; names the first
/// differences rather than print thousands.
fn same(stored: &BTreeSet<(i64, u32)>, etcd: &BTreeSet<(i64, u32)>, what: &str) {
    // The store may already hold changes after the last revision compared.
    let through = etcd.last().map_or(0, |p| p.0);
    let stored: BTreeSet<_> = stored.iter().filter(|p| p.0 <= through).copied().collect();
    let stored = &stored;
    let missing: Vec<_> = etcd.difference(stored).take(10).collect();
    let extra: Vec<_> = stored.difference(etcd).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: {} stored, {} in etcd's log; missing {missing:?}; not in etcd {extra:?}",
        stored.len(),
        etcd.len()
    );
}

/// The positions the tailer recorded (no gap events): its store's and
/// those it withholds while a hold granted in their revision lives (read
/// first: one released in between is then in both); and the number of
/// event lines in the store's segment files beyond one per stored position
/// (a duplicate would be a second line).
fn stored(store: &Path) -> (BTreeSet<(i64, u32)>, usize) {
    let withheld = holdfast_audit::store::read_withheld(store).unwrap();
    let events = holdfast_audit::store::read_events(store).unwrap();
    let mut positions: BTreeSet<(i64, u32)> = events.iter().filter(|e| e.kind != Kind::Gap).map(Event::position).collect();
    let mut lines = 0;
    for f in std::fs::read_dir(store.join("segments")).unwrap() {
        lines += std::fs::read_to_string(f.unwrap().path()).unwrap().lines().count();
    }
    let duplicates = lines - events.len();
    positions.extend(withheld.values().flat_map(|w| w.events.iter().filter(|e| e.kind != Kind::Gap).map(Event::position)));
    (positions, duplicates)
}

fn audit(store: &Path, args: &[&str]) -> Ran {
    Ran::of(Command::new(bin("holdfastctl")).arg("audit").arg("--store").arg(store).args(args))
}

struct Lab {
    etcd: Etcd,
    pki: Pki,
    arbiter: Arbiter,
    _controller: holdfast_devkit::controller::ControllerProcess,
    dir: TestDir,
}

async fn lab(name: &str) -> Lab {
    let dir = TestDir::new(name);
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    // au: fenced (10 s, a fixture pause-test result); aua: advisory (30 s).
    let controller = etcd.publish_policy(&dir.path, &[("au", 10), ("aua", 30)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    Lab { etcd, pki, arbiter, _controller: controller, dir }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_workload_is_recorded_once_per_change_with_the_right_kinds() {
    let lab = lab("audit-scripted").await;
    let store = lab.dir.path.join("audit");
    let _tailer = start_tailer(&lab.dir.path, "tailer", lab.etcd.config_as(TAILER.name), &store, free_port());
    let a = lab.arbiter.client(&lab.pki, &lab.pki.workload("a", "svc/a")).await;

    // Released, then the session closed.
    let s1 = a.open_session_for("au", None).await.unwrap();
    let h = s1.acquire(&key("au/released"), Duration::ZERO).await.unwrap();
    assert!(h.release().await.unwrap());
    s1.close().await.unwrap();
    // The session closed while holding.
    let s2 = a.open_session_for("au", None).await.unwrap();
    let _h2 = s2.acquire(&key("au/closed"), Duration::ZERO).await.unwrap();
    s2.close().await.unwrap();
    // The client stopped keeping its session alive while holding: expiry.
    let s3 = a.open_session_for("au", None).await.unwrap();
    let _h3 = s3.acquire(&key("au/expired"), Duration::ZERO).await.unwrap();
    drop(s3);
    // Two-person force-release of a live hold.
    let s4 = a.open_session_for("aua", None).await.unwrap();
    let _h4 = s4.acquire(&key("aua/forced"), Duration::ZERO).await.unwrap();
    let ops = ForceOps::new(&lab.dir.path, &lab.etcd);
    ops.release("aua/forced");
    // A hold still live at the end.
    let _live = s4.acquire(&key("aua/live"), Duration::ZERO).await.unwrap();

    // Wait for etcd to expire s3 (10 s TTL).
    let mut etcd = lab.etcd.client().await;
    let end = Instant::now() + Duration::from_secs(30);
    while !etcd.get("/l/au/expired", None).await.unwrap().kvs().is_empty() {
        assert!(Instant::now() < end, "au/expired did not expire within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let through = tailer_caught_up(&lab.etcd, &store).await;

    // The store holds exactly etcd's history, each change once.
    let (positions, duplicates) = stored(&store);
    assert_eq!(duplicates, 0, "a change is stored twice");
    same(&positions, &etcd_positions(&lab.etcd, through).await, "the store and etcd's log");

    // Per key, the kinds in order, from the operator's command.
    let out = audit(&store, &["--json", "--namespace", "au"]);
    assert_eq!(out.code, 0, "{out}");
    let events: Vec<Event> = serde_json::from_str(&out.stdout).unwrap();
    let kinds = |k: &str| events.iter().filter(|e| e.key.as_deref() == Some(k)).map(|e| e.kind).collect::<Vec<_>>();
    assert_eq!(kinds("au/released"), [Kind::Grant, Kind::Release]);
    assert_eq!(kinds("au/closed"), [Kind::Grant, Kind::Close]);
    assert_eq!(kinds("au/expired"), [Kind::Grant, Kind::Expiry], "an expiry is never recorded as a release");
    for e in &events {
        assert_eq!(e.identity.as_deref(), Some("spiffe://holdfast.dev/svc/a"), "{e:?}");
        assert_eq!((e.class.as_deref(), e.namespace.as_deref(), e.epoch), (Some("au"), Some("au"), Some(1)), "{e:?}");
        assert!(e.revision.is_some() && e.session.is_some(), "{e:?}");
    }
    let out = audit(&store, &["--json", "--namespace", "aua"]);
    let events: Vec<Event> = serde_json::from_str(&out.stdout).unwrap();
    let forced: Vec<_> = events.iter().filter(|e| e.key.as_deref() == Some("aua/forced")).collect();
    assert_eq!(forced.iter().map(|e| e.kind).collect::<Vec<_>>(), [Kind::Grant, Kind::ForceRelease]);
    let f = forced[1];
    assert_eq!((f.requester.as_deref(), f.reason.as_deref(), f.fenced), (Some("alice"), Some("a stuck batch job"), Some(false)), "{f:?}");
    assert!(f.approver.as_deref().is_some_and(|a| !a.is_empty()), "{f:?}");
    // The live hold's grant is withheld by the tailer (its revision is the
    // token's half): not in the store yet.
    assert!(events.iter().all(|e| e.key.as_deref() != Some("aua/live")), "{events:?}");

    // Sessions: two closes, one lapse, one still open.
    let out = audit(&store, &["--json", "--kind", "session-open,session-close,session-lapse,session-end"]);
    let sessions: Vec<Event> = serde_json::from_str(&out.stdout).unwrap();
    let count = |k: Kind| sessions.iter().filter(|e| e.kind == k).count();
    assert_eq!((count(Kind::SessionOpen), count(Kind::SessionClose), count(Kind::SessionLapse), count(Kind::SessionEnd)), (4, 2, 1, 0));

    // The client-health report and the text forms.
    let out = audit(&store, &["--report", "expiries", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(rows, serde_json::json!([{"namespace": "au", "identity": "spiffe://holdfast.dev/svc/a", "expiries": 1, "releases": 1}]));
    let out = audit(&store, &["au/expired"]);
    assert!(out.code == 0 && out.stdout.contains("expiry") && out.stdout.contains("(2 rows)"), "{out}");
    let out = audit(&store, &["--csv", "--kind", "force-release"]);
    assert!(out.stdout.starts_with("time,kind,key,identity") && out.stdout.contains("requested by alice"), "{out}");
    let out = audit(&store, &["--kind", "grants"]);
    assert!(out.code == 64 && out.stderr.contains("not a kind"), "{out}");
    let out = audit(&lab.dir.path.join("nowhere"), &[]);
    assert!(out.code == 78 && out.stderr.contains("--store"), "{out}");
    // The risk register counts the advisory class's grants from the store.
    let policy = lab.dir.path.join("policy").display().to_string();
    let store_arg = store.display().to_string();
    let out = Ran::of(Command::new(bin("holdfastctl")).args(["risk-register", "--dir", &policy, "--audit-store", &store_arg, "--json"]));
    let register: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let aua = register.as_array().unwrap().iter().find(|r| r["class"] == "aua").unwrap_or_else(|| panic!("{register}"));
    assert_eq!(aua["grants"], 1, "aua/forced (aua/live's grant is withheld while it lives): {register}");
    let out = Ran::of(Command::new(bin("holdfastctl")).args(["risk-register", "--dir", &policy, "--audit-store", &store_arg]));
    assert!(out.stdout.contains("GRANTS"), "{out}");
    // The Parquet export for the archive: every ended hold, no live one.
    let parquet_file = lab.dir.path.join("grants.parquet");
    let out = Ran::of(Command::new(bin("holdfastctl")).args(["audit", "export", "--out"]).arg(&parquet_file).arg("--store").arg(&store));
    assert!(out.code == 0 && out.stdout.contains("wrote 4 ended hold(s)"), "{out}");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&parquet_file).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let mut ended = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let column = |name: &str| batch.column_by_name(name).unwrap().as_any().downcast_ref::<arrow_array::StringArray>().unwrap().clone();
        let (keys, how) = (column("key"), column("ended_by"));
        ended.extend((0..batch.num_rows()).map(|i| format!("{} {}", keys.value(i), how.value(i))));
    }
    ended.sort();
    assert_eq!(ended, ["au/closed close", "au/expired expiry", "au/released release", "aua/forced force-release"]);
    // No token anywhere in the output.
    let all = audit(&store, &["--all", "--json"]);
    assert!(!all.stdout.contains("create_revision") && !all.stdout.contains("token"), "{all}");
}

/// Sessions taking and releasing locks, some closed while holding, until
/// `stop` is set; returns how many grants it made.
async fn workload(client: holdfast_client::Client, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> u64 {
    let mut grants = 0;
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let s = client.open_session_for("aua", None).await.unwrap();
        for _ in 0..5 {
            i += 1;
            let h = s.acquire(&key(&format!("aua/k{}", i % 7)), Duration::ZERO).await.unwrap();
            grants += 1;
            if !i.is_multiple_of(4) {
                h.release().await.unwrap();
            }
        }
        s.close().await.unwrap();
    }
    grants
}

fn leader(text: &str, name: &str) -> bool {
    sample_opt(text, &format!("holdfast_tailer_leader{{cluster=\"{name}\"}}")) == Some(1.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_active_tailer_loses_and_duplicates_nothing() {
    let lab = lab("audit-kill").await;
    let names = ["t1", "t2"];
    let ports = [free_port(), free_port()];
    let stores = [lab.dir.path.join("audit-t1"), lab.dir.path.join("audit-t2")];
    let start = |i: usize| start_tailer(&lab.dir.path, names[i], lab.etcd.config_as(TAILER.name), &stores[i], ports[i]);
    let mut tailers = [Some(start(0)), None];
    tokio::time::sleep(Duration::from_secs(1)).await;
    tailers[1] = Some(start(1));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = lab.arbiter.client(&lab.pki, &lab.pki.workload("a", "svc/a")).await;
    let load = tokio::spawn(workload(client, stop.clone()));

    let active = |text: [&str; 2]| (0..2).filter(|&i| leader(text[i], names[i])).collect::<Vec<_>>();
    let mut takeovers = Vec::new();
    for round in 0..4 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let texts = [scrape(ports[0]).await, scrape(ports[1]).await];
        let now = active([&texts[0], &texts[1]]);
        assert_eq!(now.len(), 1, "round {round}: exactly one active tailer, got {now:?}");
        let victim = now[0];
        let pid = tailers[victim].as_ref().unwrap().pid().unwrap();
        sigkill_group(pid);
        let killed = Instant::now();
        tailers[victim] = None;
        let other = 1 - victim;
        loop {
            if leader(&scrape(ports[other]).await, names[other]) {
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(15), "round {round}: no standby took over within 15 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        takeovers.push(killed.elapsed());
        tailers[victim] = Some(start(victim));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let grants = load.await.unwrap();
    assert!(grants > 20, "the workload made only {grants} grants");
    // The election TTL is 2 s: a standby takes over within a few seconds.
    for t in &takeovers {
        assert!(*t < Duration::from_secs(8), "takeovers {takeovers:?}");
    }

    // The active store equals etcd's history; then the other takes over and
    // catches up from its own checkpoint to the same.
    let texts = [scrape(ports[0]).await, scrape(ports[1]).await];
    let first = active([&texts[0], &texts[1]])[0];
    let through = tailer_caught_up(&lab.etcd, &stores[first]).await;
    let reference = etcd_positions(&lab.etcd, through).await;
    let (positions, duplicates) = stored(&stores[first]);
    assert_eq!(duplicates, 0, "a change is stored twice");
    same(&positions, &reference, "the active store and etcd's log");
    tailers[first].as_mut().unwrap().stop(Duration::from_secs(10));
    let other = 1 - first;
    let through = tailer_caught_up(&lab.etcd, &stores[other]).await;
    let reference = etcd_positions(&lab.etcd, through).await;
    let (positions, duplicates) = stored(&stores[other]);
    assert_eq!(duplicates, 0, "a change is stored twice");
    same(&positions, &reference, "the other store, caught up, and etcd's log");
    println!("{grants} grants; takeovers {takeovers:?}; {} changes recorded", reference.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn compaction_past_the_checkpoint_is_a_gap_event_and_an_alarm() {
    let lab = lab("audit-gap").await;
    let store = lab.dir.path.join("audit");
    let port = free_port();
    let mut tailer = start_tailer(&lab.dir.path, "tailer", lab.etcd.config_as(TAILER.name), &store, port);
    let a = lab.arbiter.client(&lab.pki, &lab.pki.workload("a", "svc/a")).await;
    let s = a.open_session_for("aua", None).await.unwrap();
    s.acquire(&key("aua/before"), Duration::ZERO).await.unwrap().release().await.unwrap();
    tailer_caught_up(&lab.etcd, &store).await;
    tailer.stop(Duration::from_secs(10));
    // (Stopping writes a last checkpoint; its resignation comes after it.)
    let checkpoint = holdfast_audit::store::read_checkpoint(&store).unwrap().unwrap().revision;

    // While the tailer is down: changes, then etcd compacts them away.
    for i in 0..3 {
        s.acquire(&key(&format!("aua/lost{i}")), Duration::ZERO).await.unwrap().release().await.unwrap();
    }
    let compacted = lab.etcd.revision().await;
    lab.etcd.client().await.compact(compacted, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();

    let _tailer = start_tailer(&lab.dir.path, "tailer", lab.etcd.config_as(TAILER.name), &store, port);
    s.acquire(&key("aua/after"), Duration::ZERO).await.unwrap().release().await.unwrap();
    tailer_caught_up(&lab.etcd, &store).await;
    let out = audit(&store, &["--json", "--kind", "gap"]);
    let gaps: Vec<Event> = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(gaps.len(), 1, "{out}");
    assert_eq!(gaps[0].gap_from, Some(checkpoint + 1), "{:?}", gaps[0]);
    assert!(gaps[0].gap_to.is_some_and(|t| t >= compacted), "{:?}", gaps[0]);
    let text = audit(&store, &["--kind", "gap"]);
    assert!(text.stdout.contains("LOST"), "{text}");
    let metrics = scrape(port).await;
    assert_eq!(sample(&metrics, "holdfast_tailer_gap_alarm{cluster=\"tailer\"}"), 1.0, "{metrics}");
    assert_eq!(sample(&metrics, "holdfast_tailer_gaps_total{cluster=\"tailer\"}"), 1.0, "{metrics}");
    // What came before and after the gap is there; what was lost is not
    // pretended.
    let keys = audit(&store, &["--json", "--kind", "grant"]);
    let grants: Vec<Event> = serde_json::from_str(&keys.stdout).unwrap();
    let names: Vec<_> = grants.iter().filter_map(|e| e.key.clone()).collect();
    assert_eq!(names, ["aua/before", "aua/after"], "{keys}");
    let log = std::fs::read_to_string(lab.dir.path.join("tailer.log")).unwrap();
    assert!(log.contains("GAP in the audit trail"), "{log}");
}

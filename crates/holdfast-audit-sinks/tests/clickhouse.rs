//! The ClickHouse sink against a real ClickHouse server (Debian 12's
//! `clickhouse-server`, 18.16) on 127.0.0.1. These tests fail, never skip,
//! when the server is not installed: run `scripts/install-deps`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_audit::event::{Kind, TimeSource};
use holdfast_audit::sink::Sink;
use holdfast_audit::store::{Store, read_events};
use holdfast_audit::{Event, event::cluster_hex};
use holdfast_audit_sinks::clickhouse::{ClickHouse, ClickHouseConfig, NAME};
use holdfast_fixtures::clickhouse::ClickHouseServer;
use std::time::Duration;

struct Fixture {
    server: ClickHouseServer,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-clickhouse-").tempdir().unwrap();
        let log = dir.path().join("clickhouse.log");
        let server = match ClickHouseServer::start(&dir.path().join("clickhouse"), &log) {
            Ok(s) => s,
            Err(e) => {
                print_log(&log);
                panic!("{e:#}");
            }
        };
        eprintln!("clickhouse-server answered /ping after {:?}", server.startup);
        Fixture { server, dir }
    }

    fn config(&self) -> ClickHouseConfig {
        let mut c = ClickHouseConfig::new(self.server.url());
        c.timeout = Duration::from_secs(5);
        c
    }

    fn connect(&self) -> ClickHouse {
        ClickHouse::connect(&self.config()).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log(&self.server.log);
        }
    }
}

fn print_log(path: &std::path::Path) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!("--- last lines of {} ---", path.display());
    for l in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("{l}");
    }
}

const CLUSTER: u64 = 0x00c0_ffee_0000_0001;

/// Two events per revision, every kind of field filled somewhere.
fn events(revisions: std::ops::RangeInclusive<i64>) -> Vec<Event> {
    let mut out = Vec::new();
    for rev in revisions {
        let t = 1_700_000_000_000 + rev as u64;
        let mut grant = Event::new(CLUSTER, rev, 0, Kind::Grant, &format!("/l/payments/key-{rev}"), t);
        grant.time_source = TimeSource::Record;
        grant.identity = Some("spiffe://example.org/ns/payments/sa/worker".into());
        grant.namespace = Some("payments".into());
        grant.key = Some(format!("payments/key-{rev}"));
        grant.class = Some("exclusive".into());
        grant.tier = Some("gold".into());
        grant.session = Some("000000000000beef".into());
        grant.epoch = Some(3);
        out.push(grant);
        let mut end = Event::new(CLUSTER, rev, 1, if rev % 2 == 0 { Kind::Release } else { Kind::ForceRelease }, "/l/payments/old", t);
        end.held_ms = Some(u64::MAX - rev as u64);
        end.key = Some("payments/old".into());
        if end.kind == Kind::ForceRelease {
            end.requester = Some("alice".into());
            end.approver = Some("bob".into());
            // Quotes, a tab, a newline, a control character and non-ASCII
            // text survive JSONEachRow both ways.
            end.reason = Some("stuck \"holder\"\tafter\nfailover \u{1} — ünïcode ✓".into());
            end.fenced = Some(rev % 3 == 0);
        }
        out.push(end);
    }
    out
}

#[test]
fn a_replayed_or_overlapping_batch_leaves_each_event_once() {
    let fx = Fixture::start();
    let mut sink = fx.connect();
    assert_eq!(sink.name(), NAME);
    let mut store = Store::open(&fx.dir.path().join("store")).unwrap();

    let first = events(10..=12);
    let overlap = events(12..=14);
    let mut gap = Event::new(CLUSTER, 20, 0, Kind::Gap, "", 1_700_000_000_020);
    gap.gap_from = Some(-1);
    gap.gap_to = Some(i64::MAX);
    let batches = [first.clone(), first.clone(), overlap, vec![gap]];
    for batch in &batches {
        sink.append(batch).unwrap_or_else(|e| panic!("{e}"));
        Sink::append(&mut store, batch).unwrap();
    }

    // Every copy is on disk until ClickHouse merges; FINAL sees one.
    let raw: u64 = fx.server.query("SELECT count() FROM holdfast.audit_events").unwrap().trim().parse().unwrap();
    assert_eq!(raw, 6 + 6 + 6 + 1);
    let stored = read_events(store.dir()).unwrap();
    assert_eq!(stored.len(), 11);
    let expected: Vec<(String, i64, u32)> = stored.iter().map(|e| (e.cluster_id.clone(), e.revision.unwrap(), e.index)).collect();
    assert_eq!(sink.positions().unwrap(), expected, "ClickHouse and the embedded store hold the same events");
    assert_eq!(sink.count().unwrap(), 11);
    // Every field comes back as it went in: kind, key, identity, held_ms,
    // nulls, fenced, the awkward reason, the gap's bounds.
    assert_eq!(sink.events().unwrap(), stored);
    let back = sink.events().unwrap();
    let grant = &back[0];
    assert_eq!((grant.kind, grant.key.as_deref(), grant.held_ms), (Kind::Grant, Some("payments/key-10"), None));
    assert_eq!(grant.identity.as_deref(), Some("spiffe://example.org/ns/payments/sa/worker"));
    assert_eq!(back[3].kind, Kind::ForceRelease);
    assert_eq!(back[3].held_ms, Some(u64::MAX - 11));
    assert_eq!(back[3].reason, first[3].reason);
    assert_eq!(back[10].gap_to, Some(i64::MAX));

    // A restarted tailer connects to the table it made and appends again.
    let mut again = fx.connect();
    again.append(&events(14..=16)).unwrap();
    assert_eq!(again.count().unwrap(), 15);

    // The same revision and index in another cluster is another event.
    let mut other = events(10..=10);
    for e in &mut other {
        e.cluster_id = cluster_hex(CLUSTER + 1);
    }
    again.append(&other).unwrap();
    assert_eq!(again.count().unwrap(), 17);
    let positions = again.positions().unwrap();
    assert_eq!(positions.iter().filter(|(_, rev, _)| *rev == 10).count(), 4);

    // After a forced merge the duplicates are gone from disk too. OPTIMIZE
    // does nothing, silently, while a background merge holds the parts.
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        fx.server.query("OPTIMIZE TABLE holdfast.audit_events FINAL").unwrap();
        let raw: u64 = fx.server.query("SELECT count() FROM holdfast.audit_events").unwrap().trim().parse().unwrap();
        if raw == 17 {
            break;
        }
        assert!(std::time::Instant::now() < end, "still {raw} rows on disk after OPTIMIZE FINAL");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(again.positions().unwrap(), positions);
}

#[test]
fn an_insert_clickhouse_refuses_is_an_error_naming_the_sink() {
    let fx = Fixture::start();
    let mut sink = fx.connect();
    sink.append(&events(1..=1)).unwrap();
    fx.server.query("DROP TABLE holdfast.audit_events").unwrap();

    let err = sink.append(&events(2..=2)).unwrap_err();
    assert_eq!(err.sink, NAME);
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.starts_with("clickhouse: inserting 2 events (revisions 2..=2) into `holdfast`.`audit_events`"), "{text}");
    assert!(text.contains("404") && text.contains("doesn't exist"), "ClickHouse's own message: {text}");
    assert!(text.contains("restart the tailer"), "what to do: {text}");
    assert!(!text.contains("e.what()"), "{text}");

    // Connecting again (what a restart does) makes the table anew.
    let mut sink = fx.connect();
    sink.append(&events(2..=2)).unwrap();
    assert_eq!(sink.count().unwrap(), 2);
}

#[test]
fn a_stopped_server_is_an_error_and_the_sink_recovers_when_it_returns() {
    let mut fx = Fixture::start();
    let mut sink = fx.connect();
    sink.append(&events(1..=2)).unwrap();
    fx.server.stop();

    let err = sink.append(&events(3..=3)).unwrap_err();
    assert_eq!(err.sink, NAME);
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.contains(&format!("cannot reach ClickHouse at {}", fx.server.url())), "{text}");
    assert!(text.contains("check that it is running"), "what to do: {text}");
    assert!(ClickHouse::connect(&fx.config()).is_err(), "connect to a stopped server");

    fx.server.restart().unwrap();
    sink.append(&events(3..=3)).unwrap_or_else(|e| panic!("after restart: {e}"));
    assert_eq!(sink.count().unwrap(), 6, "the rows from before the stop survived it");
}

#[test]
fn a_wrong_password_is_refused_at_connect() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::start();
    let password_file = fx.dir.path().join("clickhouse-password");
    std::fs::write(&password_file, "not-the-password\n").unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut config = fx.config();
    config.user = Some("default".into());
    config.password_file = Some(password_file.clone());
    let err = ClickHouse::connect(&config).unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.starts_with("clickhouse: connecting: "), "{text}");
    assert!(text.contains("Wrong password for user default"), "ClickHouse's own message: {text}");
    assert!(text.contains("Check [clickhouse] user and password_file"), "what to do: {text}");
    assert!(!text.contains("not-the-password"), "the password is never printed: {text}");

    // A world-readable password file is refused before anything is sent.
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = ClickHouse::connect(&config).unwrap_err().to_string();
    assert!(text.contains("clickhouse.password_file") && text.contains("world-readable"), "{text}");

    // The fixture's user has no password: no password_file.
    config.password_file = None;
    ClickHouse::connect(&config).unwrap_or_else(|e| panic!("the right (no) password: {e}"));
}

#[test]
fn a_table_that_would_lose_fields_or_keep_duplicates_is_refused() {
    let fx = Fixture::start();
    fx.server.query("CREATE DATABASE holdfast").unwrap();
    fx.server
        .query(
            "CREATE TABLE holdfast.plain (cluster_id String, revision Int64, `index` UInt32, kind String) \
             ENGINE = MergeTree ORDER BY (cluster_id, revision, `index`)",
        )
        .unwrap();
    let mut config = fx.config();
    config.table = "plain".into();
    let text = ClickHouse::connect(&config).unwrap_err().to_string();
    assert!(text.starts_with("clickhouse: table `holdfast`.`plain`"), "{text}");
    assert!(text.contains("column `held_ms` is missing (ALTER TABLE `holdfast`.`plain` ADD COLUMN `held_ms` Nullable(UInt64))"), "{text}");
    assert!(text.contains("its engine is MergeTree"), "{text}");

    config.table = "audit-events".into();
    let text = ClickHouse::connect(&config).unwrap_err().to_string();
    assert!(text.contains("clickhouse.table = \"audit-events\""), "{text}");
}

#[test]
fn an_event_without_a_revision_is_refused_and_nothing_of_its_batch_is_stored() {
    let fx = Fixture::start();
    let mut sink = fx.connect();
    let mut batch = events(1..=2);
    batch[3].revision = None;
    let err = sink.append(&batch).unwrap_err();
    assert!(err.to_string().contains("no revision"), "{err}");
    assert_eq!(sink.count().unwrap(), 0);
}

#[test]
fn a_table_from_before_unprotected_gets_the_column_and_the_view_lists_only_unprotected_events() {
    use holdfast_audit_sinks::clickhouse::COLUMNS;
    let fx = Fixture::start();
    // The table as the previous release made it: every column but `unprotected`.
    let old: Vec<String> = COLUMNS.iter().filter(|(n, _)| *n != "unprotected").map(|(n, t)| format!("`{n}` {t}")).collect();
    fx.server.query("CREATE DATABASE holdfast").unwrap();
    fx.server
        .query(&format!(
            "CREATE TABLE holdfast.audit_events ({}) ENGINE = ReplacingMergeTree ORDER BY (`cluster_id`, `revision`, `index`)",
            old.join(", ")
        ))
        .unwrap();
    fx.server
        .query(&format!(
            "INSERT INTO holdfast.audit_events (`cluster_id`, `revision`, `index`, `kind`, `time_unix_ms`, `time_source`, `etcd_key`) \
             VALUES ('{}', 1, 0, 'grant', 1, 'record', '/l/payments/key-1')",
            cluster_hex(CLUSTER)
        ))
        .unwrap();
    let mut sink = fx.connect();
    let column =
        fx.server.query("SELECT type FROM system.columns WHERE database = 'holdfast' AND table = 'audit_events' AND name = 'unprotected'");
    assert_eq!(column.unwrap().trim(), "Nullable(UInt8)", "the column was added on connect");
    let mut grant = Event::new(CLUSTER, 5, 0, Kind::UnprotectedGrant, "/sys/unprotected/00000000000000aa/00000000000000000001", 7);
    grant.unprotected = Some(true);
    grant.key = Some("cache/warm".into());
    let mut end = Event::new(CLUSTER, 5, 1, Kind::UnprotectedEnd, "/sys/unprotected/00000000000000aa/00000000000000000002", 8);
    end.unprotected = Some(true);
    end.reason = Some("quorum_back".into());
    let protected = events(6..=6);
    sink.append(&[grant.clone(), end.clone()]).unwrap_or_else(|e| panic!("{e}"));
    sink.append(&protected).unwrap_or_else(|e| panic!("{e}"));
    // Sent twice, still listed once (the view reads with FINAL).
    sink.append(&[grant.clone()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sink.unprotected_events().unwrap(), vec![grant, end]);
    assert_eq!(sink.count().unwrap(), 1 + 2 + protected.len() as u64, "the old row is kept, with unprotected NULL");
    assert!(sink.events().unwrap().iter().filter(|e| e.kind == Kind::Grant).all(|e| e.unprotected.is_none()));
}

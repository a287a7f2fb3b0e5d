//! Restore drills: a restored etcd must never let the arbiter issue a token
//! it has issued before. See `holdfast_model::seal` for the rule.

use holdfast_model::seal::{self, LogPosition};
use holdfast_model::{LockKey, layout};
use holdfast_proto::ErrorReason;
use holdfast_tests::*;
use std::time::{Duration, Instant};

fn key() -> LockKey {
    LockKey::parse("orders/ledger-7").unwrap()
}

/// Acquires and releases `n` times, returning the tokens.
async fn grant_many(client: &holdfast_client::Client, n: usize) -> Vec<u64> {
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let mut tokens = Vec::new();
    for _ in 0..n {
        let hold = session.acquire(&key(), Duration::from_secs(5)).await.unwrap();
        tokens.push(hold.token().expose());
        hold.release().await.unwrap();
    }
    session.close().await.unwrap();
    tokens
}

async fn positions(etcd: &Etcd) -> Vec<LogPosition> {
    let h = etcd.holdfast().await;
    h.member_status().await.into_iter().map(|s| s.unwrap().position).collect()
}

async fn hold_count(etcd: &Etcd) -> i64 {
    holdfast_store::epoch::count_prefix(&etcd.holdfast().await, layout::HOLD_PREFIX).await.unwrap()
}

/// The drill: grant, snapshot, grant more, restore, and check the arbiter is
/// sealed and grants nothing until the advance; afterwards every token is
/// above every token issued before the restore.
async fn drill(name: &str, members: usize, new_token: bool) {
    let mut app = Appliance::start(name, members).await;
    let client = app.client("team/a").await;
    let mut issued = grant_many(&client, 20).await;
    let snapshot = app.dir.path.join("snap.db");
    app.etcd.snapshot(&snapshot);
    issued.extend(grant_many(&client, 20).await);
    let before = app.etcd.spec.members.iter().map(|m| m.client_port).collect::<Vec<_>>();

    // The arbiter is down while etcd is restored; it must find out by itself.
    app.arbiter.stop();
    app.etcd.restore(&snapshot, new_token).await;
    assert_eq!(before, app.etcd.spec.members.iter().map(|m| m.client_port).collect::<Vec<_>>());
    let status = app.etcd.holdfast().await.member_status().await;
    eprintln!("restored {} member(s), new token: {new_token}; cluster id {:x}", members, status[0].as_ref().unwrap().cluster_id);

    let mut arbiter = Arbiter::start(&app.dir.path, "arbiter-after-restore", &app.etcd.endpoints(), &app.pki);
    let client = arbiter.client(&app.pki, &app.pki.workload("team-a", "team/a")).await;
    let sealed = arbiter.wait_sealed(&client, true, Duration::from_secs(10)).await;
    eprintln!("sealed: {}", sealed.sealed_reason);

    // Grants nothing: the refusal is typed, and no hold is written.
    let holds_before = hold_count(&app.etcd).await;
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let err = session.acquire(&key(), Duration::ZERO).await.unwrap_err();
    assert_eq!(err.reason(), Some(ErrorReason::Sealed), "{err}");
    assert_eq!(hold_count(&app.etcd).await, holds_before);
    // The seal is durable: a second arbiter started now is sealed too.
    let mut second = Arbiter::start(&app.dir.path, "arbiter-second", &app.etcd.endpoints(), &app.pki);
    let c2 = second.client(&app.pki, &app.pki.workload("team-a", "team/a")).await;
    second.wait_sealed(&c2, true, Duration::from_secs(10)).await;
    second.stop();

    // The advance (two-person approval comes later; here, the transaction).
    let record = holdfast_store::epoch::advance(&app.etcd.holdfast().await, 1).await.unwrap();
    assert_eq!(record.epoch, 2);
    arbiter.wait_sealed(&client, false, Duration::from_secs(10)).await;
    let after = grant_many(&client, 20).await;
    let max_before = *issued.iter().max().unwrap();
    for t in &after {
        assert!(*t > max_before, "a token after the advance is not above every token before the restore");
        assert_eq!(t >> 48, 2);
    }
    arbiter.stop();
}

#[tokio::test]
async fn restored_with_a_new_cluster_token_is_sealed_until_epoch_advance() {
    drill("restore-new-token", 1, true).await;
}

#[tokio::test]
async fn restored_with_the_same_token_and_peer_urls_is_sealed_until_epoch_advance() {
    drill("restore-same-token", 1, false).await;
}

#[tokio::test]
async fn three_member_cluster_restored_with_the_same_token_is_sealed() {
    drill("restore-3-same-token", 3, false).await;
}

/// The invariant the seal relies on, checked on the etcd under test: a
/// restart never lowers the log offset; a restore drops it below the floor.
#[tokio::test]
async fn restart_keeps_and_restore_drops_the_log_offset() {
    let dir = TestDir::new("offset");
    let mut etcd = Etcd::start(&dir.path, 1).await;
    let record = etcd.init_epoch().await;
    let mut c = etcd.client().await;
    for i in 0..50 {
        c.put(format!("/x/{i}"), "v", None).await.unwrap();
    }
    let at_snapshot = positions(&etcd).await[0];
    let snapshot = dir.path.join("snap.db");
    etcd.snapshot(&snapshot);
    for i in 0..50 {
        c.put(format!("/y/{i}"), "v", None).await.unwrap();
    }
    let before_restart = positions(&etcd).await[0];
    assert!(before_restart.offset() >= at_snapshot.offset());

    // Restart: stop and start the same member on the same data.
    etcd.members[0].take().unwrap().stop(Duration::from_secs(10));
    etcd.members[0] = Some(holdfast_devkit::etcd::EtcdProcess::start(&etcd.bin, &etcd.spec, 0, &dir.path.join("restart.log")).unwrap());
    etcd.wait_ready().await;
    let after_restart = positions(&etcd).await[0];
    eprintln!(
        "etcd {}: before restart {before_restart:?} offset {}, after {after_restart:?} offset {}",
        etcd.bin.version_string(),
        before_restart.offset(),
        after_restart.offset()
    );
    assert!(after_restart.applied_index >= before_restart.applied_index);
    assert!(after_restart.offset() >= before_restart.offset());
    assert!(matches!(seal::judge(&[after_restart], record.log_floor, 1), seal::Verdict::Intact { .. }));

    etcd.restore(&snapshot, false).await;
    let restored = positions(&etcd).await[0];
    eprintln!("etcd {}: after restore {restored:?} offset {} (floor {})", etcd.bin.version_string(), restored.offset(), record.log_floor);
    assert_eq!(restored.revision, at_snapshot.revision, "restore keeps the snapshot's revision");
    assert!(restored.applied_index < at_snapshot.applied_index, "restore rewrites the Raft log");
    assert!(matches!(seal::judge(&[restored], record.log_floor, 1), seal::Verdict::Rewound { .. }));
}

/// A running arbiter that never restarts still seals when etcd is restored
/// under it, and withholds any token it could have issued before.
#[tokio::test]
async fn a_running_arbiter_seals_when_etcd_is_restored_under_it() {
    let mut app = Appliance::start("restore-live", 1).await;
    let client = app.client("team/a").await;
    // A session that lives across the restore: the advance must end it.
    let survivor = client.open_session(Duration::from_secs(15)).await.unwrap();
    grant_many(&client, 10).await;
    let snapshot = app.dir.path.join("snap.db");
    app.etcd.snapshot(&snapshot);
    let issued = grant_many(&client, 10).await;
    app.etcd.restore(&snapshot, false).await;
    let s = app.arbiter.wait_sealed(&client, true, Duration::from_secs(15)).await;
    eprintln!("sealed: {}", s.sealed_reason);
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let err = session.acquire(&key(), Duration::ZERO).await.unwrap_err();
    assert_eq!(err.reason(), Some(ErrorReason::Sealed));
    holdfast_store::epoch::advance(&app.etcd.holdfast().await, 1).await.unwrap();
    app.arbiter.wait_sealed(&client, false, Duration::from_secs(10)).await;
    let after = grant_many(&client, 5).await;
    assert!(after.iter().all(|t| t > issued.iter().max().unwrap()));
    let mut health = survivor.health();
    tokio::time::timeout(Duration::from_secs(20), health.wait_for(|h| *h == holdfast_client::Health::Lost))
        .await
        .expect("a session of the old epoch is lost after the advance")
        .unwrap();
}

/// A restart is not a restore: etcd stops and starts on its own data under
/// a session that keeps renewing. The arbiter's etcd keepalive stream for
/// that session ends with the old etcd process; the next renewal opens a new
/// one. It used to call etcd failed instead, which paused every grant until
/// etcd was re-checked (a concurrent acquire was refused "unavailable": a
/// CI failure of `a_running_arbiter_seals_when_etcd_is_restored_under_it`).
#[tokio::test]
async fn an_etcd_restart_under_a_renewing_session_pauses_no_grant() {
    let mut app = Appliance::start("restart-keeper", 1).await;
    let client = app.client("team/a").await;
    // The key's class TTL, 30 s: a keepalive every 10 s, and room for etcd
    // to be down a few seconds. The first keepalive opens the arbiter's
    // etcd keepalive stream for the session.
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    let restarted_at = Instant::now();
    app.etcd.restart_member(0).await;
    let mark = std::fs::metadata(&app.arbiter.log).unwrap().len() as usize;
    app.arbiter.wait_sealed(&client, false, Duration::from_secs(15)).await;
    // At least one renewal after the restart, observed: the client's
    // deadline counts from a confirmed keepalive's send time, so a deadline
    // past restart + TTL comes from a keepalive sent after the restart.
    let ttl = Duration::from_secs(30);
    loop {
        if Instant::now() + session.remaining_ttl() > restarted_at + ttl {
            break;
        }
        assert!(
            restarted_at.elapsed() < Duration::from_secs(25),
            "no keepalive sent after the etcd restart was confirmed within 25 s (remaining {:?})",
            session.remaining_ttl()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read(&app.arbiter.log).unwrap();
    let after = String::from_utf8_lossy(&log[mark.min(log.len())..]);
    assert!(!after.contains("granting paused"), "a renewal after the etcd restart paused granting:\n{after}");
    assert_eq!(*session.health().borrow(), holdfast_client::Health::Healthy, "the session was not renewed after the restart");
    let hold = session.acquire(&key(), Duration::ZERO).await.unwrap();
    hold.release().await.unwrap();
    session.close().await.unwrap();
}

/// Every init and advance raises the epoch allocator (`/sys/epochs`) in the
/// same transaction, and an advance to an epoch the allocator already
/// allocated is refused, writing nothing: the coord cluster's allocator may
/// be ahead of a restored cluster's own record. Each mint is new.
#[tokio::test(flavor = "multi_thread")]
async fn an_advance_refuses_an_epoch_the_allocator_already_allocated() {
    use holdfast_store::epoch::{EpochError, Target, advance_txn_to, read_allocator};
    let dir = TestDir::new("allocator");
    let etcd = Etcd::start(&dir.path, 1).await;
    let first = etcd.init_epoch().await;
    assert_eq!(first.epoch, 1);
    assert_eq!(first.mint.len(), 32, "{first:?}");
    let h = etcd.holdfast().await;
    assert_eq!(read_allocator(&h).await.unwrap().0.highest, 1, "init raised the allocator");

    // What the allocator holds once other advances went through it.
    let mut c = etcd.client().await;
    c.put(layout::EPOCHS_KEY, layout::encode(&layout::EpochsRecord { highest: 5 }), None).await.unwrap();
    let revision = async |c: &mut etcd_client::Client| c.get("/", None).await.unwrap().header().unwrap().revision();
    let before = revision(&mut c).await;
    let target = Target { expected: 1, new_epoch: 2, cluster_id: None, known: 0, nonce: None };
    match advance_txn_to(&h, &target).await {
        Err(e @ EpochError::Allocated { new: 2, highest: 5, .. }) => assert!(e.to_string().contains("above 5"), "{e}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("advanced to an epoch the allocator had already allocated"),
    }
    assert_eq!(revision(&mut c).await, before, "a refused advance wrote to etcd");

    let done = advance_txn_to(&h, &Target { new_epoch: 6, ..target }).await.unwrap();
    assert_eq!(done.record.epoch, 6);
    assert_ne!(done.record.mint, first.mint, "a new mint");
    assert_eq!(read_allocator(&h).await.unwrap().0.highest, 6, "the advance raised the allocator");
}

/// A restore rolls `/sys/policy` back, and the controller's next versions
/// start again from the restored one: at or below the version a running
/// arbiter enforces. Sets are ordered by (epoch, version), so after the
/// advance the running arbiter takes them: a grant changed after the
/// restore reaches it.
#[tokio::test]
async fn a_grant_changed_after_a_restore_reaches_the_running_arbiter() {
    use holdfast_fixtures::policy::{FixtureClass, write_dir};
    let classes = [("pr", 30)];
    let fixture: Vec<FixtureClass> = classes.iter().map(|(ns, ttl)| FixtureClass::new(ns, Duration::from_secs(*ttl))).collect();
    // team/late may only inspect until the last change.
    let narrow = |more: &str| format!("[grant.late]\nidentity = \"{LAB_IDENTITIES}team/late\"\ninspect = [\"pr/\"]\n{more}");
    let app = Appliance::start_policy("restore-policy", 1, &|_| {}, &classes, &narrow("")).await;
    let policy_dir = app.dir.path.join("policy");
    let etcd = app.etcd.holdfast().await;
    let version = || async { holdfast_store::policy::read_published(&etcd).await.unwrap().doc().map_or(0, |d| d.version) };
    let republish = |extra: String, want: u64| {
        write_dir(&policy_dir, LAB_IDENTITIES, &fixture, &extra).unwrap();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while version().await < want {
                assert!(Instant::now() < deadline, "the controller did not publish version {want}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let late = app.client("team/late").await;
    let pr = LockKey::parse("pr/x").unwrap();
    let denied = |c: &holdfast_client::Client| {
        let pr = pr.clone();
        let c = c.clone();
        async move {
            let s = c.open_session(Duration::from_secs(30)).await;
            let s = match s {
                Err(e) => return e.reason() == Some(ErrorReason::Denied),
                Ok(s) => s,
            };
            let denied = match s.acquire(&pr, Duration::ZERO).await {
                Ok(hold) => !hold.release().await.unwrap(),
                Err(e) => e.reason() == Some(ErrorReason::Denied),
            };
            s.close().await.unwrap();
            denied
        }
    };
    assert!(denied(&late).await, "team/late may lock before the change");

    // Snapshot at v1; two more versions (unrelated grants); restore to v1.
    let v1 = version().await;
    let snapshot = app.dir.path.join("snap.db");
    app.etcd.snapshot(&snapshot);
    republish(narrow(&format!("[grant.other]\nidentity = \"{LAB_IDENTITIES}team/other\"\ninspect = [\"pr/\"]\n")), v1 + 1).await;
    republish(narrow(&format!("[grant.other]\nidentity = \"{LAB_IDENTITIES}team/other\"\ninspect = [\"pr/x\"]\n")), v1 + 2).await;
    let before = version().await;
    let mut app = app;
    app.etcd.restore(&snapshot, false).await;
    let client = app.client("team/a").await;
    app.arbiter.wait_sealed(&client, true, Duration::from_secs(30)).await;
    holdfast_store::epoch::advance(&app.etcd.holdfast().await, 1).await.unwrap();
    app.arbiter.wait_sealed(&client, false, Duration::from_secs(30)).await;

    // The grant changes: team/late may lock. The controller's version is
    // at or below the one the arbiter enforced before the restore.
    let etcd = app.etcd.holdfast().await;
    let restored = holdfast_store::policy::read_published(&etcd).await.unwrap().doc().map_or(0, |d| d.version);
    write_dir(
        &policy_dir,
        LAB_IDENTITIES,
        &fixture,
        &format!("[grant.late]\nidentity = \"{LAB_IDENTITIES}team/late\"\nlock = [\"pr/\"]\ninspect = [\"pr/\"]\n"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = restored;
    while after <= restored {
        assert!(Instant::now() < deadline, "the controller did not publish the change after the restore");
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = holdfast_store::policy::read_published(&etcd).await.unwrap().doc().map_or(0, |d| d.version);
    }
    assert!(after <= before, "the scenario needs the version after the restore ({after}) at or below the one before it ({before})");
    let deadline = Instant::now() + Duration::from_secs(10);
    while denied(&late).await {
        assert!(
            Instant::now() < deadline,
            "the running arbiter still enforces the set from before the restore (version {after} <= {before})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

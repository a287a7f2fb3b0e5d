//! A withdrawal is visible in etcd's log. When a grant commits but the
//! arbiter will not hand out its token (here: etcd was restored under it, and
//! the grant landed at a revision it had already seen), the arbiter deletes
//! the hold and writes a marker naming that exact hold in one transaction,
//! and answers "unavailable" (the grant took effect), never a plain refusal.
//! The linearizability checker excuses the delete only because of the
//! marker: without it (the `no_withdrawal_marker` mutation) it fails.

use holdfast_checkers::linearizable;
use holdfast_checkers::{ClientOp, OpKind, Outcome, Report, Rule};
use holdfast_model::LockKey;
use holdfast_proto::ErrorReason;
use holdfast_tests::recorder::{Recorder, etcd_lock_log};
use holdfast_tests::*;
use std::time::Duration;

fn key(s: &str) -> LockKey {
    LockKey::parse(s).unwrap()
}

/// Restores etcd under a running arbiter (seal checks slowed to 30 s so the
/// first grant finds the rewind) and returns the C3 report over the
/// recorded acquire of `w/after` and etcd's log of that key.
async fn withdrawn_grant(name: &str, configure: Configure<'_>) -> Report {
    // A 60 s class for w: the session outlives the restore with room to spare.
    let mut app = Appliance::start_policy(name, 1, configure, &[("w", 60)], "").await;
    let client = app.client("team/a").await;
    // A session that exists in the snapshot, so it still exists after the restore.
    let session = client.open_session_for("w", None).await.unwrap();
    assert_eq!(session.ttl(), Duration::from_secs(60));
    for _ in 0..3 {
        session.acquire(&key("w/before"), Duration::ZERO).await.unwrap().release().await.unwrap();
    }
    let snapshot = app.dir.path.join("snap.db");
    app.etcd.snapshot(&snapshot);
    for _ in 0..20 {
        session.acquire(&key("w/between"), Duration::ZERO).await.unwrap().release().await.unwrap();
    }
    app.etcd.restore(&snapshot, false).await;

    let rec = Recorder::default();
    let mut answer = None;
    // The session's keepalive stream may need a moment to reconnect.
    for _ in 0..50 {
        let r = session.acquire(&key("w/after"), Duration::ZERO).await;
        match r {
            Err(e) if e.reason() == Some(ErrorReason::Unavailable) && e.to_string().contains("not handed out") => {
                answer = Some(e.to_string());
                break;
            }
            Err(e) if e.reason() == Some(ErrorReason::Sealed) => {
                panic!("sealed before the grant: the seal check found the restore first: {e}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // The client stops waiting once it has the answer (the loop's last acquire).
    let gave_up_ns = rec.now();
    let answer = answer.expect("the grant after the restore is withdrawn and answered unavailable");
    eprintln!("answer: {answer}");
    assert!(answer.contains("withdrawn") || answer.contains("withdrawing"), "{answer}");
    // Record that acquire as the client saw it: an unknown outcome.
    rec.record(ClientOp {
        process: 1,
        kind: OpKind::Acquire { key: "w/after".into() },
        session: Some(session.id() as i64),
        token: None,
        invoke_ns: 0,
        complete_ns: None,
        outcome: Outcome::Unknown,
        gave_up_ns: Some(gave_up_ns),
    });

    let mut log = etcd_lock_log(&app.etcd.client().await).await;
    log.events.retain(|e| e.key == "/l/w/after");
    log.withdrawals.retain(|w| w.key == "/l/w/after");
    eprintln!("etcd's log of w/after: {:?}; withdrawals: {:?}", log.events, log.withdrawals);
    assert_eq!(log.events.len(), 2, "the grant's put and the withdrawal's delete");
    let history = rec.history(log);
    assert_eq!(history.ops[0].outcome, Outcome::Unknown);
    history.validate().unwrap();
    linearizable::check(&history, &linearizable::Config::default())
}

#[tokio::test]
async fn a_withdrawn_grant_leaves_a_marker_that_explains_its_delete() {
    let report = withdrawn_grant("withdraw", &|c| c.seal.check_interval = Duration::from_secs(30)).await;
    assert!(report.passed(), "{:?}", report.violations);
}

#[tokio::test]
async fn without_the_withdrawal_marker_the_delete_is_unexplained() {
    let report = withdrawn_grant("withdraw-mutant", &|c| {
        c.seal.check_interval = Duration::from_secs(30);
        c.mutation.no_withdrawal_marker = true;
    })
    .await;
    assert!(report.has(Rule::UnexplainedDelete), "{:?}", report.violations);
}

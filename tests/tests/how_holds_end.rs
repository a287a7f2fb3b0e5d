//! How a hold ended is decided from etcd's log by construction: a release
//! (or withdrawal) deletes a hold only while its session record exists, so a
//! hold deleted at or after its record's delete ended with its session. The
//! race the design must survive: a release arriving between CloseSession's
//! record delete and its lease revoke.

use holdfast_checkers::EtcdEventKind;
use holdfast_model::layout;
use holdfast_tests::recorder::etcd_lock_log;
use holdfast_tests::*;
use std::time::Duration;

fn key(s: &str) -> holdfast_model::LockKey {
    holdfast_model::LockKey::parse(s).unwrap()
}

#[tokio::test]
async fn a_release_racing_a_session_close_deletes_nothing_and_the_hold_ends_with_the_session() {
    let app = Appliance::start("holds-end", 1).await;
    let client = app.client("team/a").await;
    let mut etcd = app.etcd.client().await;

    // A release, then the session closes: the log says "released".
    let released = client.open_session(Duration::from_secs(30)).await.unwrap();
    let hold = released.acquire(&key("race/released"), Duration::ZERO).await.unwrap();
    assert!(hold.release().await.unwrap());
    released.close().await.unwrap();

    // The race: CloseSession's first step (the record's delete) lands, then
    // the release, then CloseSession's revoke.
    let racing = client.open_session(Duration::from_secs(30)).await.unwrap();
    let lease = racing.id() as i64;
    let hold = racing.acquire(&key("race/closed"), Duration::ZERO).await.unwrap();
    etcd.delete(layout::session_key(lease), None).await.unwrap();
    let answer = hold.release().await;
    assert!(!matches!(answer, Ok(true)), "a release after the session record's delete must delete nothing: {answer:?}");
    let still = etcd.get("/l/race/closed", None).await.unwrap();
    assert_eq!(still.kvs().len(), 1, "the hold is still there until the lease ends");
    etcd.lease_revoke(lease).await.unwrap();

    let log = etcd_lock_log(&etcd).await;
    let deletes: Vec<_> = log.events.iter().filter(|e| e.kind == EtcdEventKind::Delete).collect();
    let of = |k: &str| deletes.iter().find(|e| e.key == k).unwrap_or_else(|| panic!("no delete of {k}: {deletes:?}"));
    let r = of("/l/race/released");
    assert_eq!(r.expired, Some(false), "a release: {r:?}");
    let c = of("/l/race/closed");
    assert_eq!(c.expired, Some(true), "ended with its session: {c:?}");
    let end = log.session_ends.iter().find(|s| s.lease == lease).expect("the record's delete is in the log");
    assert!(end.revision < c.revision, "record deleted at {}, hold at {}: CloseSession's order", end.revision, c.revision);
    assert!(log.withdrawals.is_empty(), "nothing was withdrawn: {:?}", log.withdrawals);
}

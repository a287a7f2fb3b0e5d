//! The grant path against real etcd: tokens, expiry, guarded release.

use holdfast_model::LockKey;
use holdfast_tests::*;
use std::time::{Duration, Instant};

fn key(s: &str) -> LockKey {
    LockKey::parse(s).unwrap()
}

#[tokio::test]
async fn tokens_strictly_increase_per_key_and_carry_the_epoch() {
    let app = Appliance::start("tokens", 1).await;
    let client = app.client("team/a").await;
    let session = client.open_session_for("orders", None).await.unwrap();
    let k = key("orders/ledger-7");
    let mut last = 0u64;
    for _ in 0..200 {
        let hold = session.acquire(&k, Duration::ZERO).await.unwrap();
        let t = hold.token();
        assert_eq!(t.expose() >> 48, 1, "epoch in the top bits");
        assert_eq!(t.epoch(), 1);
        assert!(t.expose() > last, "token did not increase");
        last = t.expose();
        assert!(hold.release().await.unwrap());
    }
    session.close().await.unwrap();
}

#[tokio::test]
async fn a_second_session_waits_and_gets_a_greater_token() {
    let app = Appliance::start("handoff", 1).await;
    let a = app.client("team/a").await;
    let b = app.client("team/b").await;
    let sa = a.open_session_for("orders", None).await.unwrap();
    let sb = b.open_session_for("orders", None).await.unwrap();
    let k = key("orders/handoff");
    let first = sa.acquire(&k, Duration::ZERO).await.unwrap();
    let t1 = first.token();
    let refused = sb.acquire(&k, Duration::ZERO).await.unwrap_err();
    assert_eq!(refused.reason(), Some(holdfast_proto::ErrorReason::Contention));
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let hold = sb.acquire(&k, Duration::from_secs(10)).await.unwrap();
        (hold.token(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(first.release().await.unwrap());
    let (t2, waited) = waiter.await.unwrap();
    assert!(t2 > t1);
    assert!(waited >= Duration::from_millis(400), "the waiter did not wait: {waited:?}");
    assert!(waited < Duration::from_secs(3), "a release should wake the waiter at once, took {waited:?}");
}

#[tokio::test]
async fn a_release_naming_an_older_hold_deletes_nothing() {
    let app = Appliance::start("stale-release", 1).await;
    let client = app.client("team/a").await;
    let session = client.open_session_for("orders", None).await.unwrap();
    let k = key("orders/stale");
    let old = session.acquire(&k, Duration::ZERO).await.unwrap();
    let old_token = old.token();
    assert!(old.release().await.unwrap());
    let new = session.acquire(&k, Duration::ZERO).await.unwrap();
    // Replay the release of the old hold, as a retried RPC would.
    let mut rpc = client.rpc();
    let before = app.etcd.revision().await;
    let resp = rpc
        .release(holdfast_proto::v1::ReleaseRequest {
            session_id: session.id(),
            namespace: "orders".into(),
            key: "stale".into(),
            token: old_token.expose(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!resp.released);
    assert_eq!(app.etcd.revision().await, before, "a stale release must write nothing");
    assert!(client.inspect(&k).await.unwrap().held);
    let hold = app.etcd.client().await.get("/l/orders/stale", None).await.unwrap();
    assert_eq!(hold.kvs()[0].create_revision() as u64, new.token().revision(), "the newer hold is the one left");
    assert!(new.release().await.unwrap());
}

#[tokio::test]
async fn a_holder_killed_with_sigkill_loses_the_hold_when_its_ttl_lapses() {
    // A 5 s class for jobs, so the lapse is quick to wait for.
    let app = Appliance::start_policy("sigkill", 1, &defaults, &[("jobs", 5)], "").await;
    let ttl = Duration::from_secs(5);
    let mut holder = std::process::Command::new(bin("holdfastctl"))
        .envs(app.ctl_env("team/holder"))
        .args(["lock", "exec", "jobs/nightly", "--ttl", "5s", "--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .process_group_0()
        .spawn()
        .unwrap();
    let client = app.client("team/waiter").await;
    let k = key("jobs/nightly");
    // Wait until the holder has the lock.
    let end = Instant::now() + Duration::from_secs(20);
    while !client.inspect(&k).await.unwrap().held {
        assert!(Instant::now() < end, "holder never acquired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let session = client.open_session_for("jobs", None).await.unwrap();
    assert_eq!(session.ttl(), ttl, "the waiter's session has the class TTL");
    sigkill_group(holder.id());
    let killed = Instant::now();
    let _ = holder.wait();
    let hold = session.acquire(&k, Duration::from_secs(30)).await.unwrap();
    let took = killed.elapsed();
    assert!(took <= ttl + Duration::from_secs(3), "waiter got the lock {took:?} after the kill; TTL is {ttl:?}");
    assert!(took >= ttl - Duration::from_secs(2), "the hold ended before its TTL could have lapsed: {took:?}");
    hold.release().await.unwrap();
}

trait GroupExt {
    fn process_group_0(&mut self) -> &mut Self;
}
impl GroupExt for std::process::Command {
    fn process_group_0(&mut self) -> &mut Self {
        std::os::unix::process::CommandExt::process_group(self, 0)
    }
}

/// Group commit folds grants and releases for different keys into one etcd
/// transaction; each key's grants must stay exclusive and strictly ordered.
#[tokio::test]
async fn group_commit_keeps_each_key_exclusive_and_its_tokens_increasing() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    // One 30 s class per round's namespace.
    let classes = [("group0", 30), ("group1", 30), ("group2", 30)];
    let Appliance { dir: _dir, etcd, pki, arbiter, controller: _controller } =
        Appliance::start_policy("group-commit", 1, &|c| c.grants.group_commit = true, &classes, "").await;
    // Grouping needs grants of different keys queued at the same moment; on
    // a loaded 2-core machine one round may not produce any, so up to three
    // rounds run (each checks exclusivity and order) until one did.
    let mut shared = 0;
    for round in 0..3 {
        let held: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
        let grants: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let mut tasks = Vec::new();
        for t in 0..16 {
            let client = arbiter.client(&pki, &pki.workload(&format!("g{t}"), &format!("svc/g{t}"))).await;
            let (held, grants) = (held.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                let session = client.open_session(Duration::from_secs(30)).await.unwrap();
                let name = format!("group{round}/k{}", t % 4);
                let k = key(&name);
                for _ in 0..25 {
                    let hold = session.acquire(&k, Duration::from_secs(30)).await.unwrap();
                    {
                        let mut h = held.lock().unwrap();
                        assert!(!h.get(&name).copied().unwrap_or(false), "two holders of {name} at once");
                        h.insert(name.clone(), true);
                    }
                    grants.lock().unwrap().push((name.clone(), hold.token().expose()));
                    tokio::task::yield_now().await;
                    held.lock().unwrap().insert(name.clone(), false);
                    assert!(hold.release().await.unwrap());
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let grants = grants.lock().unwrap().clone();
        assert_eq!(grants.len(), 400);
        let mut per_key: HashMap<&str, Vec<u64>> = HashMap::new();
        for (k, t) in &grants {
            per_key.entry(k.as_str()).or_default().push(*t);
        }
        for (k, tokens) in &per_key {
            assert!(tokens.windows(2).all(|w| w[1] > w[0]), "{k}: tokens not strictly increasing");
        }
        // Grouping happened: some grants of different keys share a revision.
        let mut by_token: HashMap<u64, usize> = HashMap::new();
        for (_, t) in &grants {
            *by_token.entry(*t).or_default() += 1;
        }
        shared = by_token.values().filter(|n| **n > 1).count();
        eprintln!("round {round}: {shared} revisions carried more than one grant");
        if shared > 0 {
            break;
        }
    }
    assert!(shared > 0, "no two grants were committed together: group commit did not engage");

    // Releases are grouped too: with 16 clients each taking and releasing
    // its own key, etcd's log has revisions where a hold's delete (a
    // release: the sessions all stay open) shares the revision with a write
    // of another key.
    let start = etcd.revision().await + 1;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let client = arbiter.client(&pki, &pki.workload(&format!("d{t}"), &format!("svc/d{t}"))).await;
        tasks.push(tokio::spawn(async move {
            let session = client.open_session(Duration::from_secs(30)).await.unwrap();
            let k = key(&format!("group0/d{t}"));
            for _ in 0..25 {
                let hold = session.acquire(&k, Duration::from_secs(30)).await.unwrap();
                assert!(hold.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let end = etcd.revision().await;
    let mut client = etcd.client().await;
    let options = etcd_client::WatchOptions::new().with_prefix().with_start_revision(start);
    let mut stream = client.watch(holdfast_model::layout::HOLD_PREFIX, Some(options)).await.unwrap();
    let mut by_revision: HashMap<i64, Vec<(bool, Vec<u8>)>> = HashMap::new();
    let mut last = 0;
    // Until the revision read after the workload, or 2 s without an event
    // (its last revisions may be session closes, outside the hold prefix).
    while last < end {
        let Ok(Ok(Some(resp))) = tokio::time::timeout(Duration::from_secs(2), stream.message()).await else { break };
        for e in resp.events() {
            let Some(kv) = e.kv() else { continue };
            last = last.max(kv.mod_revision());
            let delete = e.event_type() == etcd_client::EventType::Delete;
            by_revision.entry(kv.mod_revision()).or_default().push((delete, kv.key().to_vec()));
        }
    }
    let grouped_releases = by_revision.values().filter(|events| events.len() > 1 && events.iter().any(|(delete, _)| *delete)).count();
    eprintln!("{grouped_releases} of {} revisions carried a release together with another key's write", by_revision.len());
    assert!(grouped_releases > 0, "no release was committed together with another write: releases are not grouped");
}

//! `[limits]` in arbiter.toml: a per-identity request rate and quotas on
//! sessions and holds. Past one, a call is refused with RESOURCE_EXHAUSTED,
//! a typed reason (RATE_LIMITED, QUOTA) and a message naming the limit's key,
//! and the etcd revision does not move. The caps are exported as metrics.

use holdfast_client::{Client, ErrorReason, Session};
use holdfast_model::LockKey;
use holdfast_tests::*;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn key(k: &str) -> LockKey {
    LockKey::parse(k).unwrap()
}

/// Asserts `r` is a RESOURCE_EXHAUSTED refusal of `reason` naming `limit`.
fn refused<T>(r: Result<T, holdfast_client::Error>, reason: ErrorReason, limit: &str) {
    let Err(e) = r else { panic!("expected a {reason:?} refusal naming {limit}, but the call succeeded") };
    assert_eq!(e.reason(), Some(reason), "{e}");
    assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains(limit), "the refusal names {limit}: {e}");
}

/// Retries `call` while it is refused for a quota (the arbiter's watch may
/// not have seen the release or close that frees one yet), for about a
/// second: its result, or `None` if it was still refused.
async fn once_quota_allows<T, F: std::future::Future<Output = Result<T, holdfast_client::Error>>>(call: impl Fn() -> F) -> Option<T> {
    for _ in 0..50 {
        match call().await {
            Ok(v) => return Some(v),
            Err(e) if e.reason() == Some(ErrorReason::Quota) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{e}"),
        }
    }
    None
}

#[tokio::test]
async fn quotas_on_sessions_and_holds_refuse_naming_the_limit_and_write_nothing() {
    let limits = |c: &mut holdfast_config::ArbiterConfig| {
        c.limits.max_sessions_per_identity = 2;
        c.limits.max_holds_per_identity = 3;
        c.limits.max_holds_per_namespace = 2;
        c.limits.namespaces.insert("qbig".into(), holdfast_config::arbiter::NamespaceLimits { max_holds: 10 });
    };
    let app = Appliance::start_policy("limits-quota", 1, &limits, &[("q", 30), ("qbig", 30)], "").await;
    let a = app.client("quota/a").await;
    let b = app.client("quota/b").await;

    // Sessions per identity: the third of A's is refused; B has its own.
    let s1 = a.open_session(TTL).await.unwrap();
    let s2 = a.open_session(TTL).await.unwrap();
    let before = app.etcd.revision().await;
    refused(a.open_session(TTL).await, ErrorReason::Quota, "limits.max_sessions_per_identity = 2");
    assert_eq!(app.etcd.revision().await, before, "a refused session writes nothing");
    let sb = b.open_session(TTL).await.unwrap();

    // Holds per namespace: q takes two, across identities.
    let h1 = s1.acquire(&key("q/one"), Duration::ZERO).await.unwrap();
    let _h2 = sb.acquire(&key("q/two"), Duration::ZERO).await.unwrap();
    let before = app.etcd.revision().await;
    refused(s2.acquire(&key("q/three"), Duration::ZERO).await, ErrorReason::Quota, "limits.max_holds_per_namespace = 2");
    refused(sb.acquire(&key("q/three"), Duration::ZERO).await, ErrorReason::Quota, "namespace \"q\" has 2 holds");
    assert_eq!(app.etcd.revision().await, before, "a refused acquire writes nothing");

    // qbig has its own quota of 10, so A reaches its per-identity quota of 3 there.
    let _h3 = s1.acquire(&key("qbig/a"), Duration::ZERO).await.unwrap();
    let _h4 = s2.acquire(&key("qbig/b"), Duration::ZERO).await.unwrap();
    let before = app.etcd.revision().await;
    refused(s1.acquire(&key("qbig/c"), Duration::ZERO).await, ErrorReason::Quota, "limits.max_holds_per_identity = 3");
    assert_eq!(app.etcd.revision().await, before);
    sb.acquire(&key("qbig/c"), Duration::ZERO).await.expect("B is under its own quota");

    // A release frees quota (once the arbiter's watch has seen it).
    h1.release().await.unwrap();
    let three = key("q/three");
    let granted = once_quota_allows(|| s2.acquire(&three, Duration::ZERO)).await;
    assert!(granted.is_some(), "q/three was still refused a second after a release in q");

    // The caps and the per-class hold counts are metrics.
    let text = scrape(app.arbiter.metrics_port).await;
    assert_eq!(sample(&text, "holdfast_arbiter_limit_sessions_per_identity{cluster=\"test\"}"), 2.0, "{text}");
    assert_eq!(sample(&text, "holdfast_arbiter_limit_holds_per_identity{cluster=\"test\"}"), 3.0);
    assert_eq!(sample(&text, "holdfast_arbiter_limit_holds_per_namespace{cluster=\"test\"}"), 2.0);
    assert!(sample(&text, "holdfast_arbiter_quota_refusals_total{cluster=\"test\"}") >= 4.0, "{text}");
    let qbig = "{namespace=\"qbig\",class=\"qbig\",tier=\"entity\",cluster=\"test\"}";
    let mut seen = String::new();
    for _ in 0..50 {
        seen = scrape(app.arbiter.metrics_port).await;
        if sample_opt(&seen, &format!("holdfast_arbiter_holds{qbig}")) == Some(3.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sample(&seen, &format!("holdfast_arbiter_holds{qbig}")), 3.0, "{seen}");
    assert_eq!(sample(&seen, &format!("holdfast_arbiter_holds_quota{qbig}")), 10.0, "{seen}");
}

/// Waiters of a durable class: each is two writes, a read and watches. One
/// identity queuing past `limits.max_durable_waiters_per_namespace` is
/// refused before anything is written, while another identity keeps locking.
#[tokio::test]
async fn a_flood_of_durable_waiters_is_refused_and_another_identity_still_locks() {
    let limits = |c: &mut holdfast_config::ArbiterConfig| c.limits.max_durable_waiters_per_namespace = 3;
    // "durable-q" has durable fairness (DURABLE_CLASSES), "free" is best-effort.
    let app = Appliance::start_policy("limits-waiters", 1, &limits, &[("durable-q", 30), ("free", 30)], "").await;
    let a = app.client("flood/a").await;
    let b = app.client("flood/b").await;
    let k = key("durable-q/k");
    let hold = a.open_session(TTL).await.unwrap().acquire(&k, Duration::ZERO).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let s = a.open_session(TTL).await.unwrap();
        let k = k.clone();
        waiting.push(tokio::spawn(async move {
            let h = s.acquire(&k, Duration::from_secs(30)).await?;
            h.release().await?;
            Ok::<_, holdfast_client::Error>(())
        }));
    }
    let queued = || async {
        let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
        app.etcd.client().await.get(holdfast_model::layout::WAITER_PREFIX, Some(opts)).await.unwrap().count()
    };
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while queued().await != 3 {
        assert!(tokio::time::Instant::now() < end, "three durable waiters were not recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fourth = a.open_session(TTL).await.unwrap();
    let before = app.etcd.revision().await;
    refused(fourth.acquire(&k, Duration::from_secs(30)).await, ErrorReason::Quota, "limits.max_durable_waiters_per_namespace = 3");
    assert_eq!(app.etcd.revision().await, before, "a refused durable waiter writes nothing");
    assert_eq!(queued().await, 3);

    // Meanwhile B's locks are granted.
    let sb = b.open_session(TTL).await.unwrap();
    for i in 0..20 {
        let h = sb.acquire(&key(&format!("free/{i}")), Duration::ZERO).await.expect("B is granted while A floods");
        h.release().await.unwrap();
    }

    // The queue drains once A's hold ends, and the place is free again.
    hold.release().await.unwrap();
    for w in waiting {
        w.await.unwrap().expect("each queued waiter is granted in turn");
    }
    let other = key("durable-q/other");
    let granted = once_quota_allows(|| fourth.acquire(&other, Duration::from_secs(1))).await;
    assert!(granted.is_some(), "still refused a second after the queue drained");
    let text = scrape(app.arbiter.metrics_port).await;
    assert_eq!(sample(&text, "holdfast_arbiter_limit_durable_waiters_per_namespace{cluster=\"test\"}"), 3.0, "{text}");
}

/// Sessions opened at the same moment through one arbiter: each counts from
/// its quota check, so exactly the quota is granted (the check alone reads
/// the watched counts, which none of the concurrent opens had reached yet).
#[tokio::test]
async fn concurrent_opens_through_one_arbiter_never_pass_the_session_quota() {
    let limits = |c: &mut holdfast_config::ArbiterConfig| c.limits.max_sessions_per_identity = 3;
    let app = Appliance::start_policy("limits-race", 1, &limits, &[("q", 30)], "").await;
    let a = app.client("quota/a").await;
    let mut opens = tokio::task::JoinSet::new();
    for _ in 0..24 {
        let a = a.clone();
        opens.spawn(async move { a.open_session(TTL).await });
    }
    let mut granted = Vec::new();
    let mut refusals = 0;
    while let Some(r) = opens.join_next().await {
        match r.unwrap() {
            Ok(s) => granted.push(s),
            r => {
                refused(r, ErrorReason::Quota, "limits.max_sessions_per_identity = 3");
                refusals += 1;
            }
        }
    }
    assert_eq!((granted.len(), refusals), (3, 21), "24 concurrent opens under a quota of 3");
    let mut sessions = app.etcd.client().await;
    let listed = sessions
        .get(holdfast_model::layout::SESSION_PREFIX, Some(etcd_client::GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap();
    assert_eq!(listed.count(), 3, "session records in etcd");

    // Closing one frees its place for the next open.
    let first = granted.pop().unwrap();
    first.close().await.unwrap();
    let reopened = once_quota_allows(|| a.open_session(TTL)).await;
    assert!(reopened.is_some(), "still refused a second after a session closed");
    refused(a.open_session(TTL).await, ErrorReason::Quota, "limits.max_sessions_per_identity = 3");
}

/// Calls `inspect` until the arbiter refuses one; returns how many it answered.
async fn until_limited(client: &Client) -> usize {
    for answered in 0..1000 {
        if let Err(e) = client.inspect(&key("r/k")).await {
            assert_eq!(e.reason(), Some(ErrorReason::RateLimited), "{e}");
            return answered;
        }
    }
    panic!("1000 calls in a row were answered: no rate limit");
}

#[tokio::test]
async fn the_request_rate_is_limited_per_identity() {
    let limits = |c: &mut holdfast_config::ArbiterConfig| {
        c.limits.requests_per_second = 2;
        c.limits.request_burst = 10;
    };
    let app = Appliance::start_policy("limits-rate", 1, &limits, &[("r", 30)], "").await;
    let a = app.client("rate/a").await;
    let b = app.client("rate/b").await;
    let session: Session = b.open_session(TTL).await.unwrap();

    // A spends its burst (permits refill at 2/s while it does) and is refused.
    let started = std::time::Instant::now();
    let answered = until_limited(&a).await;
    let most = 10.0 + 2.0 * started.elapsed().as_secs_f64() + 1.0;
    assert!(answered >= 10 && answered as f64 <= most, "burst 10 at 2/s, yet {answered} calls were answered first");
    // A session call while limited is refused and writes nothing. (On a slow
    // machine a permit may refill first: that call is granted, and the next
    // one is refused.)
    let mut opened = Vec::new();
    loop {
        let before = app.etcd.revision().await;
        match a.open_session(TTL).await {
            Ok(s) if opened.len() < 3 => opened.push(s),
            r => {
                refused(r, ErrorReason::RateLimited, "limits.requests_per_second = 2");
                assert_eq!(app.etcd.revision().await, before, "a rate-limited call writes nothing");
                break;
            }
        }
    }

    // B's bucket is its own: its lock goes through while A is limited.
    let hold = session.acquire(&key("r/b"), Duration::ZERO).await.expect("B is not limited by A's calls");
    hold.release().await.unwrap();

    // The bucket refills: after a second A has two permits again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    a.inspect(&key("r/k")).await.expect("a permit after a second at 2/s");

    let text = scrape(app.arbiter.metrics_port).await;
    assert_eq!(sample(&text, "holdfast_arbiter_limit_requests_per_second{cluster=\"test\"}"), 2.0, "{text}");
    assert_eq!(sample(&text, "holdfast_arbiter_limit_request_burst{cluster=\"test\"}"), 10.0);
    assert!(sample(&text, "holdfast_arbiter_rate_limited_total{cluster=\"test\"}") >= 2.0, "{text}");
}

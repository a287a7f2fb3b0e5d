//! Client semantics against real etcd: batched sessions, drain-then-fence,
//! re-entrancy, fair waiting, key affinity.

use holdfast_client::{AcquireOptions, ErrorReason, Fenced};
use holdfast_model::{LockKey, layout};
use holdfast_tests::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn key(s: &str) -> LockKey {
    LockKey::parse(s).unwrap()
}

fn no_fence() -> impl Fn(Fenced) + Send + Sync + 'static {
    |f: Fenced| panic!("unexpected fence of {} keys", f.keys.len())
}

fn opts(ttl: u64, wait_ms: u64) -> AcquireOptions {
    AcquireOptions { ttl: Some(Duration::from_secs(ttl)), wait: Duration::from_millis(wait_ms) }
}

async fn lease_count(etcd: &Etcd) -> usize {
    etcd.client().await.leases().await.unwrap().leases().len()
}

#[tokio::test]
async fn holds_of_one_ttl_share_one_session_and_one_lease() {
    // Two classes of different TTLs, so a second TTL is possible.
    let app = Appliance::start_policy("batched", 1, &defaults, &[("batch", 15), ("batch-long", 30)], "").await;
    let locker = app.locker("svc/batch", &[&app.arbiter], no_fence());
    let leases_before = lease_count(&app.etcd).await;
    let mut guards = Vec::new();
    for i in 0..500 {
        guards.push(locker.acquire(&key(&format!("batch/k{i}")), opts(15, 0)).await.unwrap());
    }
    assert_eq!(lease_count(&app.etcd).await, leases_before + 1, "500 holds of one TTL use one etcd lease");
    let holds = app.etcd.client().await.get(layout::HOLD_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(holds.kvs().len(), 500);
    let lease = holds.kvs()[0].lease();
    assert!(holds.kvs().iter().all(|kv| kv.lease() == lease), "every hold is attached to the session's lease");
    // A second TTL is a second session.
    let other = locker.acquire(&key("batch-long/other-ttl"), opts(30, 0)).await.unwrap();
    assert_eq!(lease_count(&app.etcd).await, leases_before + 2);
    assert_ne!(other.session_id(), guards[0].session_id());
    for g in guards {
        assert!(g.release().await.unwrap());
    }
}

#[tokio::test]
async fn reentrant_acquire_costs_one_grant_and_one_release() {
    let app = Appliance::start("reentrant", 1).await;
    let locker = app.locker("svc/re", &[&app.arbiter], no_fence());
    let k = key("re/entrant");
    let r0 = app.etcd.revision().await;
    let a = locker.acquire(&k, opts(10, 0)).await.unwrap();
    let b = locker.acquire(&k, opts(10, 0)).await.unwrap();
    let c = locker.acquire(&k, opts(10, 0)).await.unwrap();
    assert_eq!(a.token(), b.token());
    assert_eq!(b.token(), c.token());
    let r1 = app.etcd.revision().await;
    // The session record and lease grant add one revision, the grant one.
    assert_eq!(r1 - r0, 2, "three nested acquires cost one grant transaction");
    assert!(!c.release().await.unwrap());
    assert!(!b.release().await.unwrap());
    assert_eq!(app.etcd.revision().await, r1, "inner releases reach nothing");
    // The same identity through a second session: a leak, not contention.
    let second = app.locker("svc/re", &[&app.arbiter], no_fence());
    let err = match second.acquire(&k, opts(10, 0)).await {
        Err(e) => e,
        Ok(_) => panic!("a second session of the same identity got a held key"),
    };
    assert_eq!(err.reason(), Some(ErrorReason::Leak), "{err}");
    let other = app.locker("svc/other", &[&app.arbiter], no_fence());
    let err = match other.acquire(&k, opts(10, 0)).await {
        Err(e) => e,
        Ok(_) => panic!("another identity got a held key"),
    };
    assert_eq!(err.reason(), Some(ErrorReason::Contention), "{err}");
    let r2 = app.etcd.revision().await;
    assert!(a.release().await.unwrap());
    assert_eq!(app.etcd.revision().await, r2 + 1, "the outermost release is one transaction");
}

#[tokio::test]
async fn drain_then_fence_before_etcd_expires_the_lease() {
    // The freezes below are timed against a 6 s session TTL.
    let app = Appliance::start_policy("fence", 1, &defaults, &[("fence", 6)], "").await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Fenced)>();
    let locker = app.locker("svc/fence", &[&app.arbiter], move |f| {
        let _ = tx.send((Instant::now(), f));
    });
    let k = key("fence/job");
    let guard = locker.acquire(&k, opts(6, 0)).await.unwrap();
    assert!(guard.can_start());
    let etcd = app.etcd.client().await;
    let pid = app.arbiter.pid().unwrap();

    // 1. A short freeze: can_start drops at the first failed keepalive and
    //    comes back when keepalives recover; no fence.
    sigstop(pid);
    let frozen = Instant::now();
    while guard.can_start() {
        assert!(frozen.elapsed() < Duration::from_secs(4), "can_start stayed true through failed keepalives");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dropped_after = frozen.elapsed();
    sigcont(pid);
    let end = Instant::now() + Duration::from_secs(5);
    while !guard.can_start() {
        assert!(Instant::now() < end, "can_start did not recover after keepalives resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rx.try_recv().is_err(), "no fence on a recovered blip");
    eprintln!("can_start dropped {dropped_after:?} after the freeze and recovered");

    // 2. A long freeze: on_fence fires while etcd still holds the lease.
    sigstop(pid);
    let frozen = Instant::now();
    let (at, fenced) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("on_fence fired").unwrap();
    // Read etcd directly, at once: the lease and the hold must still exist.
    let ttl = etcd.clone().lease_time_to_live(guard.session_id() as i64, None).await.unwrap().ttl();
    let hold = etcd.clone().get(layout::hold_key(&k), None).await.unwrap();
    sigcont(pid);
    eprintln!("on_fence after {:?}; etcd lease TTL then: {ttl}s", at - frozen);
    assert_eq!(fenced.keys, vec![k.clone()]);
    assert!(ttl >= 0, "the lease had already expired in etcd when on_fence fired");
    assert_eq!(hold.kvs().len(), 1, "the hold had already expired in etcd when on_fence fired");
    assert!(!guard.can_start());
    assert_eq!(guard.remaining_ttl(), Duration::ZERO);
}

#[tokio::test]
async fn waiters_are_granted_in_arrival_order_with_one_grant_per_release() {
    let app = Appliance::start("fifo", 1).await;
    let k = key("hot/key");
    let status = app.client("svc/observer").await;
    let holder = app.client("svc/holder").await;
    let hs = holder.open_session(Duration::from_secs(10)).await.unwrap();
    let first = hs.acquire(&k, Duration::ZERO).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = app.client(&format!("svc/w{i}")).await;
        let session = client.open_session(Duration::from_secs(10)).await.unwrap();
        let order = order.clone();
        let wk = k.clone();
        tasks.push(tokio::spawn(async move {
            let hold = session.acquire(&wk, Duration::from_secs(60)).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(50)).await;
            hold.release().await.unwrap();
        }));
        // Arrival order: wait until this waiter is queued.
        let end = Instant::now() + Duration::from_secs(5);
        while status.inspect(&k).await.unwrap().waiters < i + 1 {
            assert!(Instant::now() < end, "waiter {i} never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let attempts_before = app.arbiter.grant_attempts(&status).await;
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let attempts = app.arbiter.grant_attempts(&status).await - attempts_before;
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>(), "granted in arrival order");
    assert_eq!(attempts, 20, "20 releases with a waiter caused {attempts} grant transactions");
}

#[tokio::test]
async fn without_watch_events_a_waiter_is_granted_within_about_a_second() {
    let Appliance { dir: _dir, etcd, pki, arbiter, controller: _controller } =
        Appliance::start_with("poll", 1, &|c| c.waiters.watch = false).await;
    let a = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let b = arbiter.client(&pki, &pki.workload("b", "svc/b")).await;
    let k = key("poll/key");
    let sa = a.open_session(Duration::from_secs(10)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(10)).await.unwrap();
    let _hold = sa.acquire(&k, Duration::ZERO).await.unwrap();
    let k2 = k.clone();
    let waiter = tokio::spawn(async move { sb.acquire(&k2, Duration::from_secs(20)).await.map(|h| (Instant::now(), h.token())) });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The hold ends behind this arbiter's back (as a release through another
    // arbiter would): no watch event and no in-memory hint, only the poll.
    let released = Instant::now();
    let deleted = etcd.client().await.delete(layout::hold_key(&k), None).await.unwrap();
    assert_eq!(deleted.deleted(), 1);
    let (granted, _) = waiter.await.unwrap().unwrap();
    let took = granted - released;
    eprintln!("granted {took:?} after the release, by polling");
    assert!(took < Duration::from_millis(1600), "polling took {took:?}");
}

#[tokio::test]
async fn the_keys_watch_hands_it_on_after_each_release_made_behind_the_arbiters_back() {
    // Watches on (the default): one watch per key with waiters, kept while
    // the queue lasts. Three waiters queue behind a holder; each hold then
    // ends behind this arbiter's back (as a release through another arbiter
    // or a lease expiry would), with no in-memory hint: only the key's
    // watch can beat the poll (once a second, plus up to 200 ms of jitter).
    let app = Appliance::start("follow", 1).await;
    let k = key("hot/follow");
    let status = app.client("svc/observer").await;
    let holder = app.client("svc/holder").await;
    let hs = holder.open_session(Duration::from_secs(10)).await.unwrap();
    let first = hs.acquire(&k, Duration::ZERO).await.unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = app.client(&format!("svc/w{i}")).await;
        let session = client.open_session(Duration::from_secs(10)).await.unwrap();
        let (granted, wk) = (granted.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            // Kept (not released) until the test deletes it in etcd.
            let hold = session.acquire(&wk, Duration::from_secs(60)).await.unwrap();
            granted.lock().unwrap().push((i, Instant::now(), hold.token()));
            (session, hold)
        }));
        let end = Instant::now() + Duration::from_secs(5);
        while status.inspect(&k).await.unwrap().waiters < i + 1 {
            assert!(Instant::now() < end, "waiter {i} never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // One watch for the key, not one per waiter.
    let key_watches = || async { sample(&scrape(app.arbiter.metrics_port).await, "holdfast_arbiter_key_watches{cluster=\"test\"}") };
    assert_eq!(key_watches().await, 1.0, "three waiters on one key");
    // Past the waiters' first poll, so a late grant would show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let etcd = app.etcd.client().await;
    let attempts_before = app.arbiter.grant_attempts(&status).await;
    let mut previous = first.token();
    for i in 0..3 {
        let deleted_at = Instant::now();
        assert_eq!(etcd.clone().delete(layout::hold_key(&k), None).await.unwrap().deleted(), 1);
        let end = Instant::now() + Duration::from_secs(10);
        let (who, at, token) = loop {
            if let Some(g) = granted.lock().unwrap().get(i).copied() {
                break g;
            }
            assert!(Instant::now() < end, "nobody was granted the key after the delete of hold {i}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let took = at - deleted_at;
        eprintln!("waiter {who} granted {took:?} after the hold was deleted in etcd");
        assert_eq!(who as usize, i, "granted out of arrival order");
        assert!(token > previous);
        assert!(took < Duration::from_millis(500), "handoff {i} took {took:?}: the waiter was granted by polling");
        previous = token;
    }
    let attempts = app.arbiter.grant_attempts(&status).await - attempts_before;
    assert_eq!(attempts, 3, "3 deletes with a waiter caused {attempts} grant transactions");
    for t in tasks {
        t.await.unwrap();
    }
    drop(first);
    // Nobody waits any more: the key's watch is gone with its queue.
    let end = Instant::now() + Duration::from_secs(5);
    while key_watches().await != 0.0 {
        assert!(Instant::now() < end, "the key's watch outlived its queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_release_through_the_arbiter_hands_the_key_to_its_waiter_without_waiting_for_a_poll() {
    // Watches off: only the arbiter's own release hint can beat the poll
    // (once a second, plus up to 200 ms of jitter).
    let Appliance { dir: _dir, etcd: _etcd, pki, arbiter, controller: _controller } =
        Appliance::start_with("hint", 1, &|c| c.waiters.watch = false).await;
    let k = key("poll/hint");
    let a = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let b = arbiter.client(&pki, &pki.workload("b", "svc/b")).await;
    let sa = a.open_session(Duration::from_secs(10)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(10)).await.unwrap();
    let attempts_before = arbiter.grant_attempts(&a).await;
    // Ten handoffs, each to a waiter that has waited past its first poll
    // attempt; by polling alone they would take ~10 s in all.
    let mut total = Duration::ZERO;
    let mut hold = sa.acquire(&k, Duration::ZERO).await.unwrap();
    let sessions = [&sa, &sb];
    for i in 0..10 {
        let next = sessions[(i + 1) % 2];
        let k2 = k.clone();
        let waiting = async {
            let h = next.acquire(&k2, Duration::from_secs(20)).await;
            (h, Instant::now())
        };
        let releasing = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Watches off: none for the waiting key.
            let text = scrape(arbiter.metrics_port).await;
            assert_eq!(sample(&text, "holdfast_arbiter_waiters{cluster=\"test\"}"), 1.0, "{text}");
            assert_eq!(sample(&text, "holdfast_arbiter_key_watches{cluster=\"test\"}"), 0.0, "{text}");
            let released = Instant::now();
            hold.release().await.unwrap();
            released
        };
        let ((h, granted), released) = tokio::join!(waiting, releasing);
        total += granted.saturating_duration_since(released);
        hold = h.unwrap();
    }
    hold.release().await.unwrap();
    let attempts = arbiter.grant_attempts(&a).await - attempts_before;
    eprintln!("ten handoffs took {total:?} after their releases, {attempts} grant transactions");
    assert!(total < Duration::from_millis(2000), "ten handoffs took {total:?}: the waiters were granted by polling");
    // One for the first hold, then one per handoff (a waiter's first try
    // when it queues counts as one more each: 1 + 10 + 10).
    assert!(attempts <= 21, "{attempts} grant transactions for 10 handoffs");
}

/// An AcquireRequest as clients sent it while durable waiting was the
/// caller's choice: field 5 asked for it. The class decides now, and the
/// arbiter ignores the field.
#[derive(Clone, PartialEq, prost::Message)]
struct AcquireAskingFairness {
    #[prost(uint64, tag = "1")]
    session_id: u64,
    #[prost(string, tag = "2")]
    namespace: String,
    #[prost(string, tag = "3")]
    key: String,
    #[prost(uint64, tag = "4")]
    wait_millis: u64,
    #[prost(bool, tag = "5")]
    durable: bool,
}

async fn acquire_asking(
    client: &holdfast_client::Client,
    session_id: u64,
    k: &LockKey,
    wait: Duration,
    durable: bool,
) -> Result<holdfast_proto::v1::AcquireResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(client.channel());
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/lock.v1.Lock/Acquire");
    let codec = tonic_prost::ProstCodec::<AcquireAskingFairness, holdfast_proto::v1::AcquireResponse>::default();
    let req = AcquireAskingFairness {
        session_id,
        namespace: k.namespace().into(),
        key: k.key().into(),
        wait_millis: wait.as_millis() as u64,
        durable,
    };
    grpc.unary(tonic::Request::new(req), path, codec).await.map(|r| r.into_inner())
}

/// Durable waiter records (`/q/`) written or deleted since `from`.
async fn waiter_writes_since(etcd: &Etcd, from: i64) -> usize {
    let mut client = etcd.client().await;
    let options = etcd_client::WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = client.watch(layout::WAITER_PREFIX, Some(options)).await.unwrap();
    let mut n = 0;
    while let Ok(Ok(Some(resp))) = tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
        n += resp.events().len();
    }
    n
}

async fn waiters_now(etcd: &Etcd) -> i64 {
    let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
    etcd.client().await.get(layout::WAITER_PREFIX, Some(opts)).await.unwrap().count()
}

/// A release no arbiter answered may still be applied later. Until it is
/// answered, the key stays blocked in the locker: the next acquire sends the
/// release again first (and fails while that goes unanswered), so the
/// arbiter never hands the session its old hold back for a late release to
/// delete (the two-holder trace the protocol model found).
#[tokio::test]
async fn an_unanswered_release_is_sent_again_before_the_key_is_acquired_again() {
    let mut app = Appliance::start("release-unanswered", 1).await;
    let locker = app.locker("svc/unanswered", &[&app.arbiter], no_fence());
    let k = key("orders/unanswered");
    // 30 s sessions: the session outlives the arbiter's absence.
    let g = locker.acquire(&k, opts(30, 0)).await.unwrap();
    let (first, session) = (g.token(), g.session_id());
    let port = app.arbiter.port;
    app.arbiter.stop();
    let e = g.release().await.unwrap_err();
    assert_eq!(e.reason(), Some(ErrorReason::Unavailable), "no arbiter: the release's outcome is unknown: {e}");
    let holds = app.etcd.client().await.get(layout::HOLD_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(holds.kvs().len(), 1, "the hold is still in etcd");
    let e = locker.acquire(&k, opts(30, 0)).await.err().expect("no acquire while the release is unanswered");
    assert_eq!(e.reason(), Some(ErrorReason::Unavailable), "{e}");
    // An arbiter is back at the same address: the acquire first has the
    // release answered, then gets a hold of its own.
    app.arbiter = Arbiter::start_with(&app.dir.path, "arbiter", &app.etcd.endpoints(), &app.pki, &move |c| {
        c.listen = ([127, 0, 0, 1], port).into();
    });
    let again = locker.acquire(&k, opts(30, 0)).await.unwrap();
    assert_eq!(again.session_id(), session, "the same session");
    assert!(again.token() > first, "a new hold, not the old one handed back to its session");
    let holds = app.etcd.client().await.get(layout::HOLD_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(holds.kvs().len(), 1);
    assert_eq!(holds.kvs()[0].create_revision() as u64, again.token().revision(), "etcd holds the new hold");
    assert!(again.release().await.unwrap());
    // An answered release leaves nothing to send: the next acquire is one grant.
    let g = locker.acquire(&k, opts(30, 0)).await.unwrap();
    assert!(g.release().await.unwrap());
}

/// A release whose future is dropped before its answer (a timeout around
/// it) is unanswered too: the key stays blocked the same way.
#[tokio::test]
async fn a_release_dropped_before_its_answer_blocks_the_key_too() {
    let mut app = Appliance::start("release-dropped", 1).await;
    let locker = app.locker("svc/dropped", &[&app.arbiter], no_fence());
    let k = key("orders/dropped");
    let g = locker.acquire(&k, opts(30, 0)).await.unwrap();
    let (first, session) = (g.token(), g.session_id());
    let (port, pid) = (app.arbiter.port, app.arbiter.pid().unwrap());
    // The arbiter is stopped: the release waits, and the caller gives up.
    sigstop(pid);
    assert!(tokio::time::timeout(Duration::from_millis(500), g.release()).await.is_err(), "the release was answered");
    // The request dies with the process, never applied.
    sigkill(pid);
    app.arbiter.stop();
    let holds = app.etcd.client().await.get(layout::HOLD_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(holds.kvs().len(), 1, "the hold is still in etcd");
    app.arbiter = Arbiter::start_with(&app.dir.path, "arbiter", &app.etcd.endpoints(), &app.pki, &move |c| {
        c.listen = ([127, 0, 0, 1], port).into();
    });
    let end = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match locker.acquire(&k, opts(30, 0)).await {
            Ok(g) => break g,
            // The locker's connection to the killed process is broken: the
            // first call on it may fail before it reconnects.
            Err(e) if e.reason() == Some(ErrorReason::Unavailable) && Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("acquire after the restart: {e}"),
        }
    };
    assert_eq!(again.session_id(), session, "the same session");
    assert!(again.token() > first, "a new hold, not the old one handed back to its session");
    assert!(again.release().await.unwrap());
}

#[tokio::test]
async fn fairness_is_the_classs_whatever_the_request_says() {
    // "plain" is best-effort, "durable-order" durable (DURABLE_CLASSES).
    let app = Appliance::start_policy("fairness", 1, &defaults, &[("plain", 30), ("durable-order", 30)], "").await;
    let holder = app.client("svc/holder").await;
    let hs = holder.open_session(Duration::from_secs(30)).await.unwrap();
    let (plain, durable) = (key("plain/k"), key("durable-order/k"));
    let plain_hold = hs.acquire(&plain, Duration::ZERO).await.unwrap();
    let durable_hold = hs.acquire(&durable, Duration::ZERO).await.unwrap();
    let waiter = app.client("svc/waiter").await;
    let ws = waiter.open_session(Duration::from_secs(30)).await.unwrap();

    // A best-effort class: a request asking for a durable wait waits in
    // memory and writes nothing under /q/.
    let from = app.etcd.revision().await + 1;
    let asked = acquire_asking(&waiter, ws.id(), &plain, Duration::from_millis(1500), true).await;
    let refused = asked.expect_err("the key is held");
    assert_eq!(refused.code(), tonic::Code::Aborted, "contention: {refused:?}");
    assert_eq!(waiter_writes_since(&app.etcd, from).await, 0, "a best-effort class wrote /q/ because the request asked");

    // A durable class: a request asking for none is recorded anyway, and
    // granted when the holder releases.
    let queued = {
        let (waiter, id, durable) = (waiter.clone(), ws.id(), durable.clone());
        tokio::spawn(async move { acquire_asking(&waiter, id, &durable, Duration::from_secs(20), false).await })
    };
    let end = Instant::now() + Duration::from_secs(5);
    while waiters_now(&app.etcd).await != 1 {
        assert!(Instant::now() < end, "the durable class's waiter was not recorded under /q/");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    durable_hold.release().await.unwrap();
    let granted = queued.await.unwrap().expect("granted after the release");
    assert!(granted.token > 0);
    assert_eq!(waiters_now(&app.etcd).await, 0, "the grant consumed the waiter record");
    plain_hold.release().await.unwrap();
}

#[tokio::test]
async fn durable_waiting_order_survives_an_arbiter_restart() {
    let dir = TestDir::new("durable");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    // 60 s sessions: they outlive the first arbiter, whose death stops their keepalives.
    let _controller = etcd.publish_policy(&dir.path, &[("durable", 60)], "").await;
    let pki = Pki::new(&dir.path);
    let mut first_arbiter = Arbiter::start(&dir.path, "arbiter-1", &etcd.endpoints(), &pki);
    let k = key("durable/key");
    let holder = first_arbiter.client(&pki, &pki.workload("h", "svc/h")).await;
    let hs = holder.open_session(Duration::from_secs(60)).await.unwrap();
    let hold = hs.acquire(&k, Duration::ZERO).await.unwrap();
    // Three waiters queue, in order, through the first arbiter: the class
    // is durable (DURABLE_CLASSES), the requests ask nothing.
    let mut sessions = Vec::new();
    for i in 0..3 {
        let c = first_arbiter.client(&pki, &pki.workload(&format!("w{i}"), &format!("svc/w{i}"))).await;
        let s = c.open_session(Duration::from_secs(60)).await.unwrap();
        let s = Arc::new(s);
        let task = {
            let (s, c, k) = (s.clone(), c.clone(), k.clone());
            tokio::spawn(async move { s.acquire_on(&c, &k, Duration::from_secs(60)).await })
        };
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let q = etcd
                .client()
                .await
                .get(layout::WAITER_PREFIX, Some(etcd_client::GetOptions::new().with_prefix().with_count_only()))
                .await
                .unwrap();
            if q.count() as usize == i + 1 {
                break;
            }
            assert!(Instant::now() < end, "waiter {i} not recorded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sessions.push((i, s, task));
    }
    // The arbiter dies; its in-memory state is gone. The waiters' calls fail.
    sigkill(first_arbiter.pid().unwrap());
    first_arbiter.stop();
    for (_, _, task) in sessions.iter_mut() {
        let r = task.await.unwrap();
        assert!(r.is_err());
    }
    // A new arbiter; the waiters retry in REVERSE order, and still are
    // granted in their original order.
    let second = Arbiter::start(&dir.path, "arbiter-2", &etcd.endpoints(), &pki);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, s, _) in sessions.into_iter().rev() {
        let c = second.client(&pki, &pki.workload(&format!("w{i}"), &format!("svc/w{i}"))).await;
        let (order, k) = (order.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let h = s.acquire_on(&c, &k, Duration::from_secs(60)).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(100)).await;
            h.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let holder2 = second.client(&pki, &pki.workload("h", "svc/h")).await;
    let req = holdfast_proto::v1::ReleaseRequest {
        session_id: hs.id(),
        namespace: "durable".into(),
        key: "key".into(),
        token: hold.token().expose(),
    };
    assert!(holder2.rpc().release(req).await.unwrap().into_inner().released);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2], "durable order survived the restart");
}

#[tokio::test]
async fn keys_spread_over_three_arbiters_and_killing_one_moves_only_its_keys() {
    let dir = TestDir::new("affinity");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_policy(&dir.path, &[("spread", 15)], "").await;
    let pki = Pki::new(&dir.path);
    let mut arbiters: Vec<Arbiter> = (0..3).map(|i| Arbiter::start(&dir.path, &format!("arbiter-{i}"), &etcd.endpoints(), &pki)).collect();
    let watcher = pki.workload("obs", "svc/obs");
    let mut observers = Vec::new();
    for a in &arbiters {
        observers.push(a.client(&pki, &watcher).await);
    }
    let cert = pki.workload("svc", "svc/spread");
    let locker = holdfast_client::Locker::new(
        holdfast_client::LockerConfig {
            endpoints: arbiters.iter().map(|a| a.endpoint()).collect(),
            ca: pki.ca.ca_path(),
            cert: cert.cert,
            key: cert.key,
        },
        |_| {},
    )
    .unwrap();
    let keys: Vec<LockKey> = (0..90).map(|i| key(&format!("spread/k{i}"))).collect();
    let endpoints: Vec<String> = arbiters.iter().map(|a| a.endpoint()).collect();
    let home: Vec<usize> = keys.iter().map(|k| holdfast_client::affinity::ranked(&k.to_string(), &endpoints)[0]).collect();
    let second: Vec<usize> = keys.iter().map(|k| holdfast_client::affinity::ranked(&k.to_string(), &endpoints)[1]).collect();
    let mut expected = [0u64; 3];
    for h in &home {
        expected[*h] += 1;
    }
    assert!(expected.iter().all(|n| *n >= 15), "keys spread over all three: {expected:?}");

    async fn attempts(obs: &[holdfast_client::Client], alive: &[bool]) -> Vec<u64> {
        let mut v = Vec::new();
        for (o, up) in obs.iter().zip(alive) {
            v.push(if *up { o.server_status().await.unwrap().grant_attempts } else { 0 });
        }
        v
    }
    let before = attempts(&observers, &[true; 3]).await;
    for k in &keys {
        locker.acquire(k, opts(15, 0)).await.unwrap().release().await.unwrap();
    }
    let after = attempts(&observers, &[true; 3]).await;
    let got: Vec<u64> = (0..3).map(|i| after[i] - before[i]).collect();
    assert_eq!(got, expected.to_vec(), "each key went to its rendezvous home");

    // Kill arbiter 1: only its keys move, each to its second choice.
    arbiters[1].stop();
    let alive = [true, false, true];
    let before = attempts(&observers, &alive).await;
    for k in &keys {
        locker.acquire(k, opts(15, 0)).await.unwrap().release().await.unwrap();
    }
    let after = attempts(&observers, &alive).await;
    let mut expected_after = [0u64; 3];
    for (h, s) in home.iter().zip(&second) {
        expected_after[if *h == 1 { *s } else { *h }] += 1;
    }
    for i in [0, 2] {
        assert_eq!(after[i] - before[i], expected_after[i], "arbiter {i}: only the dead arbiter's keys moved");
    }
}

/// etcd #15247: a deposed leader acknowledged keepalives. The client's
/// deadline must never run past the server's expiry, also while the leader
/// its arbiter talks to is frozen, deposed and resumed.
#[tokio::test]
async fn a_deposed_leader_never_extends_the_client_deadline_past_the_server_expiry() {
    let dir = TestDir::new("deposed");
    let etcd = Etcd::start(&dir.path, 3).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_policy(&dir.path, &[("deposed", 15)], "").await;
    let pki = Pki::new(&dir.path);
    // Find the leader; the arbiter talks to it alone.
    let h = etcd.holdfast().await;
    let statuses: Vec<_> = h.member_status().await.into_iter().map(Result::unwrap).collect();
    let leader_id = statuses[0].leader;
    let leader = statuses.iter().position(|s| s.member_id == leader_id).unwrap();
    let leader_url = etcd.endpoints()[leader].clone();
    let others: Vec<String> = etcd.endpoints().into_iter().filter(|e| *e != leader_url).collect();
    let arbiter = Arbiter::start(&dir.path, "arbiter", std::slice::from_ref(&leader_url), &pki);
    let cert = pki.workload("svc", "svc/deposed");
    let locker = holdfast_client::Locker::new(
        holdfast_client::LockerConfig { endpoints: vec![arbiter.endpoint()], ca: pki.ca.ca_path(), cert: cert.cert, key: cert.key },
        |_| {},
    )
    .unwrap();
    let guard = locker.acquire(&key("deposed/k"), opts(15, 0)).await.unwrap();
    let lease = guard.session_id() as i64;
    let observer = etcd_client::Client::connect(&others, None).await.unwrap();

    // Sample: the client's deadline against the server's remaining TTL, read
    // from a member that is not the frozen leader.
    let sample = |label: &'static str| {
        let (mut observer, guard_ttl) = (observer.clone(), guard.remaining_ttl());
        async move {
            // None: no answer (e.g. during the election), not an expiry.
            let call = observer.lease_time_to_live(lease, None);
            let server = tokio::time::timeout(Duration::from_millis(300), call).await.ok().and_then(Result::ok).map(|r| r.ttl());
            (label, guard_ttl, server)
        }
    };
    let mut samples = Vec::new();
    for _ in 0..10 {
        samples.push(sample("before").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = etcd.pid(leader).unwrap();
    sigstop(pid);
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(2500) {
        samples.push(sample("leader frozen").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The frozen leader was deposed: the healthy members follow another.
    let mut status_of_others = observer.clone();
    let leader_while_frozen = tokio::time::timeout(Duration::from_secs(1), status_of_others.status()).await.map(|r| r.map(|s| s.leader()));
    sigcont(pid);
    let leader_while_frozen = leader_while_frozen.expect("a healthy member answers status").expect("status");
    assert!(
        leader_while_frozen != 0 && leader_while_frozen != leader_id,
        "the healthy members must have elected another leader while {leader_id:x} was frozen; they follow {leader_while_frozen:x}"
    );
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(6) {
        samples.push(sample("leader resumed").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new_leader = h.member_status().await.into_iter().filter_map(Result::ok).map(|s| s.leader).next().unwrap();
    eprintln!(
        "leader {leader_id:x} frozen 2.5s; {leader_while_frozen:x} led meanwhile; leader now {new_leader:x}; {} samples",
        samples.len()
    );
    for label in ["before", "leader frozen", "leader resumed"] {
        let all: Vec<_> = samples.iter().filter(|s| s.0 == label).collect();
        eprintln!("{label}: {} samples, {} answered by a healthy member", all.len(), all.iter().filter(|s| s.2.is_some()).count());
    }
    let answered: Vec<_> = samples.iter().filter_map(|(l, c, s)| s.map(|s| (l, c, s))).collect();
    assert!(answered.iter().filter(|s| *s.0 == "leader frozen").count() > 2, "the servers answered while the leader was frozen");
    assert!(answered.iter().filter(|s| *s.0 == "leader resumed").count() > 10);
    for (label, client, server) in &answered {
        let server = *server;
        if server < 0 {
            // The lease is gone on the server: the client must already be past its deadline.
            assert_eq!(**client, Duration::ZERO, "{label}: lease expired on the server but the client still had {client:?}");
        } else {
            // etcd reports whole seconds, rounded down.
            assert!(
                **client <= Duration::from_secs(server as u64 + 1),
                "{label}: client deadline {client:?} beyond the server's remaining {server}s"
            );
        }
    }
    assert_ne!(new_leader, 0);
}

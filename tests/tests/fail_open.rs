//! Fail-open (`on_quorum_loss = "open"`): once etcd has been out of reach
//! for `fail_open.after`, an open class's keys are granted from the
//! arbiter's memory with token 0, one holder per key, each grant and end
//! spooled; every other class is refused throughout; when etcd is back the
//! unprotected sessions end and grants are protected again.

use holdfast_model::spool::{Event, read_records};
use holdfast_proto::v1::*;
use holdfast_tests::*;
use std::time::Duration;
use tonic::Code;

/// An open class (efficiency, advisory, 30 s) and a fenced correctness class.
const CLASSES: &[(&str, u64)] = &[("open-cache", 30), ("ledger", 10)];

fn open_req(namespace: &str) -> OpenSessionRequest {
    OpenSessionRequest { ttl_millis: 0, namespace: namespace.into() }
}

fn acquire_req(session_id: u64, namespace: &str, key: &str, wait: Duration) -> AcquireRequest {
    AcquireRequest { session_id, namespace: namespace.into(), key: key.into(), wait_millis: wait.as_millis() as u64 }
}

/// One keepalive on a fresh stream: its answer.
async fn keepalive(rpc: &mut holdfast_proto::LockClient<tonic::transport::Channel>, id: u64) -> KeepAliveResponse {
    let mut answers =
        rpc.keep_alive(tokio_stream::iter([KeepAliveRequest { session_id: id }])).await.expect("keepalive stream").into_inner();
    answers.message().await.expect("keepalive answer").expect("one answer")
}

/// Calls `f` every 200 ms until it succeeds; panics with `what` and the
/// last error after `within`.
async fn until_ok<T, E: std::fmt::Debug, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let t = std::time::Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if t.elapsed() < within => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("{what} within {within:?}: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_class_is_granted_token_0_from_memory_in_an_outage_spooled_and_protected_again_after() {
    let after = Duration::from_secs(3);
    let mut a = Appliance::start_policy("fail-open", 1, &|c| c.fail_open.after = after, CLASSES, "").await;
    let client = a.client("workload/cache").await;
    let mut rpc = client.rpc();
    let spool = a.dir.path.join("arbiter.state").join("unprotected.spool");

    // Before the outage: protected, a real token, nothing spooled.
    let s = rpc.open_session(open_req("open-cache")).await.expect("open").into_inner();
    assert!(!s.unprotected);
    let g = rpc.acquire(acquire_req(s.session_id, "open-cache", "before", Duration::ZERO)).await.expect("grant").into_inner();
    assert!(!g.unprotected && g.token != 0 && g.epoch > 0, "{g:?}");
    assert_eq!(std::fs::metadata(&spool).expect("the spool exists from the start").len(), 0);

    // The outage: etcd's only member dies. Until the bound has passed the
    // open class is refused like any other.
    let stopped = std::time::Instant::now();
    sigkill(a.etcd.pid(0).expect("etcd's pid"));
    let e = rpc.open_session(open_req("open-cache")).await.expect_err("refused inside the bound");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(stopped.elapsed() < after, "the refusal came inside the bound ({:?})", stopped.elapsed());

    // Past the bound: an unprotected session, with the class's TTL.
    let u = loop {
        match rpc.open_session(open_req("open-cache")).await {
            Ok(r) => break r.into_inner(),
            Err(e) if e.code() == Code::Unavailable && stopped.elapsed() < after + Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("no unprotected session {:?} after etcd stopped: {e:?}", stopped.elapsed()),
        }
    };
    assert!(u.unprotected && u.ttl_millis == 30_000 && u.tier == "entity", "{u:?}");

    // The correctness class is refused throughout, sessions and grants alike.
    let e = rpc.open_session(open_req("ledger")).await.expect_err("a correctness class never fails open");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let e = rpc.acquire(acquire_req(u.session_id, "ledger", "x", Duration::ZERO)).await.expect_err("not on an unprotected session");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");

    // Token 0, one holder per key within the arbiter.
    let g = rpc.acquire(acquire_req(u.session_id, "open-cache", "k1", Duration::ZERO)).await.expect("unprotected grant").into_inner();
    assert!(g.unprotected && g.token == 0 && g.epoch == 0 && g.revision == 0, "{g:?}");
    // Inspect reads etcd: it does not show unprotected holds.
    let e = rpc.inspect(InspectRequest { namespace: "open-cache".into(), key: "k1".into() }).await.expect_err("inspect needs etcd");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let other = a.client("workload/other").await;
    let mut rpc2 = other.rpc();
    let u2 = rpc2.open_session(open_req("open-cache")).await.expect("second unprotected session").into_inner();
    assert!(u2.unprotected);
    let e = rpc2.acquire(acquire_req(u2.session_id, "open-cache", "k1", Duration::ZERO)).await.expect_err("held");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    // Another identity cannot use (or renew) the first session.
    let e = rpc2.acquire(acquire_req(u.session_id, "open-cache", "k2", Duration::ZERO)).await.expect_err("not its session");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // A waiter is granted when the holder releases.
    let waiter = {
        let mut rpc2 = rpc2.clone();
        let id = u2.session_id;
        tokio::spawn(async move { rpc2.acquire(acquire_req(id, "open-cache", "k1", Duration::from_secs(10))).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = rpc
        .release(ReleaseRequest { session_id: u.session_id, namespace: "open-cache".into(), key: "k1".into(), token: 7 })
        .await
        .expect_err("an unprotected hold's token is 0");
    assert_eq!(e.code(), Code::InvalidArgument);
    let r = rpc
        .release(ReleaseRequest { session_id: u.session_id, namespace: "open-cache".into(), key: "k1".into(), token: 0 })
        .await
        .expect("release")
        .into_inner();
    assert!(r.released);
    let g2 = waiter.await.expect("waiter task").expect("granted after the release").into_inner();
    assert!(g2.unprotected && g2.token == 0);

    // Renewed by the arbiter alone, and confirmed: it is the only place the session exists.
    let k = keepalive(&mut rpc, u.session_id).await;
    assert!(k.ttl_millis == 30_000 && k.confirmed, "{k:?}");

    // A session not renewed within its TTL ends, and its hold with it
    // ("expired"); the renewed one lives on.
    let lapsed = rpc.open_session(open_req("open-cache")).await.expect("third unprotected session").into_inner();
    rpc.acquire(acquire_req(lapsed.session_id, "open-cache", "k3", Duration::ZERO)).await.expect("k3");
    let opened = std::time::Instant::now();
    while opened.elapsed() < Duration::from_secs(31) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(keepalive(&mut rpc2, u2.session_id).await.ttl_millis > 0, "a renewed unprotected session ended");
    }
    let mut ended = keepalive(&mut rpc, lapsed.session_id).await;
    while ended.ttl_millis > 0 && opened.elapsed() < Duration::from_secs(33) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        ended = keepalive(&mut rpc, lapsed.session_id).await;
    }
    assert_eq!(ended.ttl_millis, 0, "an unrenewed unprotected session outlived its TTL");
    let g3 = rpc2.acquire(acquire_req(u2.session_id, "open-cache", "k3", Duration::ZERO)).await.expect("k3 is free again").into_inner();
    assert!(g3.unprotected);
    let r = rpc2
        .release(ReleaseRequest { session_id: u2.session_id, namespace: "open-cache".into(), key: "k3".into(), token: 0 })
        .await
        .expect("release k3")
        .into_inner();
    assert!(r.released);

    let m = scrape(a.arbiter.metrics_port).await;
    assert_eq!(sample(&m, "holdfast_arbiter_fail_open{cluster=\"test\"}"), 1.0);
    assert_eq!(
        sample(
            &m,
            "holdfast_arbiter_unprotected_grants_total{namespace=\"open-cache\",class=\"open-cache\",tier=\"entity\",cluster=\"test\"}"
        ),
        4.0
    );

    // Every grant and release is on disk, in order, before it was answered.
    let (records, _) = read_records(&std::fs::read(&spool).expect("spool")).expect("a sound spool");
    let seen: Vec<(Event, &str, u64, &str)> = records.iter().map(|r| (r.event, r.key.as_str(), r.session, r.why.as_str())).collect();
    assert_eq!(
        seen,
        [
            (Event::Grant, "k1", u.session_id, ""),
            (Event::Release, "k1", u.session_id, ""),
            (Event::Grant, "k1", u2.session_id, ""),
            (Event::Grant, "k3", lapsed.session_id, ""),
            (Event::End, "k3", lapsed.session_id, "expired"),
            (Event::Grant, "k3", u2.session_id, ""),
            (Event::Release, "k3", u2.session_id, ""),
        ]
    );
    assert!(records.windows(2).all(|w| w[1].seq == w[0].seq + 1 && w[1].spool == w[0].spool), "one spool, numbered in order");
    assert!(records.iter().all(|r| r.class == "open-cache" && r.cluster == "test" && r.namespace == "open-cache"));
    assert_eq!(records[2].identity, "spiffe://holdfast.dev/workload/other");

    // etcd is back: the unprotected sessions end (the open hold with
    // "quorum_back"), their keepalives answer TTL 0, and new sessions and
    // grants are protected again.
    a.etcd.restart_member(0).await;
    let back = std::time::Instant::now();
    loop {
        let k = keepalive(&mut rpc2, u2.session_id).await;
        if k.ttl_millis == 0 {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(20), "the unprotected session outlived the outage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The spool is shipped to /sys/unprotected/ (for the audit trail) and
    // emptied: what was spooled, then the end of the hold etcd's return cut.
    while std::fs::metadata(&spool).expect("spool").len() > 0 {
        assert!(back.elapsed() < Duration::from_secs(30), "the spool was not shipped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shipped = a
        .etcd
        .client()
        .await
        .get(holdfast_model::layout::UNPROTECTED_PREFIX, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("read /sys/unprotected/");
    let shipped: Vec<holdfast_model::spool::Entry> =
        shipped.kvs().iter().map(|kv| serde_json::from_slice(kv.value()).expect("a spool record")).collect();
    assert_eq!(shipped[..records.len()], records[..], "shipped as spooled, in order");
    let ends: Vec<_> = shipped.iter().filter(|r| r.event == Event::End).map(|r| (r.key.as_str(), r.session, r.why.as_str())).collect();
    assert_eq!(ends, [("k3", lapsed.session_id, "expired"), ("k1", u2.session_id, "quorum_back")], "{shipped:?}");
    assert_eq!(shipped.len(), records.len() + 1);
    let s = until_ok("a protected session after etcd came back", Duration::from_secs(30), || {
        let mut rpc = rpc.clone();
        async move { rpc.open_session(open_req("open-cache")).await }
    })
    .await
    .into_inner();
    assert!(!s.unprotected);
    let g = rpc.acquire(acquire_req(s.session_id, "open-cache", "k1", Duration::ZERO)).await.expect("protected grant").into_inner();
    assert!(!g.unprotected && g.token != 0, "{g:?}");
    let m = scrape(a.arbiter.metrics_port).await;
    assert_eq!(sample(&m, "holdfast_arbiter_fail_open{cluster=\"test\"}"), 0.0);
}

/// The arbiter's spool shipped after an outage, with the arbiter killed
/// mid-outage and again between shipping and emptying its spool: every
/// record reaches the audit store once, with `unprotected = true`, and
/// `holdfastctl audit --unprotected` lists exactly them.
#[tokio::test(flavor = "multi_thread")]
async fn unprotected_grants_reach_the_audit_store_exactly_once_across_arbiter_crashes() {
    use holdfast_config::EtcdConfig;
    use holdfast_store::roles::{ARBITER, TAILER};
    let dir = TestDir::new("fail-open-audit");
    let mut etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_policy(&dir.path, CLASSES, "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let configure = move |c: &mut holdfast_config::arbiter::ArbiterConfig| {
        c.etcd = arbiter_etcd.clone();
        c.fail_open.after = Duration::from_secs(2);
    };
    let mut arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &configure);
    let store = dir.path.join("audit");
    let _tailer = start_tailer(&dir.path, "tailer", etcd.config_as(TAILER.name), &store, holdfast_devkit::ports::free_port());
    let spool = dir.path.join("arbiter.state").join("unprotected.spool");

    // The outage: two unprotected grants, one released.
    sigkill(etcd.pid(0).expect("etcd's pid"));
    let client = arbiter.client(&pki, &pki.workload("workload-cache", "workload/cache")).await;
    let mut rpc = client.rpc();
    let u = until_ok("an unprotected session", Duration::from_secs(15), || {
        let mut rpc = rpc.clone();
        async move { rpc.open_session(open_req("open-cache")).await }
    })
    .await
    .into_inner();
    assert!(u.unprotected);
    for k in ["a", "b"] {
        let g = rpc.acquire(acquire_req(u.session_id, "open-cache", k, Duration::ZERO)).await.expect("grant").into_inner();
        assert!(g.unprotected && g.token == 0);
    }
    let released = rpc
        .release(ReleaseRequest { session_id: u.session_id, namespace: "open-cache".into(), key: "b".into(), token: 0 })
        .await
        .expect("release")
        .into_inner();
    assert!(released.released);

    // kill -9 mid-outage, "a" still held: only the spool knows of it.
    sigkill(arbiter.process.pid().expect("arbiter's pid"));
    drop(client);
    etcd.restart_member(0).await;
    let before = read_records(&std::fs::read(&spool).expect("spool")).expect("a sound spool").0;
    assert_eq!(
        before.iter().map(|r| (r.event, r.key.as_str())).collect::<Vec<_>>(),
        [(Event::Grant, "a"), (Event::Grant, "b"), (Event::Release, "b")]
    );

    // Started again with the test-build fault: it ends "a" in the spool
    // (arbiter_restart), ships every record, and exits before emptying it.
    arbiter = Arbiter::spawn_env(
        &dir.path,
        "arbiter",
        &etcd.endpoints(),
        &pki,
        &configure,
        DEFAULT_LOG_FILTER,
        &[("HOLDFAST_FAULT_EXIT_AFTER_SHIP", "1")],
    );
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = arbiter.process.exited() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the arbiter did not ship its spool within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(86), "exited by the fault, after shipping");
    let shipped = read_records(&std::fs::read(&spool).expect("spool")).expect("a sound spool").0;
    assert_eq!(shipped.len(), 4, "kept: the arbiter died before emptying it");
    assert_eq!((shipped[3].event, shipped[3].key.as_str(), shipped[3].why.as_str()), (Event::End, "a", "arbiter_restart"));

    // Started once more: ships the same records again (none stored twice)
    // and empties the spool.
    arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &configure);
    let t = std::time::Instant::now();
    while std::fs::metadata(&spool).expect("spool").len() > 0 {
        assert!(t.elapsed() < Duration::from_secs(30), "the spool was not emptied");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut etcd_client = etcd.client().await;
    let stored = etcd_client
        .get(holdfast_model::layout::UNPROTECTED_PREFIX, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("read /sys/unprotected/");
    assert_eq!(stored.kvs().len(), 4);
    assert!(stored.kvs().iter().all(|kv| kv.version() == 1), "each record was put once");

    // The audit store: each record once, unprotected, in spool order.
    tailer_caught_up(&etcd, &store).await;
    let events = holdfast_audit::store::read_events(&store).expect("the audit store");
    let unprotected: Vec<_> = events.iter().filter(|e| e.unprotected == Some(true)).collect();
    let listed: Vec<(String, String, String, u64)> = unprotected
        .iter()
        .map(|e| (e.kind.to_string(), e.key.clone().unwrap_or_default(), e.reason.clone().unwrap_or_default(), e.time_unix_ms))
        .collect();
    let spooled: Vec<(String, String, String, u64)> = shipped
        .iter()
        .map(|r| {
            let kind = match r.event {
                Event::Grant => "unprotected-grant",
                Event::Release => "unprotected-release",
                Event::End => "unprotected-end",
            };
            (kind.to_string(), format!("{}/{}", r.namespace, r.key), r.why.clone(), r.at_unix_ms)
        })
        .collect();
    assert_eq!(listed, spooled, "the audit store holds the spool, once");
    assert!(unprotected.iter().all(|e| e.identity.as_deref() == Some("spiffe://holdfast.dev/workload/cache") && e.epoch.is_none()));
    assert!(events.iter().filter(|e| e.unprotected.is_none()).all(|e| !e.kind.to_string().starts_with("unprotected")));

    // The reconciliation list, as an operator reads it.
    let out = std::process::Command::new(bin("holdfastctl"))
        .args(["audit", "--unprotected", "--since", "1h", "--json", "--store"])
        .arg(&store)
        .output()
        .expect("run holdfastctl audit");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Vec<holdfast_audit::Event> = serde_json::from_slice(&out.stdout).expect("a JSON array of events");
    assert_eq!(listed.len(), 4);
    assert_eq!(listed.iter().map(|e| e.time_unix_ms).collect::<Vec<_>>(), shipped.iter().map(|r| r.at_unix_ms).collect::<Vec<_>>());
    drop(arbiter);
}

/// The Rust client and `holdfastctl lock exec` say when a grant is
/// unprotected, and a protected one never is.
#[tokio::test(flavor = "multi_thread")]
async fn the_rust_client_and_lock_exec_surface_an_unprotected_grant() {
    let mut a = Appliance::start_policy("fail-open-client", 1, &|c| c.fail_open.after = Duration::from_secs(2), CLASSES, "").await;
    let exec = |key: &str, parent_says: &str| {
        let out = std::process::Command::new(bin("holdfastctl"))
            .envs(a.ctl_env("workload/exec"))
            .env("HOLDFAST_UNPROTECTED", parent_says)
            .args(["lock", "exec", key, "--wait", "0", "--", "sh", "-c", "echo \"[$HOLDFAST_UNPROTECTED] $HOLDFAST_TOKEN\""])
            .output()
            .expect("run holdfastctl lock exec");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    // Protected: a real token, and HOLDFAST_UNPROTECTED is not passed on
    // even when the caller's environment has it.
    let (out, err) = exec("open-cache/protected", "1");
    let token: u64 = out.strip_prefix("[] ").unwrap_or_else(|| panic!("{out:?}")).parse().expect("a token");
    assert!(token > 0 && !err.contains("WITHOUT etcd"), "{out:?} {err}");
    let fenced = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = fenced.clone();
    let locker = a.locker("workload/client", &[&a.arbiter], move |f| seen.lock().unwrap().push(f.keys));
    let key = holdfast_model::LockKey::parse("open-cache/x").unwrap();

    sigkill(a.etcd.pid(0).expect("etcd's pid"));
    let guard = until_ok("an unprotected grant", Duration::from_secs(20), || locker.acquire(&key, Default::default())).await;
    assert!(guard.unprotected() && guard.token().is_unprotected() && guard.token().expose() == 0);
    let (out, err) = exec("open-cache/y", "");
    assert_eq!(out, "[1] 0");
    assert!(err.contains("open-cache/y was granted WITHOUT etcd (unprotected, token 0)"), "{err}");

    // etcd back: the unprotected hold is fenced like any lost one.
    a.etcd.restart_member(0).await;
    let t = std::time::Instant::now();
    while fenced.lock().unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(40), "the unprotected hold was never fenced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fenced.lock().unwrap()[0], vec![key.clone()]);
    drop(guard);
    let again =
        until_ok("a protected grant after etcd came back", Duration::from_secs(20), || locker.acquire(&key, Default::default())).await;
    assert!(!again.unprotected() && again.token().expose() > 0);
}

/// A full spool refuses new unprotected grants with a clear error, keeps
/// everything it holds, and still records the end of every open hold.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_spool_refuses_new_open_grants_and_loses_nothing() {
    let configure = |c: &mut holdfast_config::arbiter::ArbiterConfig| {
        c.fail_open.after = Duration::from_secs(1);
        c.fail_open.spool_max_bytes = 4096;
        c.limits.max_sessions_per_identity = 2;
    };
    let a = Appliance::start_policy("fail-open-full", 1, &configure, CLASSES, "").await;
    let client = a.client("workload/cache").await;
    let mut rpc = client.rpc();
    let spool = a.dir.path.join("arbiter.state").join("unprotected.spool");
    sigkill(a.etcd.pid(0).expect("etcd's pid"));
    let u = until_ok("an unprotected session", Duration::from_secs(15), || {
        let mut rpc = rpc.clone();
        async move { rpc.open_session(open_req("open-cache")).await }
    })
    .await
    .into_inner();
    // Unprotected sessions are capped per identity too.
    let second = rpc.open_session(open_req("open-cache")).await.expect("a second unprotected session").into_inner();
    assert!(second.unprotected);
    let e = rpc.open_session(open_req("open-cache")).await.expect_err("over limits.max_sessions_per_identity");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("2 unprotected sessions open, limits.max_sessions_per_identity = 2"), "{e:?}");
    let mut granted = Vec::new();
    let refused = loop {
        let key = format!("k{}", granted.len());
        match rpc.acquire(acquire_req(u.session_id, "open-cache", &key, Duration::ZERO)).await {
            Ok(_) => granted.push(key),
            Err(e) => break e,
        }
        assert!(granted.len() < 100, "4096 bytes never filled");
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("unprotected.spool is full") && refused.message().contains("fail_open.spool_max_bytes"),
        "{refused:?}"
    );
    assert!(granted.len() >= 3, "only {} grants fit", granted.len());
    let (records, _) = read_records(&std::fs::read(&spool).expect("spool")).expect("a sound spool");
    assert_eq!(records.iter().map(|r| r.key.clone()).collect::<Vec<_>>(), granted, "every grant answered is spooled");
    // Every open hold can still end: closing the session spools each end.
    rpc.close_session(CloseSessionRequest { session_id: u.session_id }).await.expect("close");
    let (records, len) = read_records(&std::fs::read(&spool).expect("spool")).expect("a sound spool");
    assert_eq!(records.iter().filter(|r| r.event == Event::Release).count(), granted.len());
    assert!(len <= 4096, "the bound held: {len} bytes");
}

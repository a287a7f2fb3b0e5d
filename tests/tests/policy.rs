//! The arbiter enforces the published class set (docs/policy.md): grants
//! by SPIFFE ID before any etcd read, one denial whatever the key's state
//! (and in time that does not depend on it), inspect grants, no grants
//! without a published set, a class homed elsewhere refused with its
//! region, and a change published by the controller reaching every arbiter
//! within seconds while a refused change leaves the last good set in force.

use holdfast_client::{Client, ErrorReason};
use holdfast_model::LockKey;
use holdfast_tests::*;
use std::time::{Duration, Instant};

/// The lab grant covers every `spiffe://holdfast.dev/` identity; this more
/// specific one narrows `outsider/b` to inspecting `orders/`.
const OUTSIDER: &str = "outsider/b";
const NARROW: &str = "[grant.outsider]\nidentity = \"spiffe://holdfast.dev/outsider/b\"\ninspect = [\"orders/\"]\n";

fn key(k: &str) -> LockKey {
    LockKey::parse(k).unwrap()
}

fn reason(e: &holdfast_client::Error) -> Option<ErrorReason> {
    e.reason()
}

/// The class-set version in force at an arbiter (its metric).
async fn policy_version(arbiter: &Arbiter) -> u64 {
    let text = scrape(arbiter.metrics_port).await;
    let line = text.lines().find(|l| l.starts_with("holdfast_arbiter_policy_version{")).expect(&text);
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn wait_version(arbiter: &Arbiter, version: u64, within: Duration) -> Duration {
    let start = Instant::now();
    while policy_version(arbiter).await < version {
        assert!(start.elapsed() < within, "arbiter still at version {} after {within:?}", policy_version(arbiter).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// An acquire by `client` on `session_id` (B has no session of its own: it
/// may lock nowhere, so none is opened for it; authorisation comes before
/// the session is looked at).
async fn acquire_as(client: &Client, session_id: u64, k: &LockKey) -> Result<u64, holdfast_client::Error> {
    let req = holdfast_proto::v1::AcquireRequest { session_id, namespace: k.namespace().into(), key: k.key().into(), wait_millis: 0 };
    Ok(client.rpc().acquire(req).await?.into_inner().token)
}

/// Every way B can ask about a key, each refused as Denied with one message
/// (the key named as asked); returns the messages.
async fn denials(b: &Client, session_id: u64, k: &LockKey) -> Vec<String> {
    let mut out = Vec::new();
    let e = acquire_as(b, session_id, k).await.expect_err("B must be refused");
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");
    out.push(e.to_string());
    let e = b.inspect(k).await.expect_err("B has no inspect grant on payments/");
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");
    out.push(e.to_string());
    out
}

#[tokio::test]
async fn a_granted_identity_locks_and_another_is_denied_alike_for_free_held_and_unused_keys() {
    let app = Appliance::start_policy("policy-deny", 1, &defaults, &[("payments", 30), ("orders", 30)], NARROW).await;
    let a = app.client("team/a").await;
    let b = app.client(OUTSIDER).await;
    let sa = a.open_session_for("payments", None).await.unwrap();

    // A locks payments/x; payments/free was held and released; payments/never never used.
    let held = sa.acquire(&key("payments/x"), Duration::ZERO).await.expect("A is granted payments/");
    sa.acquire(&key("payments/free"), Duration::ZERO).await.unwrap().release().await.unwrap();

    let before = app.etcd.revision().await;
    let mut messages = Vec::new();
    for k in ["payments/x", "payments/free", "payments/never"] {
        let m = denials(&b, sa.id(), &key(k)).await;
        messages.push(m.iter().map(|s| s.replace(k, "KEY")).collect::<Vec<_>>());
    }
    assert_eq!(app.etcd.revision().await, before, "a denial writes nothing");
    assert!(messages.windows(2).all(|w| w[0] == w[1]), "one message whatever the key's state: {messages:#?}");
    assert!(messages[0][0].contains("may not lock") && messages[0][0].contains("grants.d"), "{:?}", messages[0]);
    // B may open no session: not one *for* payments, nor one without a
    // namespace (B may lock in no class). Neither writes.
    let e = b.open_session_for("payments", None).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");
    let e = b.open_session(Duration::from_secs(30)).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");
    assert!(e.to_string().contains("may lock in no class, so it may open no session"), "{e}");
    assert_eq!(app.etcd.revision().await, before, "a refused session writes nothing");
    assert!(a.open_session(Duration::from_secs(30)).await.is_ok(), "A may lock in payments");
    // B may inspect orders/ (its own narrow grant) but not lock there.
    assert!(!b.inspect(&key("orders/o1")).await.unwrap().held);
    assert_eq!(reason(&acquire_as(&b, sa.id(), &key("orders/o1")).await.err().unwrap()), Some(ErrorReason::Denied));
    // ValidateToken needs an inspect grant too.
    let e = b.validate_token(&key("payments/x"), held.token()).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");
    assert!(a.validate_token(&key("payments/x"), held.token()).await.unwrap());
}

/// Welch's t statistic of two samples.
fn welch_t(a: &[f64], b: &[f64]) -> f64 {
    let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    let var = |x: &[f64], m: f64| x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() - 1) as f64;
    let (ma, mb) = (mean(a), mean(b));
    (ma - mb) / (var(a, ma) / a.len() as f64 + var(b, mb) / b.len() as f64).sqrt()
}

/// dudect's preprocessing: keep the measurements below a percentile of the
/// pooled sample (the long tail is scheduler and network noise).
fn crop(a: &mut Vec<f64>, b: &mut Vec<f64>, percentile: f64) {
    let mut all: Vec<f64> = a.iter().chain(b.iter()).copied().collect();
    all.sort_by(f64::total_cmp);
    let cut = all[((all.len() as f64 * percentile) as usize).min(all.len() - 1)];
    a.retain(|v| *v <= cut);
    b.retain(|v| *v <= cut);
}

/// dudect-style (Reparaz, Balasch, Verbauwhede 2017), measured in the test
/// process: the denial's latency for a held key, for a never-used key and
/// for a key of a namespace no class declares, interleaved in random order so drift hits both classes alike; Welch's t
/// on the cropped samples must stay under dudect's 4.5 threshold. The same
/// measurement between a denial and a granted Inspect (which reads etcd)
/// must exceed it — the test can see a difference of one etcd read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_time_does_not_depend_on_the_key() {
    use rand::Rng;
    let app = Appliance::start_policy("policy-timing", 1, &defaults, &[("payments", 30), ("orders", 30)], NARROW).await;
    let a = app.client("team/a").await;
    let b = app.client(OUTSIDER).await;
    let sa = a.open_session_for("payments", None).await.unwrap();
    let held = key("payments/held");
    let _hold = sa.acquire(&held, Duration::ZERO).await.unwrap();
    let unused = key("payments/never-used");
    let undeclared = key("no-such-class/never-used");

    const N: usize = 1500;
    let mut rng = rand::rng();
    let (mut t_held, mut t_unused, mut t_granted, mut t_undeclared) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Warm the connection and both paths.
    for _ in 0..100 {
        let _ = b.inspect(&held).await;
        let _ = a.inspect(&held).await;
    }
    for _ in 0..4 * N {
        let which = rng.random_range(0..4);
        let start = Instant::now();
        match which {
            0 => assert!(b.inspect(&held).await.is_err()),
            1 => assert!(b.inspect(&unused).await.is_err()),
            2 => assert!(a.inspect(&unused).await.is_ok()),
            _ => assert!(b.inspect(&undeclared).await.is_err()),
        }
        let ns = start.elapsed().as_nanos() as f64;
        [&mut t_held, &mut t_unused, &mut t_granted, &mut t_undeclared][which].push(ns);
    }
    let (mut h, mut u) = (t_held.clone(), t_unused.clone());
    crop(&mut h, &mut u, 0.9);
    let t_key = welch_t(&h, &u);
    let (mut u, mut n) = (t_unused.clone(), t_undeclared.clone());
    crop(&mut u, &mut n, 0.9);
    let t_namespace = welch_t(&u, &n);
    let (mut d, mut g) = (t_unused.clone(), t_granted.clone());
    crop(&mut d, &mut g, 0.9);
    let t_read = welch_t(&d, &g);
    let median = |x: &[f64]| {
        let mut v = x.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] / 1000.0
    };
    eprintln!(
        "denial held {:.0} µs, never used {:.0} µs (t = {t_key:.2}), undeclared namespace {:.0} µs (t = {t_namespace:.2}); \
         granted inspect {:.0} µs (t vs denial = {t_read:.2})",
        median(&t_held),
        median(&t_unused),
        median(&t_undeclared),
        median(&t_granted)
    );
    assert!(t_key.abs() < 4.5, "denial time depends on the key's state: t = {t_key:.2}");
    assert!(t_namespace.abs() < 4.5, "denial time depends on whether a class declares the namespace: t = {t_namespace:.2}");
    assert!(t_read.abs() > 4.5, "the measurement cannot even see an etcd read (t = {t_read:.2}); it proves nothing");
}

#[tokio::test]
async fn without_a_published_set_nothing_is_granted() {
    let dir = TestDir::new("policy-none");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let pki = Pki::new(&dir.path);
    let arbiter = Arbiter::start(&dir.path, "arbiter", &etcd.endpoints(), &pki);
    let client = arbiter.client(&pki, &pki.workload("team-a", "team/a")).await;
    let before = etcd.revision().await;
    // Not even a session: with no grants, it could hold nothing.
    let e = client.open_session(Duration::from_secs(10)).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::NoPolicy), "{e}");
    assert!(e.to_string().contains("holdfastctl status"), "{e}");
    let e = client.inspect(&key("ns/a")).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::NoPolicy), "{e}");
    assert_eq!(etcd.revision().await, before);
    assert_eq!(policy_version(&arbiter).await, 0);

    // Once a controller publishes, the client is served.
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    wait_version(&arbiter, 1, Duration::from_secs(5)).await;
    let session = client.open_session(Duration::from_secs(10)).await.expect("a session under the published set");
    session.acquire(&key("ns/a"), Duration::ZERO).await.expect("granted under the published set");
}

#[tokio::test]
async fn changes_reach_every_arbiter_in_seconds_and_a_refused_change_keeps_the_last_good_set() {
    let app = Appliance::start_policy("policy-change", 1, &defaults, &[("payments", 30), ("orders", 30)], NARROW).await;
    let second = Arbiter::start_with(&app.dir.path, "arbiter2", &app.etcd.endpoints(), &app.pki, &|c| c.region = Some("hall-b".into()));
    wait_version(&second, 1, Duration::from_secs(5)).await;
    let outsider = app.pki.workload("outsider-b", OUTSIDER);
    let b = app.arbiter.client(&app.pki, &outsider).await;
    let b2 = second.client(&app.pki, &outsider).await;
    // B may lock nowhere yet, so it may not even open a session.
    let e = b.open_session(Duration::from_secs(30)).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");

    // A good change: B may lock payments/, and payments is homed to hall-a.
    let grants = app.dir.path.join("policy/grants.d/lab.toml");
    let classes = app.dir.path.join("policy/classes.d/lab.toml");
    let text = std::fs::read_to_string(&grants).unwrap();
    std::fs::write(&grants, text.replace("inspect = [\"orders/\"]\n", "inspect = [\"orders/\"]\nlock = [\"payments/\"]\n")).unwrap();
    let text = std::fs::read_to_string(&classes).unwrap();
    std::fs::write(&classes, text.replace("namespace = \"payments\"\n", "namespace = \"payments\"\nhome_region = \"hall-a\"\n")).unwrap();
    let took = wait_version(&app.arbiter, 2, Duration::from_secs(5)).await;
    let took2 = wait_version(&second, 2, Duration::from_secs(5)).await;
    eprintln!("version 2 in force after {took:?} and {took2:?}");
    let sb = b.open_session(Duration::from_secs(30)).await.expect("B may lock in payments now");
    let hold = sb.acquire(&key("payments/p"), Duration::ZERO).await.expect("granted after the change");
    // The arbiter in hall-b refuses the hall-a class, naming its region.
    let sb2 = b2.open_session(Duration::from_secs(30)).await.unwrap();
    let e = sb2.acquire(&key("payments/q"), Duration::ZERO).await.err().unwrap();
    assert_eq!(reason(&e), Some(ErrorReason::WrongRegion), "{e}");
    assert!(e.to_string().contains("hall-a") && e.to_string().contains("hall-b"), "{e}");
    // Classes without a home region are served everywhere: hall-b answers
    // B's granted inspect of orders/, and refuses its ungranted lock there
    // as Denied, not WrongRegion.
    b2.inspect(&key("orders/o")).await.expect("orders has no home region; hall-b serves it");
    let e = sb2.acquire(&key("orders/o"), Duration::ZERO).await.expect_err("B has no lock grant on orders/");
    assert_eq!(reason(&e), Some(ErrorReason::Denied), "{e}");
    hold.release().await.unwrap();

    // A bad change (TTL out of range) is refused: version 2 stays and grants go on.
    let text = std::fs::read_to_string(&classes).unwrap();
    std::fs::write(&classes, text.replacen("ttl = \"30s\"", "ttl = \"1s\"", 1)).unwrap();
    let start = Instant::now();
    let status = loop {
        let out = std::process::Command::new(bin("holdfastctl"))
            .args(["status", "--json", "--etcd-endpoint", &app.etcd.endpoints()[0]])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if v.to_string().contains("ttl-out-of-range") {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "holdfastctl status never showed the refusal: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("{status}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!((policy_version(&app.arbiter).await, policy_version(&second).await), (2, 2));
    sb.acquire(&key("payments/p"), Duration::ZERO).await.expect("the last good set stays in force").release().await.unwrap();
}

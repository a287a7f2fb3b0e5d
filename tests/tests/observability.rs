//! Metrics with bounded labels, and tokens that never reach any output.

use holdfast_model::LockKey;
use holdfast_tests::*;
use std::process::Command;
use std::time::Duration;

/// (name, label names, value) of every sample line.
fn samples(text: &str) -> Vec<(String, Vec<String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => {
                    let inner = rest.trim_end_matches('}');
                    let names = inner.split(',').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap().0.to_string()).collect();
                    (n.to_string(), names)
                }
                None => (series.to_string(), vec![]),
            };
            (name, labels, value.parse().unwrap_or(f64::NAN))
        })
        .collect()
}

#[tokio::test]
async fn metrics_carry_only_namespace_class_tier_and_cluster_labels() {
    let app = Appliance::start("metrics", 1).await;
    let a = app.client("svc/a").await;
    let b = app.client("svc/b").await;
    let sa = a.open_session(Duration::from_secs(10)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(10)).await.unwrap();
    let k = LockKey::parse("metrics/key").unwrap();
    let h = sa.acquire(&k, Duration::ZERO).await.unwrap();
    assert!(sb.acquire(&k, Duration::from_millis(300)).await.is_err());
    h.release().await.unwrap();
    sb.acquire(&k, Duration::ZERO).await.unwrap().release().await.unwrap();

    let text = scrape(app.arbiter.metrics_port).await;
    let all = samples(&text);
    assert!(!all.is_empty());
    let allowed = ["namespace", "class", "tier", "cluster", "le"];
    for (name, labels, _) in &all {
        assert!(name.starts_with("holdfast_arbiter_"), "metric {name} is not named holdfast_arbiter_*");
        for l in labels {
            // `le` is the histogram bucket bound, part of the histogram type.
            assert!(allowed.contains(&l.as_str()), "metric {name} has label {l:?}; only namespace, class, tier, cluster are allowed");
            if l == "le" {
                assert!(name.ends_with("_bucket"), "{name}");
            }
        }
    }
    // Exactly the right labels: per-class counters carry all four, with the
    // class's values from the published set; everything else `cluster` alone.
    let per_class = [
        "holdfast_arbiter_acquire_granted_total",
        "holdfast_arbiter_acquire_contention_total",
        "holdfast_arbiter_acquire_leak_total",
        "holdfast_arbiter_validate_token_valid_total",
        "holdfast_arbiter_validate_token_invalid_total",
        "holdfast_arbiter_validate_token_refused_total",
        "holdfast_arbiter_holds",
        "holdfast_arbiter_holds_quota",
    ];
    for (name, labels, _) in &all {
        let mut got: Vec<&str> = labels.iter().map(String::as_str).filter(|l| *l != "le").collect();
        got.sort();
        let want: &[&str] = if per_class.contains(&name.as_str()) { &["class", "cluster", "namespace", "tier"] } else { &["cluster"] };
        assert_eq!(got, want, "labels of {name}");
    }
    assert!(
        text.contains("holdfast_arbiter_acquire_granted_total{namespace=\"metrics\",class=\"metrics\",tier=\"entity\",cluster=\"test\"} 2"),
        "{text}"
    );
    let value = |n: &str| all.iter().find(|s| s.0 == n).map(|s| s.2).unwrap_or_else(|| panic!("no {n} in\n{text}"));
    assert_eq!(value("holdfast_arbiter_acquire_granted_total"), 2.0);
    assert_eq!(value("holdfast_arbiter_acquire_contention_total"), 1.0);
    assert!(value("holdfast_arbiter_grant_attempts_total") >= 3.0);
    assert_eq!(value("holdfast_arbiter_sealed"), 0.0);
    assert_eq!(value("holdfast_arbiter_grant_latency_seconds_count"), 2.0);
    assert_eq!(value("holdfast_arbiter_hold_duration_seconds_count"), 2.0);
    assert!(text.contains("cluster=\"test\""), "label values come from configuration");
}

#[tokio::test]
async fn issued_tokens_never_appear_in_any_output_at_debug_level() {
    let dir = TestDir::new("redaction");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    let pki = Pki::new(&dir.path);
    let mut arbiter = Arbiter::spawn_logged(&dir.path, "arbiter", &etcd.endpoints(), &pki, &defaults, "debug");
    arbiter.wait_ready(Duration::from_secs(30)).unwrap();
    let cert = pki.workload("svc", "svc/redact");
    let env = [
        ("HOLDFAST_ENDPOINT", arbiter.endpoint()),
        ("HOLDFAST_CA", pki.ca.ca_path().display().to_string()),
        ("HOLDFAST_CERT", cert.cert.display().to_string()),
        ("HOLDFAST_KEY", cert.key.display().to_string()),
    ];
    let tokens_file = dir.path.join("tokens");
    let mut outputs = String::new();
    let mut tokens = Vec::new();
    // Through the CLI: the command receives the token and records it aside.
    for i in 0..10 {
        let script = format!("echo $HOLDFAST_TOKEN >> {}", tokens_file.display());
        let out = Command::new(bin("holdfastctl"))
            .envs(env.iter().cloned())
            .env("RUST_LOG", "debug")
            .args(["lock", "exec", &format!("redact/k{}", i % 3), "--", "sh", "-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success());
        outputs.push_str(&String::from_utf8_lossy(&out.stdout));
        outputs.push_str(&String::from_utf8_lossy(&out.stderr));
        for args in [
            vec!["inspect".to_string(), format!("redact/k{}", i % 3)],
            vec!["inspect".into(), "--json".into(), "redact/k0".into()],
            vec!["epoch".into(), "status".into(), "--json".into()],
        ] {
            let out = Command::new(bin("holdfastctl")).envs(env.iter().cloned()).args(&args).output().unwrap();
            outputs.push_str(&String::from_utf8_lossy(&out.stdout));
            outputs.push_str(&String::from_utf8_lossy(&out.stderr));
        }
    }
    // Through the library, including refusals and Debug formatting.
    let client = arbiter.client(&pki, &cert).await;
    let other = arbiter.client(&pki, &pki.workload("other", "svc/other")).await;
    let s = client.open_session(Duration::from_secs(10)).await.unwrap();
    let so = other.open_session(Duration::from_secs(10)).await.unwrap();
    for i in 0..10 {
        let k = LockKey::parse(&format!("redact/lib{i}")).unwrap();
        let h = s.acquire(&k, Duration::ZERO).await.unwrap();
        tokens.push(h.token().expose());
        outputs.push_str(&format!("{h:?} {} {:?}\n", h.token(), h.token()));
        if let Err(e) = so.acquire(&k, Duration::from_millis(100)).await {
            outputs.push_str(&format!("{e} {e:?}\n"));
        }
        h.release().await.unwrap();
    }
    tokens.extend(std::fs::read_to_string(&tokens_file).unwrap().lines().map(|l| l.trim().parse::<u64>().unwrap()));
    assert_eq!(tokens.len(), 20);
    arbiter.stop();
    let mut haystacks = vec![("holdfastctl and library output".to_string(), outputs)];
    for entry in std::fs::read_dir(&dir.path).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "log") {
            haystacks.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap_or_default()));
        }
    }
    assert!(haystacks.iter().any(|(n, h)| n.ends_with("arbiter.log") && h.contains("DEBUG")), "the arbiter ran at debug level");
    for t in &tokens {
        for (what, text) in &haystacks {
            for form in [t.to_string(), format!("{t:x}"), format!("{t:#x}")] {
                assert!(!text.contains(&form), "token found in {what}");
            }
        }
    }
}

/// Scrapes one sample's value (0 when absent).
async fn metric(port: u16, name: &str) -> f64 {
    samples(&scrape(port).await).into_iter().find(|s| s.0 == name).map(|s| s.2).unwrap_or(0.0)
}

/// A workload through `arbiter` that touches every traced call: sessions
/// opened, renewed and closed; grants, contention, inspects, releases, and a
/// stale release with an old token. Returns every token issued.
async fn traced_workload(arbiter: &Arbiter, pki: &Pki, keys: usize) -> (Vec<u64>, u64) {
    let a = arbiter.client(pki, &pki.workload("svc-a", "svc/a")).await;
    let b = arbiter.client(pki, &pki.workload("svc-b", "svc/b")).await;
    let sa = a.open_session(Duration::from_secs(10)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(10)).await.unwrap();
    let mut tokens = Vec::new();
    let mut first = None;
    for i in 0..keys {
        let k = LockKey::parse(&format!("trace/k{i}")).unwrap();
        let h = sa.acquire(&k, Duration::ZERO).await.unwrap();
        tokens.push(h.token().expose());
        first.get_or_insert(h.token().expose());
        let refused = sb.acquire(&k, Duration::from_millis(100)).await.unwrap_err();
        assert_eq!(refused.reason(), Some(holdfast_proto::ErrorReason::Contention));
        assert!(a.inspect(&k).await.unwrap().held);
        assert!(h.release().await.unwrap());
    }
    // k0 again: a newer hold, then a stale release with the first token.
    let k0 = LockKey::parse("trace/k0").unwrap();
    let again = sa.acquire(&k0, Duration::ZERO).await.unwrap();
    tokens.push(again.token().expose());
    let stale =
        holdfast_proto::v1::ReleaseRequest { session_id: sa.id(), namespace: "trace".into(), key: "k0".into(), token: first.unwrap() };
    assert!(!a.rpc().release(stale).await.unwrap().into_inner().released, "a stale release deletes nothing");
    assert!(again.release().await.unwrap());
    let session = sa.id();
    sa.close().await.unwrap();
    sb.close().await.unwrap();
    (tokens, session)
}

fn names(spans: &[holdfast_tests::otlp::Span]) -> std::collections::BTreeSet<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

#[tokio::test]
async fn rpc_spans_reach_an_otlp_http_collector_without_any_token() {
    let dir = TestDir::new("otlp-http");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    let pki = Pki::new(&dir.path);
    let receiver = holdfast_tests::otlp::OtlpReceiver::http();
    let configure = |c: &mut ArbiterConfig| {
        c.tracing.otlp_endpoint = Some(receiver.endpoint());
        c.tracing.service_name = "arbiter-under-test".into();
    };
    let mut arbiter = Arbiter::spawn_logged(&dir.path, "arbiter", &etcd.endpoints(), &pki, &configure, "debug");
    arbiter.wait_ready(Duration::from_secs(30)).unwrap();
    let (tokens, session) = traced_workload(&arbiter, &pki, 5).await;
    assert_eq!(tokens.len(), 6);
    // SIGTERM: the arbiter flushes its queued spans before it exits.
    arbiter.stop();

    let received = receiver.received();
    assert!(!received.is_empty(), "no export request arrived");
    let spans = holdfast_tests::otlp::spans(&received);
    let seen = names(&spans);
    for name in [
        "lock.v1.Lock/OpenSession",
        "lock.v1.Lock/KeepAlive",
        "lock.v1.Lock/Acquire",
        "lock.v1.Lock/Inspect",
        "lock.v1.Lock/Release",
        "lock.v1.Lock/CloseSession",
        "grant transaction",
        "release transaction",
    ] {
        assert!(seen.contains(name), "no span {name:?} among {seen:?}");
    }
    assert!(spans.iter().all(|s| s.service == "arbiter-under-test"), "service.name comes from the config");
    fn named<'a>(spans: &'a [holdfast_tests::otlp::Span], name: &'a str) -> impl Iterator<Item = &'a holdfast_tests::otlp::Span> {
        spans.iter().filter(move |s| s.name == name)
    }
    let of = |name: &'static str| named(&spans, name);
    let session_hex = format!("{session:x}");
    let granted: Vec<_> = of("lock.v1.Lock/Acquire").filter(|s| s.attr("outcome") == Some("granted")).collect();
    assert_eq!(granted.len(), 6, "{granted:#?}");
    for s in &granted {
        assert_eq!(s.attr("namespace"), Some("trace"));
        assert!(s.attr("key").is_some_and(|k| k.starts_with('k')), "{s:?}");
        assert_eq!(s.attr("session"), Some(session_hex.as_str()));
        assert_eq!(s.attr("rpc.system"), Some("grpc"));
    }
    assert_eq!(of("lock.v1.Lock/Acquire").filter(|s| s.attr("outcome") == Some("contention")).count(), 5);
    assert_eq!(of("lock.v1.Lock/Release").filter(|s| s.attr("outcome") == Some("released")).count(), 6);
    assert_eq!(of("lock.v1.Lock/Release").filter(|s| s.attr("outcome") == Some("not_held")).count(), 1, "the stale release");
    assert_eq!(of("lock.v1.Lock/Inspect").filter(|s| s.attr("outcome") == Some("held")).count(), 5);
    assert!(
        of("lock.v1.Lock/CloseSession").any(|s| s.attr("session") == Some(session_hex.as_str()) && s.attr("outcome") == Some("closed"))
    );
    // Every grant transaction is a child of an Acquire call.
    let acquires: Vec<&[u8]> = of("lock.v1.Lock/Acquire").map(|s| s.span_id.as_slice()).collect();
    for g in of("grant transaction") {
        assert!(acquires.contains(&g.parent_span_id.as_slice()), "grant transaction without its Acquire: {g:?}");
        assert!(g.attr("hold_key").is_some_and(|k| k.starts_with("/l/trace/k")), "{g:?}");
    }
    assert!(of("grant transaction").any(|s| s.attr("outcome") == Some("held")), "the contended attempts");

    holdfast_tests::otlp::assert_no_tokens(&received, &tokens);
    let log = std::fs::read_to_string(&arbiter.log).unwrap();
    assert!(log.contains("DEBUG"), "the arbiter ran at debug level");
    for t in &tokens {
        for form in [t.to_string(), format!("{t:x}")] {
            assert!(!log.contains(&form), "a token is in the arbiter's log");
        }
    }
}

#[tokio::test]
async fn rpc_spans_reach_an_otlp_grpc_collector_without_any_token() {
    let dir = TestDir::new("otlp-grpc");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    let pki = Pki::new(&dir.path);
    let receiver = holdfast_tests::otlp::OtlpReceiver::grpc();
    let configure = |c: &mut ArbiterConfig| {
        c.tracing.otlp_endpoint = Some(receiver.endpoint());
        c.tracing.protocol = OtlpProtocol::Grpc;
    };
    let mut arbiter = Arbiter::spawn_logged(&dir.path, "arbiter", &etcd.endpoints(), &pki, &configure, "debug");
    arbiter.wait_ready(Duration::from_secs(30)).unwrap();
    let (tokens, _) = traced_workload(&arbiter, &pki, 2).await;
    arbiter.stop();

    let received = receiver.received();
    let spans = holdfast_tests::otlp::spans(&received);
    let seen = names(&spans);
    for name in ["lock.v1.Lock/Acquire", "lock.v1.Lock/Release", "grant transaction", "release transaction"] {
        assert!(seen.contains(name), "no span {name:?} among {seen:?}");
    }
    assert!(spans.iter().all(|s| s.service == "holdfast-arbiter"), "the default service.name");
    holdfast_tests::otlp::assert_no_tokens(&received, &tokens);
}

#[tokio::test]
async fn without_an_otlp_endpoint_nothing_is_exported() {
    let dir = TestDir::new("otlp-off");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    let pki = Pki::new(&dir.path);
    let http = holdfast_tests::otlp::OtlpReceiver::http();
    let grpc = holdfast_tests::otlp::OtlpReceiver::grpc();
    // A [tracing] table without an endpoint is still off.
    let mut arbiter =
        Arbiter::spawn_logged(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.tracing.service_name = "x".into(), "debug");
    arbiter.wait_ready(Duration::from_secs(30)).unwrap();
    traced_workload(&arbiter, &pki, 2).await;
    arbiter.stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!((http.connections(), grpc.connections()), (0, 0), "nothing connected to a collector");
    assert!(http.received().is_empty() && grpc.received().is_empty());
}

#[tokio::test]
async fn holds_ended_by_session_expiry_are_counted_once_by_their_granting_arbiter() {
    const EXPIRED: &str = "holdfast_arbiter_expiries_without_release_total";
    // Sessions of 5 s expire quickly; the hold the epoch advance ends is in
    // a 30 s class, so it cannot expire first.
    let app = Appliance::start_policy("expiry", 1, &defaults, &[("expiry", 5), ("expiry-advance", 30)], "").await;
    let second = Arbiter::start(&app.dir.path, "second", &app.etcd.endpoints(), &app.pki);
    let cert = app.pki.workload("svc-x", "svc/x");
    let one = app.arbiter.client(&app.pki, &cert).await;
    let two = second.client(&app.pki, &cert).await;
    let ttl = Duration::from_secs(5);
    let key = |k: &str| LockKey::parse(&format!("expiry/{k}")).unwrap();

    // Ended explicitly: a release, and a CloseSession sent to the *other*
    // arbiter for holds the first one granted.
    let s = one.open_session(ttl).await.unwrap();
    assert!(s.acquire(&key("released"), Duration::ZERO).await.unwrap().release().await.unwrap());
    s.close().await.unwrap();
    let closed = one.open_session(ttl).await.unwrap();
    closed.acquire(&key("closed-1"), Duration::ZERO).await.unwrap();
    closed.acquire(&key("closed-2"), Duration::ZERO).await.unwrap();
    two.rpc().close_session(holdfast_proto::v1::CloseSessionRequest { session_id: closed.id() }).await.unwrap();
    drop(closed);

    // A client that vanishes: three holds granted by the first arbiter, one
    // by the second; nobody renews the session.
    let vanished = one.open_session(ttl).await.unwrap();
    for k in ["gone-1", "gone-2", "gone-3"] {
        vanished.acquire(&key(k), Duration::ZERO).await.unwrap();
    }
    vanished.acquire_on(&two, &key("gone-4"), Duration::ZERO).await.unwrap();
    drop(vanished);

    let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(15);
    while metric(app.arbiter.metrics_port, EXPIRED).await < 3.0 || metric(second.metrics_port, EXPIRED).await < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "the expiries were not counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // An epoch advance deletes every hold with its session record in one
    // revision too; it is not an expiry.
    let last = one.open_session(Duration::from_secs(30)).await.unwrap();
    last.acquire(&LockKey::parse("expiry-advance/advanced").unwrap(), Duration::ZERO).await.unwrap();
    holdfast_store::epoch::advance(&app.etcd.holdfast().await, 1).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(metric(app.arbiter.metrics_port, EXPIRED).await, 3.0, "exactly the vanished client's holds granted here");
    assert_eq!(metric(second.metrics_port, EXPIRED).await, 1.0, "the one hold the second arbiter granted, and no other");
}

#[tokio::test]
async fn without_the_watch_expiries_are_not_counted() {
    let app = Appliance::start_with("expiry-off", 1, &|c| c.waiters.watch = false).await;
    let c = app.client("svc/y").await;
    let s = c.open_session(Duration::from_secs(5)).await.unwrap();
    s.acquire(&LockKey::parse("expiry/off").unwrap(), Duration::ZERO).await.unwrap();
    drop(s);
    let free = tokio::time::Instant::now() + Duration::from_secs(20);
    while c.inspect(&LockKey::parse("expiry/off").unwrap()).await.unwrap().held {
        assert!(tokio::time::Instant::now() < free, "the session never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = scrape(app.arbiter.metrics_port).await;
    assert!(text.contains("# HELP holdfast_arbiter_expiries_without_release") && text.contains("watch = false"), "the help text says why");
    assert_eq!(metric(app.arbiter.metrics_port, "holdfast_arbiter_expiries_without_release_total").await, 0.0);
}

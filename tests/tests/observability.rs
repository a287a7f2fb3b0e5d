//! Metrics with bounded labels, and tokens that never reach any output.

use holdfast_model::LockKey;
use holdfast_tests::*;
use std::process::Command;
use std::time::Duration;

async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    assert!(buf.starts_with("HTTP/1."), "{buf}");
    buf.split_once("\r\n\r\n").unwrap().1.to_string()
}

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
    let pki = Pki::new(&dir.path);
    let mut arbiter = Arbiter::spawn_logged(&dir.path, "arbiter", &etcd.endpoints(), &pki, "", "debug");
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
        for args in [vec!["inspect".to_string(), format!("redact/k{}", i % 3)], vec!["inspect".into(), "--json".into(), "redact/k0".into()], vec!["epoch".into(), "status".into(), "--json".into()]] {
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

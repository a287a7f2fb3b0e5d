//! `holdfastctl status` against a real etcd and a real holdfast-controller:
//! no published set (exit 1), the dev set published (exit 0, version and
//! hash), a refused change (exit 1, FILE:LINE and the rule; version 1
//! stays), a seal (exit 1), `--json`, and etcd unreachable (exit 69).

use holdfast_config::{ControllerConfig, EtcdConfig};
use holdfast_devkit::controller::{ControllerLaunch, ControllerProcess};
use holdfast_devkit::ports::free_port;
use holdfast_model::layout::{POLICY_KEY, SEAL_KEY};
use holdfast_store::policy::PublishedPolicy;
use holdfast_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// `holdfastctl status` with the etcd endpoint from the environment.
fn status(endpoint: &str, extra: &[&str]) -> Out {
    let out = Command::new(bin("holdfastctl"))
        .arg("status")
        .args(extra)
        .env("HOLDFAST_ETCD_ENDPOINT", endpoint)
        .env_remove("HOLDFAST_ETCD_CA")
        .env_remove("HOLDFAST_ETCD_CERT")
        .env_remove("HOLDFAST_ETCD_KEY")
        .env_remove("HOLDFAST_COORD_ENDPOINT")
        .output()
        .expect("run holdfastctl");
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json(endpoint: &str) -> (Option<i32>, serde_json::Value) {
    let out = status(endpoint, &["--json"]);
    assert_eq!(out.stdout.trim().lines().count(), 1, "one object: {out}");
    (out.code, serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out}")))
}

/// Replaces the first `from` in `file`; returns the 1-based line it was on.
fn edit(file: &Path, from: &str, to: &str) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    let at = text.find(from).unwrap_or_else(|| panic!("{from:?} not in {}", file.display()));
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
    text[..at].matches('\n').count() + 1
}

async fn published(etcd: &mut etcd_client::Client) -> PublishedPolicy {
    let resp = etcd.get(POLICY_KEY, None).await.unwrap();
    serde_json::from_slice(resp.kvs().first().expect("/sys/policy").value()).expect("a PublishedPolicy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_set_the_refusal_the_seal_and_the_leader() {
    let dir = TestDir::new("status");
    let etcd = Etcd::start(&dir.path, 1).await;
    let url = etcd.endpoints().join(",");
    let mut kv = etcd.client().await;
    etcd.init_epoch().await;

    // No controller yet: nothing is published.
    let out = status(&url, &[]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stdout.contains("class set    none published"), "{out}");
    assert!(out.stdout.contains("controller   no leader"), "{out}");
    assert!(out.stdout.contains("allocator    highest epoch allocated 1 (/sys/epochs on this cluster)"), "{out}");
    assert!(out.stdout.contains("tiers        one cluster serves both tiers"), "{out}");
    // The same cluster named as coord is still one cluster.
    let same = status(&url, &[&format!("--coord-endpoint={url}")]);
    assert!(same.stdout.contains("tiers        one cluster serves both tiers"), "{same}");
    let last = out.stdout.trim_end().lines().last().unwrap();
    assert!(last.starts_with("needs attention: ") && last.contains("no published class set"), "{out}");

    // A controller publishes the dev set: all is well.
    let policy = dev_policy(&dir.path);
    let mut config = ControllerConfig::new(EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config() });
    config.policy_dir = policy.clone();
    config.metrics_listen = ([127, 0, 0, 1], free_port()).into();
    config.cluster_name = "test".into();
    config.rescan_interval = Duration::from_millis(300);
    config.election.ttl = Duration::from_secs(3);
    let launch = ControllerLaunch::new(bin("holdfast-controller"), config, &dir.path, "controller");
    let mut ctl = ControllerProcess::spawn(&launch).expect("start holdfast-controller");
    ctl.wait_ready(Duration::from_secs(20)).expect("controller READY=1");
    let pid = ctl.pid().unwrap();
    let p = published(&mut kv).await;
    assert_eq!(p.version, 1);
    let out = status(&url, &[]);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("class set    version 1\n"), "{out}");
    assert!(out.stdout.contains(&format!("  hash       {}\n", p.hash)), "{out}");
    assert!(out.stdout.contains("refused      none"), "{out}");
    assert!(out.stdout.contains("epoch        1 "), "{out}");
    assert!(out.stdout.contains("sealed       no"), "{out}");
    assert!(out.stdout.contains(&format!("pid {pid} (leader)")), "{out}");
    assert!(!out.stdout.contains("needs attention"), "{out}");

    // Sealed: needs attention, says so; unsealed again: fine.
    holdfast_store::epoch::write_seal(&etcd.holdfast().await, "test seal").await.unwrap();
    let out = status(&url, &[]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stdout.contains("SEALED since") && out.stdout.contains("test seal"), "{out}");
    assert!(out.stdout.trim_end().lines().last().unwrap().contains("the cluster is sealed"), "{out}");
    let (code, v) = json(&url);
    assert_eq!((code, &v["sealed"], &v["seal"]["reason"]), (Some(1), &serde_json::json!(true), &serde_json::json!("test seal")), "{v}");
    kv.delete(SEAL_KEY, None).await.unwrap();
    assert_eq!(status(&url, &[]).code, Some(0));

    // A bad change: refused; status names FILE:LINE and the rule; version 1 stays.
    let file = policy.join("classes.d/dev.toml");
    let line = edit(&file, "ttl = \"30s\"", "ttl = \"1s\"");
    let where_ = format!("{}:{line}: ", file.display());
    let start = Instant::now();
    let out = loop {
        let out = status(&url, &[]);
        if out.code == Some(1) {
            break out;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no refusal shown: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("holdfastctl status with a refused change:\n{}", out.stdout);
    assert!(out.stdout.contains("REFUSED change at "), "{out}");
    assert!(out.stdout.lines().any(|l| l.trim_start().starts_with(&where_) && l.ends_with("[ttl-out-of-range]")), "{where_} in {out}");
    assert!(out.stdout.contains("class set    version 1\n"), "{out}");
    let last = out.stdout.trim_end().lines().last().unwrap();
    assert!(last.starts_with("needs attention: ") && last.contains("refused class change"), "{out}");
    assert_eq!(published(&mut kv).await.version, 1);

    // --json: one object with every part.
    let (code, v) = json(&url);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["published"]["version"], 1, "{v}");
    assert_eq!(v["published"]["hash"], p.hash.as_str(), "{v}");
    assert!(v["published"]["published_by"].as_str().unwrap().ends_with(&format!("pid {pid}")), "{v}");
    let problems = v["refused_change"]["problems"].as_array().expect("problems");
    assert!(
        problems.iter().any(|p| p["file"] == file.display().to_string().as_str() && p["line"] == line && p["rule"] == "ttl-out-of-range"),
        "{v}"
    );
    assert_eq!(v["epoch"]["epoch"], 1, "{v}");
    assert_eq!(v["allocator"]["highest"], 1, "epoch init allocated epoch 1: {v}");
    assert_eq!(v["tiers"]["shared"], true, "{v}");
    assert_eq!(v["sealed"], false, "{v}");
    assert!(v["controller_leader"].as_str().unwrap().ends_with(&format!("pid {pid}")), "{v}");
    assert!(v["needs_attention"].as_array().unwrap().iter().any(|a| a.as_str().unwrap().contains("refused")), "{v}");
    assert!(v.get("set").is_none() && !v.to_string().contains("revision"), "no set, no revisions: {v}");

    // etcd on a closed port: unreachable.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let out = status(&closed, &[]);
    assert_eq!(out.code, Some(69), "{out}");
    assert!(out.stdout.is_empty(), "{out}");
    // An unreadable CA: configuration.
    let out = status(&url, &["--etcd-ca", "/nonexistent/ca.pem"]);
    assert_eq!(out.code, Some(78), "{out}");
}

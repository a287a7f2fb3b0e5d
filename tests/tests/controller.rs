//! holdfast-controller against a real etcd: it publishes the shipped dev
//! set, refuses a bad change (the last good set stays, the refusal is in
//! /sys/policy-status and the metric), publishes a good one within seconds,
//! rescans on SIGHUP, and with two controllers only the elected one
//! publishes — a killed leader's standby takes over after the lease TTL, and
//! a paused (deposed) leader cannot publish when it wakes.

use holdfast_config::{ControllerConfig, EtcdConfig};
use holdfast_devkit::controller::{ControllerLaunch, ControllerProcess};
use holdfast_devkit::ports::free_port;
use holdfast_model::layout::{POLICY_KEY, POLICY_STATUS_KEY};
use holdfast_store::policy::{PolicyStatus, PublishedPolicy};
use holdfast_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Controller {
    process: ControllerProcess,
    metrics_port: u16,
    config: PathBuf,
    log: PathBuf,
}

impl Controller {
    fn spawn(dir: &Path, name: &str, etcd: &Etcd, policy: &Path, rescan: Duration, ttl: Duration) -> Self {
        let mut config = ControllerConfig::new(EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config() });
        config.policy_dir = policy.to_path_buf();
        config.metrics_listen = ([127, 0, 0, 1], free_port()).into();
        config.cluster_name = "test".into();
        config.rescan_interval = rescan;
        config.election.ttl = ttl;
        let metrics_port = config.metrics_listen.port();
        let mut launch = ControllerLaunch::new(bin("holdfast-controller"), config, dir, name);
        launch.env.push(("HOLDFAST_LOG".into(), "info,holdfast_controller=debug".into()));
        let process = ControllerProcess::spawn(&launch).expect("start holdfast-controller");
        Controller { process, metrics_port, config: launch.config_path, log: launch.log }
    }

    fn start(dir: &Path, name: &str, etcd: &Etcd, policy: &Path, rescan: Duration, ttl: Duration) -> Self {
        let mut c = Self::spawn(dir, name, etcd, policy, rescan, ttl);
        c.process.wait_ready(Duration::from_secs(20)).expect("controller READY=1");
        c
    }

    fn pid(&self) -> u32 {
        self.process.pid().expect("running")
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), signal).unwrap();
    }

    /// A metric's value (the one series with cluster="test").
    async fn metric(&self, name: &str) -> f64 {
        let text = scrape(self.metrics_port).await;
        let prefix = format!("{name}{{cluster=\"test\"}} ");
        let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {name} in:\n{text}"));
        line[prefix.len()..].parse().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- controller log {} -----\n{}", self.log.display(), self.log());
        }
    }
}

/// `/sys/policy` and its mod revision.
async fn published(etcd: &mut etcd_client::Client) -> Option<(PublishedPolicy, i64)> {
    let resp = etcd.get(POLICY_KEY, None).await.unwrap();
    resp.kvs().first().map(|kv| (serde_json::from_slice(kv.value()).expect("a PublishedPolicy"), kv.mod_revision()))
}

async fn status(etcd: &mut etcd_client::Client) -> Option<PolicyStatus> {
    let resp = etcd.get(POLICY_STATUS_KEY, None).await.unwrap();
    resp.kvs().first().map(|kv| serde_json::from_slice(kv.value()).expect("a PolicyStatus"))
}

/// Waits until `/sys/policy` has `version`.
async fn wait_version(etcd: &mut etcd_client::Client, version: u64, timeout: Duration) -> (PublishedPolicy, Duration) {
    let start = Instant::now();
    loop {
        if let Some((p, _)) = published(etcd).await
            && p.version >= version
        {
            assert_eq!(p.version, version, "versions go up by one per publish");
            return (p, start.elapsed());
        }
        assert!(start.elapsed() < timeout, "/sys/policy did not reach version {version} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The set's hash as `holdfast-controller check --offline` prints it.
fn checked_hash(config: &Path) -> String {
    let out = Command::new(bin("holdfast-controller")).args(["check", "--offline", "--config"]).arg(config).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let at = stdout.find("sha256:").unwrap_or_else(|| panic!("no hash in {stdout}"));
    stdout[at..at + 71].to_string()
}

/// Replaces the first `from` in `file`; returns the 1-based line it was on.
fn edit(file: &Path, from: &str, to: &str) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    let at = text.find(from).unwrap_or_else(|| panic!("{from:?} not in {}", file.display()));
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
    text[..at].matches('\n').count() + 1
}

const FAST: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(3);

#[tokio::test]
async fn publishes_the_dev_set_refuses_a_bad_change_and_publishes_a_good_one() {
    let dir = TestDir::new("controller-publish");
    let etcd = Etcd::start(&dir.path, 1).await;
    let mut kv = etcd.client().await;
    let policy = dev_policy(&dir.path);
    // The policy directory is inside a (minimal) Git checkout.
    let commit = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(dir.path.join(".git/refs/heads")).unwrap();
    std::fs::write(dir.path.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(dir.path.join(".git/refs/heads/main"), format!("{commit}\n")).unwrap();
    let ctl = Controller::start(&dir.path, "controller", &etcd, &policy, FAST, TTL);

    // READY came after the first round: the dev set is published as version 1.
    let (p, _) = wait_version(&mut kv, 1, Duration::from_secs(2)).await;
    assert_eq!(p.source_commit.as_deref(), Some(commit));
    assert_eq!(p.hash, checked_hash(&ctl.config), "the published hash is the set's content hash");
    assert_eq!(p.set.hash, p.hash);
    assert!(p.set.classes.contains_key("demo") && p.set.grants.contains_key("dev-operator"));
    assert!(p.published_by.ends_with(&format!("pid {}", ctl.pid())), "{}", p.published_by);
    let s = status(&mut kv).await.expect("/sys/policy-status");
    assert_eq!((s.version, s.hash.as_deref(), s.last_refusal.is_none()), (1, Some(p.hash.as_str()), true));
    assert_eq!(ctl.metric("holdfast_controller_published_version").await, 1.0);
    assert_eq!(ctl.metric("holdfast_controller_leader").await, 1.0);
    assert_eq!(ctl.metric("holdfast_controller_refusals_total").await, 0.0);
    let (_, v1_revision) = published(&mut kv).await.unwrap();

    // A bad change: refused, named with file:line, counted once; version 1 stays.
    let file = policy.join("classes.d/dev.toml");
    let line = edit(&file, "ttl = \"30s\"", "ttl = \"1s\"");
    let start = Instant::now();
    let refusal = loop {
        if let Some(r) = status(&mut kv).await.and_then(|s| s.last_refusal) {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no refusal in /sys/policy-status");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let where_ = format!("{}:{line}", file.display());
    assert!(
        refusal.problems.iter().any(|p| p.to_string().starts_with(&where_) && p.rule == "ttl-out-of-range"),
        "{where_} not in {:#?}",
        refusal.problems
    );
    tokio::time::sleep(FAST * 4).await; // a few more rounds over the same bad files
    let (p, revision) = published(&mut kv).await.unwrap();
    assert_eq!((p.version, revision), (1, v1_revision), "a refused change leaves /sys/policy untouched");
    assert_eq!(ctl.metric("holdfast_controller_refusals_total").await, 1.0, "one refusal per change, not per round");
    let log = ctl.log();
    assert!(log.contains("REFUSED the policy") && log.contains(&where_), "{log}");

    // A good change: published as version 2 within seconds; the refusal is cleared.
    edit(&file, "ttl = \"1s\"", "ttl = \"45s\"");
    let (p, took) = wait_version(&mut kv, 2, Duration::from_secs(5)).await;
    assert_eq!(p.set.classes["demo"].ttl, Duration::from_secs(45));
    eprintln!("good change published after {took:?}");
    let s = status(&mut kv).await.unwrap();
    assert_eq!((s.version, s.last_refusal.is_none()), (2, true), "{s:?}");
    assert_eq!(ctl.metric("holdfast_controller_published_version").await, 2.0);
}

#[tokio::test]
async fn sighup_rescans_at_once() {
    let dir = TestDir::new("controller-hup");
    let etcd = Etcd::start(&dir.path, 1).await;
    let mut kv = etcd.client().await;
    let policy = dev_policy(&dir.path);
    // Rescans every minute: only SIGHUP can make the change visible quickly.
    let ctl = Controller::start(&dir.path, "controller", &etcd, &policy, Duration::from_secs(60), Duration::from_secs(120));
    wait_version(&mut kv, 1, Duration::from_secs(2)).await;
    edit(&policy.join("classes.d/dev.toml"), "ttl = \"30s\"", "ttl = \"60s\"");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(published(&mut kv).await.unwrap().0.version, 1, "no rescan before the interval or a SIGHUP");
    ctl.signal(nix::sys::signal::Signal::SIGHUP);
    let (p, took) = wait_version(&mut kv, 2, Duration::from_secs(3)).await;
    assert_eq!(p.set.classes["demo"].ttl, Duration::from_secs(60));
    eprintln!("published {took:?} after SIGHUP");
    assert!(ctl.log().contains("SIGHUP: rescanning"));
}

#[tokio::test]
async fn only_the_leader_publishes_and_a_standby_takes_over_a_killed_leader() {
    let dir = TestDir::new("controller-election");
    let etcd = Etcd::start(&dir.path, 1).await;
    let mut kv = etcd.client().await;
    let policy = dev_policy(&dir.path);
    let mut a = Controller::start(&dir.path, "a", &etcd, &policy, FAST, TTL);
    wait_version(&mut kv, 1, Duration::from_secs(2)).await;
    let b = Controller::start(&dir.path, "b", &etcd, &policy, FAST, TTL);
    assert_eq!(b.metric("holdfast_controller_leader").await, 0.0);
    assert_eq!(a.metric("holdfast_controller_leader").await, 1.0);
    assert!(b.log().contains("standby"), "{}", b.log());
    tokio::time::sleep(FAST * 3).await;
    let (p, _) = published(&mut kv).await.unwrap();
    assert_eq!(p.version, 1, "the standby published nothing");
    assert!(p.published_by.ends_with(&format!("pid {}", a.pid())));
    assert_eq!(b.metric("holdfast_controller_published_version").await, 1.0, "the standby reads the version");

    // SIGKILL: no resignation; the standby takes over when the lease expires.
    let b_pid = b.pid();
    a.process.kill();
    let killed = Instant::now();
    edit(&policy.join("classes.d/dev.toml"), "ttl = \"30s\"", "ttl = \"40s\"");
    let (p, _) = wait_version(&mut kv, 2, TTL + Duration::from_secs(8)).await;
    let took = killed.elapsed();
    eprintln!("standby published {took:?} after the leader was killed (lease TTL {TTL:?})");
    assert!(p.published_by.ends_with(&format!("pid {b_pid}")), "{}", p.published_by);
    assert!(took >= TTL - Duration::from_millis(500), "took over after {took:?}, before the lease could expire");
    assert_eq!(b.metric("holdfast_controller_leader").await, 1.0);
}

#[tokio::test]
async fn a_paused_leader_is_deposed_and_cannot_publish_when_it_wakes() {
    let dir = TestDir::new("controller-deposed");
    let etcd = Etcd::start(&dir.path, 1).await;
    let mut kv = etcd.client().await;
    let policy = dev_policy(&dir.path);
    let a = Controller::start(&dir.path, "a", &etcd, &policy, FAST, TTL);
    wait_version(&mut kv, 1, Duration::from_secs(2)).await;
    let b = Controller::start(&dir.path, "b", &etcd, &policy, FAST, TTL);

    // A freezes past its lease; B takes over and publishes a change.
    sigstop(a.pid());
    let file = policy.join("classes.d/dev.toml");
    edit(&file, "ttl = \"30s\"", "ttl = \"40s\"");
    let (p, _) = wait_version(&mut kv, 2, TTL + Duration::from_secs(8)).await;
    assert!(p.published_by.ends_with(&format!("pid {}", b.pid())), "{}", p.published_by);

    // Another change, then A wakes believing it leads: whatever A tries, only
    // B publishes, and each version once.
    edit(&file, "ttl = \"40s\"", "ttl = \"50s\"");
    sigcont(a.pid());
    let (p, _) = wait_version(&mut kv, 3, Duration::from_secs(5)).await;
    assert!(p.published_by.ends_with(&format!("pid {}", b.pid())), "{}", p.published_by);
    tokio::time::sleep(FAST * 5).await;
    let (p, _) = published(&mut kv).await.unwrap();
    assert_eq!(p.version, 3, "the woken controller published nothing");
    assert_eq!(b.metric("holdfast_controller_leader").await, 1.0);
    assert_eq!(a.metric("holdfast_controller_leader").await, 0.0, "{}", a.log());
    assert!(a.log().contains("lost the leadership"), "{}", a.log());
}

#[test]
fn check_validates_the_config_and_the_class_set() {
    let dir = TestDir::new("controller-check");
    let policy = dev_policy(&dir.path);
    let config = dir.path.join("controller.toml");
    let write = |text: &str| std::fs::write(&config, text).unwrap();
    let run = || {
        let out = Command::new(bin("holdfast-controller")).args(["check", "--offline", "--config"]).arg(&config).output().unwrap();
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    write(&format!("policy_dir = {:?}\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n", policy.display().to_string()));
    let (code, out) = run();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(": ok") && out.contains(": valid: 5 class(es)"), "{out}");

    // A bad class set: 65, each problem as FILE:LINE: message.
    let line = edit(&policy.join("classes.d/dev.toml"), "ttl = \"30s\"", "ttl = \"1s\"");
    let (code, out) = run();
    assert_eq!(code, Some(65), "{out}");
    assert!(out.contains(&format!("classes.d/dev.toml:{line}: ")) && out.contains("INVALID"), "{out}");

    // A bad config: 78, every problem named.
    write("rescan_interval = \"1ms\"\n[etcd]\nendpoints = [\"127.0.0.1:2379\"]\n[election]\nttl = \"1s\"\n");
    let (code, out) = run();
    assert_eq!(code, Some(78), "{out}");
    assert!(out.contains("rescan_interval") && out.contains("election.ttl") && out.contains("needs a scheme"), "{out}");

    // The shipped example passes `check`, pointed at the shipped class set
    // (its policy_dir, /etc/holdfast, exists only on a host).
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let text = std::fs::read_to_string(example.join("controller.toml")).unwrap();
    assert!(text.contains("policy_dir = \"/etc/holdfast\""));
    write(&text.replace("policy_dir = \"/etc/holdfast\"", &format!("policy_dir = {:?}", example.display().to_string())));
    let (code, out) = run();
    assert_eq!(code, Some(0), "{out}");
}

//! `holdfastctl lock exec`, the flock-like entry point.

use holdfast_tests::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `lock exec` in the background; the child appends
/// `start <ns> <token>` and `end <ns> <token>` lines to `log`.
fn spawn_exec(app: &Appliance, identity: &str, key: &str, log: &std::path::Path, hold_for: &str) -> std::process::Child {
    let script = format!(
        "echo \"start $(date +%s%N) $HOLDFAST_TOKEN\" >> {log}; sleep {hold_for}; echo \"end $(date +%s%N) $HOLDFAST_TOKEN\" >> {log}",
        log = log.display()
    );
    Command::new(bin("holdfastctl"))
        .envs(app.ctl_env(identity))
        .args(["lock", "exec", key, "--wait", "60s", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn two_concurrent_lock_execs_on_one_key_never_overlap() {
    let app = Appliance::start("lock-exec", 1).await;
    let log = app.dir.path.join("runs.log");
    // Same identity (two replicas of one job) and a different identity.
    let mut a = spawn_exec(&app, "jobs/report", "jobs/report", &log, "1.5");
    std::thread::sleep(Duration::from_millis(300));
    let mut b = spawn_exec(&app, "jobs/report", "jobs/report", &log, "0.5");
    let mut c = spawn_exec(&app, "jobs/other", "jobs/report", &log, "0.5");
    for child in [&mut a, &mut b, &mut c] {
        let status = child.wait().unwrap();
        assert!(status.success(), "lock exec exited {status}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(String, u128, u64)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), 6, "{text}");
    // Lines come in start/end pairs of one token, never interleaved.
    let mut tokens = Vec::new();
    for pair in lines.chunks(2) {
        assert_eq!(pair[0].0, "start", "{text}");
        assert_eq!(pair[1].0, "end", "{text}");
        assert_eq!(pair[0].2, pair[1].2, "another holder started inside this one's run:\n{text}");
        tokens.push(pair[0].2);
    }
    assert!(tokens.windows(2).all(|w| w[1] > w[0]), "each later holder has a greater token: {tokens:?}");
    assert!(lines.windows(2).all(|w| w[1].1 >= w[0].1));
}

#[tokio::test]
async fn lock_exec_exits_with_the_commands_status_and_releases() {
    let app = Appliance::start("lock-exec-status", 1).await;
    let out = Command::new(bin("holdfastctl"))
        .envs(app.ctl_env("jobs/a"))
        .args(["lock", "exec", "jobs/status", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    let client = app.client("jobs/b").await;
    let k = holdfast_model::LockKey::parse("jobs/status").unwrap();
    assert!(!client.inspect(&k).await.unwrap().held, "released after the command exited");
    // --wait 0 while held: exit 75, the command never runs.
    let session = client.open_session_for("jobs", None).await.unwrap();
    let _hold = session.acquire(&k, Duration::ZERO).await.unwrap();
    let marker = app.dir.path.join("ran");
    let out = Command::new(bin("holdfastctl"))
        .envs(app.ctl_env("jobs/a"))
        .args(["lock", "exec", "jobs/status", "--wait", "0", "--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!marker.exists());
    // The token never appears in what holdfastctl prints.
    assert!(!String::from_utf8_lossy(&out.stderr).contains(&_hold.token().expose().to_string()));
}

#[tokio::test]
async fn lock_exec_terminates_the_command_when_the_session_is_lost() {
    // A 5 s class for jobs: the loss must come (and be acted on) quickly.
    let app = Appliance::start_policy("lock-exec-lost", 1, &defaults, &[("jobs", 5)], "").await;
    let marker = app.dir.path.join("got-term");
    let script = format!("trap 'echo term > {}; exit 0' TERM; while true; do sleep 0.1; done", marker.display());
    let mut child = Command::new(bin("holdfastctl"))
        .envs(app.ctl_env("jobs/a"))
        .args(["lock", "exec", "jobs/lost", "--ttl", "5s", "--kill-after", "2s", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = app.client("jobs/b").await;
    let k = holdfast_model::LockKey::parse("jobs/lost").unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while !client.inspect(&k).await.unwrap().held {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Freeze the arbiter: keepalives stop being acknowledged.
    let arbiter = app.arbiter.pid().unwrap();
    sigstop(arbiter);
    let frozen = Instant::now();
    let marker_seen = {
        let marker = marker.clone();
        tokio::task::spawn_blocking(move || {
            while !marker.exists() && frozen.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            frozen.elapsed()
        })
    };
    let status = tokio::task::spawn_blocking(move || {
        let s = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        (s, err)
    })
    .await
    .unwrap();
    let exited = frozen.elapsed();
    let took = marker_seen.await.unwrap();
    sigcont(arbiter);
    assert_eq!(status.0.code(), Some(79), "exit status says the lock was lost; stderr:\n{}", status.1);
    assert!(status.1.contains("lost the lock"), "{}", status.1);
    assert!(marker.exists(), "the command got SIGTERM");
    assert!(took < Duration::from_secs(5), "SIGTERM {took:?} after the freeze: must be before the 5s TTL passes");
    assert!(exited < Duration::from_secs(8), "holdfastctl took {exited:?} to exit after the loss");
}

#[tokio::test]
async fn lock_exec_with_a_ttl_other_than_the_class_ttl_is_refused_naming_the_class() {
    let app = Appliance::start("lock-exec-ttl", 1).await;
    let client = app.client("jobs/b").await;
    let k = holdfast_model::LockKey::parse("jobs/ttl").unwrap();
    let marker = app.dir.path.join("ran");
    // 20 s is a valid session TTL, but jobs' class TTL is 10 s.
    let before = app.etcd.revision().await;
    let ran = Ran::of(
        Command::new(bin("holdfastctl"))
            .envs(app.ctl_env("jobs/a"))
            .args(["lock", "exec", "jobs/ttl", "--ttl", "20s", "--wait", "0", "--", "touch"])
            .arg(&marker),
    );
    assert_eq!(ran.code, 64, "a TTL that is not the class's is a usage error:\n{ran}");
    assert!(ran.stderr.contains("class jobs") && ran.stderr.contains("10s"), "the refusal names the class and its TTL:\n{ran}");
    assert!(!marker.exists(), "the command never ran");
    assert!(!client.inspect(&k).await.unwrap().held, "nothing is held after the refusal");
    assert_eq!(app.etcd.revision().await, before, "the refusal wrote nothing to etcd (no session, no hold)");
    // The class's own TTL, given explicitly, is accepted.
    let ran = Ran::of(
        Command::new(bin("holdfastctl"))
            .envs(app.ctl_env("jobs/a"))
            .args(["lock", "exec", "jobs/ttl", "--ttl", "10s", "--wait", "0", "--", "touch"])
            .arg(&marker),
    );
    assert_eq!(ran.code, 0, "{ran}");
    assert!(marker.exists(), "the command ran with the class's TTL");
    assert!(!client.inspect(&k).await.unwrap().held, "released after the command exited");
}

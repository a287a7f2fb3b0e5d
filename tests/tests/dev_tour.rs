//! The README's first command and its tour, as a new user runs them:
//! `holdfastctl dev --detach`, a lock held in one shell, the second shell's
//! identity seeing contention (75), the first identity seeing its own leaked
//! hold (76), inspect, epoch status, and `dev stop`.

use holdfast_tests::*;
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ctl(env: &HashMap<String, String>, args: &[&str]) -> std::process::Output {
    Command::new(bin("holdfastctl")).envs(env).args(args).output().expect("run holdfastctl")
}

#[test]
fn the_dev_tour_works_as_the_readme_says() {
    let dir = TestDir::new("dev-tour");
    let state = dir.path.join("hf");
    let (banner, _stop) = dev_detach(&state);
    assert!(banner.contains("source") && banner.contains("env-second") && banner.contains("holdfastctl lock exec"), "{banner}");
    let first = env_file(&state.join("env"));
    let second = env_file(&state.join("env-second"));
    assert_ne!(first["HOLDFAST_CERT"], second["HOLDFAST_CERT"], "two identities");
    assert_eq!(first["HOLDFAST_ENDPOINT"], second["HOLDFAST_ENDPOINT"]);
    // The rendered arbiter config is what the arbiter parsed (no mutation).
    let config = std::fs::read_to_string(state.join("arbiter.toml")).unwrap();
    assert!(config.starts_with("# Written by `holdfastctl dev`") && !config.contains("[mutation]"), "{config}");
    // The controller published the dev class set before the banner.
    assert!(banner.contains("/policy"), "the banner says where the class set is: {banner}");
    // etcd speaks mTLS with authentication on; the shells carry the
    // read-only observer's credentials.
    let observer = holdfast_config::EtcdConfig {
        ca_file: Some(first["HOLDFAST_ETCD_CA"].clone().into()),
        cert_file: Some(first["HOLDFAST_ETCD_CERT"].clone().into()),
        key_file: Some(first["HOLDFAST_ETCD_KEY"].clone().into()),
        ..holdfast_config::EtcdConfig::plain(vec![first["HOLDFAST_ETCD_ENDPOINT"].clone()])
    };
    assert!(observer.endpoints[0].starts_with("https://"), "{observer:?}");
    // The class set is published on the coord cluster, not the entity one.
    let coord = holdfast_config::EtcdConfig { endpoints: vec![first["HOLDFAST_COORD_ENDPOINT"].clone()], ..observer.clone() };
    let published = tokio::runtime::Runtime::new().unwrap().block_on(async move {
        let mut etcd = Etcd::client_for(&observer).await;
        assert!(etcd.put("/sys/policy", "x", None).await.is_err(), "the observer wrote the class set");
        assert!(etcd.get("/l/demo/report", None).await.is_err(), "the observer read a hold");
        assert_eq!(etcd.get("/sys/policy", None).await.unwrap().count(), 0, "a class set on the entity cluster");
        let mut coord = Etcd::client_for(&coord).await;
        assert!(coord.put("/sys/policy", "x", None).await.is_err(), "the observer wrote the class set");
        // The controller and both tailers campaign on the coord cluster
        // (each tailer in an election of its own): the entity cluster (its
        // history recorded by the tailer) holds no election.
        for election in ["/sys/election/controller/", "/sys/election/tailer/", "/sys/election/tailer-coord/"] {
            let prefix = || Some(etcd_client::GetOptions::new().with_prefix().with_count_only());
            assert_eq!(etcd.get(election, prefix()).await.unwrap().count(), 0, "{election} on the entity cluster");
            assert_eq!(coord.get(election, prefix()).await.unwrap().count(), 1, "{election} on the coord cluster: one candidate");
        }
        let r = coord.get("/sys/policy", None).await.unwrap();
        serde_json::from_slice::<serde_json::Value>(r.kvs()[0].value()).unwrap()
    });
    assert_eq!(published["version"], 1, "{published}");
    assert!(published["set"].to_string().contains("demo"), "the dev set has the tour's namespace: {published}");

    // First shell: hold demo/report for a while.
    let ready = state.join("held");
    let mut holder = Command::new(bin("holdfastctl"))
        .envs(&first)
        .args(["lock", "exec", "demo/report", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 20", ready.display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < end, "the first lock exec did not start its command");
        assert!(holder.try_wait().unwrap().is_none(), "the first lock exec exited early");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Second shell, second identity: contention.
    let out = ctl(&second, &["lock", "exec", "demo/report", "--wait", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    // The first identity from another process: its own hold under another
    // session, a leaked hold.
    let out = ctl(&first, &["lock", "exec", "demo/report", "--wait", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(76), "{}", String::from_utf8_lossy(&out.stderr));

    let out = ctl(&second, &["inspect", "demo/report", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let inspect = String::from_utf8_lossy(&out.stdout);
    assert!(inspect.contains("dev/operator"), "inspect names the holder: {inspect}");
    let out = ctl(&first, &["epoch", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The arbiter grants on both clusters, each in its own epoch.
    assert!(text.contains("epoch        1\n") && text.contains("coord        serving epoch 2 (cluster coord"), "{text}");
    // A coord-tier class's keys are granted on the coord cluster, in its epoch.
    let out = ctl(&first, &["lock", "exec", "jobs/nightly", "--", "sh", "-c", "echo $(($HOLDFAST_TOKEN >> 48))"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2", "a jobs token carries the coord cluster's epoch");
    // The coord cluster's own tailer records that hold, in DIR/audit-coord.
    let coord_store = state.join("audit-coord").display().to_string();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = ctl(&first, &["audit", "--store", &coord_store, "jobs/nightly"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains("spiffe://holdfast.dev/dev/operator") {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the coord tailer did not record jobs/nightly in 30 s:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // One history over both clusters' stores: merged by time, each event
    // with its cluster.
    let both = format!("{},{coord_store}", state.join("audit").display());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = ctl(&first, &["audit", "--store", &both, "--kind", "grant", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let events: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        let keys: Vec<(&str, &str)> =
            events.iter().map(|e| (e["key"].as_str().unwrap_or(""), e["cluster_id"].as_str().unwrap_or(""))).collect();
        let (demo, jobs) = (keys.iter().find(|k| k.0 == "demo/report"), keys.iter().find(|k| k.0 == "jobs/nightly"));
        if let (Some(demo), Some(jobs)) = (demo, jobs) {
            assert_ne!(demo.1, jobs.1, "the two grants were recorded on two clusters: {keys:?}");
            let times: Vec<u64> = events.iter().map(|e| e["time_unix_ms"].as_u64().unwrap()).collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "merged by time: {times:?}");
            let out = ctl(&first, &["audit", "--store", &both, "--kind", "grant"]);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.starts_with("CLUSTER") && text.contains(jobs.1) && text.contains(demo.1), "{text}");
            break;
        }
        assert!(std::time::Instant::now() < end, "the two stores did not show both grants in 30 s: {keys:?}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // `holdfastctl status` reads etcd as the observer, from the shell's env.
    let out = ctl(&first, &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("class set    version 1\n"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // Two clusters: the banner names both, and status tells them apart (the
    // shell's env names the coord cluster); both clusters' first epochs
    // were allocated on the coord cluster, and each has its own.
    assert!(banner.contains("coord") && first["HOLDFAST_COORD_ENDPOINT"] != first["HOLDFAST_ETCD_ENDPOINT"], "{banner}");
    assert!(text.contains("(separate)") && text.contains("highest epoch allocated 2 (/sys/epochs on the coord cluster)"), "{text}");
    assert!(text.contains("epoch        1 (") && text.contains("coord epoch  2 (") && text.contains("coord sealed no\n"), "{text}");
    let out = ctl(&first, &["status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["tiers"]["shared"], false, "{json}");
    assert_eq!((&json["coord"]["epoch"]["epoch"], &json["coord"]["sealed"]), (&serde_json::json!(2), &serde_json::json!(false)), "{json}");
    assert_ne!(json["tiers"]["coord_cluster_id"], json["tiers"]["entity_cluster_id"], "{json}");
    // Told of no coord cluster, status reads one cluster for both tiers.
    let mut one = first.clone();
    one.remove("HOLDFAST_COORD_ENDPOINT");
    let out = ctl(&one, &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("one cluster serves both tiers"), "{text}");

    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = Command::new(bin("holdfastctl")).args(["dev", "stop", "--dir"]).arg(&state).output().unwrap();
    assert!(out.status.success(), "dev stop: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!state.join("dev.pid").exists(), "dev stop removed the pid file");
}

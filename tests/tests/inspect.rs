//! `Inspect` (and `holdfastctl inspect`) never hands out a value from which
//! the holder's token can be rebuilt: the token is `epoch << 48 | create
//! revision`, and the epoch is public, so the hold's create revision must not
//! leave the arbiter. The holder, its session and the grant time say enough.

use holdfast_model::LockKey;
use holdfast_tests::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

#[tokio::test]
async fn inspect_of_a_held_key_says_who_and_since_when_but_nothing_that_rebuilds_the_token() {
    let classes = [("warmup", 30), ("reports", 30)];
    let app = Appliance::start_policy("inspect", 1, &defaults, &classes, "").await;
    // Move etcd's revision well away from small numbers that could appear
    // in the output by chance (waiters, epoch, durations).
    let client = app.client("team/a").await;
    // One session for both namespaces: their classes share the 30 s TTL.
    let session = client.open_session_for("reports", None).await.unwrap();
    assert_eq!(session.ttl(), Duration::from_secs(30));
    for i in 0..40 {
        let k = LockKey::parse(&format!("warmup/k{i}")).unwrap();
        session.acquire(&k, Duration::ZERO).await.unwrap().release().await.unwrap();
    }
    let k = LockKey::parse("reports/daily").unwrap();
    let hold = session.acquire(&k, Duration::ZERO).await.unwrap();
    let revision = hold.token().revision();
    let token = hold.token().expose();
    assert!(revision > 80, "etcd's revision moved: {revision}");

    let run = |args: &[&str]| {
        let out = Command::new(bin("holdfastctl")).envs(app.ctl_env("team/b")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let json = run(&["inspect", "reports/daily", "--json"]);
    let table = run(&["inspect", "reports/daily"]);
    eprintln!("{json}\n{table}");

    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let fields: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        fields,
        BTreeSet::from(["key", "held", "holder_identity", "session_id", "since_unix_ms", "epoch", "waiters"]),
        "exactly these fields, none with a revision"
    );
    assert_eq!(v["held"], true);
    assert!(v["holder_identity"].as_str().unwrap().ends_with("team/a"), "{v}");
    for text in [&json, &table] {
        assert!(!text.contains("revision"), "no revision in the output: {text}");
        for word in text.split(|c: char| !c.is_ascii_alphanumeric()) {
            assert_ne!(word, revision.to_string(), "the create revision appears in: {text}");
            assert_ne!(word, token.to_string(), "the token appears in: {text}");
            assert_ne!(word, format!("{token:x}"), "the token (hex) appears in: {text}");
        }
    }
    // The raw RPC answer carries nothing else either.
    let raw = client.inspect(&k).await.unwrap();
    assert!(raw.held);
    assert!(raw.since_unix_ms > 0);
    assert_ne!(raw.session_id, revision);
    hold.release().await.unwrap();
}

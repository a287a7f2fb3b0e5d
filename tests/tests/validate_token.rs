//! `ValidateToken`, for resources that cannot store a fence mark: valid only
//! for the current holder's token, read linearizably, never echoed or
//! logged, refused while sealed, rate-limited on its own and counted per
//! class.

use holdfast_client::{Client, Error};
use holdfast_model::{LockKey, Token};
use holdfast_proto::ErrorReason;
use holdfast_tests::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Validates until the arbiter answers (it refuses while it re-checks etcd).
async fn answer(client: &Client, key: &LockKey, token: Token) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match client.validate_token(key, token).await {
            Ok(v) => return v,
            Err(e) if tokio::time::Instant::now() < end && e.reason() == Some(ErrorReason::Unavailable) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("ValidateToken refused: {e}"),
        }
    }
}

#[tokio::test]
async fn validate_token_says_valid_only_for_the_current_holders_token() {
    let dir = TestDir::new("validate-token");
    let etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    let pki = Pki::new(&dir.path);
    // Everything at debug level, to show the token reaches no log line.
    let mut arbiter = Arbiter::spawn_logged(&dir.path, "arbiter", &etcd.endpoints(), &pki, &defaults, "debug");
    arbiter.wait_ready(Duration::from_secs(30)).unwrap();
    let cert_a = pki.workload("team-a", "team/a");
    let a = arbiter.client(&pki, &cert_a).await;
    let b = arbiter.client(&pki, &pki.workload("team-b", "team/b")).await;
    let sa = a.open_session(Duration::from_secs(30)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(30)).await.unwrap();
    let k = LockKey::parse("vt/orders").unwrap();
    let mut tokens = Vec::new();

    // A free key: no token is valid, not even one that looks right.
    assert!(!a.validate_token(&k, Token::new(1, 1).unwrap()).await.unwrap(), "a free key");

    // The current holder's token, and nothing next to it.
    let first = sa.acquire(&k, Duration::ZERO).await.unwrap();
    let t1 = first.token();
    tokens.push(t1.expose());
    assert!(a.validate_token(&k, t1).await.unwrap(), "the current holder's token");
    assert!(b.validate_token(&k, t1).await.unwrap(), "whoever asks: the resource is not the holder");
    let other_epoch = Token::new(t1.epoch() + 1, t1.revision()).unwrap();
    let next_revision = Token::new(t1.epoch(), t1.revision() + 1).unwrap();
    let previous_revision = Token::new(t1.epoch(), t1.revision() - 1).unwrap();
    for (t, what) in [(other_epoch, "the right revision in another epoch"), (next_revision, "one above"), (previous_revision, "one below")]
    {
        tokens.push(t.expose());
        assert!(!a.validate_token(&k, t).await.unwrap(), "{what}");
    }
    let elsewhere = LockKey::parse("vt/elsewhere").unwrap();
    assert!(!a.validate_token(&elsewhere, t1).await.unwrap(), "the token of another key");

    // Released and re-acquired by another holder: the old token is dead.
    assert!(first.release().await.unwrap());
    assert!(!a.validate_token(&k, t1).await.unwrap(), "released");
    let second = sb.acquire(&k, Duration::ZERO).await.unwrap();
    let t2 = second.token();
    tokens.push(t2.expose());
    assert!(t2 > t1);
    assert!(!a.validate_token(&k, t1).await.unwrap(), "the previous holder's token");
    assert!(a.validate_token(&k, t2).await.unwrap(), "the new holder's token");

    // holdfastctl: the token from HOLDFAST_TOKEN or stdin, never argv.
    let env = [
        ("HOLDFAST_ENDPOINT", arbiter.endpoint()),
        ("HOLDFAST_CA", pki.ca.ca_path().display().to_string()),
        ("HOLDFAST_CERT", cert_a.cert.display().to_string()),
        ("HOLDFAST_KEY", cert_a.key.display().to_string()),
    ];
    let mut outputs = String::new();
    let ctl = |token_env: Option<u64>, stdin: Option<String>| {
        let mut cmd = Command::new(bin("holdfastctl"));
        cmd.envs(env.iter().cloned()).env_remove("HOLDFAST_TOKEN").args(["validate-token", "vt/orders"]);
        if let Some(t) = token_env {
            cmd.env("HOLDFAST_TOKEN", t.to_string());
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), String::from_utf8_lossy(&out.stdout).trim().to_string(), text)
    };
    for (env_token, stdin, code, says) in [
        (Some(t2.expose()), None, 0, "valid"),
        (Some(t1.expose()), None, 1, "invalid"),
        (None, Some(format!("{}\n", t2.expose())), 0, "valid"),
        (None, Some(format!("{}\n", t1.expose())), 1, "invalid"),
    ] {
        let (status, stdout, all) = ctl(env_token, stdin);
        assert_eq!((status, stdout.as_str()), (Some(code), says), "{all}");
        outputs.push_str(&all);
    }
    let (status, _, all) = ctl(None, Some(String::new()));
    assert_eq!(status, Some(64), "no token anywhere is a usage error: {all}");
    assert!(all.contains("HOLDFAST_TOKEN"), "{all}");
    let (status, _, all) = ctl(Some(u64::MAX), None);
    assert_eq!(status, Some(1), "a value no arbiter mints: {all}");
    let help = Command::new(bin("holdfastctl")).args(["validate-token", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    assert!(help.contains("HOLDFAST_TOKEN") && help.contains("Exit status") && help.contains("1   invalid"), "{help}");

    // Sealed: the arbiter vouches for nothing, not even the current token.
    let store = etcd.holdfast().await;
    holdfast_store::epoch::write_seal(&store, "sealed by the validate-token test").await.unwrap();
    arbiter.wait_sealed(&a, true, Duration::from_secs(15)).await;
    let refused = a.validate_token(&k, t2).await.unwrap_err();
    assert_eq!(refused.reason(), Some(ErrorReason::Sealed), "{refused}");

    // After an epoch advance every earlier token is invalid, and the new
    // epoch's holder is valid.
    holdfast_store::epoch::advance(&store, 1).await.unwrap();
    let status = arbiter.wait_sealed(&a, false, Duration::from_secs(15)).await;
    assert_eq!(status.epoch, 2);
    for t in [t1, t2] {
        assert!(!answer(&a, &k, t).await, "a token of epoch 1 after the advance");
    }
    let sa2 = a.open_session(Duration::from_secs(30)).await.unwrap();
    let third = sa2.acquire(&k, Duration::ZERO).await.unwrap();
    let t3 = third.token();
    tokens.push(t3.expose());
    assert_eq!(t3.epoch(), 2);
    assert!(a.validate_token(&k, t3).await.unwrap(), "the holder in the new epoch");
    let epoch1_same_revision = Token::new(1, t3.revision()).unwrap();
    tokens.push(epoch1_same_revision.expose());
    assert!(!a.validate_token(&k, epoch1_same_revision).await.unwrap(), "the new hold's revision with the old epoch");

    // Counted per class; outcomes are metric names, like acquire_*.
    let text = scrape(arbiter.metrics_port).await;
    let valid =
        sample(&text, "holdfast_arbiter_validate_token_valid_total{namespace=\"vt\",class=\"vt\",tier=\"entity\",cluster=\"test\"}");
    let invalid =
        sample(&text, "holdfast_arbiter_validate_token_invalid_total{namespace=\"vt\",class=\"vt\",tier=\"entity\",cluster=\"test\"}");
    let refused =
        sample(&text, "holdfast_arbiter_validate_token_refused_total{namespace=\"vt\",class=\"vt\",tier=\"entity\",cluster=\"test\"}");
    assert!(valid >= 6.0 && invalid >= 12.0 && refused >= 1.0, "valid {valid}, invalid {invalid}, refused {refused}:\n{text}");
    third.release().await.unwrap();

    // No token in the arbiter's log (at debug level) or in holdfastctl's output.
    arbiter.stop();
    let log = std::fs::read_to_string(&arbiter.log).unwrap();
    assert!(log.contains("DEBUG"), "the arbiter ran at debug level");
    for t in &tokens {
        for form in [t.to_string(), format!("{t:x}"), format!("{t:#x}")] {
            assert!(!log.contains(&form), "a token is in the arbiter's log");
            assert!(!outputs.contains(&form), "a token is in holdfastctl's output: {outputs}");
        }
    }
}

/// ValidateToken has its own rate limit, per identity: a flood from one
/// identity is refused in part (RESOURCE_EXHAUSTED) while a second
/// identity's calls in the same moment are all answered, and granting goes
/// on. (With one bucket per arbiter, as before, the flood refused the other
/// resource's calls too.)
#[tokio::test]
async fn validate_token_is_rate_limited_on_its_own() {
    const CALLS: usize = 1500;
    /// The other identity's calls during each flood: well under its burst.
    const OTHER_CALLS: usize = 60;
    let app = Appliance::start("validate-token-limit", 1).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(app.client("team/burst").await);
    }
    let other = app.client("team/quiet").await;
    let session = clients[0].open_session(Duration::from_secs(30)).await.unwrap();
    let key = LockKey::parse("vt-burst/k").unwrap();
    let token = Token::new(1, 1).unwrap();
    // The bucket holds 200 and refills at 2000/s: a burst well beyond what
    // arrives in its first moments is refused in part. (Retried a few times
    // in case a loaded machine sends the burst too slowly.)
    let mut refused_total = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let mut calls = tokio::task::JoinSet::new();
        let mut quiet = tokio::task::JoinSet::new();
        for i in 0..CALLS {
            let (c, k) = (clients[i % clients.len()].clone(), key.clone());
            calls.spawn(async move { c.validate_token(&k, token).await });
            if i % (CALLS / OTHER_CALLS) == 0 {
                let (c, k) = (other.clone(), key.clone());
                quiet.spawn(async move { c.validate_token(&k, token).await });
            }
        }
        let mut quiet_answered = 0;
        while let Some(r) = quiet.join_next().await {
            match r.unwrap() {
                Ok(valid) => {
                    assert!(!valid, "a free key");
                    quiet_answered += 1;
                }
                Err(e) => panic!("team/quiet was refused during team/burst's flood: {e}"),
            }
        }
        assert_eq!(quiet_answered, OTHER_CALLS);
        let (mut answered, mut refused) = (0usize, 0usize);
        while let Some(r) = calls.join_next().await {
            match r.unwrap() {
                Ok(valid) => {
                    assert!(!valid, "a free key");
                    answered += 1;
                }
                Err(Error::Refused { code: tonic::Code::ResourceExhausted, reason: ErrorReason::Unavailable, message, .. }) => {
                    assert!(message.contains("rate-limited for spiffe://holdfast.dev/team/burst"), "{message}");
                    refused += 1;
                }
                Err(e) => panic!("unexpected refusal: {e}"),
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        // Never more than the bucket and its refill allow.
        assert!(answered as f64 <= 200.0 + 2000.0 * elapsed + 1.0, "{answered} answered in {elapsed:.3}s");
        eprintln!("burst of {CALLS}: {answered} answered, {refused} refused in {elapsed:.3}s");
        refused_total += refused;
        if refused > 0 {
            break;
        }
    }
    assert!(refused_total > 0, "no call was refused");
    // The limit is ValidateToken's own: granting goes on.
    let hold = session.acquire(&key, Duration::ZERO).await.unwrap();
    assert!(hold.release().await.unwrap());
    let text = scrape(app.arbiter.metrics_port).await;
    let counted = sample(
        &text,
        "holdfast_arbiter_validate_token_refused_total{namespace=\"vt-burst\",class=\"vt-burst\",tier=\"entity\",cluster=\"test\"}",
    );
    assert_eq!(counted, refused_total as f64, "{text}");
    // The refusals did not pause the arbiter as an etcd failure would.
    let status = clients[0].server_status().await.unwrap();
    assert!(status.serving && !status.sealed, "{status:?}");
}

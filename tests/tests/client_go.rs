//! The Go client (clients/go) against a real etcd and arbiter: this test
//! starts them, issues two workload certificates and runs the Go
//! conformance package (clients/go/conformance) with `go test -json`. It
//! fails, never skips, when Go is missing or when any expected Go test did
//! not run and pass (a Go test that skips counts as a failure).

use holdfast_tests::golang::go_in_clients;
use holdfast_tests::*;
use std::collections::BTreeMap;

/// Every test of clients/go/conformance; each must report "pass".
const EXPECTED: &[&str] = &[
    "TestAcquireAndRelease",
    "TestHoldsOfOneTTLShareOneSession",
    "TestReentrantAcquireReachesTheArbiterOnce",
    "TestContentionIsATypedErrorAfterAZeroWait",
    "TestLeakIsATypedError",
    "TestRefusalsReachGrpcGoWithTheirCodeAndDetail",
    "TestACertificateWithoutASpiffeIDIsUnauthenticated",
    "TestASessionClosedElsewhereIsFencedWithItsKeys",
    "TestTheTokenNeverPrints",
    "TestAStoppedArbiterDrainsThenFencesBeforeTheLeaseCanExpire",
];

/// The last action `go test -json` reported per test, and every output line.
fn results(stdout: &str) -> (BTreeMap<String, String>, String) {
    let mut last = BTreeMap::new();
    let mut output = String::new();
    for line in stdout.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            output.push_str(line);
            output.push('\n');
            continue;
        };
        if let Some(text) = event["Output"].as_str() {
            output.push_str(text);
        }
        if let (Some(test), Some(action)) = (event["Test"].as_str(), event["Action"].as_str())
            && matches!(action, "pass" | "fail" | "skip")
        {
            last.insert(test.to_string(), action.to_string());
        }
    }
    (last, output)
}

#[tokio::test]
async fn the_go_client_passes_its_conformance_suite_against_a_real_arbiter() {
    let app = Appliance::start("client-go", 1).await;
    let a = app.pki.workload("go-a", "go/a");
    let b = app.pki.workload("go-b", "go/b");
    let plain = app.pki.no_spiffe("go-plain");
    let pid = app.arbiter.pid().expect("arbiter pid");
    let etcd = app.etcd.endpoints()[0].clone();
    assert!(etcd.starts_with("http://"), "the Go test reads etcd over plain HTTP: {etcd}");
    let ran = tokio::task::spawn_blocking(move || {
        let ran = Ran::of(
            go_in_clients()
                .args(["test", "-json", "-count=1", "-timeout=5m", "./conformance"])
                .env("HOLDFAST_CONFORMANCE", "1")
                .env("HOLDFAST_ENDPOINT", app.arbiter.endpoint())
                .env("HOLDFAST_CA", app.pki.ca.ca_path())
                .env("HOLDFAST_CERT", &a.cert)
                .env("HOLDFAST_KEY", &a.key)
                .env("HOLDFAST_CONFORMANCE_CERT2", &b.cert)
                .env("HOLDFAST_CONFORMANCE_KEY2", &b.key)
                .env("HOLDFAST_CONFORMANCE_PLAIN_CERT", &plain.cert)
                .env("HOLDFAST_CONFORMANCE_PLAIN_KEY", &plain.key)
                .env("HOLDFAST_CONFORMANCE_ARBITER_PID", pid.to_string())
                .env("HOLDFAST_CONFORMANCE_ETCD", etcd),
        );
        // Whatever the Go side did, the arbiter runs on (and stops cleanly).
        sigcont(pid);
        (ran, app)
    })
    .await
    .expect("go test");
    let (ran, _app) = ran;
    let (last, output) = results(&ran.stdout);
    eprintln!("{output}");
    assert_conformance("Go", EXPECTED, &last, "pass", &ran.stderr);
    assert_eq!(ran.code, 0, "go test failed:\n{}", ran.stderr);
    assert!(output.contains("FENCE-MARGIN go:"), "the SIGSTOP test printed no fence margin");
}

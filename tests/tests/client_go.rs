//! The Go client (clients/go) against the dev appliance: this test starts
//! the conformance lab ([`ConformanceLab`]: `holdfastctl dev` with the
//! conformance classes dropped in, and what the refusals need) and runs the Go
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
    "TestAnUnansweredReleaseIsSentAgainBeforeTheKeyIsAcquiredAgain",
    "TestAStoppedArbiterDrainsThenFencesBeforeTheLeaseCanExpire",
    "TestAStoppedClientsLateWriteIsRejectedByThePostgresqlFence",
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
    let lab = ConformanceLab::start("go").await;
    let pid = lab.arbiter_pid();
    let ran = tokio::task::spawn_blocking(move || {
        let ran = Ran::of(go_in_clients().args(["test", "-json", "-count=1", "-timeout=5m", "./conformance"]).envs(lab.env.clone()));
        // Whatever the Go side did, the arbiter runs on (and stops cleanly).
        sigcont(pid);
        (ran, lab)
    })
    .await
    .expect("go test");
    let (ran, _lab) = ran;
    let (last, output) = results(&ran.stdout);
    eprintln!("{output}");
    assert_conformance("Go", EXPECTED, &last, "pass", &ran.stderr);
    assert_eq!(ran.code, 0, "go test failed:\n{}", ran.stderr);
    assert!(output.contains("FENCE-MARGIN go:"), "the SIGSTOP test printed no fence margin");
    assert!(output.contains("LATE-WRITE go:"), "the late-write test printed no result");
}

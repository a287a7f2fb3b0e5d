//! The Java client's own checks, which need no server: its JUnit tests
//! (token packing and redaction, key validation with the Go client's
//! messages, rendezvous vectors shared with the Rust client, refusal
//! decoding, deadline arithmetic, every entry of the shared
//! clients/conformance/vectors.json, and the session loop against an
//! in-process fake arbiter: drain then fence at the send-time deadline,
//! unconfirmed keepalives, a session the arbiter calls gone, shared sessions
//! and re-entrancy; the client SVID read again when its files change),
//! compiled with every javac lint. Run
//! once, not per etcd target (scripts/test). The conformance class skips
//! here (it needs HOLDFAST_CONFORMANCE=1: tests/tests/client_java.rs).

use holdfast_tests::Ran;
use holdfast_tests::java::{mvn_in_clients, surefire_results};

/// The unit test classes; each must have run with no failure and no skip.
const UNIT_CLASSES: &[&str] =
    &["TokenTest", "KeyTest", "RendezvousTest", "ErrorsTest", "DeadlineTest", "VectorsTest", "SessionTest", "ReloadingKeyManagerTest"];

#[test]
fn the_java_client_builds_and_passes_its_unit_tests() {
    let build = tempfile::tempdir().expect("tempdir");
    let unit = Ran::of(mvn_in_clients(build.path()).args(["test", &format!("-Dtest={}", UNIT_CLASSES.join(","))]));
    assert_eq!(unit.code, 0, "mvn test:\n{unit}");
    let last = surefire_results(build.path());
    let wrong: Vec<_> = last.iter().filter(|(_, outcome)| *outcome != "passed").collect();
    assert!(wrong.is_empty(), "Java unit tests that did not pass: {wrong:?}\n{unit}");
    for class in UNIT_CLASSES {
        let report = build.path().join(format!("surefire-reports/TEST-dev.holdfast.client.{class}.xml"));
        assert!(report.is_file(), "{class} did not run:\n{unit}");
    }
    assert!(last.len() >= 20, "only {} Java unit tests ran: {last:?}", last.len());
    assert!(last.contains_key("tokens") && last.contains_key("errorDetails"), "the shared vectors did not run: {last:?}");
}

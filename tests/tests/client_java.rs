//! The Java client (clients/java) against the dev appliance: this test
//! starts the conformance lab ([`ConformanceLab`]: `holdfastctl dev` with the
//! conformance classes dropped in, an arbiter in another region, a sealed
//! one, PostgreSQL with the reference fence, three workload certificates) and runs the Java conformance class
//! (clients/java/src/test/java/dev/holdfast/client/ConformanceTest.java)
//! with Maven, reading surefire's XML reports. It fails, never skips, when
//! the JDK or Maven is missing or when any expected test did not run and
//! pass (a JUnit test that skips counts as a failure).

use holdfast_tests::java::{mvn_in_clients, surefire_results};
use holdfast_tests::*;

/// Every test of ConformanceTest; each must report "passed".
const EXPECTED: &[&str] = &[
    "acquireAndRelease",
    "holdsOfOneTtlShareOneSession",
    "reentrantAcquireReachesTheArbiterOnce",
    "contentionIsATypedErrorAfterAZeroWait",
    "leakIsATypedError",
    "refusalsReachGrpcJavaWithTheirCodeAndDetail",
    "aCertificateWithoutASpiffeIdIsUnauthenticated",
    "aSessionClosedElsewhereIsFencedWithItsKeys",
    "theTokenNeverPrints",
    "anUnansweredReleaseIsSentAgainBeforeTheKeyIsAcquiredAgain",
    "aStoppedArbiterDrainsThenFencesBeforeTheLeaseCanExpire",
    "aStoppedClientsLateWriteIsRejectedByThePostgresqlFence",
];

#[tokio::test]
async fn the_java_client_passes_its_conformance_suite_against_a_real_arbiter() {
    let lab = ConformanceLab::start("java").await;
    let pid = lab.arbiter_pid();
    let build = lab.dir.path.join("java-build");
    let ran = tokio::task::spawn_blocking(move || {
        let ran = Ran::of(
            mvn_in_clients(&build).args(["test", "-Dtest=ConformanceTest", "-Dsurefire.failIfNoSpecifiedTests=true"]).envs(lab.env.clone()),
        );
        // Whatever the Java side did, the arbiter runs on (and stops cleanly).
        sigcont(pid);
        let last = surefire_results(&build);
        (ran, last, lab)
    })
    .await
    .expect("mvn test");
    let (ran, last, _lab) = ran;
    eprintln!("{}", ran.stdout);
    assert_conformance("Java", EXPECTED, &last, "passed", &ran.stderr);
    assert_eq!(ran.code, 0, "mvn test failed:\n{ran}");
    assert!(ran.stdout.contains("FENCE-MARGIN java:"), "the SIGSTOP test printed no fence margin");
    assert!(ran.stdout.contains("LATE-WRITE java:"), "the late-write test printed no result");
}

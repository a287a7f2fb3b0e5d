//! The Python client (clients/python) against the dev appliance: this test
//! starts the conformance lab ([`ConformanceLab`]: `holdfastctl dev` with the
//! conformance classes dropped in, and what the refusals need) and runs the Python
//! conformance suite (clients/python/tests/conformance) with pytest, from a
//! venv under target/ and with the client installed from a wheel built from
//! the checkout. It fails, never skips, when Python is missing or when any
//! expected test did not run and pass (a test that skips counts as a
//! failure).

use holdfast_tests::python::python_in_clients;
use holdfast_tests::*;
use std::collections::BTreeMap;

/// Every test of clients/python/tests/conformance; each must report PASSED.
const EXPECTED: &[&str] = &[
    "test_acquire_and_release",
    "test_the_asyncio_api_acquires_and_releases",
    "test_holds_of_one_ttl_share_one_session",
    "test_reentrant_acquire_reaches_the_arbiter_once",
    "test_contention_is_a_typed_error_after_a_zero_wait",
    "test_leak_is_a_typed_error",
    "test_refusals_reach_grpcio_with_their_code_and_detail",
    "test_a_certificate_without_a_spiffe_id_is_unauthenticated",
    "test_a_session_closed_elsewhere_is_fenced_with_its_keys",
    "test_the_token_never_prints",
    "test_an_unanswered_release_is_sent_again_before_the_key_is_acquired_again",
    "test_a_stopped_arbiter_drains_then_fences_before_the_lease_can_expire",
    "test_a_stopped_clients_late_write_is_rejected_by_the_postgresql_fence",
];

/// The outcome pytest's `-rA` summary reports per test: lines such as
/// `PASSED tests/conformance/test_conformance.py::test_x` (a skipped test's
/// line names no test, so it shows as "did not run").
fn results(stdout: &str) -> BTreeMap<String, String> {
    let mut last = BTreeMap::new();
    for line in stdout.lines() {
        let Some((outcome, rest)) = line.split_once(' ') else {
            continue;
        };
        if !matches!(outcome, "PASSED" | "FAILED" | "ERROR" | "XFAIL" | "XPASS") {
            continue;
        }
        let Some((_, test)) = rest.split_once("::") else {
            continue;
        };
        let test = test.split([' ', '[']).next().unwrap_or(test);
        last.insert(test.to_string(), outcome.to_string());
    }
    last
}

#[tokio::test]
async fn the_python_client_passes_its_conformance_suite_against_a_real_arbiter() {
    let lab = ConformanceLab::start("py").await;
    let pid = lab.arbiter_pid();
    let site = lab.dir.path.join("py-site");
    let ran = tokio::task::spawn_blocking(move || {
        let ran = Ran::of(
            python_in_clients(&site)
                .args(["-m", "pytest", "-rA", "-s", "-p", "no:cacheprovider", "tests/conformance"])
                .envs(lab.env.clone()),
        );
        // Whatever the Python side did, the arbiter runs on (and stops cleanly).
        sigcont(pid);
        (ran, lab)
    })
    .await
    .expect("pytest");
    let (ran, _lab) = ran;
    let last = results(&ran.stdout);
    eprintln!("{}", ran.stdout);
    assert_conformance("Python", EXPECTED, &last, "PASSED", &ran.stderr);
    assert_eq!(ran.code, 0, "pytest failed:\n{}", ran.stderr);
    assert!(ran.stdout.contains("FENCE-MARGIN python:"), "the SIGSTOP test printed no fence margin");
    assert!(ran.stdout.contains("LATE-WRITE python:"), "the late-write test printed no result");
}

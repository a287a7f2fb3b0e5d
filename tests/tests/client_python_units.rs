//! The Python client's own checks, which need no server: its committed
//! stubs are what `lock.proto` generates (`gen_stubs.py --check`), and its
//! unit tests pass (rendezvous vectors shared with the Rust and Go clients,
//! token redaction in every repr, format and logging path, deadline
//! arithmetic, refusal decoding, and the session loop against an
//! in-process fake arbiter). Run once, not per etcd target (scripts/test).

use holdfast_tests::python::python_in_clients;
use holdfast_tests::{Ran, TestDir};

#[test]
fn the_python_clients_stubs_match_the_proto_and_its_unit_tests_pass() {
    let dir = TestDir::new("client-python-units");
    let site = dir.path.join("py-site");
    let check = Ran::of(python_in_clients(&site).args(["gen_stubs.py", "--check"]));
    assert_eq!(check.code, 0, "gen_stubs.py --check:\n{check}");
    let unit = Ran::of(python_in_clients(&site).args(["-m", "pytest", "-p", "no:cacheprovider", "--ignore=tests/conformance", "tests"]));
    assert_eq!(unit.code, 0, "pytest:\n{unit}");
    assert!(unit.stdout.contains(" passed"), "pytest ran no test:\n{unit}");
}

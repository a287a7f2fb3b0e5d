//! The Go client's own checks, which need no server: `go vet` and its unit
//! tests (rendezvous vectors shared with the Rust client, token redaction in
//! every format verb, deadline arithmetic, refusal decoding, and the
//! session loop against an in-process fake arbiter). Run once, not per
//! etcd target (scripts/test).

use holdfast_tests::Ran;
use holdfast_tests::golang::go_in_clients;

#[test]
fn the_go_client_vets_and_passes_its_unit_tests() {
    let vet = Ran::of(go_in_clients().args(["vet", "./..."]));
    assert_eq!(vet.code, 0, "go vet:\n{vet}");
    let unit = Ran::of(go_in_clients().args(["test", "-count=1", "-timeout=5m", "."]));
    assert_eq!(unit.code, 0, "go test:\n{unit}");
}

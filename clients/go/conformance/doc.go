// Package conformance drives the Go client against a real arbiter (etcd and
// holdfast-arbiter): tests/tests/client_go.rs starts them, issues workload
// certificates and runs `go test -json` here, and fails unless every test
// below ran and passed. Run by hand, the tests are skipped unless
// HOLDFAST_CONFORMANCE=1 and the variables below are set:
//
//	HOLDFAST_ENDPOINT, HOLDFAST_CA, HOLDFAST_CERT, HOLDFAST_KEY   identity A
//	HOLDFAST_CONFORMANCE_CERT2, HOLDFAST_CONFORMANCE_KEY2        identity B
//	HOLDFAST_CONFORMANCE_PLAIN_CERT, _PLAIN_KEY   from the CA, no SPIFFE ID
//	HOLDFAST_CONFORMANCE_ARBITER_PID   the arbiter, SIGSTOPped by one test
//	HOLDFAST_CONFORMANCE_ETCD          etcd's client URL (plain HTTP), where
//	                                   that test watches the hold expire
//
// The arbiter must serve the test harness's lab classes (tests/src/lib.rs:
// "jobs" and "re" with a 10 s TTL, "expiry" with 5 s).
package conformance

// Package conformance drives the Go client against the dev appliance
// (`holdfastctl dev`): tests/tests/client_go.rs starts it with the
// conformance classes dropped in, issues workload certificates and runs
// `go test -json` here, and fails unless every test
// below ran and passed. Run by hand, the tests are skipped unless
// HOLDFAST_CONFORMANCE=1 and the variables below are set:
//
//	HOLDFAST_ENDPOINT, HOLDFAST_CA, HOLDFAST_CERT, HOLDFAST_KEY   identity A
//	HOLDFAST_CONFORMANCE_CERT2, HOLDFAST_CONFORMANCE_KEY2        identity B
//	HOLDFAST_CONFORMANCE_PLAIN_CERT, _PLAIN_KEY   from the CA, no SPIFFE ID
//	HOLDFAST_CONFORMANCE_ARBITER_PID   the arbiter, SIGSTOPped by one test
//	HOLDFAST_CONFORMANCE_ETCD          etcd's client URL, where that test
//	                                   watches the hold expire, and with TLS
//	                                   _ETCD_CA, _ETCD_CERT, _ETCD_KEY
//	HOLDFAST_CONFORMANCE_SCRIPTS       clients/conformance (hold-in-etcd,
//	                                   fenced-write, take-over)
//	HOLDFAST_CONFORMANCE_PG_URL        PostgreSQL with the fence's table
//	HOLDFAST_CONFORMANCE_ELSEWHERE, _SEALED   the refusals' other arbiters
//	HOLDFAST_CONFORMANCE_IDENTITY      A's SPIFFE path (conformance/go-a)
//
// The arbiter must serve the conformance classes (tests/src/lib.rs,
// CONFORMANCE_CLASSES: "conformance", "re" and "fence" with a 10 s TTL,
// "homed" homed to hall-a).
package conformance

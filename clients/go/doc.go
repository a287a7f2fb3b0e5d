// Package holdfast is the Go client of holdfast, a distributed lock service
// with fencing tokens on etcd. It is a thin library over the lock.v1 gRPC API
// (package lockv1, generated from the proto) with the same semantics as the
// Rust client (crates/holdfast-client):
//
//   - One session per TTL (and tier), shared by every hold of that TTL: one
//     keepalive stream renews them all, and losing the session ends them all.
//   - Keepalives every TTL/3 (at least 500 ms). Only an answer with a TTL
//     above zero that the arbiter marks confirmed counts.
//   - The local deadline is the monotonic send time of the last confirmed
//     keepalive + TTL − FenceMargin (1 s): the lease cannot end before it.
//   - Drain, then fence: CanStart turns false at the first failed keepalive
//     (true again once one is confirmed); at the deadline the session is lost
//     and the OnFence callback, a required argument of NewLocker, receives
//     every key the session held.
//   - Re-entrant: acquiring a key the session already holds increments a
//     count here; only the outermost acquire and the last release reach the
//     arbiter.
//   - Key affinity: each key goes to the arbiter ranked first for it by
//     rendezvous hashing over the configured endpoints (the next one when it
//     is unavailable), exactly as the Rust client ranks them.
//   - Tokens are capabilities: a Token prints as "<redacted token>" in every
//     fmt verb and in log/slog; Token.Expose is the one way to read it.
//   - Refusals are *Error values carrying the arbiter's typed reason;
//     branch with errors.Is(err, holdfast.ErrContention) and friends.
package holdfast

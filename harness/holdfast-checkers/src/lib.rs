//! Checkers for holdfast's correctness gate.
//!
//! A pure library: it reads a recorded [`History`] and returns [`Report`]s.
//! It does no I/O and logs nothing.
//!
//! - [`etcd_log::check`] compares the client-visible grants with etcd's own event
//!   log of the lock key space (ground truth).
//! - [`fence::check`] checks the fenced resource's accept/reject log and final
//!   counters.
//! - [`linearizable::check`] searches, per key, for a linearization of the lock
//!   operations against a sequential fenced-mutex model with expiry
//!   (Wing–Gong–Lowe, as in Porcupine).
//!
//! [`audit::compare`] checks the audit tailer's store against etcd's log.
//!
//! [`check_all`] runs the three; [`History::stats`] gives the counts a gate
//! summary needs (operations, expiries, rejected stale writes).
//!
//! What a recorder must provide for the checkers to be meaningful:
//! - etcd's watch of `/l/` from revision 1 with `prev_kv`, so deletes carry
//!   the deleted hold's create revision and lease, and `expired` set when
//!   the recorder can tell a lease expiry from an explicit delete;
//! - releases recorded `Ok` only when the arbiter answered `released = true`;
//! - timeouts and lost answers recorded `Unknown`, never `Fail`;
//! - the fence log in the resource's own serial order, and every record's
//!   final counter.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod audit;
pub mod etcd_log;
pub mod fence;
pub mod history;
pub mod linearizable;
pub mod report;

pub use history::{ClientOp, EtcdEvent, EtcdEventKind, EtcdLog, FenceEntry, History, OpKind, Outcome, Stats, Withdrawal};
pub use report::{Checker, Inconclusive, OpRef, Report, Rule, Violation};

/// Runs C1, C2 and C3 (with `c3_config`) and returns their reports in that
/// order. The history passes the gate iff every report [`Report::passed`].
pub fn check_all(history: &History, c3_config: &linearizable::Config) -> Vec<Report> {
    vec![etcd_log::check(history), fence::check(history), linearizable::check(history, c3_config)]
}

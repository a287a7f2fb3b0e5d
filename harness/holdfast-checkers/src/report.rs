//! Reports and violations shared by all checkers.

use serde::{Deserialize, Serialize};

/// Which checker produced a report or violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Checker {
    C1,
    C2,
    C3,
}

/// The rule a violation breaks. One variant per rule, so the gate can say
/// which rule (and checker) caught which broken arbiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The history itself is inconsistent (e.g. an ok acquire with no token).
    Malformed,
    /// C1: etcd's events are not in revision order.
    EtcdLogOutOfOrder,
    /// C1: holds on one key (create → delete revision) overlap in etcd's log.
    HolderIntervalOverlap,
    /// C1: tokens of a key, in etcd order, do not strictly increase.
    TokenNotIncreasing,
    /// C1: an ok grant has no etcd put creating its key at its revision.
    GrantWithoutEtcdEvent,
    /// C1: the etcd put at the grant's revision belongs to another lease.
    GrantEventMismatch,
    /// C1: the grant's epoch is not the epoch in force at its revision.
    GrantWrongEpoch,
    /// C1: etcd's log shows a hold created on a lease after that session's
    /// record was deleted.
    GrantOnEndedSession,
    /// C1: etcd's log shows a hold created while a drain marker of its
    /// key's range existed (the range was moving off this cluster).
    GrantWhileDraining,
    /// C1: two ok grants carry the same token.
    TokenReused,
    /// C1: a grant that completed before another was invoked (same key) has
    /// a token that is not smaller.
    RealTimeOrder,
    /// C1: a client treated its session as alive past the moment etcd's log
    /// ended it (lease expiry): its local deadline was later than an
    /// operation that had already observed the session's end.
    DeadlinePastSessionEnd,
    /// C1: after an etcd restore, a grant carries a token not above every
    /// token granted before the restore.
    TokenNotAboveRestore,
    /// C2: the resource accepted a token lower than one it accepted before.
    FenceTokenDecreased,
    /// C2: a holder's accepted writes are split by another holder's (A,B,A).
    FenceInterleaving,
    /// C2: the final counter is below the acknowledged increments.
    LostUpdate,
    /// C2: the final counter exceeds acknowledged plus unknown increments.
    PhantomUpdate,
    /// C2: the final counter differs from the number of accepted writes.
    CounterMismatch,
    /// C2: a write acknowledged to the client was rejected at the fence.
    AckedButRejected,
    /// C3: no linearization of the key's operations exists.
    NotLinearizable,
    /// C3: etcd shows an explicit (non-expiry) delete of a hold that no ok or
    /// unknown-outcome release presented the token of.
    UnexplainedDelete,
}

/// A reference to one entry of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "in", rename_all = "snake_case")]
pub enum OpRef {
    /// `History::ops[index]`.
    Client { index: usize, invoke_ns: u64, complete_ns: Option<u64> },
    /// `History::etcd.events[index]`.
    Etcd { index: usize, revision: u64 },
    /// `History::fence[index]`.
    Fence { index: usize, at_ns: u64 },
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub checker: Checker,
    pub rule: Rule,
    /// The lock key (`ns/key`) or, for fence rules, the record.
    pub key: String,
    pub ops: Vec<OpRef>,
    /// One line saying what is wrong.
    pub explanation: String,
}

/// A key the checker could not decide (C3 search over its budget).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inconclusive {
    pub key: String,
    pub reason: String,
}

/// What one checker found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub checker: Checker,
    pub violations: Vec<Violation>,
    /// Keys that could not be decided. The gate must count these as failures.
    pub inconclusive: Vec<Inconclusive>,
    /// Number of keys (C1, C3) or records (C2) examined.
    pub checked: usize,
}

impl Report {
    pub(crate) fn new(checker: Checker) -> Self {
        Report { checker, violations: Vec::new(), inconclusive: Vec::new(), checked: 0 }
    }

    pub(crate) fn push(&mut self, rule: Rule, key: &str, ops: Vec<OpRef>, explanation: String) {
        self.violations.push(Violation { checker: self.checker, rule, key: key.to_string(), ops, explanation });
    }

    /// True when nothing was violated and nothing was left undecided.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.inconclusive.is_empty()
    }

    /// Whether some violation breaks `rule`.
    pub fn has(&self, rule: Rule) -> bool {
        self.violations.iter().any(|v| v.rule == rule)
    }
}

pub(crate) fn client_ref(history: &crate::History, index: usize) -> OpRef {
    match history.ops.get(index) {
        Some(op) => OpRef::Client { index, invoke_ns: op.invoke_ns, complete_ns: op.complete_ns },
        None => OpRef::Client { index, invoke_ns: 0, complete_ns: None },
    }
}

pub(crate) fn etcd_ref(history: &crate::History, index: usize) -> OpRef {
    let revision = history.etcd.events.get(index).map_or(0, |e| e.revision);
    OpRef::Etcd { index, revision }
}

pub(crate) fn fence_ref(history: &crate::History, index: usize) -> OpRef {
    let at_ns = history.fence.get(index).map_or(0, |e| e.at_ns);
    OpRef::Fence { index, at_ns }
}

//! The recorded history the checkers read: client operations, the fenced
//! resource's accept/reject log, and etcd's event log of the lock key space.
//!
//! Everything here is plain data with serde derives so that a recorder can
//! write a history to a JSON file and the gate (or a human) can read it back.
//! Timestamps are monotonic nanoseconds from one clock shared by all recorded
//! processes on the machine (e.g. `CLOCK_MONOTONIC`); they are only compared
//! with each other, never with wall time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Bits of a token that carry the etcd revision (see `holdfast-model::token`).
pub const REVISION_BITS: u32 = 48;
/// Mask of the revision part of a token.
pub const REVISION_MASK: u64 = (1 << REVISION_BITS) - 1;
/// Prefix of the lock key space in etcd: a hold on `ns/key` lives at `/l/ns/key`.
pub const LOCK_PREFIX: &str = "/l/";

/// The epoch part of a token (`token >> 48`).
pub fn token_epoch(token: u64) -> u64 {
    token >> REVISION_BITS
}

/// The revision part of a token (`token & (2^48 - 1)`): the etcd revision at
/// which the grant committed.
pub fn token_revision(token: u64) -> u64 {
    token & REVISION_MASK
}

/// Packs an epoch and a revision into a token (for tests and recorders).
pub fn make_token(epoch: u64, revision: u64) -> u64 {
    (epoch << REVISION_BITS) | (revision & REVISION_MASK)
}

/// The lock key (`ns/key`) of an etcd key in the lock key space, or `None`
/// for keys outside `/l/`.
pub fn lock_key_of(etcd_key: &str) -> Option<&str> {
    etcd_key.strip_prefix(LOCK_PREFIX)
}

/// The etcd key that holds the lock `ns/key`.
pub fn etcd_key_of(lock_key: &str) -> String {
    format!("{LOCK_PREFIX}{lock_key}")
}

/// How a client operation ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The server acknowledged the operation: it took effect.
    Ok,
    /// The server definitely refused it: it had no effect.
    Fail,
    /// The client does not know (timeout, connection lost, crash): it may
    /// have taken effect at any point after its invocation, or never.
    Unknown,
}

/// What a client operation did. Lock keys are `ns/key` (no `/l/` prefix).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// Open a session (an etcd lease); `ClientOp::session` is the lease
    /// granted when the outcome is ok.
    OpenSession { ttl_ms: u64 },
    /// Acquire `key` on `ClientOp::session`; `ClientOp::token` is the
    /// granted token when ok.
    Acquire { key: String },
    /// Release `key` held by `ClientOp::session` with `ClientOp::token`.
    /// Record `Ok` only when the server says it deleted the hold
    /// (`ReleaseResponse.released = true`); `released = false` (no such hold
    /// any more) had no effect and is recorded as `Fail`.
    Release { key: String },
    /// Renew `ClientOp::session`.
    Keepalive,
    /// Not a request: the client moved its local deadline for
    /// `ClientOp::session` (when the session opened, and after each
    /// acknowledged keepalive). Until `until_ns` (the shared monotonic
    /// clock) it treats the session, and every hold on it, as alive.
    /// `invoke_ns` and `complete_ns` are when it decided so. C1 checks the
    /// belief against the lease's real end in etcd's log.
    Deadline { until_ns: u64 },
    /// Increment the counter of `record` at the fenced resource, presenting
    /// `ClientOp::token` obtained for lock `key`.
    Write { key: String, record: String },
}

/// One client operation with its real-time interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientOp {
    /// The recording process (client) that issued it.
    pub process: u64,
    pub kind: OpKind,
    /// The session (etcd lease ID) the operation used or, for an ok
    /// `OpenSession`, obtained.
    #[serde(default)]
    pub session: Option<i64>,
    /// Acquire: the granted token (required when ok). Release and Write: the
    /// token presented.
    #[serde(default)]
    pub token: Option<u64>,
    /// Monotonic nanoseconds when the client sent the request.
    pub invoke_ns: u64,
    /// Monotonic nanoseconds when the client saw the answer. `None` if it
    /// never saw one: an unknown outcome (see `gave_up_ns`).
    #[serde(default)]
    pub complete_ns: Option<u64>,
    pub outcome: Outcome,
    /// For an unknown outcome: monotonic nanoseconds when the client stopped
    /// waiting (timeout, lost connection). The operation may still take
    /// effect after it, so the checkers keep treating it as pending to the
    /// end of the history; it is recorded so that a reader of a history (and
    /// of a violation) sees when the client gave up. `None` for ok and fail
    /// outcomes, and in histories recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gave_up_ns: Option<u64>,
}

impl ClientOp {
    /// The lock key the operation is about, if any.
    pub fn key(&self) -> Option<&str> {
        match &self.kind {
            OpKind::Acquire { key } | OpKind::Release { key } | OpKind::Write { key, .. } => Some(key),
            OpKind::OpenSession { .. } | OpKind::Keepalive | OpKind::Deadline { .. } => None,
        }
    }
}

/// One decision of the fenced resource, in the order the resource made them
/// (the vector order of [`History::fence`] is the resource's serial order;
/// `at_ns` is informational).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceEntry {
    pub record: String,
    /// The token the write presented.
    pub token: u64,
    /// Whether the resource accepted (applied) the write.
    pub accepted: bool,
    pub at_ns: u64,
    /// Index into [`History::ops`] of the `Write` that caused it, if known.
    #[serde(default)]
    pub op: Option<usize>,
}

/// Kind of an etcd watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EtcdEventKind {
    Put,
    Delete,
}

/// One event of etcd's watch on the lock key space (ground truth).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdEvent {
    pub kind: EtcdEventKind,
    /// Full etcd key, e.g. `/l/ns/key`. Events outside `/l/` are ignored.
    pub key: String,
    /// The revision of the event (mod revision for a put, the deleting
    /// revision for a delete).
    pub revision: u64,
    /// Create revision of the key-value: for a put that creates the key it
    /// equals `revision`; for a delete it is the create revision of the
    /// deleted value (from `prev_kv`), or 0 if unknown.
    pub create_revision: u64,
    /// Lease the value was attached to (0 if none or unknown).
    pub lease: i64,
    /// For a delete: `Some(true)` if it came from lease expiry, `Some(false)`
    /// if from an explicit delete, `None` if the recorder cannot tell.
    #[serde(default)]
    pub expired: Option<bool>,
}

/// An epoch advance seen in etcd's log: `/sys/epoch` was set to `epoch` at
/// `revision` (the advance transaction, which also deleted every hold and
/// session record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochChange {
    pub revision: u64,
    pub epoch: u64,
}

/// The end of a session record in etcd's log: `/s/<lease>` was deleted at
/// `revision` (lease expiry, CloseSession, or an epoch advance). No hold
/// may be created on `lease` after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    pub lease: i64,
    pub revision: u64,
}

/// A drain marker (`/sys/drain/<unit>`) written or deleted in etcd's log.
/// While the marker of a unit exists, no hold of a key in that unit may be
/// created ([`crate::etcd_log`], `GrantWhileDraining`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainChange {
    /// The unit, e.g. `ns` or `ns/a/b`: it covers the lock key equal to it
    /// and every key under it (`ns/a/b/...`).
    pub unit: String,
    pub revision: u64,
    /// Written (true) or deleted (false) at `revision`.
    pub present: bool,
}

/// etcd's log of the lock key space plus the epoch(s) the run was in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdLog {
    /// The epoch in `/sys/epoch` when the log starts; every grant must carry
    /// the epoch in force at its revision (this one, or the latest of
    /// `epoch_changes` at or before it).
    pub epoch: u64,
    /// Epoch advances during the run, in revision order.
    #[serde(default)]
    pub epoch_changes: Vec<EpochChange>,
    /// Session records deleted during the run.
    #[serde(default)]
    pub session_ends: Vec<SessionEnd>,
    /// Withdrawal markers the arbiters wrote (`/sys/withdrawn/...`): each
    /// names the one hold its transaction deleted.
    #[serde(default)]
    pub withdrawals: Vec<Withdrawal>,
    /// Drain markers written and deleted during the run, in revision order.
    #[serde(default)]
    pub drains: Vec<DrainChange>,
    /// Watch events in revision order, from revision 1.
    pub events: Vec<EtcdEvent>,
}

impl EtcdLog {
    /// The epoch in force at `revision`.
    pub fn epoch_at(&self, revision: u64) -> u64 {
        self.epoch_changes.iter().filter(|c| c.revision <= revision).map(|c| c.epoch).next_back().unwrap_or(self.epoch)
    }

    /// True if an epoch advance committed at exactly `revision`.
    pub fn is_advance(&self, revision: u64) -> bool {
        self.epoch_changes.iter().any(|c| c.revision == revision)
    }
}

/// A withdrawal marker in etcd's log: the transaction at `revision` deleted
/// the hold of `key` (`/l/<ns>/<key>`) created at `create_revision` on
/// `lease`, because the arbiter would not hand out its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withdrawal {
    pub key: String,
    pub create_revision: u64,
    pub lease: i64,
    pub revision: u64,
}

/// A whole recorded history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<ClientOp>,
    #[serde(default)]
    pub fence: Vec<FenceEntry>,
    /// The counter of each record read from the resource after the run.
    #[serde(default)]
    pub final_counters: BTreeMap<String, u64>,
    pub etcd: EtcdLog,
}

/// Counts over a history, for the gate's summary (which must show that a
/// passing run was not vacuous).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// All client operations (deadline records are not operations).
    pub ops: usize,
    /// Local deadlines the clients recorded ([`OpKind::Deadline`]), each
    /// checked against its lease's end.
    #[serde(default)]
    pub deadlines: usize,
    /// Acquires and releases, any outcome.
    pub lock_ops: usize,
    /// Acquires with outcome ok.
    pub ok_grants: usize,
    /// Client operations with outcome unknown.
    pub unknown_ops: usize,
    /// etcd deletes in the lock key space marked as lease expiry (not
    /// counting the holds an epoch advance deleted).
    pub expiries: usize,
    /// Writes the fence rejected.
    pub stale_rejected: usize,
    /// Writes the fence accepted.
    pub accepted_writes: usize,
}

impl History {
    /// Rejects a malformed history: a give-up time on an operation whose
    /// outcome is not unknown, or one before the operation's invocation.
    /// The error names the first offending operation (its index in
    /// [`History::ops`], process, kind and invocation time).
    pub fn validate(&self) -> Result<(), String> {
        for (index, op) in self.ops.iter().enumerate() {
            let Some(gave_up) = op.gave_up_ns else { continue };
            let name = || format!("op {index} (process {}, {:?}, invoked at {} ns)", op.process, op.kind, op.invoke_ns);
            if op.outcome != Outcome::Unknown {
                return Err(format!(
                    "{}: gave_up_ns {gave_up} but its outcome is {:?}; only an unknown outcome has a give-up time",
                    name(),
                    op.outcome
                ));
            }
            if gave_up < op.invoke_ns {
                return Err(format!("{}: gave_up_ns {gave_up} is before its invoke_ns {}", name(), op.invoke_ns));
            }
        }
        Ok(())
    }

    /// Counts operations, expiries and fence decisions.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for op in &self.ops {
            if matches!(op.kind, OpKind::Deadline { .. }) {
                s.deadlines += 1;
                continue;
            }
            s.ops += 1;
            match op.kind {
                OpKind::Acquire { .. } => {
                    s.lock_ops += 1;
                    if op.outcome == Outcome::Ok {
                        s.ok_grants += 1;
                    }
                }
                OpKind::Release { .. } => s.lock_ops += 1,
                _ => {}
            }
            if op.outcome == Outcome::Unknown {
                s.unknown_ops += 1;
            }
        }
        s.expiries = self
            .etcd
            .events
            .iter()
            .filter(|e| {
                e.kind == EtcdEventKind::Delete
                    && e.expired == Some(true)
                    && lock_key_of(&e.key).is_some()
                    && !self.etcd.is_advance(e.revision)
            })
            .count();
        s.accepted_writes = self.fence.iter().filter(|f| f.accepted).count();
        s.stale_rejected = self.fence.len() - s.accepted_writes;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(outcome: Outcome, invoke_ns: u64, complete_ns: Option<u64>, gave_up_ns: Option<u64>) -> History {
        let op = ClientOp {
            process: 3,
            kind: OpKind::Acquire { key: "ns/a".into() },
            session: Some(7),
            token: None,
            invoke_ns,
            complete_ns,
            outcome,
            gave_up_ns,
        };
        History { ops: vec![op], ..History::default() }
    }

    #[test]
    fn an_unknown_outcome_may_carry_a_give_up_time_at_or_after_its_invocation() {
        assert_eq!(history(Outcome::Unknown, 100, None, Some(100)).validate(), Ok(()));
        assert_eq!(history(Outcome::Unknown, 100, None, Some(250)).validate(), Ok(()));
        // Histories recorded before give-up times existed.
        assert_eq!(history(Outcome::Unknown, 100, None, None).validate(), Ok(()));
        assert_eq!(history(Outcome::Ok, 100, Some(120), None).validate(), Ok(()));
    }

    #[test]
    fn a_give_up_time_on_a_known_outcome_is_rejected() {
        for outcome in [Outcome::Ok, Outcome::Fail] {
            let err = history(outcome, 100, Some(120), Some(120)).validate().unwrap_err();
            assert_eq!(
                err,
                format!(
                    "op 0 (process 3, Acquire {{ key: \"ns/a\" }}, invoked at 100 ns): gave_up_ns 120 but its outcome is {outcome:?}; \
                     only an unknown outcome has a give-up time"
                )
            );
        }
    }

    #[test]
    fn a_give_up_time_before_the_invocation_is_rejected() {
        let mut h = history(Outcome::Unknown, 100, None, Some(150));
        h.ops.push(ClientOp { invoke_ns: 200, gave_up_ns: Some(199), ..h.ops[0].clone() });
        let err = h.validate().unwrap_err();
        assert_eq!(err, "op 1 (process 3, Acquire { key: \"ns/a\" }, invoked at 200 ns): gave_up_ns 199 is before its invoke_ns 200");
    }

    #[test]
    fn a_give_up_time_round_trips_and_is_omitted_when_absent() {
        let h = history(Outcome::Unknown, 100, None, Some(250));
        let text = serde_json::to_string(&h).unwrap();
        assert!(text.contains("\"gave_up_ns\":250"), "{text}");
        assert_eq!(serde_json::from_str::<History>(&text).unwrap(), h);

        let known = history(Outcome::Ok, 100, Some(120), None);
        let text = serde_json::to_string(&known).unwrap();
        assert!(!text.contains("gave_up_ns"), "{text}");
        assert_eq!(serde_json::from_str::<History>(&text).unwrap(), known);
    }

    #[test]
    fn an_old_history_without_give_up_times_still_loads() {
        let old = r#"{"ops":[{"process":1,"kind":{"type":"acquire","key":"ns/a"},"session":5,"token":null,
            "invoke_ns":10,"complete_ns":null,"outcome":"unknown"}],"etcd":{"epoch":1,"events":[]}}"#;
        let h: History = serde_json::from_str(old).unwrap();
        assert_eq!(h.ops[0].gave_up_ns, None);
        assert_eq!(h.ops[0].outcome, Outcome::Unknown);
        assert_eq!(h.validate(), Ok(()));
    }
}

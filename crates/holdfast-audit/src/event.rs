//! One audit event per committed change of one etcd key.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a change was. Each kind is decided from etcd's log alone (see
/// [`crate::classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A hold was created (`/l/<ns>/<key>` put).
    Grant,
    /// The holder released its hold (deleted while its session record lived).
    Release,
    /// The session lapsed: etcd deleted the hold together with the session
    /// record when the lease expired.
    Expiry,
    /// The hold ended because its session was closed (deleted after the
    /// session record was, by the lease revoke that follows a close).
    Close,
    /// The arbiter withdrew a grant it could not vouch for (the same
    /// transaction wrote a `/sys/withdrawn/` marker for this hold).
    Withdrawal,
    /// A two-person force-release deleted the hold (the same transaction
    /// wrote the `/sys/force/` record).
    ForceRelease,
    /// An epoch advance deleted the hold (the same transaction wrote
    /// `/sys/epoch`).
    Advance,
    /// A session record was created.
    SessionOpen,
    /// The session was closed (CloseSession, or a force-release that ended
    /// the holder's session): the record was deleted by the transaction that
    /// wrote `/sys/closed/<lease>`.
    SessionClose,
    /// The session's lease expired: etcd deleted the record itself.
    SessionLapse,
    /// An epoch advance deleted the session record.
    SessionEnd,
    /// A durable waiter was queued (`/q/` put).
    Wait,
    /// A durable waiter left the queue (granted, gave up, or its session ended).
    WaitEnd,
    /// `/sys/epoch` was written.
    Epoch,
    /// An arbiter sealed the cluster (`/sys/seal` put).
    Seal,
    /// The seal was cleared (by an epoch advance).
    Unseal,
    /// The controller published a class and grant set.
    ClassSet,
    /// Revisions the tailer could not read (etcd compacted them first).
    Gap,
    /// An arbiter granted a key of an `on_quorum_loss = "open"` class from
    /// memory, token 0, while etcd was out of its reach (a shipped spool
    /// record, `/sys/unprotected/`; `unprotected = true`).
    UnprotectedGrant,
    /// The holder of an unprotected grant released it (or closed its session).
    UnprotectedRelease,
    /// An unprotected hold ended otherwise: its session was not renewed,
    /// etcd came back, or the arbiter restarted (`reason` says which).
    UnprotectedEnd,
    /// Any other holdfast record: markers, nonces, the force record itself,
    /// the watermark, election keys, the controller's status.
    Record,
}

impl Kind {
    pub const ALL: [Kind; 22] = [
        Kind::Grant,
        Kind::Release,
        Kind::Expiry,
        Kind::Close,
        Kind::Withdrawal,
        Kind::ForceRelease,
        Kind::Advance,
        Kind::SessionOpen,
        Kind::SessionClose,
        Kind::SessionLapse,
        Kind::SessionEnd,
        Kind::Wait,
        Kind::WaitEnd,
        Kind::Epoch,
        Kind::Seal,
        Kind::Unseal,
        Kind::ClassSet,
        Kind::Gap,
        Kind::UnprotectedGrant,
        Kind::UnprotectedRelease,
        Kind::UnprotectedEnd,
        Kind::Record,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Grant => "grant",
            Kind::Release => "release",
            Kind::Expiry => "expiry",
            Kind::Close => "close",
            Kind::Withdrawal => "withdrawal",
            Kind::ForceRelease => "force-release",
            Kind::Advance => "advance",
            Kind::SessionOpen => "session-open",
            Kind::SessionClose => "session-close",
            Kind::SessionLapse => "session-lapse",
            Kind::SessionEnd => "session-end",
            Kind::Wait => "wait",
            Kind::WaitEnd => "wait-end",
            Kind::Epoch => "epoch",
            Kind::Seal => "seal",
            Kind::Unseal => "unseal",
            Kind::ClassSet => "class-set",
            Kind::Gap => "gap",
            Kind::UnprotectedGrant => "unprotected-grant",
            Kind::UnprotectedRelease => "unprotected-release",
            Kind::UnprotectedEnd => "unprotected-end",
            Kind::Record => "record",
        }
    }

    /// Whether this kind ends a hold (a protected one: an unprotected hold
    /// has no revision or token of its own).
    pub fn ends_hold(self) -> bool {
        matches!(self, Kind::Release | Kind::Expiry | Kind::Close | Kind::Withdrawal | Kind::ForceRelease | Kind::Advance)
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where `time_unix_ms` comes from: etcd's log has no commit times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeSource {
    /// A time the writer put in the record (a grant's time, a force record's).
    Record,
    /// When the tailer read the change (within milliseconds while it keeps
    /// up; later when it catches up after a restart).
    Observed,
}

/// One committed change. Never carries a token; see the crate docs for the
/// grant's revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The etcd cluster ID, 16 hex digits.
    pub cluster_id: String,
    /// The etcd revision of the change (`None` only in output, where a live
    /// hold's grant revision is withheld).
    pub revision: Option<i64>,
    /// The change's position within its revision (etcd's order).
    pub index: u32,
    pub kind: Kind,
    pub time_unix_ms: u64,
    pub time_source: TimeSource,
    /// The SPIFFE ID of the holder, session owner or publisher.
    pub identity: Option<String>,
    pub namespace: Option<String>,
    /// The lock key as `<namespace>/<key>`.
    pub key: Option<String>,
    /// The class governing the namespace in the class set then published.
    pub class: Option<String>,
    pub tier: Option<String>,
    /// The session lease, 16 hex digits.
    pub session: Option<String>,
    /// The epoch of the hold, or the cluster's epoch then.
    pub epoch: Option<u32>,
    /// The etcd key that changed.
    pub etcd_key: String,
    /// For an event that ends a hold: how long it was held, from the
    /// grant's recorded time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<u64>,
    /// A force-release's requester, approver and reason, and whether the
    /// class is fenced; a seal's or withdrawal's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<bool>,
    /// A gap's first and last unread revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap_from: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap_to: Option<i64>,
    /// `true` for the record of a grant made without etcd (token 0) and
    /// of its end: the reconciliation list is the events with it set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unprotected: Option<bool>,
}

impl Event {
    /// An event with only its key fields and kind set.
    pub fn new(cluster_id: u64, revision: i64, index: u32, kind: Kind, etcd_key: &str, time_unix_ms: u64) -> Event {
        Event {
            cluster_id: cluster_hex(cluster_id),
            revision: Some(revision),
            index,
            kind,
            time_unix_ms,
            time_source: TimeSource::Observed,
            identity: None,
            namespace: None,
            key: None,
            class: None,
            tier: None,
            session: None,
            epoch: None,
            etcd_key: etcd_key.to_string(),
            held_ms: None,
            requester: None,
            approver: None,
            reason: None,
            fenced: None,
            gap_from: None,
            gap_to: None,
            unprotected: None,
        }
    }

    /// `(revision, index)`: the order and identity of events in one cluster.
    pub fn position(&self) -> (i64, u32) {
        (self.revision.unwrap_or(0), self.index)
    }
}

pub fn cluster_hex(id: u64) -> String {
    format!("{id:016x}")
}

pub fn lease_hex(lease: i64) -> String {
    format!("{:016x}", lease as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_one_name_each() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), serde_json::Value::String(k.as_str().into()));
        }
        assert_eq!(Kind::parse("grants"), None);
    }
}

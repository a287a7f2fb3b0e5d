//! holdfast-arbiter: the only component that writes grants to etcd.
//!
//! - [`grant`]: the grant and release transactions, token minting.
//! - [`waiting`]: waiting for a held key: in-memory FIFO queues, durable waiters.
//! - [`session`]: sessions (an etcd lease and its owner record).
//! - [`confirm`], [`deposed`]: when a keepalive counts (its Raft term
//!   confirmed by a quorum read; no deposed leader left to revoke its lease).
//! - [`seal`]: whether the arbiter may grant; restore detection loop.
//! - [`cluster`]: the etcd clusters (entity, coord) and which one a class's
//!   tier picks; session IDs that name their tier.
//!
//! The config file's structs are `holdfast_config::arbiter`; the etcd
//! connection and the grant, release and epoch transactions are
//! `holdfast_store` (re-exported here as [`config`], [`etcd`], [`epoch`]).
//! - [`service`]: the lock.v1 gRPC service; input checks at the boundary.
//! - [`server`]: TLS, listener, systemd notify and watchdog, drain on SIGTERM.
//! - [`metrics`], [`telemetry`]: Prometheus metrics; span export over OTLP.
//! - [`expiry`]: counting holds that ended by lease expiry.
//! - [`policy`]: the published class set, watched and enforced (grants,
//!   class TTL, home region) before any etcd read.
//! - [`limits`]: the per-identity request rate and the quotas on sessions
//!   and holds, counted from a watch of etcd.
//! - [`validate`]: ValidateToken: a linearizable, constant-time check of a
//!   presented token against the current hold, rate-limited on its own.

pub mod cluster;
pub mod commit;
pub mod confirm;
pub mod deposed;
pub mod expiry;
pub mod grant;
pub mod health;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod policy;
pub mod renewal;
pub mod seal;
pub mod served;
pub mod server;
pub mod service;
pub mod session;
pub mod spool;
pub mod telemetry;
pub mod tls;
pub mod unprotected;
pub mod validate;
pub mod waiting;

pub use holdfast_config::arbiter as config;
pub use holdfast_store::{epoch, etcd};

use holdfast_model::LockKey;
use holdfast_proto::ErrorReason;
use tonic::Code;

/// A refusal on its way to the client: a gRPC code, a typed reason, the
/// field at fault (for invalid arguments) and a message saying what to do.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub code: Code,
    pub reason: ErrorReason,
    pub field: &'static str,
    pub message: String,
    /// An etcd call failed: granting pauses until the cluster is re-checked
    /// (a reconnect may have reached a restored cluster). Only
    /// [`Refusal::unavailable`] and [`Refusal::etcd`] set it. Refusals that
    /// follow from a pause already in force (not serving, a withdrawn grant)
    /// must not: each would pause granting again after the re-check resumed
    /// it, and withdraw the grants then in flight, whose refusals would pause
    /// it once more.
    pub pauses_granting: bool,
    /// How long the client should wait before it retries, sent as a
    /// `google.rpc.RetryInfo` beside the reason (only [`Refusal::moving`]).
    pub retry_after: Option<std::time::Duration>,
}

impl Refusal {
    pub(crate) fn new(code: Code, reason: ErrorReason, message: impl Into<String>) -> Self {
        Refusal { code, reason, field: "", message: message.into(), pauses_granting: false, retry_after: None }
    }

    /// The reason as one lower-case word, for span attributes.
    pub fn outcome(&self) -> &'static str {
        match self.reason {
            ErrorReason::Unspecified => "refused",
            ErrorReason::Contention => "contention",
            ErrorReason::Leak => "leak",
            ErrorReason::Sealed => "sealed",
            ErrorReason::SessionNotFound => "session_not_found",
            ErrorReason::InvalidArgument => "invalid_argument",
            ErrorReason::Unauthenticated => "unauthenticated",
            ErrorReason::Denied => "denied",
            ErrorReason::Unavailable => "unavailable",
            ErrorReason::NoPolicy => "no_policy",
            ErrorReason::WrongRegion => "wrong_region",
            ErrorReason::ClassTtl => "class_ttl",
            ErrorReason::ClassTier => "class_tier",
            ErrorReason::RateLimited => "rate_limited",
            ErrorReason::Quota => "quota",
            ErrorReason::Moving => "moving",
        }
    }

    pub fn invalid(field: &'static str, message: impl std::fmt::Display) -> Self {
        Refusal { field, ..Self::new(Code::InvalidArgument, ErrorReason::InvalidArgument, format!("{field}: {message}")) }
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, ErrorReason::Unauthenticated, message)
    }

    pub fn session_not_found(lease: i64) -> Self {
        Self::new(
            Code::NotFound,
            ErrorReason::SessionNotFound,
            format!("session {lease:x} does not exist, has expired, or belongs to another identity; open a new session"),
        )
    }

    pub fn contention(key: &LockKey) -> Self {
        Self::new(
            Code::Aborted,
            ErrorReason::Contention,
            format!("{key} is held by another session and was not released before the wait deadline"),
        )
    }

    pub fn leak(key: &LockKey) -> Self {
        Self::new(
            Code::FailedPrecondition,
            ErrorReason::Leak,
            format!(
                "{key} is held by this same identity under a different session: a leaked hold; release it from that session or let it expire"
            ),
        )
    }

    pub fn sealed(reason: &str) -> Self {
        Self::new(Code::FailedPrecondition, ErrorReason::Sealed, format!("sealed, granting nothing: {reason}"))
    }

    /// A grant committed in etcd, but its token did not leave the arbiter:
    /// the outcome the client sees is not "no effect" (a hold existed for a
    /// moment), so it is answered as unavailable, never as a plain refusal.
    /// `withdrawn`: etcd confirmed the withdrawal (nothing is held now).
    pub fn withdrawn(why: &str, withdrawn: bool) -> Self {
        let now = if withdrawn {
            "the hold was withdrawn and nothing is held now"
        } else {
            "withdrawing the hold failed, so it ends with the session at the latest"
        };
        Self::new(
            Code::Unavailable,
            ErrorReason::Unavailable,
            format!("the grant committed in etcd but was not handed out ({why}); {now}; retry"),
        )
    }

    /// Past the per-identity request rate (see [`limits`]).
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, ErrorReason::RateLimited, message)
    }

    /// A session or hold quota used up (see [`limits`]).
    pub fn quota(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, ErrorReason::Quota, message)
    }

    /// An etcd call failed (or answered what a healthy cluster would not):
    /// pauses granting until the cluster is re-checked.
    pub fn unavailable(reason: &str) -> Self {
        Refusal { pauses_granting: true, ..Self::not_serving(reason) }
    }

    /// One session's keepalive got no answer from etcd (its stream stalled
    /// or ended, twice): unavailable to that session's client, which drains
    /// it, but no pause of granting: etcd answered others, or the failure
    /// to reach it shows in a call that does pause.
    pub fn renewal(reason: &str) -> Self {
        Self::new(
            Code::Unavailable,
            ErrorReason::Unavailable,
            format!("etcd did not renew this session: {reason}; the session is renewed again at its next keepalive"),
        )
    }

    /// The arbiter is not serving now (re-checking etcd, shutting down):
    /// unavailable to the client, but no new etcd failure.
    pub fn not_serving(reason: &str) -> Self {
        Self::new(Code::Unavailable, ErrorReason::Unavailable, format!("etcd is not available to this arbiter: {reason}; retry"))
    }

    /// `key`'s range is draining from this etcd cluster (one of its drain
    /// markers is present): retry after the time the marker's record says
    /// the move should be done by, at least [`MOVING_RETRY_MIN`] and at
    /// most [`MOVING_RETRY_MAX`] (without a readable record, the least).
    pub fn moving(key: &LockKey, record: Option<&holdfast_model::layout::DrainRecord>, now_unix_ms: u64) -> Self {
        let left = record.map_or(0, |r| r.until_unix_ms.saturating_sub(now_unix_ms));
        let retry = std::time::Duration::from_millis(left).clamp(MOVING_RETRY_MIN, MOVING_RETRY_MAX);
        Refusal {
            retry_after: Some(retry),
            ..Self::new(
                Code::Unavailable,
                ErrorReason::Moving,
                format!("{key} is in a range moving to another etcd cluster; nothing was written; retry in {} ms", retry.as_millis()),
            )
        }
    }

    /// An etcd error. Only failures to reach etcd count as unavailable
    /// (and pause granting until the cluster is re-checked).
    pub fn etcd(e: etcd_client::Error) -> Self {
        match &e {
            etcd_client::Error::LeaseKeepAliveError(m) if m.contains("not found") => {
                Self::new(Code::NotFound, ErrorReason::SessionNotFound, "the session's lease no longer exists; open a new session")
            }
            etcd_client::Error::GRpcStatus(s) if s.code() == Code::NotFound => {
                Self::new(Code::NotFound, ErrorReason::SessionNotFound, "the session's lease no longer exists; open a new session")
            }
            _ => Self::unavailable(&e.to_string()),
        }
    }
}

/// The shortest wait a [`Refusal::moving`] asks for.
pub const MOVING_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(250);
/// The longest wait a [`Refusal::moving`] asks for (a client may try again
/// sooner elsewhere, once its map says the range has moved).
pub const MOVING_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        holdfast_proto::refusal_retry_after(r.code, r.reason, r.field, r.message, r.retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_etcd_failures_pause_granting() {
        let grpc = |s| etcd_client::Error::GRpcStatus(s);
        // etcd failed, or answered what a healthy cluster would not.
        assert!(Refusal::unavailable("etcd answered without a header").pauses_granting);
        assert!(Refusal::etcd(grpc(tonic::Status::unavailable("connection refused"))).pauses_granting);
        // What follows from a pause already in force, and what is not etcd's.
        let after_a_pause = [
            Refusal::not_serving("re-checking etcd after an error: connection refused"),
            Refusal::withdrawn("this arbiter lost track of etcd while the grant was in flight", true),
            Refusal::withdrawn("the etcd cluster was rewound; this arbiter sealed", false),
        ];
        for r in &after_a_pause {
            assert!(!r.pauses_granting, "{r:?}");
            // The client sees the same code and reason as for an etcd failure.
            assert_eq!((r.code, r.reason), (Code::Unavailable, ErrorReason::Unavailable), "{r:?}");
        }
        assert!(!Refusal::etcd(grpc(tonic::Status::not_found("etcdserver: requested lease not found"))).pauses_granting);
        assert!(!crate::validate::rate_limited("spiffe://example.org/db").pauses_granting);
        assert!(!Refusal::sealed("restored").pauses_granting);
    }

    #[test]
    fn a_moving_key_is_told_when_to_retry() {
        let k = LockKey::new("payments", "eu/7").unwrap();
        let drain = |until_unix_ms| holdfast_model::layout::DrainRecord { since_unix_ms: 1_000, until_unix_ms };
        let r = Refusal::moving(&k, Some(&drain(5_000)), 2_000);
        assert_eq!((r.code, r.reason, r.pauses_granting), (Code::Unavailable, ErrorReason::Moving, false));
        assert_eq!(r.retry_after, Some(std::time::Duration::from_secs(3)));
        assert!(r.message.contains("payments/eu/7") && r.message.contains("3000 ms"), "{}", r.message);
        assert_eq!(Refusal::moving(&k, Some(&drain(5_000)), 9_000).retry_after, Some(MOVING_RETRY_MIN), "past its bound");
        assert_eq!(Refusal::moving(&k, Some(&drain(u64::MAX)), 0).retry_after, Some(MOVING_RETRY_MAX));
        assert_eq!(Refusal::moving(&k, None, 0).retry_after, Some(MOVING_RETRY_MIN), "an unreadable record");
        let status = tonic::Status::from(r);
        assert_eq!(holdfast_proto::retry_after_of(&status), Some(std::time::Duration::from_secs(3)));
    }
}

//! Sessions: one etcd lease plus the record `/s/<lease>` naming its owner.
//!
//! A session is usable only by the identity that opened it. Every arbiter
//! learns a session's record on first use (one read) and caches it; the
//! grant transaction then compares the record byte for byte, so a session
//! that expired or was closed can never receive a grant (etcd #11456).

use crate::Refusal;
use crate::etcd::Etcd;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use holdfast_model::layout::{self, SessionRecord};
use holdfast_policy::Tier;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Sessions this arbiter has seen, by lease ID.
#[derive(Default)]
pub struct Sessions {
    known: Mutex<HashMap<i64, SessionRecord>>,
}

const MAX_CACHED: usize = 200_000;

pub struct Owned {
    pub lease: i64,
    pub record: SessionRecord,
    pub bytes: Vec<u8>,
}

impl Sessions {
    /// Opens a session for `identity`: grant the lease, then write the record
    /// on it. If the record cannot be written the lease is revoked. Returns
    /// the lease, its TTL in seconds, the revision of the record and the
    /// Raft term etcd granted the lease in ([`crate::deposed`]).
    pub async fn open(&self, etcd: &Etcd, identity: &str, ttl: Duration, tier: Tier) -> Result<(i64, i64, i64, u64), Refusal> {
        let grant = || {
            let mut c = etcd.client.clone();
            async move { c.lease_grant(ttl.as_secs() as i64, None).await }
        };
        let lease = holdfast_store::etcd::retry_auth_race(grant).await.map_err(Refusal::etcd)?;
        let record = SessionRecord { spiffe_id: identity.to_string(), ttl_secs: ttl.as_secs(), coord: tier == Tier::Coord };
        let key = layout::session_key(lease.id());
        let txn = Txn::new().when([Compare::version(key.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key.as_str(),
            layout::encode(&record),
            Some(PutOptions::new().with_lease(lease.id())),
        )]);
        let revision = match etcd.txn(txn).await {
            Ok(r) if r.succeeded() => r.header().map_or(0, |h| h.revision()),
            outcome => {
                let _ = etcd.client.clone().lease_revoke(lease.id()).await;
                return Err(match outcome {
                    Err(e) => Refusal::etcd(e),
                    Ok(_) => Refusal::unavailable("session record already existed for a new lease; retry"),
                });
            }
        };
        self.remember(lease.id(), record);
        let term = lease.header().map_or(0, |h| h.raft_term());
        Ok((lease.id(), lease.ttl(), revision, term))
    }

    fn remember(&self, lease: i64, record: SessionRecord) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() >= MAX_CACHED {
            known.clear();
        }
        known.insert(lease, record);
    }

    pub fn forget(&self, lease: i64) {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease);
    }

    /// The session `lease` if it exists, belongs to `identity` and is on
    /// `tier`. A session of another identity (or presented with another
    /// tier) is reported exactly like a missing one.
    pub async fn owned(&self, etcd: &Etcd, lease: i64, identity: &str, tier: Tier) -> Result<Owned, Refusal> {
        let cached = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(&lease).cloned();
        let record = match cached {
            Some(r) => r,
            None => {
                let resp = etcd.get(&layout::session_key(lease), None).await.map_err(Refusal::etcd)?;
                let kv = resp.kvs().first().ok_or_else(|| Refusal::session_not_found(lease))?;
                let r: SessionRecord =
                    layout::decode(&layout::session_key(lease), kv.value()).map_err(|_| Refusal::session_not_found(lease))?;
                self.remember(lease, r.clone());
                r
            }
        };
        if record.spiffe_id != identity || record.coord != (tier == Tier::Coord) {
            return Err(Refusal::session_not_found(lease));
        }
        let bytes = layout::encode(&record);
        Ok(Owned { lease, record, bytes })
    }

    /// Ends a session and every hold on it (`holdfast_store::txn::
    /// close_session`): the record `/s/<lease>` goes first, with the close
    /// marker, in a revision of its own (no grant can use the session after
    /// it); the lease revoke then deletes every hold in one committed entry.
    /// An *expiring* lease deletes its record and holds in one revision and
    /// writes no marker: that is how an expiry is told from a close
    /// ([`crate::expiry`], `holdfast_audit::classify`).
    pub async fn close(&self, etcd: &Etcd, lease: i64) -> Result<(), Refusal> {
        self.forget(lease);
        holdfast_store::txn::close_session(etcd, lease).await.map_err(Refusal::etcd)
    }
}

//! Force-release: ending one hold that its holder cannot or will not
//! release, with two signed approvals (`holdfastctl force-release`).
//!
//! A request names the hold by its holder, session and grant time, read
//! from the hold's record ([`current_hold`]) — never by its create
//! revision, which with the epoch is the holder's token. [`release`] reads
//! the hold again, refuses unless it is still the one the request names,
//! then runs one transaction guarded by that hold's create revision (so a
//! newer hold of the same key is never deleted, even one taken in between)
//! and by the request's nonce being unused: delete the hold, write the
//! force record (`/sys/force/<nonce>`, on a 24 h lease), record the nonce.
//! With `revoke_session` the holder's session is then closed (the close
//! transaction and the lease revoke, `crate::txn::close_session`). Before
//! any of it, what the requester wrote about the hold's cluster (its ID)
//! and class (its name and whether it is fenced) is derived again; any
//! difference refuses the request ([`ForceError::WrongCluster`],
//! [`ForceError::Changed`]); and each signer's SPIFFE ID (approvers.toml)
//! must hold a `force_release` grant covering the key in the published set
//! ([`check_granted`], [`ForceError::NotGranted`]).
//!
//! With a separate coord cluster ([`release_via`]) the nonce is recorded
//! there, where a restore of the entity cluster cannot roll it back: first
//! the coord transaction (the nonce compared absent and recorded), then the
//! entity transaction (the hold compared, deleted, the force record
//! written). A hold that changed in between is left alone and the request
//! is spent ([`ForceError::Spent`]).

use crate::etcd::Etcd;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use holdfast_approval::{Approved, Operation};
use holdfast_model::LockKey;
use holdfast_model::layout::{self, ForceRecord, HoldRecord, NonceRecord};

#[derive(Debug, thiserror::Error)]
pub enum ForceError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("{0} is not held (released, expired, or already force-released); nothing was changed")]
    NotHeld(String),
    #[error(
        "{key} is held now by {holder} (session {session:x}, granted at {granted_unix_ms} ms), not the hold the request names; \
         nothing was changed: request again for the hold there now"
    )]
    OtherHold { key: String, holder: String, session: i64, granted_unix_ms: u64 },
    #[error("this request was already carried out (its nonce is recorded at {0}); nothing was changed")]
    NonceUsed(String),
    #[error("the hold changed while we worked; nothing was changed, retry")]
    Raced,
    #[error(
        "the hold changed after this request's nonce was recorded on the coord cluster; the hold was not touched: request again for the hold there now"
    )]
    Spent,
    #[error(
        "the hold's cluster reports cluster ID {actual}, but the request names {expected}; nothing was changed: request again against this cluster"
    )]
    WrongCluster { expected: u64, actual: u64 },
    #[error(
        "the request says {field} = {requested}, but the published class set says {now} for this key; nothing was changed: request again, so that the signers see what is true now"
    )]
    Changed { field: &'static str, requested: String, now: String },
    #[error("{signer} may not force-release {key}: {why}; nothing was changed")]
    NotGranted { signer: String, key: String, why: String },
    #[error("{0}")]
    Malformed(String),
}

/// Refuses unless every signer may force-release `key` by the published
/// class set: their SPIFFE ID in approvers.toml (`identities`, in the order
/// of `signers`) holds a grant whose `force_release` prefixes cover it.
pub fn check_granted(
    set: Option<&holdfast_policy::CompiledSet>,
    key: &LockKey,
    signers: &[String],
    identities: &[Option<String>],
) -> Result<(), ForceError> {
    let access = set.map(holdfast_policy::access::Access::new);
    for (i, signer) in signers.iter().enumerate() {
        let refuse = |why: String| ForceError::NotGranted { signer: signer.clone(), key: key.to_string(), why };
        let Some(identity) = identities.get(i).cloned().flatten() else {
            return Err(refuse(format!(
                "approvers.toml gives {signer} no identity, so no grant can allow it; add identity = \"spiffe://…\" to [approver.{signer}]"
            )));
        };
        let Some(access) = &access else {
            return Err(refuse("no class set is published, so no grant allows it".to_string()));
        };
        if access.check(&identity, key.namespace(), key.key(), holdfast_policy::access::Action::ForceRelease).is_none() {
            return Err(refuse(format!(
                "no grant of {identity} lists a force_release prefix covering it (grants.d: force_release = [\"{}/\"] or narrower)",
                key.namespace()
            )));
        }
    }
    Ok(())
}

/// What a force-release request states about a key's class, derived from
/// the published class set: the class's name ("(no class)" when none
/// matches) and whether it is fenced.
pub fn class_facts(class: Option<&holdfast_policy::Class>) -> (String, bool) {
    match class {
        Some(c) => (c.name.clone(), c.enforcement.is_fenced()),
        None => ("(no class)".to_string(), false),
    }
}

/// The hold on a key now, as a force-release request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentHold {
    pub record: HoldRecord,
    /// Kept here only to guard the delete; never shown.
    create_revision: i64,
}

/// Reads the hold on `key`, if any.
pub async fn current_hold(etcd: &Etcd, key: &LockKey) -> Result<Option<CurrentHold>, ForceError> {
    let hold_key = layout::hold_key(key);
    let resp = etcd.get(hold_key.as_str(), None).await?;
    let Some(kv) = resp.kvs().first() else { return Ok(None) };
    let record: HoldRecord = layout::decode(&hold_key, kv.value()).map_err(ForceError::Malformed)?;
    Ok(Some(CurrentHold { record, create_revision: kv.create_revision() }))
}

/// A force-release carried out.
#[derive(Debug, Clone)]
pub struct Released {
    pub record: ForceRecord,
    /// The session lease was revoked (`revoke_session` and it still lived).
    pub session_revoked: bool,
}

/// Carries out an approved force-release request (see the module docs).
pub async fn release(etcd: &Etcd, approved: &Approved, now_unix: u64) -> Result<Released, ForceError> {
    release_via(etcd, None, approved, now_unix).await
}

/// [`release`] with the nonce recorded on the coord cluster when `coord`
/// is another cluster than `etcd` (see the module docs).
pub async fn release_via(etcd: &Etcd, coord: Option<&Etcd>, approved: &Approved, now_unix: u64) -> Result<Released, ForceError> {
    let coord = crate::epoch::separate_coord(etcd, coord).await.map_err(|e| match e {
        crate::epoch::EpochError::Etcd(e) => ForceError::Etcd(e),
        e => ForceError::Malformed(e.to_string()),
    })?;
    let r = &approved.request;
    let Operation::ForceRelease { cluster_id, namespace, key, holder, session, granted_unix_ms, class, fenced, revoke_session } =
        &r.operation
    else {
        return Err(ForceError::Malformed(format!("a {} request is not a force-release", r.operation.kind())));
    };
    let lock_key =
        LockKey::new(namespace, key).map_err(|e| ForceError::Malformed(format!("the request's key: {} {}", e.field, e.message)))?;
    let nonce_key = layout::nonce_key(&r.nonce);
    for at in coord.into_iter().chain([etcd]) {
        if at.get(nonce_key.as_str(), Some(GetOptions::new().with_count_only())).await?.count() > 0 {
            return Err(ForceError::NonceUsed(nonce_key));
        }
    }
    // What the requester wrote about the hold's cluster and class, derived
    // again: the signers approved what the request said, so it must still
    // be true.
    let actual = crate::epoch::cluster_id(etcd).await.map_err(|e| match e {
        crate::epoch::EpochError::Etcd(e) => ForceError::Etcd(e),
        e => ForceError::Malformed(e.to_string()),
    })?;
    if actual != *cluster_id {
        return Err(ForceError::WrongCluster { expected: *cluster_id, actual });
    }
    let published = crate::policy::read_published(coord.unwrap_or(etcd)).await?;
    let (now_class, now_fenced) = class_facts(published.doc().and_then(|p| p.set.class_for(namespace)));
    if now_class != *class {
        return Err(ForceError::Changed { field: "class", requested: class.clone(), now: now_class });
    }
    if now_fenced != *fenced {
        return Err(ForceError::Changed { field: "fenced", requested: fenced.to_string(), now: now_fenced.to_string() });
    }
    // Both signers' grants must allow this key, by the set in force now.
    check_granted(published.doc().map(|p| &p.set), &lock_key, &approved.signers, &approved.identities)?;
    let now = current_hold(etcd, &lock_key).await?.ok_or_else(|| ForceError::NotHeld(lock_key.to_string()))?;
    let named = now.record.spiffe_id == *holder && now.record.session == *session && now.record.granted_unix_ms == *granted_unix_ms;
    if !named {
        return Err(ForceError::OtherHold {
            key: lock_key.to_string(),
            holder: now.record.spiffe_id,
            session: now.record.session,
            granted_unix_ms: now.record.granted_unix_ms,
        });
    }
    let approver = approved.signers.iter().find(|s| **s != r.requester).cloned().unwrap_or_default();
    let record = ForceRecord {
        namespace: namespace.clone(),
        key: key.clone(),
        holder: holder.clone(),
        session: *session,
        granted_unix_ms: *granted_unix_ms,
        class: class.clone(),
        fenced: *fenced,
        requester: r.requester.clone(),
        approver,
        reason: r.reason.clone(),
        revoked_session: *revoke_session,
        at_unix: now_unix,
    };
    let nonce = NonceRecord {
        kind: r.operation.kind().to_string(),
        requester: r.requester.clone(),
        signers: approved.signers.clone(),
        reason: r.reason.clone(),
        at_unix: now_unix,
    };
    let record_lease = etcd.client.clone().lease_grant(layout::FORCE_RECORD_TTL.as_secs() as i64, None).await?.id();
    let nonce_ttl = r.expires_unix.saturating_sub(now_unix) + 86_400;
    let hold_key = layout::hold_key(&lock_key);
    let force_key = layout::force_key(&r.nonce);
    if let Some(coord) = coord {
        let nonce_lease = coord.client.clone().lease_grant(nonce_ttl as i64, None).await?.id();
        let recorded = Txn::new().when([Compare::create_revision(nonce_key.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            nonce_key.as_str(),
            layout::encode(&nonce),
            Some(PutOptions::new().with_lease(nonce_lease)),
        )]);
        if !coord.txn(recorded).await?.succeeded() {
            return Err(ForceError::NonceUsed(nonce_key));
        }
        let txn = Txn::new().when([Compare::create_revision(hold_key.as_str(), CompareOp::Equal, now.create_revision)]).and_then([
            TxnOp::delete(hold_key.as_str(), None),
            TxnOp::put(force_key.as_str(), layout::encode(&record), Some(PutOptions::new().with_lease(record_lease))),
        ]);
        if !etcd.txn(txn).await?.succeeded() {
            return Err(ForceError::Spent);
        }
        let session_revoked = *revoke_session && crate::txn::close_session(etcd, *session).await.is_ok();
        return Ok(Released { record, session_revoked });
    }
    let nonce_lease = etcd.client.clone().lease_grant(nonce_ttl as i64, None).await?.id();
    let txn = Txn::new()
        .when([
            Compare::create_revision(hold_key.as_str(), CompareOp::Equal, now.create_revision),
            Compare::create_revision(nonce_key.as_str(), CompareOp::Equal, 0),
        ])
        .and_then([
            TxnOp::delete(hold_key.as_str(), None),
            TxnOp::put(force_key.as_str(), layout::encode(&record), Some(PutOptions::new().with_lease(record_lease))),
            TxnOp::put(nonce_key.as_str(), layout::encode(&nonce), Some(PutOptions::new().with_lease(nonce_lease))),
        ]);
    if !etcd.txn(txn).await?.succeeded() {
        if etcd.get(nonce_key.as_str(), Some(GetOptions::new().with_count_only())).await?.count() > 0 {
            return Err(ForceError::NonceUsed(nonce_key));
        }
        return Err(ForceError::Raced);
    }
    // Ended like a close (record and marker, then the revoke), so the audit
    // trail shows a session close, not a lapse.
    let session_revoked = *revoke_session && crate::txn::close_session(etcd, *session).await.is_ok();
    Ok(Released { record, session_revoked })
}

#[cfg(test)]
mod tests {
    use super::class_facts;
    use holdfast_policy::{Class, Enforcement, Fairness, OnQuorumLoss, Purpose, Tier};

    /// A demoted class is not fenced: force-release's request says so and
    /// `holdfastctl force-release` warns that the holder may write on.
    #[test]
    fn only_a_class_fenced_in_force_counts_as_fenced() {
        let class = |enforcement| Class {
            name: "ledger".into(),
            namespace: "ledger".into(),
            purpose: Purpose::Correctness,
            enforcement,
            ttl: std::time::Duration::from_secs(10),
            tier: Tier::Entity,
            on_quorum_loss: OnQuorumLoss::Closed,
            fairness: Fairness::BestEffort,
            home_region: None,
        };
        let fenced = class(Enforcement::Fenced { resource: "fixture:r".into(), schema_version: 1 });
        assert_eq!(class_facts(Some(&fenced)), ("ledger".into(), true));
        let demoted = class(Enforcement::Demoted { resource: "fixture:r".into(), schema_version: 1, reason: "expired".into() });
        assert_eq!(class_facts(Some(&demoted)), ("ledger".into(), false));
        assert_eq!(class_facts(None), ("(no class)".into(), false));
    }
}

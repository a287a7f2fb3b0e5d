//! The grant and release transactions: the only two writes to a hold.
//!
//! The arbiter sends them (`holdfast_arbiter::grant`); `holdfast-bench`
//! sends the same transactions straight to etcd to measure what the arbiter
//! adds.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use holdfast_model::layout;

/// The grant transaction (also used by `holdfast-bench` to measure etcd
/// without the arbiter): the hold is absent, the epoch record is exactly
/// `epoch_bytes`, the session record is exactly `session_bytes`, no seal,
/// none of the key's drain markers (`drains`, [`layout::drain_keys`]);
/// then put the hold on the session's lease. On failure it reads back the
/// hold, session, epoch, seal and each drain marker, in that order, so the
/// refusal can be classified.
pub fn grant_txn(
    hold_key: &str,
    epoch_bytes: &[u8],
    lease: i64,
    session_bytes: &[u8],
    hold_bytes: &[u8],
    waiter_key: Option<&str>,
    drains: &[String],
) -> Txn {
    let session_key = layout::session_key(lease);
    let mut compares = vec![
        Compare::create_revision(hold_key, CompareOp::Equal, 0),
        Compare::value(layout::EPOCH_KEY, CompareOp::Equal, epoch_bytes.to_vec()),
        Compare::value(session_key.as_str(), CompareOp::Equal, session_bytes.to_vec()),
        Compare::version(layout::SEAL_KEY, CompareOp::Equal, 0),
    ];
    #[cfg(feature = "mutations")]
    {
        if crate::mutation::on(&crate::mutation::NO_SESSION_COMPARE) {
            compares.remove(2);
        }
        if crate::mutation::on(&crate::mutation::NO_EPOCH_COMPARE) {
            compares.remove(1);
        }
    }
    #[cfg(feature = "mutations")]
    let drains = if crate::mutation::on(&crate::mutation::NO_DRAIN_COMPARE) { &[] } else { drains };
    compares.extend(drains.iter().map(|d| Compare::version(d.as_str(), CompareOp::Equal, 0)));
    let mut then = vec![TxnOp::put(hold_key, hold_bytes.to_vec(), Some(PutOptions::new().with_lease(lease)))];
    if let Some(w) = waiter_key {
        compares.push(Compare::version(w, CompareOp::Greater, 0));
        then.push(TxnOp::delete(w, None));
    }
    let mut reads = vec![
        TxnOp::get(hold_key, None),
        TxnOp::get(session_key.as_str(), None),
        TxnOp::get(layout::EPOCH_KEY, None),
        TxnOp::get(layout::SEAL_KEY, None),
    ];
    reads.extend(drains.iter().map(|d| TxnOp::get(d.as_str(), None)));
    Txn::new().when(compares).and_then(then).or_else(reads)
}

/// The release transaction: delete the hold only if it is exactly the one
/// granted at `create_revision` to `lease`, and only while the session's
/// record exists.
///
/// The record guard makes etcd's log say by construction how a hold ended: a
/// hold deleted while its session record exists was released (or withdrawn,
/// see [`withdraw_txn`]); one deleted at or after its record's delete ended
/// with its session (lease expiry, CloseSession — which deletes the record
/// before revoking the lease — or an epoch advance). A release racing a
/// session close therefore deletes nothing, and the hold ends with the
/// session.
pub fn release_txn_for(hold_key: &str, lease: i64, create_revision: i64) -> Txn {
    #[cfg(feature = "mutations")]
    if crate::mutation::on(&crate::mutation::RELEASE_UNGUARDED) {
        return Txn::new().when([Compare::version(hold_key, CompareOp::Greater, 0)]).and_then([TxnOp::delete(hold_key, None)]);
    }
    let session_key = layout::session_key(lease);
    Txn::new()
        .when([
            Compare::create_revision(hold_key, CompareOp::Equal, create_revision),
            Compare::lease(hold_key, CompareOp::Equal, lease),
            Compare::version(session_key.as_str(), CompareOp::Greater, 0),
        ])
        .and_then([TxnOp::delete(hold_key, Some(etcd_client::DeleteOptions::new().with_prev_key()))])
}

/// The withdrawal transaction: like a release (the exact hold, its session
/// record present), and in the same transaction a marker at
/// [`layout::withdrawn_key`] naming the withdrawn hold, on its session's
/// lease. The arbiter withdraws a grant that committed but whose token it
/// will not hand out (it sealed, or lost track of etcd, while the grant was
/// in flight); the marker lets a reader of etcd's log tell that delete from
/// any other.
pub fn withdraw_txn(hold_key: &str, lease: i64, create_revision: i64, reason: &str) -> Txn {
    let session_key = layout::session_key(lease);
    let marker = layout::WithdrawnRecord { create_revision, session: lease, reason: reason.to_string() };
    #[allow(unused_mut)]
    let mut then = vec![
        TxnOp::delete(hold_key, None),
        TxnOp::put(layout::withdrawn_key(hold_key), layout::encode(&marker), Some(PutOptions::new().with_lease(lease))),
    ];
    #[cfg(feature = "mutations")]
    if crate::mutation::on(&crate::mutation::NO_WITHDRAWAL_MARKER) {
        then.pop();
    }
    Txn::new()
        .when([
            Compare::create_revision(hold_key, CompareOp::Equal, create_revision),
            Compare::lease(hold_key, CompareOp::Equal, lease),
            Compare::version(session_key.as_str(), CompareOp::Greater, 0),
        ])
        .and_then(then)
}

/// The close transaction: while the session record exists, delete it and
/// put the close marker [`layout::closed_key`] on the session's lease, in
/// one revision. A reader of etcd's log tells a close from a lapse by that
/// marker (`holdfast_audit::classify`); no grant or release can use the
/// session after this commits.
pub fn close_txn(lease: i64) -> Txn {
    let session_key = layout::session_key(lease);
    Txn::new().when([Compare::version(session_key.as_str(), CompareOp::Greater, 0)]).and_then([
        TxnOp::delete(session_key.as_str(), None),
        TxnOp::put(layout::closed_key(lease), Vec::new(), Some(PutOptions::new().with_lease(lease))),
    ])
}

/// Ends a session and every hold on it: [`close_txn`], then the lease
/// revoke, which deletes the holds and the marker in one more revision. A
/// lease already gone (expired, revoked) is not an error.
pub async fn close_session(etcd: &crate::Etcd, lease: i64) -> Result<(), etcd_client::Error> {
    etcd.txn(close_txn(lease)).await?;
    // A revoke is checked against the keys on the lease: it can be refused
    // for the same auth race as a transaction.
    let revoke = || {
        let mut c = etcd.client.clone();
        async move { c.lease_revoke(lease).await }
    };
    match crate::etcd::retry_auth_race(revoke).await {
        Ok(_) => Ok(()),
        Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

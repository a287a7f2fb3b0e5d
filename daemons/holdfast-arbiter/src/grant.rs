//! Where a grant is made, and where a hold is released.
//!
//! **Grant** = one etcd transaction: the hold key is absent (create revision
//! 0), `/sys/epoch` holds exactly the record this arbiter serves, and the
//! session record is still present and unchanged; then the hold is put on the
//! session's lease. **Token** = `epoch << 48 | revision` of that transaction.
//!
//! Before a token leaves the arbiter, the response is checked against what
//! the arbiter already knows: the cluster ID must be the epoch's, and the
//! revision must be above every revision seen in this epoch before the
//! transaction was sent. A cluster rewound under a running arbiter fails the
//! second check at its first grant; the token is then withheld and the
//! arbiter seals.
//!
//! **Release** = one transaction guarded by the hold's create revision and
//! lease, so a stale or retried release never deletes a newer hold.
//!
//! Waiting for a held key is in [`crate::waiting`].

use crate::Refusal;
use crate::seal::{Guard, Serve};
use crate::session::Owned;
use etcd_client::TxnOpResponse;
use holdfast_model::layout::{self, HoldRecord};
use holdfast_model::{LockKey, Token};
use holdfast_store::etcd::Etcd;
use holdfast_store::txn::{grant_txn, release_txn_for};
use tracing::Instrument;

/// The outcome of one grant transaction that did not fail.
pub enum Attempt {
    Granted(Token),
    /// Held by another session: the revision to watch from, the hold's
    /// create revision (0 if the key was found free), and the holder's
    /// identity (a hold of the caller's own identity under another session
    /// is a leak, if it persists).
    Held {
        watch_from: i64,
        since: i64,
        holder: Option<String>,
    },
}

/// The span of one grant or release transaction.
macro_rules! txn_span {
    ($name:literal, $hold_key:expr, $lease:expr) => {
        tracing::info_span!(
            $name,
            otel.kind = "client",
            db.system = "etcd",
            hold_key = $hold_key,
            session = format!("{:x}", $lease),
            outcome = tracing::field::Empty,
        )
    };
}

/// One grant transaction, sent through the committer (which may group it
/// with grants of other keys). With `waiter_key` (durable fairness) the
/// transaction also requires that waiter record and deletes it.
///
/// Traced as a `grant transaction` span (hold key, session, outcome); the
/// revision is never recorded: it is half of the token.
pub async fn attempt(
    committer: &crate::commit::Committer,
    etcd: &Etcd,
    guard: &Guard,
    session: &Owned,
    key: &LockKey,
    waiter_key: Option<&str>,
) -> Result<Attempt, Refusal> {
    let hold_key = layout::hold_key(key);
    let span = txn_span!("grant transaction", hold_key.as_str(), session.lease);
    let r = attempt_txn(committer, etcd, guard, session, key, &hold_key, waiter_key).instrument(span.clone()).await;
    span.record(
        "outcome",
        match &r {
            Ok(Attempt::Granted(_)) => "granted",
            Ok(Attempt::Held { .. }) => "held",
            Err(e) => e.outcome(),
        },
    );
    r
}

async fn attempt_txn(
    committer: &crate::commit::Committer,
    etcd: &Etcd,
    guard: &Guard,
    session: &Owned,
    key: &LockKey,
    hold_key: &str,
    waiter_key: Option<&str>,
) -> Result<Attempt, Refusal> {
    let current = match guard.state() {
        Serve::Serving(c) => c,
        Serve::Sealed { reason, .. } => return Err(Refusal::sealed(&reason)),
        Serve::Unverified(why) => return Err(Refusal::not_serving(&why)),
    };
    let epoch = current.record.epoch;
    let hold = HoldRecord { spiffe_id: session.record.spiffe_id.clone(), session: session.lease, epoch, granted_unix_ms: now_unix_ms() };
    crate::metrics::inc(|m| &m.grant_attempts);
    let sent = std::time::Instant::now();
    let drains = layout::drain_keys(key);
    let txn = grant_txn(hold_key, &current.bytes, session.lease, &session.bytes, &layout::encode(&hold), waiter_key, &drains);
    let highest_before = guard.highest_before(epoch);
    let resp = committer.commit(hold_key, txn).await.map_err(|e| {
        guard.etcd_failed(&e);
        Refusal::unavailable(&e)
    })?;
    let header = resp.header.as_ref().ok_or_else(|| Refusal::unavailable("etcd answered without a header"))?;
    let (revision, cluster_id) = (header.revision(), header.cluster_id());
    if cluster_id != current.record.cluster_id {
        guard.seal(
            format!(
                "etcd answered a grant with cluster ID {cluster_id:x}, not {:x} of epoch {epoch}: the cluster was restored or replaced",
                current.record.cluster_id
            ),
            epoch,
        );
        if resp.succeeded {
            let withdrawn = withdraw(etcd, hold_key, session.lease, revision, "the etcd cluster changed identity").await;
            return Err(Refusal::withdrawn("the etcd cluster changed identity; this arbiter sealed", withdrawn));
        }
        return Err(Refusal::sealed("the etcd cluster changed identity"));
    }
    if resp.succeeded {
        #[cfg(feature = "mutations")]
        let highest_before = if holdfast_store::mutation::on(&holdfast_store::mutation::NO_SEAL_CHECK) { 0 } else { highest_before };
        if revision <= highest_before {
            // Revisions only grow on a cluster that was never rewound. Withhold
            // this token: it may equal one already issued. (No numbers in the
            // reason: they could be token values.)
            guard.seal(
                "a grant committed at a revision at or below one already seen in this epoch: \
                 the etcd cluster was rewound (restored from a snapshot)"
                    .into(),
                epoch,
            );
            let withdrawn = withdraw(etcd, hold_key, session.lease, revision, "the etcd cluster was rewound").await;
            return Err(Refusal::withdrawn("the etcd cluster was rewound; this arbiter sealed", withdrawn));
        }
        if !guard.still_serving(epoch) {
            // Sealed, or an etcd error seen elsewhere, while this grant was in
            // flight: the token does not leave.
            let why = match guard.state() {
                Serve::Sealed { reason, .. } => format!("this arbiter sealed while the grant was in flight: {reason}"),
                other => format!("this arbiter lost track of etcd while the grant was in flight: {}", other.describe()),
            };
            let withdrawn = withdraw(etcd, hold_key, session.lease, revision, "not serving when the grant committed").await;
            return Err(Refusal::withdrawn(&why, withdrawn));
        }
        guard.observe(epoch, revision);
        let m = &*crate::metrics::METRICS;
        m.grant_latency.get_or_create(m.labels()).observe(sent.elapsed().as_secs_f64());
        #[cfg(feature = "mutations")]
        let revision = holdfast_store::mutation::token_revision(revision);
        let token = Token::new(epoch, revision as u64).map_err(|e| Refusal::unavailable(&format!("cannot mint a token: {e}")))?;
        return Ok(Attempt::Granted(token));
    }
    let gets: Vec<Option<etcd_client::KeyValue>> = resp
        .ops
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        })
        .collect();
    let (hold_kv, session_kv, epoch_kv) = (gets.first().cloned().flatten(), gets.get(1).cloned().flatten(), gets.get(2).cloned().flatten());
    if gets.get(3).cloned().flatten().is_some() {
        // Another arbiter sealed the cluster: re-check now.
        guard.etcd_failed("/sys/seal appeared");
        return Err(Refusal::sealed("another arbiter sealed this cluster; see `holdfastctl epoch status`"));
    }
    if session_kv.as_ref().map(|kv| kv.value()) != Some(session.bytes.as_slice()) {
        return Err(Refusal::session_not_found(session.lease));
    }
    if epoch_kv.as_ref().map(|kv| kv.value()) != Some(current.bytes.as_slice()) {
        guard.etcd_failed("the epoch record changed");
        return Err(Refusal::unavailable("the epoch record changed; retry after the arbiter has re-read it"));
    }
    if let Some(marker) = gets.iter().skip(4).flatten().next() {
        // The key's range is draining from this cluster (a move): nothing
        // is granted here until the move is done.
        guard.observe(epoch, revision);
        let record: Option<layout::DrainRecord> = layout::decode(&String::from_utf8_lossy(marker.key()), marker.value()).ok();
        return Err(Refusal::moving(key, record.as_ref(), now_unix_ms()));
    }
    guard.observe(epoch, revision);
    let Some(hold_kv) = hold_kv else {
        // Free, yet the compare failed: a durable waiter record is missing
        // (expired) or the key was released in between. Try again at once.
        return Ok(Attempt::Held { watch_from: revision, since: 0, holder: None });
    };
    let holder: Option<HoldRecord> = layout::decode(hold_key, hold_kv.value()).ok();
    if hold_kv.lease() == session.lease {
        // Already held by this very session (a retried acquire): the same hold.
        if let Some(h) = &holder
            && let Ok(token) = Token::new(h.epoch, hold_kv.create_revision() as u64)
            && h.epoch == epoch
        {
            return Ok(Attempt::Granted(token));
        }
    }
    Ok(Attempt::Held { watch_from: revision + 1, since: hold_kv.create_revision(), holder: holder.map(|h| h.spiffe_id) })
}

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Releases the hold of `hold_key` named by `token`, through the committer
/// (grouped with other keys' grants and releases when group commit is on).
/// Returns whether a hold was deleted.
pub async fn release(
    committer: &crate::commit::Committer,
    guard: &Guard,
    session: &Owned,
    hold_key: &str,
    token: Token,
) -> Result<bool, Refusal> {
    let serving_epoch = match guard.state() {
        Serve::Serving(c) => Some(c.record.epoch),
        _ => None,
    };
    if serving_epoch.is_some_and(|e| e != token.epoch()) {
        // A token of another epoch names no hold that can still exist.
        return Ok(false);
    }
    release_txn(committer, hold_key, session.lease, token.revision() as i64).await.map_err(|e| {
        guard.etcd_failed(&e);
        Refusal::unavailable(&e)
    })
}

/// Withdraws a grant that committed but whose token will not leave: deletes
/// the hold and writes its withdrawal marker in one transaction
/// ([`holdfast_store::txn::withdraw_txn`]). Returns whether etcd confirmed
/// the delete. Traced as a `withdraw transaction` span.
async fn withdraw(etcd: &Etcd, hold_key: &str, lease: i64, create_revision: i64, reason: &str) -> bool {
    let span = txn_span!("withdraw transaction", hold_key, lease);
    let txn = holdfast_store::txn::withdraw_txn(hold_key, lease, create_revision, reason);
    let r = etcd.txn(txn).instrument(span.clone()).await;
    let done = matches!(&r, Ok(resp) if resp.succeeded());
    span.record("outcome", if done { "withdrawn" } else { "unknown" });
    if let Err(e) = &r {
        tracing::warn!(hold_key, error = %e, "a withdrawn grant's hold could not be deleted; it ends with its session");
    }
    done
}

/// The release transaction, traced as a `release transaction` span (hold
/// key, session, outcome; never the revision).
async fn release_txn(committer: &crate::commit::Committer, hold_key: &str, lease: i64, create_revision: i64) -> Result<bool, String> {
    let span = txn_span!("release transaction", hold_key, lease);
    let r = release_txn_traced(committer, hold_key, lease, create_revision).instrument(span.clone()).await;
    span.record(
        "outcome",
        match &r {
            Ok(true) => "released",
            Ok(false) => "not_held",
            Err(_) => "unavailable",
        },
    );
    r
}

async fn release_txn_traced(
    committer: &crate::commit::Committer,
    hold_key: &str,
    lease: i64,
    create_revision: i64,
) -> Result<bool, String> {
    let txn = release_txn_for(hold_key, lease, create_revision);
    let resp = committer.commit(hold_key, txn).await?;
    if resp.succeeded {
        // Hold duration, from the deleted record's grant time.
        for op in resp.ops {
            if let TxnOpResponse::Delete(d) = op {
                for kv in d.prev_kvs() {
                    if let Ok(h) = layout::decode::<HoldRecord>(hold_key, kv.value())
                        && h.granted_unix_ms > 0
                    {
                        let secs = now_unix_ms().saturating_sub(h.granted_unix_ms) as f64 / 1000.0;
                        let m = &*crate::metrics::METRICS;
                        m.hold_duration.get_or_create(m.labels()).observe(secs);
                    }
                }
            }
        }
    }
    Ok(resp.succeeded)
}

/// The current hold of a key, if any: (record, session lease).
pub async fn inspect(etcd: &Etcd, key: &LockKey) -> Result<Option<(HoldRecord, i64)>, Refusal> {
    let hold_key = layout::hold_key(key);
    let resp = etcd.get(hold_key.as_str(), None).await.map_err(Refusal::etcd)?;
    // Not the create revision: with the epoch it is the holder's token.
    Ok(resp.kvs().first().and_then(|kv| {
        let record: HoldRecord = layout::decode(&hold_key, kv.value()).ok()?;
        Some((record, kv.lease()))
    }))
}

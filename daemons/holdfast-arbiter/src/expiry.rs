//! Holds that ended because their session's lease expired, not by a release
//! (`holdfast_arbiter_expiries_without_release_total`).
//!
//! **How an expiry looks in etcd.** When a lease expires, etcd deletes every
//! key on it in one revision: the holds `/l/<ns>/<key>` and the session record
//! `/s/<lease>` disappear together. Nothing else deletes a hold and its
//! session record in one revision: a release deletes only the hold;
//! CloseSession deletes the record first, in a revision of its own, and then
//! revokes the lease (see [`crate::session::Sessions::close`]); an epoch
//! advance deletes everything in one revision but rewrites `/sys/epoch` in
//! that same revision, which is checked before counting.
//!
//! **Who counts.** The arbiter that granted the hold — with key-affine
//! clients, the key's home arbiter — so the sum over a cluster's arbiters
//! counts each expired hold once. An arbiter remembers the holds it granted
//! (hold key and create revision) in memory until it sees them deleted; after
//! a restart it has forgotten them, and their expiries go uncounted.
//!
//! **The watch.** One per arbiter over `/l/` up to `/s/` inclusive, deletes
//! only (etcd drops the puts before sending), with the deleted values. It
//! runs only with `[waiters] watch = true`; with it off the arbiter opens no
//! watches and the counter stays 0.

use crate::etcd::Etcd;
use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions};
use holdfast_model::{Token, layout};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// End of the watched range: everything from `/l/` below `/s0` — the holds,
/// the durable waiters `/q/` and the session records `/s/`, not `/sys/`.
const RANGE_END: &str = "/s0";

/// Holds remembered at most (a missed delete must not grow memory forever).
const MAX_TRACKED: usize = 200_000;

/// The holds this arbiter granted that it has not yet seen deleted.
pub struct Expiries {
    enabled: bool,
    granted: Mutex<HashSet<(String, i64)>>,
}

/// A delete the watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    pub key: String,
    /// The revision of the delete.
    pub revision: i64,
    /// From the deleted value: its lease and create revision (0 if etcd did
    /// not send the previous value).
    pub lease: i64,
    pub create_revision: i64,
}

/// The hold deletes among `deletes` that are lease expiries: each deleted in
/// the same revision as its session's record.
pub fn expired(deletes: &[Deleted]) -> Vec<&Deleted> {
    let mut sessions_gone: HashMap<i64, HashSet<i64>> = HashMap::new();
    for d in deletes {
        if let Some(lease) = session_lease(&d.key) {
            sessions_gone.entry(d.revision).or_default().insert(lease);
        }
    }
    deletes
        .iter()
        .filter(|d| d.key.starts_with(layout::HOLD_PREFIX) && d.lease != 0)
        .filter(|d| sessions_gone.get(&d.revision).is_some_and(|gone| gone.contains(&d.lease)))
        .collect()
}

/// The lease of a session record key `/s/<16 hex digits>`.
fn session_lease(key: &str) -> Option<i64> {
    let hex = key.strip_prefix(layout::SESSION_PREFIX)?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok().map(|v| v as i64)).flatten()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Expiries {
    /// `enabled` is `[waiters] watch`: without the watch nothing is tracked.
    pub fn new(enabled: bool) -> Self {
        Expiries { enabled, granted: Mutex::new(HashSet::new()) }
    }

    /// Remembers a hold this arbiter granted (the token's revision is the
    /// hold's create revision).
    pub fn granted(&self, hold_key: &str, token: Token) {
        if !self.enabled {
            return;
        }
        let mut granted = lock(&self.granted);
        if granted.len() >= MAX_TRACKED {
            granted.clear();
        }
        granted.insert((hold_key.to_string(), token.revision() as i64));
    }

    /// Forgets every deleted hold; returns the revisions of the expiries of
    /// holds granted here, one entry per hold.
    fn observe(&self, deletes: &[Deleted]) -> Vec<i64> {
        let expired: HashSet<(&str, i64)> = expired(deletes).into_iter().map(|d| (d.key.as_str(), d.create_revision)).collect();
        let mut granted = lock(&self.granted);
        let mut ours = Vec::new();
        for d in deletes.iter().filter(|d| d.key.starts_with(layout::HOLD_PREFIX)) {
            let was_ours = granted.remove(&(d.key.clone(), d.create_revision));
            if was_ours && expired.contains(&(d.key.as_str(), d.create_revision)) {
                ours.push(d.revision);
            }
        }
        ours
    }
}

/// Watches for deletes and counts expiries of holds granted here, until the
/// process ends. Reconnects after errors, resuming where it stopped.
pub async fn run(etcd: Etcd, expiries: std::sync::Arc<Expiries>) {
    if !expiries.enabled {
        return;
    }
    let mut from = 0;
    loop {
        let mut opts = WatchOptions::new().with_range(RANGE_END).with_prev_key().with_filters([WatchFilterType::NoPut]);
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        match etcd.watch.clone().watch(layout::HOLD_PREFIX, Some(opts)).await {
            Ok(mut stream) => loop {
                let resp = match stream.message().await {
                    Ok(Some(resp)) => resp,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "expiry watch ended; reconnecting");
                        break;
                    }
                };
                if resp.canceled() {
                    // Compacted past `from`: deletes in between are missed
                    // (their holds stay remembered until MAX_TRACKED).
                    if resp.compact_revision() > 0 {
                        from = resp.compact_revision();
                    }
                    break;
                }
                let deletes: Vec<Deleted> = resp
                    .events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Delete)
                    .filter_map(|e| {
                        let kv = e.kv()?;
                        let prev = e.prev_kv();
                        Some(Deleted {
                            key: kv.key_str().ok()?.to_string(),
                            revision: kv.mod_revision(),
                            lease: prev.map(|p| p.lease()).unwrap_or(0),
                            create_revision: prev.map(|p| p.create_revision()).unwrap_or(0),
                        })
                    })
                    .collect();
                if let Some(last) = resp.events().iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max() {
                    from = last + 1;
                }
                let revisions = expiries.observe(&deletes);
                let mut counted = 0;
                for revision in &revisions {
                    if !epoch_advanced_at(&etcd, *revision).await {
                        counted += 1;
                    }
                }
                if counted > 0 {
                    let m = &*crate::metrics::METRICS;
                    m.expiries_without_release.get_or_create(m.labels()).inc_by(counted);
                    tracing::info!(holds = counted, "holds granted here ended by session expiry, without a release");
                }
            },
            Err(e) => tracing::debug!(error = %e, "cannot open the expiry watch; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether `/sys/epoch` was written at `revision` (an epoch advance, which
/// deletes every hold and session record in that revision). Unknown (the
/// revision was compacted, or etcd did not answer): assume not.
async fn epoch_advanced_at(etcd: &Etcd, revision: i64) -> bool {
    let at = etcd.get(layout::EPOCH_KEY, Some(GetOptions::new().with_revision(revision))).await;
    at.ok().and_then(|r| r.kvs().first().map(|kv| kv.mod_revision() == revision)).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn del(key: &str, revision: i64, lease: i64, create_revision: i64) -> Deleted {
        Deleted { key: key.into(), revision, lease, create_revision }
    }

    fn token(revision: u64) -> Token {
        Token::new(1, revision).unwrap()
    }

    #[test]
    fn a_hold_deleted_with_its_session_record_expired() {
        let lease = 0x694d_0000_0000_0001_i64;
        let record = layout::session_key(lease);
        let deletes =
            [del("/l/ns/a", 20, lease, 10), del("/l/ns/b", 20, lease, 11), del(&record, 20, 0, 0), del("/l/ns/c", 20, lease + 1, 12)];
        let keys: Vec<&str> = expired(&deletes).iter().map(|d| d.key.as_str()).collect();
        assert_eq!(keys, ["/l/ns/a", "/l/ns/b"], "a hold of another lease in the same revision did not expire");
    }

    #[test]
    fn releases_and_closes_are_not_expiries() {
        let lease = 7;
        let record = layout::session_key(lease);
        // A release: the hold alone. A close: the record, then the holds.
        assert!(expired(&[del("/l/ns/a", 20, lease, 10)]).is_empty());
        assert!(expired(&[del(&record, 21, 0, 0), del("/l/ns/b", 22, lease, 11)]).is_empty());
        // A durable waiter record deleted with the session is not a hold.
        assert!(expired(&[del("/q/ns/a/0000000000000007", 23, lease, 9), del(&record, 23, 0, 0)]).is_empty());
    }

    #[test]
    fn only_holds_granted_here_count_and_each_once() {
        let lease = 7;
        let record = layout::session_key(lease);
        let e = Expiries::new(true);
        e.granted("/l/ns/a", token(10));
        let deletes = [del("/l/ns/a", 20, lease, 10), del("/l/ns/b", 20, lease, 11), del(&record, 20, 0, 0)];
        assert_eq!(e.observe(&deletes), vec![20], "b was granted by another arbiter");
        assert!(e.observe(&deletes).is_empty(), "forgotten once deleted");
        let off = Expiries::new(false);
        off.granted("/l/ns/a", token(10));
        assert!(off.observe(&deletes).is_empty());
    }
}

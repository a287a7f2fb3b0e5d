//! From etcd's revision stream to events: one [`Event`] per changed key,
//! its kind decided **by construction** from what else the same revision
//! changed, never from timing.
//!
//! Every write that ends a hold says why in its own transaction:
//!
//! | a hold `/l/<ns>/<key>` deleted in revision R …                         | kind            |
//! |-------------------------------------------------------------------------|-----------------|
//! | R also puts `/sys/withdrawn/<ns>/<key>` (the withdrawal transaction)    | `withdrawal`    |
//! | R also puts a `/sys/force/<nonce>` record naming the key                | `force-release` |
//! | R also puts `/sys/epoch` (the advance transaction)                      | `advance`       |
//! | R also deletes the hold's session record `/s/<lease>` (etcd expired the lease: it deletes every key on it in one revision) | `expiry` |
//! | the session record was deleted before R (a close: the lease revoke after the close transaction) | `close` |
//! | the session record still exists                                          | `release`       |
//!
//! The release transaction compares the session record present
//! (`holdfast_store::txn::release_txn_for`), so a release can never commit
//! after the record is gone: a release racing a close deletes nothing, and
//! the hold ends as `close`. A lease expiry cannot split a record from its
//! holds. Sessions end the same way:
//!
//! | `/s/<lease>` deleted in revision R …                                    | kind            |
//! |-------------------------------------------------------------------------|-----------------|
//! | R also puts `/sys/closed/<lease>` (the close transaction, `holdfast_store::txn::close_txn`) | `session-close` |
//! | R also puts `/sys/epoch`                                                | `session-end`   |
//! | otherwise (etcd expired the lease)                                      | `session-lapse` |
//!
//! To tell `close` from `release` the classifier keeps the set of live
//! session records. It is seeded from a read of the key space at the
//! revision the tailer resumes after ([`Classifier::seed`]), so a restart
//! classifies exactly as an uninterrupted run would.

use crate::event::{Event, Kind, TimeSource, lease_hex};
use holdfast_model::layout::{self, ForceRecord, HoldRecord, SealRecord, SessionRecord, WithdrawnRecord};
use holdfast_store::policy::PublishedPolicy;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One changed key, as etcd's watch reports it (with the previous value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    /// A put (`true`) or a delete.
    pub put: bool,
    pub value: Vec<u8>,
    /// The value before this change, if there was one.
    pub prev_value: Option<Vec<u8>>,
    /// The key's create revision after a put.
    pub create_revision: i64,
}

impl Change {
    pub fn put(key: &str, value: Vec<u8>, create_revision: i64) -> Change {
        Change { key: key.to_string(), put: true, value, prev_value: None, create_revision }
    }

    pub fn delete(key: &str, prev_value: Option<Vec<u8>>) -> Change {
        Change { key: key.to_string(), put: false, value: Vec::new(), prev_value, create_revision: 0 }
    }
}

/// The class and tier governing a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClassOf {
    class: String,
    tier: String,
}

/// Turns revisions into events; keeps what it needs across revisions (live
/// sessions, the epoch, the published classes).
#[derive(Debug, Clone)]
pub struct Classifier {
    cluster_id: u64,
    /// Live session records: lease → owner.
    sessions: HashMap<i64, String>,
    epoch: Option<u32>,
    classes: BTreeMap<String, ClassOf>,
}

impl Classifier {
    pub fn new(cluster_id: u64) -> Classifier {
        Classifier { cluster_id, sessions: HashMap::new(), epoch: None, classes: BTreeMap::new() }
    }

    /// Sets the state from the key space as it was at the revision the
    /// stream resumes after (every key, or at least `/s/`, `/sys/epoch` and
    /// `/sys/policy`).
    pub fn seed<'a>(&mut self, kvs: impl IntoIterator<Item = (&'a str, &'a [u8])>) {
        self.sessions.clear();
        self.epoch = None;
        self.classes.clear();
        for (key, value) in kvs {
            self.learn_put(key, value);
        }
    }

    /// Live sessions (for tests and metrics).
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    fn learn_put(&mut self, key: &str, value: &[u8]) {
        if let Some(lease) = layout::lease_of_session(key) {
            let owner = layout::decode::<SessionRecord>(key, value).map(|r| r.spiffe_id).unwrap_or_default();
            self.sessions.insert(lease, owner);
        } else if key == layout::EPOCH_KEY {
            if let Ok(r) = layout::decode::<layout::EpochRecord>(key, value) {
                self.epoch = Some(r.epoch);
            }
        } else if key == layout::POLICY_KEY
            && let Ok(p) = layout::decode::<PublishedPolicy>(key, value)
        {
            self.classes = p
                .set
                .classes
                .iter()
                .map(|(ns, c)| {
                    let tier = serde_json::to_value(c.tier).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
                    (ns.clone(), ClassOf { class: c.name.clone(), tier })
                })
                .collect();
        }
    }

    /// The events of one revision, in etcd's order (`index` 0, 1, …).
    /// `now_unix_ms` stamps events whose records carry no time.
    pub fn revision(&mut self, revision: i64, changes: &[Change], now_unix_ms: u64) -> Vec<Event> {
        // What the revision's own transaction says about why keys went.
        let mut withdrawn: HashMap<String, String> = HashMap::new();
        let mut forced: HashMap<String, ForceRecord> = HashMap::new();
        let mut closed: HashSet<i64> = HashSet::new();
        let mut ended_here: HashSet<i64> = HashSet::new();
        let mut advanced = false;
        for c in changes {
            if c.put {
                if let Some(hold) = layout::hold_key_of_withdrawn(&c.key) {
                    let reason = layout::decode::<WithdrawnRecord>(&c.key, &c.value).map(|r| r.reason).unwrap_or_default();
                    withdrawn.insert(hold, reason);
                } else if c.key.starts_with(layout::FORCE_PREFIX) {
                    if let Ok(r) = layout::decode::<ForceRecord>(&c.key, &c.value) {
                        forced.insert(format!("{}{}/{}", layout::HOLD_PREFIX, r.namespace, r.key), r);
                    }
                } else if let Some(lease) = layout::lease_of_closed(&c.key) {
                    closed.insert(lease);
                } else if c.key == layout::EPOCH_KEY {
                    advanced = true;
                }
            } else if let Some(lease) = layout::lease_of_session(&c.key) {
                ended_here.insert(lease);
            }
        }
        let mut events = Vec::with_capacity(changes.len());
        for (index, c) in changes.iter().enumerate() {
            let mut e = Event::new(self.cluster_id, revision, index as u32, Kind::Record, &c.key, now_unix_ms);
            e.epoch = self.epoch;
            if let Some(lock_key) = c.key.strip_prefix(layout::HOLD_PREFIX) {
                self.hold(&mut e, c, lock_key, &withdrawn, &forced, &ended_here, advanced, now_unix_ms);
            } else if let Some(lease) = layout::lease_of_session(&c.key) {
                e.session = Some(lease_hex(lease));
                let bytes = if c.put { Some(c.value.as_slice()) } else { c.prev_value.as_deref() };
                e.identity = bytes
                    .and_then(|b| layout::decode::<SessionRecord>(&c.key, b).ok())
                    .map(|r| r.spiffe_id)
                    .or_else(|| self.sessions.get(&lease).cloned());
                e.kind = if c.put {
                    Kind::SessionOpen
                } else if closed.contains(&lease) {
                    Kind::SessionClose
                } else if advanced {
                    Kind::SessionEnd
                } else {
                    Kind::SessionLapse
                };
            } else if let Some(rest) = c.key.strip_prefix(layout::WAITER_PREFIX) {
                e.kind = if c.put { Kind::Wait } else { Kind::WaitEnd };
                if let Some((lock_key, lease)) = rest.rsplit_once('/') {
                    self.name_key(&mut e, lock_key);
                    e.session = Some(lease.to_string());
                    if let Ok(l) = u64::from_str_radix(lease, 16) {
                        e.identity = self.sessions.get(&(l as i64)).cloned();
                    }
                }
            } else if c.key == layout::EPOCH_KEY && c.put {
                e.kind = Kind::Epoch;
                e.epoch = layout::decode::<layout::EpochRecord>(&c.key, &c.value).ok().map(|r| r.epoch);
            } else if c.key == layout::SEAL_KEY {
                e.kind = if c.put { Kind::Seal } else { Kind::Unseal };
                if c.put {
                    e.reason = layout::decode::<SealRecord>(&c.key, &c.value).ok().map(|r| r.reason);
                }
            } else if c.key.starts_with(layout::UNPROTECTED_PREFIX) && c.put {
                if let Ok(r) = layout::decode::<holdfast_model::spool::Entry>(&c.key, &c.value) {
                    let tier = self.classes.get(&r.namespace).map(|c| c.tier.clone());
                    unprotected(&mut e, r, tier);
                }
            } else if c.key == layout::POLICY_KEY && c.put {
                e.kind = Kind::ClassSet;
                if let Ok(p) = layout::decode::<PublishedPolicy>(&c.key, &c.value) {
                    e.identity = Some(p.published_by.clone());
                    e.reason = Some(format!("version {} {}", p.version, p.hash));
                    e.time_unix_ms = p.published_unix_ms;
                    e.time_source = TimeSource::Record;
                }
            }
            events.push(e);
        }
        // State changes take effect after the whole revision was read.
        for c in changes {
            if c.put {
                self.learn_put(&c.key, &c.value);
            } else if let Some(lease) = layout::lease_of_session(&c.key) {
                self.sessions.remove(&lease);
            }
        }
        events
    }

    /// Namespace, key, class and tier of a lock key `<ns>/<key>`.
    fn name_key(&self, e: &mut Event, lock_key: &str) {
        let namespace = lock_key.split('/').next().unwrap_or_default();
        e.namespace = Some(namespace.to_string());
        e.key = Some(lock_key.to_string());
        if let Some(c) = self.classes.get(namespace) {
            e.class = Some(c.class.clone());
            e.tier = Some(c.tier.clone());
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn hold(
        &self,
        e: &mut Event,
        c: &Change,
        lock_key: &str,
        withdrawn: &HashMap<String, String>,
        forced: &HashMap<String, ForceRecord>,
        ended_here: &HashSet<i64>,
        advanced: bool,
        now_unix_ms: u64,
    ) {
        self.name_key(e, lock_key);
        let bytes = if c.put { Some(c.value.as_slice()) } else { c.prev_value.as_deref() };
        let record = bytes.and_then(|b| layout::decode::<HoldRecord>(&c.key, b).ok());
        if let Some(r) = &record {
            e.identity = Some(r.spiffe_id.clone());
            e.session = Some(lease_hex(r.session));
            e.epoch = Some(r.epoch);
        }
        if c.put {
            e.kind = Kind::Grant;
            if let Some(r) = record.as_ref().filter(|r| r.granted_unix_ms > 0) {
                e.time_unix_ms = r.granted_unix_ms;
                e.time_source = TimeSource::Record;
            }
            return;
        }
        if let Some(r) = record.as_ref().filter(|r| r.granted_unix_ms > 0) {
            e.held_ms = Some(now_unix_ms.saturating_sub(r.granted_unix_ms));
        }
        let session = record.as_ref().map(|r| r.session);
        e.kind = if let Some(reason) = withdrawn.get(&c.key) {
            e.reason = Some(reason.clone());
            Kind::Withdrawal
        } else if let Some(f) = forced.get(&c.key) {
            e.requester = Some(f.requester.clone());
            e.approver = Some(f.approver.clone());
            e.reason = Some(f.reason.clone());
            e.fenced = Some(f.fenced);
            e.time_unix_ms = f.at_unix.saturating_mul(1000);
            e.time_source = TimeSource::Record;
            if let Some(r) = &record {
                e.held_ms = Some(e.time_unix_ms.saturating_sub(r.granted_unix_ms));
            }
            Kind::ForceRelease
        } else if advanced {
            Kind::Advance
        } else if session.is_some_and(|s| ended_here.contains(&s)) {
            Kind::Expiry
        } else if session.is_some_and(|s| !self.sessions.contains_key(&s)) {
            Kind::Close
        } else {
            Kind::Release
        };
    }
}

/// The audit event of a shipped fail-open spool record: its kind, the key
/// and class it names, the holder, the unprotected session, when, why it
/// ended, and `unprotected = true`. No epoch: its token was 0.
fn unprotected(e: &mut Event, r: holdfast_model::spool::Entry, tier: Option<String>) {
    use holdfast_model::spool::Event as Spooled;
    e.kind = match r.event {
        Spooled::Grant => Kind::UnprotectedGrant,
        Spooled::Release => Kind::UnprotectedRelease,
        Spooled::End => Kind::UnprotectedEnd,
    };
    e.key = Some(format!("{}/{}", r.namespace, r.key));
    e.namespace = Some(r.namespace);
    e.class = Some(r.class);
    e.tier = tier;
    e.identity = Some(r.identity);
    e.session = Some(format!("{:016x}", r.session));
    e.epoch = None;
    e.time_unix_ms = r.at_unix_ms;
    e.time_source = TimeSource::Record;
    e.reason = (!r.why.is_empty()).then_some(r.why);
    e.unprotected = Some(true);
}

#[cfg(test)]
mod tests;

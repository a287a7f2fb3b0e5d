//! `[limits]`: what one workload may take.
//!
//! - **Request rate**, per identity, on this arbiter: a keyed token bucket
//!   ([`governor`], GCRA) checked right after the caller is authenticated,
//!   before anything else; ValidateToken has a second one of its own, also
//!   per identity. Keepalive renewals on an open stream are not
//!   counted (the stream itself is, once); the session quota bounds them.
//! - **Quotas**, across the cluster: sessions per identity, holds per
//!   identity, holds per namespace (with per-namespace overrides). They are
//!   counted from etcd itself, not from this arbiter's own calls: a
//!   [`Ledger`] lists the session records `/s/` and holds `/l/` once (before
//!   READY) and then follows a watch of them, so every arbiter sees the
//!   sessions and holds any arbiter made, and expiries, which etcd commits
//!   on its own. The view is a watch delivery behind etcd (milliseconds);
//!   a check first waits for the arbiter's own latest session or grant to
//!   arrive, so calls through one arbiter see each other. Sessions being
//!   opened through this arbiter count from the check until the watch
//!   delivers their record (a [`SessionSlot`]), so concurrent opens through
//!   one arbiter never overshoot; opens in flight on several arbiters at
//!   once can overshoot by their number, as can acquires (checked once,
//!   before any wait in the queue). A quota is a guard against a runaway workload, not a
//!   correctness property; it is checked before any etcd read or write, so
//!   a refusal writes nothing.
//!
//! Refusals are `ResourceExhausted` with reason `RATE_LIMITED` or `QUOTA`
//! and a message naming the `limits.` key and what to do.

use crate::Refusal;
use crate::etcd::Etcd;
use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use holdfast_config::arbiter::LimitsConfig;
use holdfast_model::LockKey;
use holdfast_model::layout::{self, HoldRecord, SessionRecord};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// End of the listed and watched range: `/l/`, `/q/` and `/s/`, not `/sys/`.
const RANGE_END: &str = "/s0";

pub struct Limits {
    pub config: LimitsConfig,
    rate: DefaultKeyedRateLimiter<String>,
    /// ValidateToken's own bucket per identity ([`crate::validate`]).
    validate_rate: DefaultKeyedRateLimiter<String>,
    /// One ledger per etcd cluster the arbiter grants on (its sessions and
    /// holds); the quotas count them all together.
    pub ledgers: Vec<Ledger>,
}

impl Limits {
    /// Limits over `clusters` etcd clusters (at least one).
    pub fn new(config: LimitsConfig, clusters: usize) -> Self {
        let nonzero = |v: u32| NonZeroU32::new(v).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::per_second(nonzero(config.requests_per_second)).allow_burst(nonzero(config.request_burst));
        let ledgers = (0..clusters.max(1)).map(|_| Ledger::default()).collect();
        let validate = Quota::per_second(nonzero(crate::validate::RATE_PER_SECOND)).allow_burst(nonzero(crate::validate::BURST));
        Limits { rate: RateLimiter::keyed(quota), validate_rate: RateLimiter::keyed(validate), config, ledgers }
    }

    /// Notes that this arbiter committed a session or a grant at `revision`
    /// on the cluster of ledger `at`.
    pub fn wrote(&self, at: usize, revision: i64) {
        if let Some(l) = self.ledgers.get(at) {
            l.wrote(revision);
        }
    }

    async fn caught_up(&self) {
        for l in &self.ledgers {
            l.caught_up().await;
        }
    }

    /// Holds in `namespace`, on every cluster.
    pub fn holds_in(&self, namespace: &str) -> u64 {
        self.ledgers.iter().map(|l| l.holds_in(namespace)).sum()
    }

    /// One request of `who`, if its bucket has a permit.
    /// `limits.max_sessions_per_identity`.
    pub fn max_sessions_per_identity(&self) -> u64 {
        self.config.max_sessions_per_identity
    }

    pub fn admit(&self, who: &str) -> Result<(), Refusal> {
        match self.rate.check_key(&who.to_string()) {
            Ok(()) => Ok(()),
            Err(_) => {
                crate::metrics::inc(|m| &m.rate_limited);
                Err(Refusal::rate_limited(format!(
                    "{who} is past limits.requests_per_second = {} (burst limits.request_burst = {}) on this arbiter; \
                     retry after a short backoff, or ask the operator to raise it in arbiter.toml",
                    self.config.requests_per_second, self.config.request_burst
                )))
            }
        }
    }

    /// Whether `who` may open one more session: if so, a slot that counts
    /// the session until the watch delivers its record (call
    /// [`SessionSlot::opened`] once it is written; dropped unused, it frees
    /// the slot).
    /// `at`: the ledger of the cluster the session is opened on.
    pub async fn session_quota(&self, who: &str, at: usize) -> Result<SessionSlot<'_>, Refusal> {
        self.caught_up().await;
        let ledger = self.ledgers.get(at).ok_or_else(|| Refusal::unavailable("no such cluster"))?;
        // Every ledger locked (always in this order), so that concurrent
        // opens through this arbiter never overshoot.
        let mut all: Vec<_> = self.ledgers.iter().map(|l| l.counts()).collect();
        let open: u64 = all.iter().map(|c| c.sessions_by_identity.get(who).copied().unwrap_or(0) + c.sessions_coming(who)).sum();
        let max = self.config.max_sessions_per_identity;
        if open >= max {
            drop(all);
            crate::metrics::inc(|m| &m.quota_refusals);
            return Err(Refusal::quota(format!(
                "{who} has {open} sessions open, limits.max_sessions_per_identity = {max}; \
                 close sessions it no longer uses (one session can hold many keys), or ask the operator to raise the quota"
            )));
        }
        bump(&mut all[at].opening, who, true);
        drop(all);
        Ok(SessionSlot { ledger, who: who.to_string(), open: true })
    }

    /// Whether `who` may take one more hold, on `key`.
    pub async fn hold_quota(&self, who: &str, key: &LockKey) -> Result<(), Refusal> {
        self.caught_up().await;
        let (mine, in_namespace) =
            self.ledgers.iter().map(|l| l.holds_of(who, key.namespace())).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let max = self.config.max_holds_per_identity;
        if mine >= max {
            crate::metrics::inc(|m| &m.quota_refusals);
            return Err(Refusal::quota(format!(
                "{who} has {mine} holds, limits.max_holds_per_identity = {max}; \
                 release holds it no longer needs, or ask the operator to raise the quota"
            )));
        }
        let max = self.config.max_holds_in(key.namespace());
        if in_namespace >= max {
            crate::metrics::inc(|m| &m.quota_refusals);
            let ns = key.namespace();
            let which = if self.config.namespaces.contains_key(ns) {
                format!("limits.namespaces.{ns}.max_holds")
            } else {
                "limits.max_holds_per_namespace".to_string()
            };
            return Err(Refusal::quota(format!(
                "namespace {ns:?} has {in_namespace} holds, {which} = {max}; wait for holds to be released, \
                 or ask the operator to raise the quota"
            )));
        }
        Ok(())
    }

    /// Whether one more durable waiter may queue in `key`'s namespace with
    /// the record `record` (a waiter already recorded, retrying after an
    /// arbiter restart, keeps its place). Checked before the record is
    /// written, so a refusal writes nothing; waiters queuing on several
    /// arbiters at once can overshoot by their number.
    pub async fn waiter_quota(&self, key: &LockKey, record: &str) -> Result<(), Refusal> {
        self.caught_up().await;
        let ns = key.namespace();
        let (mut queued, mut known) = (0, false);
        for l in &self.ledgers {
            let (n, k) = l.waiters_in(ns, record);
            queued += n;
            known |= k;
        }
        let max = self.config.max_durable_waiters_per_namespace;
        if known || queued < max {
            return Ok(());
        }
        crate::metrics::inc(|m| &m.quota_refusals);
        Err(Refusal::quota(format!(
            "namespace {ns:?} has {queued} durable waiters queued, limits.max_durable_waiters_per_namespace = {max}; \
             retry after a backoff (waiters leave as they are granted or give up), or ask the operator to raise it"
        )))
    }

    /// Forgets the rate state of identities idle long enough to have a
    /// full bucket again (memory stays bounded by the active identities).
    pub fn forget_idle(&self) {
        self.rate.retain_recent();
        self.validate_rate.retain_recent();
    }

    /// One ValidateToken call of `who`, if its own bucket has a permit: one
    /// caller's flood refuses only that caller.
    pub fn admit_validate(&self, who: &str) -> Result<(), Refusal> {
        self.validate_rate.check_key(&who.to_string()).map_err(|_| crate::validate::rate_limited(who))
    }
}

/// A session of `who` counted against its quota before etcd's watch
/// delivers it: from the check to the write ([`Counts::opening`]), then
/// until the watch reaches the write's revision ([`Counts::opened`]).
pub struct SessionSlot<'a> {
    ledger: &'a Ledger,
    who: String,
    open: bool,
}

impl SessionSlot<'_> {
    /// The session was written at `revision`: it stays counted until the
    /// watch has delivered that revision (then its record counts it).
    pub fn opened(mut self, revision: i64) {
        self.ledger.wrote(revision);
        let mut c = self.ledger.counts();
        bump(&mut c.opening, &self.who, false);
        if revision > c.revision {
            c.opened.push((self.who.clone(), revision));
        }
        self.open = false;
    }
}

impl std::fmt::Debug for SessionSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSlot").field("who", &self.who).field("open", &self.open).finish()
    }
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        if self.open {
            bump(&mut self.ledger.counts().opening, &self.who, false);
        }
    }
}

/// Sessions and holds in etcd, by owner and namespace.
pub struct Ledger {
    counts: Mutex<Counts>,
    /// The revision the counts include (listing or last watch response).
    seen: tokio::sync::watch::Sender<i64>,
    /// The latest revision this arbiter itself wrote a session or grant at.
    wrote: AtomicI64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger { counts: Mutex::default(), seen: tokio::sync::watch::Sender::new(0), wrote: AtomicI64::new(0) }
    }
}

/// Longest a quota check waits for the watch to deliver this arbiter's own
/// latest write (normally it already has: a watch event follows its commit
/// within a millisecond).
const CATCH_UP: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Counts {
    /// Session record key → owner.
    sessions: HashMap<String, String>,
    /// Hold key → (owner, namespace).
    holds: HashMap<String, (String, String)>,
    sessions_by_identity: HashMap<String, u64>,
    holds_by_identity: HashMap<String, u64>,
    holds_by_namespace: HashMap<String, u64>,
    /// Durable waiter record key → namespace.
    waiters: HashMap<String, String>,
    waiters_by_namespace: HashMap<String, u64>,
    /// The revision these counts include.
    revision: i64,
    /// Sessions this arbiter is opening, by identity: checked, not yet
    /// written.
    opening: HashMap<String, u64>,
    /// Sessions this arbiter wrote at a revision the counts do not include
    /// yet: (identity, revision).
    opened: Vec<(String, i64)>,
}

fn bump(map: &mut HashMap<String, u64>, key: &str, up: bool) {
    if up {
        *map.entry(key.to_string()).or_default() += 1;
    } else if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Counts {
    fn put(&mut self, key: &str, value: &[u8]) {
        if key.starts_with(layout::SESSION_PREFIX) {
            let Ok(record) = layout::decode::<SessionRecord>(key, value) else { return };
            if let Some(old) = self.sessions.insert(key.to_string(), record.spiffe_id.clone()) {
                bump(&mut self.sessions_by_identity, &old, false);
            }
            bump(&mut self.sessions_by_identity, &record.spiffe_id, true);
        } else if let Some(rest) = key.strip_prefix(layout::HOLD_PREFIX) {
            let Ok(record) = layout::decode::<HoldRecord>(key, value) else { return };
            let ns = rest.split('/').next().unwrap_or_default().to_string();
            if let Some((old_owner, old_ns)) = self.holds.insert(key.to_string(), (record.spiffe_id.clone(), ns.clone())) {
                bump(&mut self.holds_by_identity, &old_owner, false);
                bump(&mut self.holds_by_namespace, &old_ns, false);
            }
            bump(&mut self.holds_by_identity, &record.spiffe_id, true);
            bump(&mut self.holds_by_namespace, &ns, true);
        } else if let Some(rest) = key.strip_prefix(layout::WAITER_PREFIX) {
            let ns = rest.split('/').next().unwrap_or_default().to_string();
            if self.waiters.insert(key.to_string(), ns.clone()).is_none() {
                bump(&mut self.waiters_by_namespace, &ns, true);
            }
        }
    }

    /// Sessions of `who` this arbiter is opening or opened that the counts
    /// do not include yet.
    fn sessions_coming(&self, who: &str) -> u64 {
        self.opening.get(who).copied().unwrap_or(0) + self.opened.iter().filter(|(w, _)| w == who).count() as u64
    }

    /// The counts now include `revision`: sessions written up to it are
    /// counted by their records.
    fn reached(&mut self, revision: i64) {
        self.revision = self.revision.max(revision);
        let now = self.revision;
        self.opened.retain(|(_, r)| *r > now);
    }

    fn delete(&mut self, key: &str) {
        if let Some(owner) = self.sessions.remove(key) {
            bump(&mut self.sessions_by_identity, &owner, false);
        } else if let Some((owner, ns)) = self.holds.remove(key) {
            bump(&mut self.holds_by_identity, &owner, false);
            bump(&mut self.holds_by_namespace, &ns, false);
        } else if let Some(ns) = self.waiters.remove(key) {
            bump(&mut self.waiters_by_namespace, &ns, false);
        }
    }
}

impl Ledger {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that this arbiter committed a session or a grant at `revision`.
    pub fn wrote(&self, revision: i64) {
        self.wrote.fetch_max(revision, Ordering::Relaxed);
    }

    /// Waits (at most [`CATCH_UP`]) until the counts include this arbiter's
    /// own latest write, so one client's calls through one arbiter see each
    /// other's sessions and holds.
    async fn caught_up(&self) {
        let target = self.wrote.load(Ordering::Relaxed);
        let mut seen = self.seen.subscribe();
        let _ = tokio::time::timeout(CATCH_UP, seen.wait_for(|r| *r >= target)).await;
    }

    /// Holds of `who`, and holds in `namespace`.
    pub fn holds_of(&self, who: &str, namespace: &str) -> (u64, u64) {
        let c = self.counts();
        (c.holds_by_identity.get(who).copied().unwrap_or(0), c.holds_by_namespace.get(namespace).copied().unwrap_or(0))
    }

    pub fn holds_in(&self, namespace: &str) -> u64 {
        self.counts().holds_by_namespace.get(namespace).copied().unwrap_or(0)
    }

    /// Durable waiters queued in `namespace`, and whether the record `key`
    /// is one of them.
    fn waiters_in(&self, namespace: &str, key: &str) -> (u64, bool) {
        let c = self.counts();
        (c.waiters_by_namespace.get(namespace).copied().unwrap_or(0), c.waiters.contains_key(key))
    }

    /// Replaces the view with a fresh listing; returns the revision to watch
    /// from.
    pub async fn load(&self, etcd: &Etcd) -> Result<i64, etcd_client::Error> {
        let resp = etcd.get(layout::HOLD_PREFIX, Some(GetOptions::new().with_range(RANGE_END))).await?;
        let mut fresh = Counts::default();
        for kv in resp.kvs() {
            if let Ok(key) = kv.key_str() {
                fresh.put(key, kv.value());
            }
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut c = self.counts();
        fresh.opening = std::mem::take(&mut c.opening);
        fresh.opened = std::mem::take(&mut c.opened);
        fresh.reached(revision);
        *c = fresh;
        drop(c);
        self.seen.send_replace(revision);
        Ok(revision + 1)
    }

    fn apply(&self, resp: &etcd_client::WatchResponse) {
        let mut c = self.counts();
        let mut last = resp.header().map_or(0, |h| h.revision());
        for e in resp.events() {
            let Some(kv) = e.kv() else { continue };
            last = last.max(kv.mod_revision());
            let Ok(key) = KeyValue::key_str(kv) else { continue };
            match e.event_type() {
                EventType::Put => c.put(key, kv.value()),
                EventType::Delete => c.delete(key),
            }
        }
        c.reached(last);
        drop(c);
        self.seen.send_if_modified(|r| {
            let newer = last > *r;
            *r = (*r).max(last);
            newer
        });
    }
}

/// Follows the watch from `from` (0: list first) until the process ends;
/// after a watch error or a compaction it lists again and resumes from that
/// listing, so whatever happened in between (a compaction, a restore) is
/// counted from etcd's state, not replayed.
pub async fn run(etcd: Etcd, limits: Arc<Limits>, at: usize, mut from: i64) {
    let Some(ledger) = limits.ledgers.get(at) else { return };
    loop {
        if from <= 0 {
            match ledger.load(&etcd).await {
                Ok(next) => from = next,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list sessions and holds for the quotas; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let opts = WatchOptions::new().with_range(RANGE_END).with_start_revision(from);
        match etcd.watch.clone().watch(layout::HOLD_PREFIX, Some(opts)).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => break,
                    Ok(Some(resp)) => ledger.apply(&resp),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "quota watch ended; listing again");
                        break;
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "cannot open the quota watch; retrying"),
        }
        from = 0;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every few seconds: the hold count and quota of each class's namespace
/// (per class, from the published set), and forgetting idle rate buckets.
pub async fn export(limits: Arc<Limits>, policy: Arc<crate::policy::Policy>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        limits.forget_idle();
        let m = &*crate::metrics::METRICS;
        for class in policy.classes() {
            let labels = m.class_labels(&class);
            m.holds.get_or_create(&labels).set(limits.holds_in(&class.namespace) as i64);
            m.holds_quota.get_or_create(&labels).set(limits.config.max_holds_in(&class.namespace) as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(who: &str) -> Vec<u8> {
        layout::encode(&SessionRecord { spiffe_id: who.into(), ttl_secs: 10, coord: false })
    }

    fn hold(who: &str) -> Vec<u8> {
        layout::encode(&HoldRecord { spiffe_id: who.into(), session: 1, epoch: 1, granted_unix_ms: 0 })
    }

    #[test]
    fn counts_follow_puts_and_deletes_and_a_rewrite_counts_once() {
        let mut c = Counts::default();
        c.put("/s/0000000000000001", &session("a"));
        c.put("/s/0000000000000002", &session("a"));
        c.put("/l/pay/x", &hold("a"));
        c.put("/l/pay/y/z", &hold("b"));
        c.put("/l/pay/x", &hold("a"));
        c.put("/q/pay/x/0000000000000003", b"waiter");
        assert_eq!(c.sessions_by_identity["a"], 2);
        assert_eq!(c.holds_by_identity["a"], 1, "a rewritten hold is still one hold");
        assert_eq!(c.holds_by_namespace["pay"], 2);
        c.delete("/l/pay/x");
        c.delete("/l/pay/x");
        c.delete("/s/0000000000000001");
        c.delete("/q/pay/x/0000000000000003");
        assert_eq!(c.sessions_by_identity["a"], 1);
        assert!(!c.holds_by_identity.contains_key("a"));
        assert_eq!(c.holds_by_namespace["pay"], 1);
    }

    #[test]
    fn a_record_that_does_not_decode_is_not_counted() {
        let mut c = Counts::default();
        c.put("/s/0000000000000001", b"not json");
        c.put("/l/pay/x", b"{}");
        assert!(c.sessions.is_empty() && c.holds.is_empty());
    }

    #[tokio::test]
    async fn a_session_counts_from_its_check_until_the_watch_delivers_it() {
        let config = LimitsConfig { max_sessions_per_identity: 2, ..LimitsConfig::default() };
        let limits = Limits::new(config, 1);
        limits.ledgers[0].counts().reached(5);
        let first = limits.session_quota("a", 0).await.unwrap();
        let second = limits.session_quota("a", 0).await.unwrap();
        let e = limits.session_quota("a", 0).await.unwrap_err();
        assert!(e.message.contains("a has 2 sessions open"), "two checked, unwritten opens count: {}", e.message);
        assert!(limits.session_quota("b", 0).await.is_ok(), "slots are per identity");

        // An open that failed frees its slot.
        drop(second);
        let second = limits.session_quota("a", 0).await.unwrap();

        // Written at revision 7: counted until the counts include 7, then by
        // its record (not twice).
        first.opened(7);
        second.opened(8);
        assert!(limits.session_quota("a", 0).await.is_err(), "written, not yet watched");
        {
            let mut c = limits.ledgers[0].counts();
            c.put("/s/0000000000000007", &session("a"));
            c.reached(7);
            assert_eq!(c.sessions_by_identity["a"] + c.sessions_coming("a"), 2);
            c.reached(8);
            assert_eq!(c.sessions_by_identity["a"] + c.sessions_coming("a"), 1, "the record at 8 never came (closed at once)");
        }
        assert!(limits.session_quota("a", 0).await.is_ok());

        // Written at a revision the watch already passed: only its record counts.
        let late = limits.session_quota("b", 0).await.unwrap();
        late.opened(3);
        assert_eq!(limits.ledgers[0].counts().sessions_coming("b"), 0);
    }

    #[tokio::test]
    async fn quotas_count_every_cluster_together() {
        let config = LimitsConfig { max_sessions_per_identity: 2, max_holds_per_namespace: 2, ..LimitsConfig::default() };
        let limits = Limits::new(config, 2);
        limits.ledgers[0].counts().put("/s/0000000000000001", &session("a"));
        let coord = limits.session_quota("a", 1).await.unwrap();
        let e = limits.session_quota("a", 0).await.unwrap_err();
        assert!(e.message.contains("has 2 sessions open"), "one on each cluster: {}", e.message);
        drop(coord);
        assert!(limits.session_quota("a", 0).await.is_ok(), "a dropped slot frees its place");
        limits.ledgers[0].counts().put("/l/jobs/x", &hold("a"));
        limits.ledgers[1].counts().put("/l/jobs/y", &hold("b"));
        let e = limits.hold_quota("c", &LockKey::new("jobs", "z").unwrap()).await.unwrap_err();
        assert!(e.message.contains("has 2 holds"), "{}", e.message);
        assert_eq!(limits.holds_in("jobs"), 2);
    }

    #[tokio::test]
    async fn refusals_name_the_limit() {
        let config = LimitsConfig {
            requests_per_second: 1,
            request_burst: 2,
            max_sessions_per_identity: 1,
            max_holds_per_identity: 5,
            max_holds_per_namespace: 1,
            max_durable_waiters_per_namespace: 2,
            namespaces: [("big".to_string(), holdfast_config::arbiter::NamespaceLimits { max_holds: 3 })].into(),
            ..LimitsConfig::default()
        };
        let limits = Limits::new(config, 1);
        assert!(limits.admit("a").is_ok() && limits.admit("a").is_ok());
        let e = limits.admit("a").unwrap_err();
        assert_eq!(e.reason, holdfast_proto::ErrorReason::RateLimited);
        assert!(e.message.contains("limits.requests_per_second = 1"), "{}", e.message);
        assert!(limits.admit("b").is_ok(), "buckets are per identity");

        limits.ledgers[0].counts().put("/s/0000000000000001", &session("a"));
        let e = limits.session_quota("a", 0).await.unwrap_err();
        assert!(e.message.contains("limits.max_sessions_per_identity = 1"), "{}", e.message);
        assert!(limits.session_quota("b", 0).await.is_ok());

        limits.ledgers[0].counts().put("/l/small/x", &hold("a"));
        limits.ledgers[0].counts().put("/l/big/x", &hold("a"));
        let small = LockKey::new("small", "y").unwrap();
        let big = LockKey::new("big", "y").unwrap();
        let e = limits.hold_quota("b", &small).await.unwrap_err();
        assert_eq!(e.reason, holdfast_proto::ErrorReason::Quota);
        assert!(e.message.contains("limits.max_holds_per_namespace = 1"), "{}", e.message);
        assert!(limits.hold_quota("b", &big).await.is_ok(), "big has its own quota of 3");
        limits.ledgers[0].counts().put("/l/big/y", &hold("a"));
        limits.ledgers[0].counts().put("/l/big/z", &hold("a"));
        let e = limits.hold_quota("b", &big).await.unwrap_err();
        assert!(e.message.contains("limits.namespaces.big.max_holds = 3"), "{}", e.message);

        // Durable waiters per namespace; a waiter already recorded keeps its place.
        let jobs = LockKey::new("jobs", "k").unwrap();
        limits.ledgers[0].counts().put("/q/jobs/k/0000000000000001", b"a");
        assert!(limits.waiter_quota(&jobs, "/q/jobs/k/0000000000000002").await.is_ok());
        limits.ledgers[0].counts().put("/q/jobs/k/0000000000000002", b"a");
        limits.ledgers[0].counts().put("/q/jobs/k/0000000000000002", b"a");
        let e = limits.waiter_quota(&jobs, "/q/jobs/k/0000000000000003").await.unwrap_err();
        assert_eq!(e.reason, holdfast_proto::ErrorReason::Quota);
        assert!(e.message.contains("has 2 durable waiters queued, limits.max_durable_waiters_per_namespace = 2"), "{}", e.message);
        assert!(limits.waiter_quota(&jobs, "/q/jobs/k/0000000000000002").await.is_ok(), "a recorded waiter retrying");
        assert!(limits.waiter_quota(&small, "/q/small/y/0000000000000003").await.is_ok(), "another namespace");
        limits.ledgers[0].counts().delete("/q/jobs/k/0000000000000001");
        assert!(limits.waiter_quota(&jobs, "/q/jobs/k/0000000000000003").await.is_ok(), "a waiter that left frees its place");
    }
}

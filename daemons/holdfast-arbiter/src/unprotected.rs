//! Fail-open: what keys of `on_quorum_loss = "open"` classes get while
//! etcd is out of reach (the quorum-loss ADR).
//!
//! Once a cluster has been unverified for `fail_open.after` (etcd not
//! answering, or fewer than a majority of its members answering, so no
//! grant can commit), this arbiter opens sessions of open classes in its own
//! memory and grants their keys from it with **token 0**: one holder per
//! key within this arbiter, none across arbiters. Every other class is
//! refused throughout, as before the bound. Each grant and each end of an
//! unprotected hold is appended to the spool ([`crate::spool`]) and fsync'd
//! before it is answered; the spool is shipped to the audit store with
//! `unprotected = true` once etcd is back.
//!
//! An unprotected session lives only while the outage does: the first
//! sweep after the cluster serves again ends it, and every hold on it (an
//! `end` record, `why = "quorum_back"`), and its next keepalive answers TTL
//! 0, so its client drains and fences as for any lost session and opens a
//! protected one. A session not renewed within its TTL ends the same way
//! (`why = "expired"`).
//!
//! Its ID is a random lease-shaped number with the tier bit of
//! [`crate::cluster::session_id`], known only to this arbiter; every call
//! with it is answered here, before anything is asked of etcd.

use crate::Refusal;
use crate::cluster::{self, Cluster, Clusters};
use crate::spool::{Entry, Event, Spool, SpoolError};
use holdfast_model::LockKey;
use holdfast_policy::{Class, OnQuorumLoss, Tier};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often unprotected sessions are checked for expiry and for the end of
/// the outage.
pub const SWEEP: Duration = Duration::from_millis(250);

struct Local {
    identity: String,
    tier: Tier,
    /// The class it was opened for (its holds may be of any open class of
    /// the same TTL and tier).
    class: String,
    ttl: Duration,
    /// The session ends when this passes without a keepalive.
    deadline: Instant,
}

#[derive(Default)]
struct State {
    sessions: HashMap<u64, Local>,
    /// Held keys (`namespace/key`): the session holding each, the key and
    /// its class.
    holds: HashMap<String, (u64, LockKey, String)>,
    /// Sessions that ended lately: a keepalive for one answers TTL 0 (not
    /// an error, which would end the client's whole keepalive stream).
    ended: std::collections::HashSet<u64>,
}

/// Ended sessions remembered; the set starts again when it reaches this.
const ENDED_KEPT: usize = 100_000;

pub struct Unprotected {
    after: Duration,
    spool: Arc<Mutex<Spool>>,
    state: Mutex<State>,
    freed: Notify,
    /// No shipping attempt before this (after one failed).
    ship_after: Mutex<Option<Instant>>,
}

/// After a failed attempt to ship the spool, the next waits this long.
const SHIP_BACKOFF: Duration = Duration::from_secs(2);

impl Unprotected {
    /// Takes over the spool found at start: a hold it shows granted and not
    /// ended was open when this arbiter last stopped, and lived only in its
    /// memory, so it is ended now (`why = "arbiter_restart"`).
    pub fn new(after: Duration, mut spool: Spool) -> Result<Self, String> {
        let (entries, _) = spool.records()?;
        for g in crate::spool::open_grants(&entries) {
            spool.end(Entry { event: Event::End, why: "arbiter_restart".into(), ..g }).map_err(|e| e.to_string())?;
        }
        crate::metrics::METRICS.spool_bytes.get_or_create(crate::metrics::METRICS.labels()).set(spool.len() as i64);
        Ok(Unprotected {
            after,
            spool: Arc::new(Mutex::new(spool)),
            state: Mutex::new(State::default()),
            freed: Notify::new(),
            ship_after: Mutex::new(None),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when `c` has been out of reach for longer than the bound.
    pub fn outage(&self, c: &Cluster) -> bool {
        c.guard.unverified_for().is_some_and(|d| d >= self.after)
    }

    /// True when `class` is granted from memory now, on cluster `c`.
    pub fn applies(&self, c: &Cluster, class: &Class) -> bool {
        #[cfg(feature = "mutations")]
        if holdfast_store::mutation::on(&holdfast_store::mutation::FAIL_OPEN_ANY_CLASS) {
            return self.outage(c);
        }
        class.on_quorum_loss == OnQuorumLoss::Open && self.outage(c)
    }

    /// True when `id` is one of this arbiter's unprotected sessions.
    pub fn is_local(&self, id: u64) -> bool {
        self.state().sessions.contains_key(&id)
    }

    /// Opens an unprotected session of `class` for `who`: its wire ID.
    /// `who` may have at most `max` unprotected sessions open.
    pub fn open(&self, who: &str, class: &Class, max: u64) -> Result<u64, Refusal> {
        let mut state = self.state();
        let open = state.sessions.values().filter(|s| s.identity == who).count() as u64;
        if open >= max {
            return Err(Refusal::quota(format!(
                "{who} has {open} unprotected sessions open, limits.max_sessions_per_identity = {max}; close one (or reuse one) first"
            )));
        }
        loop {
            let lease = (rand::random::<u64>() >> 2) as i64;
            let id = cluster::session_id(class.tier, lease);
            if lease == 0 || state.sessions.contains_key(&id) {
                continue;
            }
            state.sessions.insert(
                id,
                Local {
                    identity: who.to_string(),
                    tier: class.tier,
                    class: class.name.clone(),
                    ttl: class.ttl,
                    deadline: Instant::now() + class.ttl,
                },
            );
            tracing::warn!(identity = who, class = %class.name, "unprotected session opened: etcd out of reach, class fails open");
            return Ok(id);
        }
    }

    /// Renews `id` if it is an unprotected session: its TTL, or 0 if it
    /// ended lately; None for any other session (renewed through etcd).
    pub fn renew(&self, id: u64, who: &str) -> Result<Option<Duration>, Refusal> {
        let mut state = self.state();
        let ended = state.ended.contains(&id);
        match state.sessions.get_mut(&id) {
            Some(s) if s.identity == who => {
                s.deadline = Instant::now() + s.ttl;
                Ok(Some(s.ttl))
            }
            Some(_) => Err(not_found(id)),
            None if ended => Ok(Some(Duration::ZERO)),
            None => Ok(None),
        }
    }

    /// Grants `key` (of `class`) to the unprotected session `id`, waiting
    /// until `deadline` while another of this arbiter's unprotected
    /// sessions holds it. Spooled (fsync'd) before it returns.
    pub async fn acquire(&self, c: &Cluster, id: u64, who: &str, key: &LockKey, class: &Class, deadline: Instant) -> Result<(), Refusal> {
        let name = key.to_string();
        loop {
            let freed = self.freed.notified();
            if self.claim(c, id, who, key, &name, class)? {
                return self.grant(c, id, who, key, class).await;
            }
            if Instant::now() >= deadline {
                return Err(Refusal::contention(key));
            }
            let _ = tokio::time::timeout_at(deadline, freed).await;
        }
    }

    /// Claims `key` for session `id` if it is free (true); false while
    /// another session holds it. Claimed under the lock, so a second caller
    /// waits instead of spooling a second grant of the key.
    fn claim(&self, c: &Cluster, id: u64, who: &str, key: &LockKey, name: &str, class: &Class) -> Result<bool, Refusal> {
        let mut state = self.state();
        let Some(s) = state.sessions.get(&id).filter(|s| s.identity == who) else { return Err(not_found(id)) };
        if !self.applies(c, class) {
            if class.on_quorum_loss != OnQuorumLoss::Open {
                return Err(Refusal::not_serving(&format!(
                    "class {} has on_quorum_loss = \"closed\" and etcd is out of reach; only open classes are granted without it",
                    class.name
                )));
            }
            return Err(Refusal::new(
                tonic::Code::NotFound,
                holdfast_proto::ErrorReason::SessionNotFound,
                "etcd is back within reach: unprotected sessions have ended; open a new session (it will be protected)",
            ));
        }
        // Like a protected session: any class of its TTL and tier (here,
        // any open one).
        if s.tier != class.tier || s.ttl != class.ttl {
            return Err(Refusal::invalid(
                "session_id",
                format!(
                    "is an unprotected session of TTL {}s; key {key} is of class {} (TTL {}s): open a session for its namespace",
                    s.ttl.as_secs(),
                    class.name,
                    class.ttl.as_secs()
                ),
            ));
        }
        match state.holds.get(name) {
            Some((holder, ..)) if *holder == id => Err(Refusal::invalid("key", format!("{key} is already held by this session"))),
            Some(_) => Ok(false),
            None => {
                state.holds.insert(name.to_string(), (id, key.clone(), class.name.clone()));
                Ok(true)
            }
        }
    }

    /// Spools the grant of `key`, already claimed for `id`; the claim is
    /// given back if the spool refuses.
    async fn grant(&self, c: &Cluster, id: u64, who: &str, key: &LockKey, class: &Class) -> Result<(), Refusal> {
        let entry = entry(c, id, who, key, &class.name, Event::Grant, "");
        let spooled = self.spool_with(move |s| s.grant(entry)).await;
        if let Err(e) = spooled {
            self.state().holds.remove(&key.to_string());
            self.freed.notify_waiters();
            return Err(spool_refusal(e));
        }
        crate::metrics::inc_class(|m| &m.unprotected_granted, class);
        tracing::warn!(identity = who, class = %class.name, namespace = key.namespace(), "unprotected grant (token 0) spooled");
        Ok(())
    }

    /// Releases `key` if the unprotected session `id` holds it.
    pub async fn release(&self, c: &Cluster, id: u64, who: &str, key: &LockKey) -> Result<bool, Refusal> {
        let class = {
            let mut state = self.state();
            if state.sessions.get(&id).is_none_or(|s| s.identity != who) {
                return Err(not_found(id));
            }
            match state.holds.remove(&key.to_string()) {
                Some((holder, _, class)) if holder == id => class,
                Some(other) => {
                    state.holds.insert(key.to_string(), other);
                    return Ok(false);
                }
                None => return Ok(false),
            }
        };
        self.end(c, id, who, key, &class, Event::Release, "").await?;
        Ok(true)
    }

    /// Ends the unprotected session `id` and releases its holds.
    pub async fn close(&self, clusters: &Clusters, id: u64, who: &str) -> Result<(), Refusal> {
        if self.state().sessions.get(&id).is_none_or(|s| s.identity != who) {
            return Err(not_found(id));
        }
        self.end_session(clusters, id, Event::Release, "").await
    }

    /// Ends sessions past their deadline, and every session whose cluster
    /// serves again; keeps the metrics in step (`classes`: the class set in
    /// force); ships the spool once no cluster is out of reach.
    pub async fn sweep(&self, clusters: &Clusters, classes: &[Class]) {
        let now = Instant::now();
        let ending: Vec<(u64, &'static str)> = self
            .state()
            .sessions
            .iter()
            .filter_map(|(id, s)| {
                if !self.outage(clusters.of(s.tier)) {
                    Some((*id, "quorum_back"))
                } else if s.deadline <= now {
                    Some((*id, "expired"))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in ending {
            if let Err(e) = self.end_session(clusters, id, Event::End, why).await {
                tracing::error!(error = %e.message, "could not spool the end of an unprotected session; it stays open and is retried");
            }
        }
        let out: Vec<&Arc<Cluster>> = clusters.all().into_iter().filter(|c| self.outage(c)).collect();
        // Granting from memory: a cluster out of reach holds an open class.
        let granting =
            classes.iter().any(|k| k.on_quorum_loss == OnQuorumLoss::Open && out.iter().any(|c| Arc::ptr_eq(c, clusters.of(k.tier))));
        let m = &*crate::metrics::METRICS;
        m.fail_open.get_or_create(m.labels()).set(i64::from(granting));
        if out.is_empty() {
            self.ship(clusters).await;
        }
    }

    /// Ships the spool once no unprotected session is left and every
    /// cluster its records name serves again: each record is put at
    /// `/sys/unprotected/<spool>/<seq>` on its cluster, compared absent (a
    /// record shipped before a crash is not stored twice), then the spool
    /// is emptied if nothing was appended meanwhile. A failure leaves the
    /// spool as it is, for another try after [`SHIP_BACKOFF`].
    async fn ship(&self, clusters: &Clusters) {
        if !self.state().sessions.is_empty() {
            return;
        }
        if self.ship_after.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|t| Instant::now() < t) {
            return;
        }
        let records = {
            let spool = self.spool.lock().unwrap_or_else(|e| e.into_inner());
            if spool.is_empty() {
                return;
            }
            spool.records()
        };
        let (entries, len) = match records {
            Ok(r) => r,
            Err(e) => return self.ship_failed(&e),
        };
        let target = |e: &Entry| clusters.all().into_iter().find(|c| c.name() == e.cluster).unwrap_or(&clusters.entity).clone();
        if entries.iter().any(|e| !matches!(target(e).guard.state(), crate::seal::Serve::Serving(_))) {
            return;
        }
        let mut stored = 0;
        for e in &entries {
            let key = holdfast_model::layout::unprotected_key(&e.spool, e.seq);
            let value = serde_json::to_vec(e).unwrap_or_default();
            let txn = etcd_client::Txn::new()
                .when([etcd_client::Compare::version(key.as_str(), etcd_client::CompareOp::Equal, 0)])
                .and_then([etcd_client::TxnOp::put(key.as_str(), value, None)]);
            match target(e).etcd.txn(txn).await {
                Ok(r) => stored += usize::from(r.succeeded()),
                Err(err) => return self.ship_failed(&format!("etcd refused {key}: {err}")),
            }
        }
        #[cfg(feature = "mutations")]
        fault::exit_after_ship();
        let emptied = self.spool.lock().unwrap_or_else(|e| e.into_inner()).shipped_up_to(len);
        match emptied {
            Ok(emptied) => {
                tracing::warn!(
                    records = entries.len(),
                    stored,
                    emptied,
                    "fail-open spool shipped to /sys/unprotected/ for the audit trail (records already there were not stored again)"
                );
                let m = &*crate::metrics::METRICS;
                m.spool_bytes.get_or_create(m.labels()).set(if emptied { 0 } else { len as i64 });
            }
            Err(e) => self.ship_failed(&e),
        }
    }

    fn ship_failed(&self, why: &str) {
        tracing::error!(error = why, "could not ship the fail-open spool; it is kept and tried again");
        *self.ship_after.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + SHIP_BACKOFF);
    }

    /// Ends session `id`: taken out of memory with its holds at once (so a
    /// concurrent release cannot spool a second end of one of them), then
    /// each hold's end spooled. If the spool fails, what is not yet spooled
    /// is put back, for the next sweep.
    async fn end_session(&self, clusters: &Clusters, id: u64, event: Event, why: &str) -> Result<(), Refusal> {
        let (session, mut keys) = {
            let mut state = self.state();
            let Some(s) = state.sessions.remove(&id) else { return Ok(()) };
            let keys: Vec<String> = state.holds.iter().filter(|(_, (h, ..))| *h == id).map(|(n, _)| n.clone()).collect();
            let keys: Vec<(String, (u64, LockKey, String))> = keys.into_iter().filter_map(|n| state.holds.remove_entry(&n)).collect();
            (s, keys)
        };
        let (who, class) = (session.identity.clone(), session.class.clone());
        let c = clusters.of(session.tier);
        while let Some((name, (_, key, held_class))) = keys.pop() {
            if let Err(e) = self.end(c, id, &who, &key, &held_class, event, why).await {
                let mut state = self.state();
                state.holds.insert(name, (id, key, held_class));
                state.holds.extend(keys);
                state.sessions.insert(id, session);
                return Err(e);
            }
        }
        {
            let mut state = self.state();
            if state.ended.len() >= ENDED_KEPT {
                state.ended.clear();
            }
            state.ended.insert(id);
        }
        self.freed.notify_waiters();
        tracing::warn!(identity = %who, class = %class, why = if why.is_empty() { "closed" } else { why }, "unprotected session ended");
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn end(&self, c: &Cluster, id: u64, who: &str, key: &LockKey, class: &str, event: Event, why: &str) -> Result<(), Refusal> {
        let entry = entry(c, id, who, key, class, event, why);
        self.spool_with(move |s| s.end(entry)).await.map_err(spool_refusal)?;
        self.freed.notify_waiters();
        Ok(())
    }

    /// Runs a spool append (it fsyncs) off the async threads.
    async fn spool_with(&self, f: impl FnOnce(&mut Spool) -> Result<Entry, SpoolError> + Send + 'static) -> Result<Entry, SpoolError> {
        let spool = self.spool.clone();
        let r = tokio::task::spawn_blocking(move || {
            let mut s = spool.lock().unwrap_or_else(|e| e.into_inner());
            let r = f(&mut s);
            (r, s.len())
        })
        .await;
        match r {
            Ok((r, len)) => {
                crate::metrics::METRICS.spool_bytes.get_or_create(crate::metrics::METRICS.labels()).set(len as i64);
                r
            }
            Err(e) => Err(SpoolError::Io { path: "unprotected.spool".into(), error: std::io::Error::other(e.to_string()) }),
        }
    }
}

fn entry(c: &Cluster, id: u64, who: &str, key: &LockKey, class: &str, event: Event, why: &str) -> Entry {
    Entry {
        spool: String::new(),
        seq: 0,
        event,
        at_unix_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        cluster: c.name().to_string(),
        namespace: key.namespace().to_string(),
        key: key.key().to_string(),
        class: class.to_string(),
        identity: who.to_string(),
        session: id,
        why: why.to_string(),
    }
}

fn not_found(id: u64) -> Refusal {
    Refusal::session_not_found((id & !cluster::COORD_SESSION) as i64)
}

fn spool_refusal(e: SpoolError) -> Refusal {
    match e {
        SpoolError::Full { .. } => Refusal::quota(e.to_string()),
        SpoolError::Io { .. } => Refusal::not_serving(&e.to_string()),
    }
}

/// Test builds only (the `mutations` feature): with
/// `HOLDFAST_FAULT_EXIT_AFTER_SHIP=1` in its environment the arbiter exits
/// (status 86, as a crash would leave it) right after shipping its spool and
/// before emptying it, so a test can prove the next start ships nothing
/// twice. A build without the feature has none of this code.
#[cfg(feature = "mutations")]
mod fault {
    pub fn exit_after_ship() {
        if std::env::var("HOLDFAST_FAULT_EXIT_AFTER_SHIP").is_ok_and(|v| v == "1") {
            eprintln!("HOLDFAST_FAULT_EXIT_AFTER_SHIP: exiting after shipping the spool, before emptying it");
            std::process::exit(86);
        }
    }
}

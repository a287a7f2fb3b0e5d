//! The `Locker`: what a workload uses.
//!
//! - **One session per TTL** (design decision "How is renewal traffic kept
//!   from dominating the write path?"): every hold of a TTL is attached to
//!   the same session, so one keepalive stream renews them all and losing the
//!   session ends them all in one committed entry. A hold never has a lease
//!   of its own.
//! - **Drain, then fence** ("What does a holder do when it cannot renew…"):
//!   at the first failed keepalive [`LockGuard::can_start`] turns false; at
//!   the local deadline (see [`crate::session`]) the `on_fence` callback,
//!   required at construction, receives every key the session held.
//! - **Re-entrancy** ("Where is the re-entrant hold count kept?"): nested
//!   acquisitions of a key in one session are counted here; only the
//!   outermost acquire and the final release reach the arbiter.
//! - **Key affinity**: each key goes to the arbiter ranked first for it by
//!   rendezvous hashing ([`crate::affinity`]), the next one if it is down.
//! - **A release without an answer blocks the key**: a release that reached
//!   no arbiter, or got no answer, may still be applied later. Until an
//!   attempt is answered, every acquire of that key in the session sends
//!   the release again first, and fails if that is not answered either
//!   (unavailable, or the arbiter's refusal). A release whose future is
//!   dropped before its answer (a timeout around it) counts as unanswered
//!   too. Without this the arbiter would hand the same session its
//!   still-live hold back, and the late release would then delete the hold
//!   the caller believes it has: two holders.

use crate::affinity::ranked;
use crate::session::{Health, Session};
use crate::{Client, ClientConfig, Error, ErrorReason};
use holdfast_model::{LockKey, Token};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the arbiters are, and this workload's mTLS material.
#[derive(Debug, Clone)]
pub struct LockerConfig {
    /// Every arbiter, `host:port`. The order does not matter: all clients
    /// with the same set route each key to the same arbiter.
    pub endpoints: Vec<String>,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Handed to `on_fence` when a session's local deadline passes: every key
/// it held must be treated as lost. Stop acting on them now.
#[derive(Debug, Clone)]
pub struct Fenced {
    pub ttl: Duration,
    pub session_id: u64,
    pub keys: Vec<LockKey>,
}

/// How to acquire.
#[derive(Debug, Clone, Copy)]
pub struct AcquireOptions {
    /// Session TTL. `None` (the default): the TTL of the key's class, which
    /// is the only TTL the arbiter accepts for it; a different value is
    /// refused naming the class. Holds of one TTL and one tier (the class's
    /// `tier`: a session lives on one) share one session.
    pub ttl: Option<Duration>,
    /// How long to wait while another session holds the key (0: try once).
    /// Whether the wait is durable (its order survives an arbiter restart)
    /// is the key's class's `fairness`, not the caller's choice.
    pub wait: Duration,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions { ttl: None, wait: Duration::ZERO }
    }
}

type FenceFn = dyn Fn(Fenced) + Send + Sync;

struct Entry {
    token: Token,
    count: u32,
    via: usize,
}

/// A final release sent without a definite answer (the hold it names may or
/// may not be gone).
struct Unanswered {
    token: Token,
    via: usize,
}

struct Slot {
    session: Session,
    /// The arbiter (index into the endpoints) the session was opened on:
    /// the only one that knows an unprotected session.
    home: usize,
    holds: Mutex<HashMap<LockKey, Entry>>,
    releasing: Mutex<HashMap<LockKey, Unanswered>>,
    key_locks: Mutex<HashMap<LockKey, Arc<tokio::sync::Mutex<()>>>>,
}

impl Slot {
    fn key_lock(&self, key: &LockKey) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.key_locks).entry(key.clone()).or_default().clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    endpoints: Vec<String>,
    clients: Vec<Client>,
    slots: tokio::sync::Mutex<HashMap<SlotKey, Arc<Slot>>>,
    /// The class TTL and tier of each namespace a session was opened for.
    class_ttls: Mutex<HashMap<String, SlotKey>>,
    on_fence: Arc<FenceFn>,
}

/// One session per (TTL, tier): a class's keys live on its tier's etcd
/// cluster, and a session lives on one of them.
type SlotKey = (Duration, String);

/// Takes locks for one workload identity. Cheap to clone.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

/// A held lock. Call [`LockGuard::release`]; dropping a guard keeps the
/// hold until its session ends.
pub struct LockGuard {
    slot: Arc<Slot>,
    inner: Arc<Inner>,
    key: LockKey,
    token: Token,
}

fn unavailable(e: &Error) -> bool {
    e.reason() == Some(ErrorReason::Unavailable)
}

impl Locker {
    /// `on_fence` is required: it is how the library tells you to stop.
    pub fn new(config: LockerConfig, on_fence: impl Fn(Fenced) + Send + Sync + 'static) -> Result<Self, Error> {
        if config.endpoints.is_empty() {
            return Err(Error::Config("no arbiter endpoints configured".into()));
        }
        let clients = config
            .endpoints
            .iter()
            .map(|e| {
                Client::connect_lazy(&ClientConfig {
                    endpoint: e.clone(),
                    ca: config.ca.clone(),
                    cert: config.cert.clone(),
                    key: config.key.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Locker {
            inner: Arc::new(Inner {
                endpoints: config.endpoints,
                clients,
                slots: Default::default(),
                class_ttls: Default::default(),
                on_fence: Arc::new(on_fence),
            }),
        })
    }

    /// Which endpoint (index into the configured list) serves `key` first.
    pub fn home_of(&self, key: &LockKey) -> usize {
        ranked(&key.to_string(), &self.inner.endpoints)[0]
    }

    /// The session used for holds of `key`'s class TTL (or `ttl`), opening
    /// it if needed: a new session is opened for the key's namespace, so the
    /// arbiter says the class's TTL (and refuses a `ttl` that differs).
    async fn slot(&self, key: &LockKey, ttl: Option<Duration>) -> Result<Arc<Slot>, Error> {
        let mut slots = self.inner.slots.lock().await;
        // The namespace's class, once a session was opened for it: its tier,
        // and its TTL unless `ttl` says another (the arbiter refuses that).
        let known = lock(&self.inner.class_ttls).get(key.namespace()).cloned().map(|(t, tier)| (ttl.unwrap_or(t), tier));
        if let Some(k) = &known
            && let Some(s) = slots.get(k)
            && *s.session.health().borrow() != Health::Lost
        {
            return Ok(s.clone());
        }
        // Sessions are spread by TTL and tier (or namespace, until its class
        // is known) over the arbiters, with failover.
        let spread = match &known {
            Some((ttl, tier)) if tier == "entity" => format!("session/{}", ttl.as_millis()),
            Some((ttl, tier)) => format!("session/{}/{tier}", ttl.as_millis()),
            None => format!("session/{}", key.namespace()),
        };
        let asked = ttl.or(known.as_ref().map(|k| k.0));
        let order = ranked(&spread, &self.inner.endpoints);
        let mut last = None;
        for (n, i) in order.iter().enumerate() {
            let others: Vec<Client> =
                order.iter().skip(n + 1).chain(order.iter().take(n)).map(|j| self.inner.clients[*j].clone()).collect();
            match self.inner.clients[*i].open_session_with(asked.unwrap_or_default(), key.namespace(), others, None).await {
                Ok(session) => {
                    let k: SlotKey = (session.ttl(), session.tier().to_string());
                    lock(&self.inner.class_ttls).insert(key.namespace().to_string(), k.clone());
                    // Opened only to learn the class's TTL and tier, which a
                    // live session already has: keep that one (one session
                    // per TTL and tier).
                    if let Some(s) = slots.get(&k)
                        && *s.session.health().borrow() != Health::Lost
                    {
                        let _ = session.close().await;
                        return Ok(s.clone());
                    }
                    let slot = Arc::new(Slot {
                        session,
                        home: *i,
                        holds: Default::default(),
                        releasing: Default::default(),
                        key_locks: Default::default(),
                    });
                    slots.insert(k.clone(), slot.clone());
                    tokio::spawn(fence_when_lost(self.inner.clone(), k, slot.clone()));
                    return Ok(slot);
                }
                Err(e) if unavailable(&e) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("no arbiter endpoints".into())))
    }

    /// Ends every session of this locker (and so every hold), each in one
    /// committed entry. No fence is delivered for holds ended this way.
    pub async fn close(&self) -> Result<(), Error> {
        let slots: Vec<Arc<Slot>> = self.inner.slots.lock().await.drain().map(|(_, s)| s).collect();
        let mut result = Ok(());
        for slot in slots {
            lock(&slot.holds).clear();
            lock(&slot.releasing).clear();
            if let Err(e) = slot.session.close().await {
                result = Err(e);
            }
        }
        result
    }

    /// Acquires `key`. A key already held through this locker's session of
    /// the same TTL is re-entered: its count goes up, nothing is sent. If
    /// the key's last release in this session got no answer, it is sent
    /// again first; while it stays unanswered the acquire fails
    /// ([`ErrorReason::Unavailable`], or the arbiter's refusal of the
    /// release: retry later).
    pub async fn acquire(&self, key: &LockKey, opts: AcquireOptions) -> Result<LockGuard, Error> {
        let slot = self.slot(key, opts.ttl).await?;
        let key_lock = slot.key_lock(key);
        let _serial = key_lock.lock().await;
        let unanswered = lock(&slot.releasing).get(key).map(|u| (u.token, u.via));
        if let Some((token, via)) = unanswered {
            send_release(&self.inner, &slot, key, token, via, false).await?;
        }
        if let Some(e) = lock(&slot.holds).get_mut(key) {
            e.count += 1;
            return Ok(LockGuard { slot: slot.clone(), inner: self.inner.clone(), key: key.clone(), token: e.token });
        }
        let mut last = None;
        // An unprotected session exists only on the arbiter that opened it.
        let order = if slot.session.unprotected() { vec![slot.home] } else { ranked(&key.to_string(), &self.inner.endpoints) };
        for i in order {
            match slot.session.acquire_on(&self.inner.clients[i], key, opts.wait).await {
                Ok(hold) => {
                    let token = hold.token();
                    lock(&slot.holds).insert(key.clone(), Entry { token, count: 1, via: i });
                    return Ok(LockGuard { slot: slot.clone(), inner: self.inner.clone(), key: key.clone(), token });
                }
                Err(e) if unavailable(&e) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("no arbiter endpoints".into())))
    }
}

/// Watches a session; when it is lost, drops it and tells the application.
async fn fence_when_lost(inner: Arc<Inner>, k: SlotKey, slot: Arc<Slot>) {
    let mut health = slot.session.health();
    let _ = health.wait_for(|h| *h == Health::Lost).await;
    {
        let mut slots = inner.slots.lock().await;
        if slots.get(&k).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
            slots.remove(&k);
        }
    }
    let ttl = k.0;
    let keys: Vec<LockKey> = lock(&slot.holds).drain().map(|(k, _)| k).collect();
    if !keys.is_empty() {
        (inner.on_fence)(Fenced { ttl, session_id: slot.session.id(), keys });
    }
}

impl LockGuard {
    /// The fencing token: pass it to the resource with every write.
    /// [`Token::unprotected`] (0) for an unprotected grant, which a fenced
    /// resource refuses.
    pub fn token(&self) -> Token {
        self.token
    }

    /// True for a grant made from an arbiter's memory while etcd was out of
    /// its reach (an `on_quorum_loss = "open"` class): token 0, another
    /// arbiter may grant the key at the same time, and it is recorded for
    /// reconciliation. The hold is lost (fenced) once etcd is back.
    pub fn unprotected(&self) -> bool {
        self.token.is_unprotected()
    }

    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// False from the first failed keepalive until keepalives recover:
    /// finish the unit of work in hand, start no new one.
    pub fn can_start(&self) -> bool {
        self.slot.session.can_start()
    }

    /// Time left until the local deadline, when the hold must be treated as
    /// lost. Do not start a unit of work that cannot finish in this time.
    pub fn remaining_ttl(&self) -> Duration {
        self.slot.session.remaining_ttl()
    }

    pub fn session_id(&self) -> u64 {
        self.slot.session.id()
    }

    /// Watch this to learn when the session degrades, recovers or is lost.
    pub fn health(&self) -> tokio::sync::watch::Receiver<Health> {
        self.slot.session.health()
    }

    /// Ends one level of nesting; the last one releases the hold. Returns
    /// whether a hold was deleted at the arbiter (false while still nested,
    /// or if it was already gone). An error with
    /// [`ErrorReason::Unavailable`] means the outcome is unknown: the hold
    /// may still be live until its session ends, and the next acquire of the
    /// key through this locker sends the release again before anything else
    /// (so does dropping this future before it is answered).
    pub async fn release(self) -> Result<bool, Error> {
        let key_lock = self.slot.key_lock(&self.key);
        let _serial = key_lock.lock().await;
        let via = {
            let mut holds = lock(&self.slot.holds);
            match holds.get_mut(&self.key) {
                Some(e) if e.token == self.token && e.count > 1 => {
                    e.count -= 1;
                    return Ok(false);
                }
                Some(e) if e.token == self.token => {
                    let via = e.via;
                    holds.remove(&self.key);
                    via
                }
                // Fenced or replaced meanwhile: nothing of ours to release.
                _ => return Ok(false),
            }
        };
        // Unanswered until an answer says otherwise, also if this future is
        // dropped before one comes.
        lock(&self.slot.releasing).insert(self.key.clone(), Unanswered { token: self.token, via });
        send_release(&self.inner, &self.slot, &self.key, self.token, via, true).await
    }
}

/// Sends the final release of `key`'s hold `token`, from arbiter `via` on
/// (failing over while unavailable). Without an answer the release stays in
/// the slot as unanswered; an answer clears it, and so does a refusal of
/// the `first` attempt (nothing of it can land later).
async fn send_release(inner: &Inner, slot: &Slot, key: &LockKey, token: Token, via: usize, first: bool) -> Result<bool, Error> {
    let req = holdfast_proto::v1::ReleaseRequest {
        session_id: slot.session.id(),
        namespace: key.namespace().into(),
        key: key.key().into(),
        token: token.expose(),
    };
    let n = inner.clients.len();
    let mut last = None;
    for step in 0..n {
        let client = &inner.clients[(via + step) % n];
        match client.rpc.clone().release(req.clone()).await {
            Ok(r) => {
                lock(&slot.releasing).remove(key);
                return Ok(r.into_inner().released);
            }
            Err(s) => {
                let e = Error::from(s);
                // A refusal says this attempt did nothing; an earlier
                // unanswered one may still land.
                if !unavailable(&e) {
                    if first {
                        lock(&slot.releasing).remove(key);
                    }
                    return Err(e);
                }
                last = Some(e);
            }
        }
    }
    lock(&slot.releasing).insert(key.clone(), Unanswered { token, via });
    Err(last.unwrap_or_else(|| Error::Config("no arbiter endpoints".into())))
}

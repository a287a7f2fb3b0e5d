//! Waiting for a held key (design decisions "Is the wait queue durable
//! state?" and "What may a release notification cause?").
//!
//! **Best-effort fairness (default).** Waiters for a key queue in this
//! arbiter's memory in arrival order; clients send every acquire of a key to
//! the same arbiter (rendezvous hashing), so they meet here. Only the head of
//! the queue tries to grant. It watches the key from the revision its last
//! attempt saw; a delete event is only a hint that makes it send the full
//! grant transaction. Without events it polls every second (with jitter) by
//! *reading* the key and sends a transaction only when the key is free. When
//! the head is granted, the next waiter becomes head and starts watching from
//! the new grant's revision: one release causes one grant transaction. A
//! release made through this arbiter is also a hint, given in memory as soon
//! as etcd confirms it ([`Waiters::released`]): the head need not wait for
//! etcd's watch event, and without watches it need not wait for its next
//! poll. The hint names the hold it ended, and the head heeds it only for the
//! hold it waits on: a hint that arrives after a watch event already handed
//! the key on must not send the next head's transaction early. The order
//! survives an etcd leader change and is lost when the arbiter restarts
//! (waiters then retry).
//!
//! **Durable fairness** (per acquire until classes exist): the waiter is
//! recorded at `/q/<ns>/<key>/<lease>` on its own session lease; the grant
//! goes to the lowest create revision, checked and consumed inside the grant
//! transaction. The order survives an arbiter restart.

use crate::Refusal;
use crate::etcd::Etcd;
use crate::grant::{self, Attempt};
use crate::seal::Guard;
use crate::session::Owned;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use holdfast_model::{LockKey, Token, layout};
use rand::Rng;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a waiter looks at the key even without a watch event.
pub const POLL: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The in-memory queues, one per key with waiters.
pub struct Waiters {
    queues: Mutex<HashMap<String, Arc<KeyQueue>>>,
    next_id: AtomicU64,
    /// Watch the key while waiting (off: poll only).
    watch: bool,
    /// Sends grant transactions (alone, or grouped with others).
    committer: crate::commit::Committer,
}

#[derive(Default)]
struct KeyQueue {
    /// Waiters in arrival order, each with the signal that wakes it when it
    /// may have become the head. Only the new head is woken when the head
    /// leaves: waking every waiter cost the arbiter ~4.8 ms of CPU per
    /// handoff with 1,000 waiters on one key (docs/benchmarks.md).
    order: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    /// What the head knows of the current hold.
    state: Mutex<Seen>,
    /// Rung when a release of this key through this arbiter has committed:
    /// a hint for the waiting head, like a watch event.
    released: Notify,
    /// The create revision of the latest hold released through this arbiter.
    last_released: AtomicI64,
}

impl KeyQueue {
    /// The hold granted at `create_revision` was released through this
    /// arbiter ([`release_of`] listens).
    fn ring(&self, create_revision: i64) {
        self.last_released.fetch_max(create_revision, Ordering::AcqRel);
        self.released.notify_waiters();
    }
}

/// The hold a head waits on, as its last look at the key found it.
#[derive(Clone, Default)]
struct Seen {
    /// Where to watch for its delete from.
    watch_from: i64,
    /// Its create revision (0: not known).
    since: i64,
    /// Its holder's identity.
    holder: Option<String>,
}

/// A place in a key's queue; leaving it (drop) wakes the next waiter.
struct Ticket<'a> {
    waiters: &'a Waiters,
    key: String,
    queue: Arc<KeyQueue>,
    id: u64,
    turn: Arc<Notify>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let m = &*crate::metrics::METRICS;
        m.waiters.get_or_create(m.labels()).dec();
        let mut map = lock(&self.waiters.queues);
        let mut order = lock(&self.queue.order);
        let was_head = order.front().is_some_and(|(id, _)| *id == self.id);
        if let Some(i) = order.iter().position(|(id, _)| *id == self.id) {
            order.remove(i);
        }
        let next = if was_head { order.front().map(|(_, turn)| turn.clone()) } else { None };
        if order.is_empty() {
            map.remove(&self.key);
        }
        drop(order);
        // A permit is kept if the new head is not waiting yet.
        if let Some(turn) = next {
            turn.notify_one();
        }
    }
}

enum Hint {
    /// A delete (or a compaction cancel): try now.
    Event,
    /// The poll interval passed without an event.
    Poll,
    Deadline,
}

impl Waiters {
    pub fn new(watch: bool, committer: crate::commit::Committer) -> Self {
        Waiters { queues: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1), watch, committer }
    }

    pub fn committer(&self) -> &crate::commit::Committer {
        &self.committer
    }

    /// Waiters queued here for a key.
    pub fn count(&self, hold_key: &str) -> u32 {
        lock(&self.queues).get(hold_key).map(|q| lock(&q.order).len() as u32).unwrap_or(0)
    }

    /// The hold of `hold_key` granted at `create_revision` was released
    /// through this arbiter: a head waiting on that hold tries its grant
    /// transaction now. A head waiting on a later hold ignores it: the hint
    /// can arrive after etcd's watch event has already handed the key on, and
    /// acting on it then costs a transaction that finds the key held.
    pub fn released(&self, hold_key: &str, create_revision: i64) {
        let queue = lock(&self.queues).get(hold_key).cloned();
        if let Some(q) = queue {
            q.ring(create_revision);
        }
    }

    fn has_queue(&self, hold_key: &str) -> bool {
        lock(&self.queues).contains_key(hold_key)
    }

    fn enter(&self, hold_key: &str, seen: Seen) -> Ticket<'_> {
        let mut map = lock(&self.queues);
        let queue = map.entry(hold_key.to_string()).or_default().clone();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut order = lock(&queue.order);
        if order.is_empty() {
            *lock(&queue.state) = seen;
        }
        let turn = Arc::new(Notify::new());
        order.push_back((id, turn.clone()));
        drop(order);
        crate::metrics::inc(|m| &m.waited);
        let m = &*crate::metrics::METRICS;
        m.waiters.get_or_create(m.labels()).inc();
        Ticket { waiters: self, key: hold_key.to_string(), queue, id, turn }
    }

    /// Grants `key` to the session, waiting in arrival order until
    /// `deadline` while another session holds it.
    pub async fn acquire(&self, etcd: &Etcd, guard: &Guard, session: &Owned, key: &LockKey, deadline: Instant) -> Result<Token, Refusal> {
        let hold_key = layout::hold_key(key);
        // Nobody queued here: try at once.
        let seen = if self.has_queue(&hold_key) {
            Seen::default()
        } else {
            match grant::attempt(&self.committer, etcd, guard, session, &hold_key, None).await? {
                Attempt::Granted(token) => return Ok(token),
                Attempt::Held { watch_from, since, holder } => Seen { watch_from, since, holder },
            }
        };
        if Instant::now() >= deadline {
            return Err(contention_or_leak(key, session, &seen.holder));
        }
        let ticket = self.enter(&hold_key, seen);
        // Wait to be the head.
        loop {
            if lock(&ticket.queue.order).front().is_some_and(|(id, _)| *id == ticket.id) {
                break;
            }
            tokio::select! {
                _ = ticket.turn.notified() => {}
                _ = tokio::time::sleep_until(deadline) => return Err(contention_or_leak(key, session, &lock(&ticket.queue.state).holder)),
            }
        }
        // The head: wait for a release, then send the grant transaction.
        let mut seen = lock(&ticket.queue.state).clone();
        loop {
            match self.wait_for_release(etcd, &ticket.queue, &hold_key, &seen, deadline).await {
                Hint::Deadline => return Err(contention_or_leak(key, session, &seen.holder)),
                Hint::Poll => {
                    // A failed read: the grant transaction decides.
                    if let Ok(Some((revision, since))) = held_at(etcd, &hold_key).await {
                        seen.watch_from = revision + 1;
                        seen.since = since;
                        continue;
                    }
                }
                Hint::Event => {}
            }
            match grant::attempt(&self.committer, etcd, guard, session, &hold_key, None).await {
                Ok(Attempt::Granted(token)) => {
                    // The next head watches from this grant.
                    let revision = token.revision() as i64;
                    *lock(&ticket.queue.state) =
                        Seen { watch_from: revision + 1, since: revision, holder: Some(session.record.spiffe_id.clone()) };
                    return Ok(token);
                }
                Ok(Attempt::Held { watch_from, since, holder }) => {
                    seen = Seen { watch_from, since, holder };
                    *lock(&ticket.queue.state) = seen.clone();
                }
                Err(e) => {
                    *lock(&ticket.queue.state) = seen;
                    return Err(e);
                }
            }
        }
    }

    /// Waits for a delete of the key after `watch_from`, a release through
    /// this arbiter, the poll interval, or the deadline. With `watch_from` 0
    /// (unknown), polls at once.
    async fn wait_for_release(&self, etcd: &Etcd, queue: &KeyQueue, key: &str, seen: &Seen, deadline: Instant) -> Hint {
        let watch_from = seen.watch_from;
        if watch_from <= 0 {
            return Hint::Poll;
        }
        let released = release_of(queue, seen.since);
        let jitter = Duration::from_millis(rand::rng().random_range(0..200));
        let poll_at = (Instant::now() + POLL + jitter).min(deadline);
        let watch = async {
            if !self.watch {
                return std::future::pending().await;
            }
            watch_release(etcd, key, watch_from).await
        };
        tokio::select! {
            _ = tokio::time::sleep_until(poll_at) => if Instant::now() >= deadline { Hint::Deadline } else { Hint::Poll },
            _ = watch => Hint::Event,
            _ = released => Hint::Event,
        }
    }
}

/// Resolves when the key, known held before revision `from`, may be free:
/// a delete seen by a watch opened *now*, or, if etcd had already moved past
/// `from - 1` when that watch was created, a read that finds the key free.
/// A watch from an older revision would do without the read, but etcd
/// delivers such a watch's events from its catch-up loop, every 100 ms:
/// with any other write in between, a handoff waited ~50 ms on average and
/// ~95 ms at p99 (docs/benchmarks.md). A cancelled watch also means "look
/// now". Never resolves if the watch cannot be opened; the caller polls.
async fn watch_release(etcd: &Etcd, key: &str, from: i64) {
    // Deletes only: the next grant's put is of no use to the head, and etcd
    // would send it to a watch the head has just dropped. h2 answers a frame
    // for a stream it has already forgotten with a reset that counts against
    // the connection's lifetime limit of 1,024; past it the connection to
    // etcd is closed under every call in flight.
    let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    let Ok(mut stream) = etcd.client.clone().watch(key, Some(opts)).await else {
        return std::future::pending().await;
    };
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                    return;
                }
                // A failed read (after its retries) waits for the event or
                // the poll: taking it as "free" let a head whose reads
                // failed while its transactions went through send one
                // transaction per watch it opened, back to back.
                if resp.created() && resp.header().is_none_or(|h| h.revision() >= from) && matches!(held_at(etcd, key).await, Ok(None)) {
                    return;
                }
            }
            _ => return std::future::pending().await,
        }
    }
}

/// Resolves when a delete under `key` (a prefix if `prefix`) is seen from
/// `from`, or the watch is cancelled (compaction): both mean "look now".
/// Never resolves if the watch cannot be opened; the caller polls.
async fn watch_delete(etcd: &Etcd, key: &str, from: i64, prefix: bool) {
    let mut opts = WatchOptions::new().with_start_revision(from).with_filters([WatchFilterType::NoPut]);
    if prefix {
        opts = opts.with_prefix();
    }
    let Ok(mut stream) = etcd.client.clone().watch(key, Some(opts)).await else {
        return std::future::pending().await;
    };
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                    return;
                }
            }
            _ => return std::future::pending().await,
        }
    }
}

/// If the key is held: the revision the read saw and the hold's create
/// revision; None if it is free.
async fn held_at(etcd: &Etcd, key: &str) -> Result<Option<(i64, i64)>, etcd_client::Error> {
    let resp = etcd.get(key, Some(GetOptions::new().with_keys_only())).await?;
    Ok(resp.kvs().first().map(|hold| (resp.header().map(|h| h.revision()).unwrap_or(0), hold.create_revision())))
}

/// Resolves when a release through this arbiter has ended the hold granted
/// at `since` (or a later one: then that hold is gone too), even one that
/// ended before this call; with `since` 0 (not known), at the next release.
async fn release_of(queue: &KeyQueue, since: i64) {
    let ended = || since > 0 && queue.last_released.load(Ordering::Acquire) >= since;
    loop {
        // Listen before looking, so a release in between is not missed.
        let rung = queue.released.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        if ended() {
            return;
        }
        rung.await;
        if since <= 0 || ended() {
            return;
        }
    }
}

/// `/q/<ns>/<key>/<lease as 16 hex digits>`
fn waiter_key(hold_key: &str, lease: i64) -> String {
    format!("{}{}/{:016x}", layout::WAITER_PREFIX, &hold_key[layout::HOLD_PREFIX.len()..], lease as u64)
}

/// Durable fairness: see the module docs.
pub async fn acquire_durable(
    committer: &crate::commit::Committer,
    etcd: &Etcd,
    guard: &Guard,
    session: &Owned,
    key: &LockKey,
    deadline: Instant,
) -> Result<Token, Refusal> {
    let hold_key = layout::hold_key(key);
    let me = waiter_key(&hold_key, session.lease);
    let prefix = format!("{}{}/", layout::WAITER_PREFIX, &hold_key[layout::HOLD_PREFIX.len()..]);
    // Record the waiter once; a retry after an arbiter restart keeps its place.
    let txn = Txn::new().when([Compare::create_revision(me.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        me.as_str(),
        layout::encode(&session.record.spiffe_id),
        Some(PutOptions::new().with_lease(session.lease)),
    )]);
    etcd.txn(txn).await.map_err(Refusal::etcd)?;
    let mut holder = None;
    let outcome = loop {
        // Who is first? Only waiter records of exactly this key count (a
        // longer key can share the prefix).
        let opts = GetOptions::new().with_prefix().with_keys_only().with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = match etcd.get(prefix.as_str(), Some(opts)).await {
            Ok(r) => r,
            Err(e) => break Err(Refusal::etcd(e)),
        };
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let first = resp.kvs().iter().filter_map(|kv| kv.key_str().ok()).find(|k| {
            let rest = &k[prefix.len()..];
            rest.len() == 16 && rest.bytes().all(|b| b.is_ascii_hexdigit())
        });
        if first == Some(me.as_str()) {
            match grant::attempt(committer, etcd, guard, session, &hold_key, Some(&me)).await {
                Ok(Attempt::Granted(token)) => break Ok(token),
                Ok(Attempt::Held { watch_from, holder: h, .. }) => {
                    holder = h;
                    if Instant::now() >= deadline {
                        break Err(contention_or_leak(key, session, &holder));
                    }
                    wait_any(etcd, &hold_key, &prefix, watch_from, deadline).await;
                }
                Err(e) => break Err(e),
            }
        } else {
            if first.is_none() {
                // Our record is gone (the session expired): nothing to wait for.
                break Err(Refusal::session_not_found(session.lease));
            }
            if Instant::now() >= deadline {
                break Err(contention_or_leak(key, session, &holder));
            }
            wait_any(etcd, &hold_key, &prefix, revision + 1, deadline).await;
        }
    };
    if outcome.is_err() {
        // Leave the queue (best effort; the lease removes it anyway).
        let _ = etcd.client.clone().delete(me.as_str(), None).await;
    }
    outcome
}

/// A hold of the same identity under another session is named as a leak,
/// not as contention, when the wait ends.
fn contention_or_leak(key: &LockKey, session: &Owned, holder: &Option<String>) -> Refusal {
    if holder.as_deref() == Some(session.record.spiffe_id.as_str()) { Refusal::leak(key) } else { Refusal::contention(key) }
}

/// Waits for a delete of the hold or of any waiter record, a poll interval,
/// or the deadline.
async fn wait_any(etcd: &Etcd, hold_key: &str, prefix: &str, from: i64, deadline: Instant) {
    let jitter = Duration::from_millis(rand::rng().random_range(0..200));
    tokio::select! {
        _ = tokio::time::sleep_until((Instant::now() + POLL + jitter).min(deadline)) => {}
        _ = watch_delete(etcd, hold_key, from, false) => {}
        _ = watch_delete(etcd, prefix, from, true) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Arc<KeyQueue> {
        Arc::new(KeyQueue::default())
    }

    async fn resolves(f: impl std::future::Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f).await.is_ok()
    }

    #[tokio::test]
    async fn a_late_hint_for_an_earlier_hold_does_not_wake_the_head_waiting_on_the_next() {
        let q = queue();
        // The head waits on the hold granted at 20; the release of the hold
        // at 10 is reported only now (its watch event handed the key on).
        let head = {
            let q = q.clone();
            tokio::spawn(async move { release_of(&q, 20).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.ring(10);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!head.is_finished(), "a hint for the hold at 10 woke the head waiting on the hold at 20");
        q.ring(20);
        assert!(resolves(async { head.await.unwrap() }).await, "the release of the hold at 20 did not wake its head");
    }

    #[tokio::test]
    async fn a_release_before_the_head_starts_waiting_is_not_missed() {
        let q = queue();
        q.ring(20);
        assert!(resolves(release_of(&q, 20)).await);
        // A later hold released also ends the earlier one.
        assert!(resolves(release_of(&q, 15)).await);
        // Not the next hold.
        assert!(!resolves(release_of(&q, 21)).await);
    }

    #[tokio::test]
    async fn with_the_hold_unknown_any_release_wakes_the_head() {
        let q = queue();
        q.ring(20);
        // Nothing is stored for a head that does not know its hold...
        assert!(!resolves(release_of(&q, 0)).await);
        // ...but the next release wakes it.
        let head = {
            let q = q.clone();
            tokio::spawn(async move { release_of(&q, 0).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.ring(5);
        assert!(resolves(async { head.await.unwrap() }).await);
    }
}

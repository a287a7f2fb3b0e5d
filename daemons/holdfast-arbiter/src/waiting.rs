//! Waiting for a held key (design decisions "Is the wait queue durable
//! state?" and "What may a release notification cause?").
//!
//! **Best-effort fairness (default).** Waiters for a key queue in this
//! arbiter's memory in arrival order; clients send every acquire of a key to
//! the same arbiter (rendezvous hashing), so they meet here. Only the head of
//! the queue tries to grant. It waits for the hold it last saw (named by its
//! create revision) to end; that is only a hint that makes it send the full
//! grant transaction. Without a hint it polls every second (with jitter) by
//! *reading* the key and sends a transaction only when the key is free. When
//! the head is granted, the next waiter becomes head and waits on the new
//! grant's hold: one release causes one grant transaction.
//!
//! The hints, each naming the hold that ended ([`KeyQueue::ended`]):
//! - a release made through this arbiter, given in memory as soon as etcd
//!   confirms it ([`Waiters::released`]);
//! - a delete seen by the key's watch. One watch per key with waiters is
//!   kept for as long as the queue exists ([`follow`]), not one per head:
//!   opening and dropping a watch stream for every handoff cost ~9 % of the
//!   contended handoff rate on a 2-core machine (docs/benchmarks.md).
//!
//! A head heeds a hint only for the hold it waits on or a later one: a
//! release hint that arrives after the watch event already handed the key on
//! must not send the next head's transaction early. The order survives an
//! etcd leader change and is lost when the arbiter restarts (waiters then
//! retry).
//!
//! **Durable fairness** (a class with `fairness = "durable"`; the request
//! has no say): the waiter is recorded at `/q/<ns>/<key>/<lease>` on its own
//! session lease; the grant goes to the lowest create revision, checked and
//! consumed inside the grant transaction. The order survives an arbiter
//! restart. `limits.max_durable_waiters_per_namespace` caps the records.

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
use std::sync::{Arc, Mutex, Weak};
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
    /// Watch each key with waiters (off: poll, and heed the releases made
    /// through this arbiter).
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
    /// Rung when [`KeyQueue::ended`] grows.
    rung: Notify,
    /// Every hold of this key created at or before this revision is known to
    /// have ended: released through this arbiter, deleted as the key's watch
    /// saw, or gone as a read found.
    ended: AtomicI64,
    /// Tells the key's watch to open again: a head's poll found that the
    /// hold it waited on had ended without the watch saying so (a watch
    /// stuck on a member cut off from the others sends nothing).
    reopen: Arc<Notify>,
    /// The key's watch ([`follow`]), stopped when the queue goes.
    follow: Mutex<Option<tokio::task::AbortHandle>>,
}

impl KeyQueue {
    /// Every hold created at or before `revision` has ended ([`ended`]
    /// listens).
    fn ended(&self, revision: i64) {
        if self.ended.fetch_max(revision, Ordering::AcqRel) < revision {
            self.rung.notify_waiters();
        }
    }

    /// What a read of the key ([`held_at`]) shows has ended: every hold
    /// before the one it found, or every hold up to its revision if it found
    /// the key free.
    fn looked(&self, (revision, held): (i64, Option<i64>)) {
        self.ended(held.map_or(revision, |since| since - 1));
    }
}

impl Drop for KeyQueue {
    fn drop(&mut self) {
        if let Some(follow) = self.follow.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            follow.abort();
        }
    }
}

/// The hold a head waits on, as its last look at the key found it.
#[derive(Clone, Default)]
struct Seen {
    /// Its create revision (0: not known; the head looks at once).
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
    /// The hold the head waits on (or a later one) is known to have ended:
    /// try now.
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
            q.ended(create_revision);
        }
    }

    fn has_queue(&self, hold_key: &str) -> bool {
        lock(&self.queues).contains_key(hold_key)
    }

    fn enter(&self, etcd: &Etcd, hold_key: &str, seen: Seen) -> Ticket<'_> {
        let mut map = lock(&self.queues);
        let queue = map
            .entry(hold_key.to_string())
            .or_insert_with(|| {
                let queue = Arc::new(KeyQueue::default());
                if self.watch {
                    let task = tokio::spawn(follow(etcd.clone(), hold_key.to_string(), Arc::downgrade(&queue), queue.reopen.clone()));
                    *lock(&queue.follow) = Some(task.abort_handle());
                }
                queue
            })
            .clone();
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
            match grant::attempt(&self.committer, etcd, guard, session, key, None).await? {
                Attempt::Granted(token) => return Ok(token),
                Attempt::Held { since, holder, .. } => Seen { since, holder },
            }
        };
        if Instant::now() >= deadline {
            return Err(contention_or_leak(key, session, &seen.holder));
        }
        let ticket = self.enter(etcd, &hold_key, seen);
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
        // A hold a hint said had ended that the grant transaction then found
        // still there. Only an etcd whose revisions went back (restored from a
        // snapshot; this arbiter seals when it sees that) can do this; the
        // head then polls that hold instead of trying again at once, forever.
        let mut disproved = 0;
        loop {
            let hint = wait_for_release(&ticket.queue, &seen, seen.since != disproved, deadline).await;
            match hint {
                Hint::Deadline => return Err(contention_or_leak(key, session, &seen.holder)),
                Hint::Poll => match held_at(etcd, &hold_key).await {
                    Ok((_, Some(since))) if since == seen.since => continue,
                    Ok((revision, now)) => {
                        // The hold waited on has ended and nothing said so:
                        // record it, and have the key's watch open again.
                        if seen.since > 0 {
                            ticket.queue.looked((revision, now));
                            ticket.queue.reopen.notify_one();
                        }
                        if let Some(since) = now {
                            seen.since = since;
                            continue;
                        }
                    }
                    // A failed read: the grant transaction decides.
                    Err(_) => {}
                },
                Hint::Event => {}
            }
            match grant::attempt(&self.committer, etcd, guard, session, key, None).await {
                Ok(Attempt::Granted(token)) => {
                    // The next head waits on this grant's hold.
                    let revision = token.revision() as i64;
                    *lock(&ticket.queue.state) = Seen { since: revision, holder: Some(session.record.spiffe_id.clone()) };
                    return Ok(token);
                }
                Ok(Attempt::Held { since, holder, .. }) => {
                    if matches!(hint, Hint::Event) && since == seen.since {
                        tracing::warn!(
                            hold_key,
                            "etcd still shows a hold a hint said had ended: its revisions went back (restored?); this waiter polls"
                        );
                        disproved = since;
                    }
                    seen = Seen { since, holder };
                    *lock(&ticket.queue.state) = seen.clone();
                }
                Err(e) => {
                    *lock(&ticket.queue.state) = seen;
                    return Err(e);
                }
            }
        }
    }
}

/// Waits until the hold the head saw has ended ([`KeyQueue::ended`]; only
/// with `hints`), the poll interval, or the deadline. With the hold not
/// known, polls at once.
async fn wait_for_release(queue: &KeyQueue, seen: &Seen, hints: bool, deadline: Instant) -> Hint {
    if seen.since <= 0 {
        return Hint::Poll;
    }
    let jitter = Duration::from_millis(rand::rng().random_range(0..200));
    let poll_at = (Instant::now() + POLL + jitter).min(deadline);
    let hint = async {
        if !hints {
            return std::future::pending().await;
        }
        ended(queue, seen.since).await
    };
    tokio::select! {
        _ = tokio::time::sleep_until(poll_at) => if Instant::now() >= deadline { Hint::Deadline } else { Hint::Poll },
        _ = hint => Hint::Event,
    }
}

/// The key's watch, for as long as its queue exists: each delete of the key
/// tells the queue that every hold created before it has ended. The watch
/// starts at etcd's current revision (a watch from a past revision is served
/// by etcd's catch-up loop, every 100 ms) and a read right after it is
/// created covers what happened before: a key found free, or held by a later
/// hold, has ended the holds before. A watch that etcd cancels or refuses,
/// that breaks, whose read fails, or that a head's poll found silent
/// (`reopen`) is opened again the same way, after a pause that doubles up to
/// the poll interval while nothing comes through. While it cannot be opened,
/// heads poll. Counted in `holdfast_arbiter_key_watches`.
async fn follow(etcd: Etcd, key: String, queue: Weak<KeyQueue>, reopen: Arc<Notify>) {
    /// Counts this task in the gauge until it ends or is aborted.
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            let m = &*crate::metrics::METRICS;
            m.key_watches.get_or_create(m.labels()).dec();
        }
    }
    let m = &*crate::metrics::METRICS;
    m.key_watches.get_or_create(m.labels()).inc();
    let _counted = Counted;
    let mut pause = Duration::from_millis(10);
    loop {
        // Deletes only: the grants' puts are of no use here, and etcd could
        // send one to this stream just after the queue has dropped it. h2
        // answers a frame for a stream it has forgotten with a reset that
        // counts against the connection's lifetime limit of 1,024; past it
        // the connection to etcd is closed under every call in flight.
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let opened = Instant::now();
        if let Ok(mut stream) = etcd.watch.clone().watch(key.as_str(), Some(opts)).await {
            loop {
                let resp = tokio::select! {
                    r = stream.message() => match r {
                        Ok(Some(resp)) => resp,
                        _ => break,
                    },
                    _ = reopen.notified() => break,
                };
                let Some(queue) = queue.upgrade() else { return };
                let deleted: Vec<i64> = resp
                    .events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Delete)
                    .filter_map(|e| e.kv())
                    .map(|kv| kv.mod_revision())
                    .collect();
                if !deleted.is_empty() {
                    // It works: the next failure pauses briefly again.
                    pause = Duration::from_millis(10);
                }
                for revision in deleted {
                    queue.ended(revision - 1);
                }
                if resp.created() || resp.canceled() {
                    match held_at(&etcd, &key).await {
                        Ok(read) => queue.looked(read),
                        Err(_) => break,
                    }
                }
                if resp.canceled() {
                    break;
                }
            }
        }
        if queue.strong_count() == 0 {
            return;
        }
        if opened.elapsed() >= POLL {
            // It served a while: this is a new failure, not the same one.
            pause = Duration::from_millis(10);
        }
        let jitter = Duration::from_millis(rand::rng().random_range(0..=pause.as_millis() as u64 / 2));
        tokio::time::sleep(pause + jitter).await;
        pause = (pause * 2).min(POLL);
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
    let Ok(mut stream) = etcd.watch.clone().watch(key, Some(opts)).await else {
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

/// The revision a read of the key saw, and the hold's create revision if it
/// is held.
async fn held_at(etcd: &Etcd, key: &str) -> Result<(i64, Option<i64>), etcd_client::Error> {
    let resp = etcd.get(key, Some(GetOptions::new().with_keys_only())).await?;
    Ok((resp.header().map(|h| h.revision()).unwrap_or(0), resp.kvs().first().map(|hold| hold.create_revision())))
}

/// Resolves when the hold granted at `since` (> 0) has ended, even before
/// this call.
async fn ended(queue: &KeyQueue, since: i64) {
    loop {
        // Listen before looking, so a hint in between is not missed.
        let rung = queue.rung.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        if queue.ended.load(Ordering::Acquire) >= since {
            return;
        }
        rung.await;
    }
}

/// `/q/<ns>/<key>/<lease as 16 hex digits>`
fn waiter_key(hold_key: &str, lease: i64) -> String {
    format!("{}{}/{:016x}", layout::WAITER_PREFIX, &hold_key[layout::HOLD_PREFIX.len()..], lease as u64)
}

/// The cap on durable waiters per namespace, and the ledger of the
/// cluster the waiter is recorded on.
pub struct WaiterQuota<'a> {
    pub limits: &'a crate::limits::Limits,
    pub ledger: usize,
}

/// Durable fairness: see the module docs.
pub async fn acquire_durable(
    committer: &crate::commit::Committer,
    etcd: &Etcd,
    guard: &Guard,
    session: &Owned,
    key: &LockKey,
    quota: WaiterQuota<'_>,
    deadline: Instant,
) -> Result<Token, Refusal> {
    let hold_key = layout::hold_key(key);
    let me = waiter_key(&hold_key, session.lease);
    let prefix = format!("{}{}/", layout::WAITER_PREFIX, &hold_key[layout::HOLD_PREFIX.len()..]);
    quota.limits.waiter_quota(key, &me).await?;
    // Record the waiter once; a retry after an arbiter restart keeps its place.
    let txn = Txn::new().when([Compare::create_revision(me.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        me.as_str(),
        layout::encode(&session.record.spiffe_id),
        Some(PutOptions::new().with_lease(session.lease)),
    )]);
    let recorded = etcd.txn(txn).await.map_err(Refusal::etcd)?;
    // The next quota check through this arbiter waits to count this record.
    quota.limits.wrote(quota.ledger, recorded.header().map_or(0, |h| h.revision()));
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
            match grant::attempt(committer, etcd, guard, session, key, Some(&me)).await {
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
        // at 10 is reported only now (the key's watch handed the key on).
        let head = {
            let q = q.clone();
            tokio::spawn(async move { ended(&q, 20).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.ended(10);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!head.is_finished(), "a hint for the hold at 10 woke the head waiting on the hold at 20");
        q.ended(20);
        assert!(resolves(async { head.await.unwrap() }).await, "the release of the hold at 20 did not wake its head");
    }

    #[tokio::test]
    async fn a_release_before_the_head_starts_waiting_is_not_missed() {
        let q = queue();
        q.ended(20);
        assert!(resolves(ended(&q, 20)).await);
        // A later hold released also ends the earlier one.
        assert!(resolves(ended(&q, 15)).await);
        // Not the next hold.
        assert!(!resolves(ended(&q, 21)).await);
    }

    #[tokio::test]
    async fn a_hint_never_moves_what_is_known_back() {
        let q = queue();
        q.ended(20);
        // A read or a release hint about an earlier hold arrives late.
        q.ended(12);
        assert!(resolves(ended(&q, 20)).await);
    }

    #[tokio::test]
    async fn a_head_that_does_not_know_its_hold_looks_at_once() {
        let q = queue();
        let seen = Seen { since: 0, holder: None };
        let hint = tokio::time::timeout(Duration::from_millis(50), wait_for_release(&q, &seen, true, Instant::now() + POLL * 5)).await;
        assert!(matches!(hint, Ok(Hint::Poll)));
    }

    #[tokio::test]
    async fn a_head_whose_hint_was_disproved_waits_for_its_poll() {
        let q = queue();
        q.ended(20);
        let seen = Seen { since: 20, holder: None };
        // Trusted, the hint wakes the head at once...
        let hint = tokio::time::timeout(Duration::from_millis(50), wait_for_release(&q, &seen, true, Instant::now() + POLL * 5)).await;
        assert!(matches!(hint, Ok(Hint::Event)));
        // ...not once the grant transaction found that hold still there.
        let hint = tokio::time::timeout(Duration::from_millis(50), wait_for_release(&q, &seen, false, Instant::now() + POLL * 5)).await;
        assert!(hint.is_err(), "a disproved hint woke the head before its poll");
        let hint = wait_for_release(&q, &seen, false, Instant::now() + Duration::from_millis(20)).await;
        assert!(matches!(hint, Hint::Deadline));
    }
}

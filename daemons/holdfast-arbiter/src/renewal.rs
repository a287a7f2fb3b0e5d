//! Sessions are renewed over a fixed set of shared etcd keepalive streams
//! ([`STREAMS`]), not one stream per session.
//!
//! etcd's `LeaseKeepAlive` stream takes requests for any lease and answers
//! each with its lease ID, in the order the requests came (its server reads
//! one request, renews, answers, reads the next). So one stream can serve
//! many sessions, as etcd's own Go client does with all of a process's
//! leases. One stream per session made etcd's HTTP/2 server (Go's, which
//! etcd uses for gRPC over TLS) scan every open stream on each frame it
//! wrote: at 40,000 sessions that scan took 56 % of etcd's CPU
//! (`docs/benchmarks.md`, "Scale"). A single stream for all of them makes
//! every renewal wait behind any slow one; [`STREAMS`] streams keep that to
//! the sessions sharing one.
//!
//! Answers are matched to callers per lease, first in first out. A caller
//! that gives up waiting keeps its place in the queue, so the late answer
//! to its request is consumed by that place and never handed to a later
//! request of the same lease (whose caller counts its TTL from a later send).
//! When the stream ends (etcd restarted, a member lost its leadership and
//! answered with an error, the connection was replaced) or stalls, every
//! waiting caller is told at once and tries again on a new stream, for as
//! long as etcd's request timeout lasts.
//!
//! **Stalls.** etcd answers a stream's requests in order, so one renewal
//! that waits inside etcd (for the applied index, or a read index that got
//! lost) holds up every renewal behind it on that stream. A renewal waits
//! on its first try only for its stream's stall bound, [`stall_bound`]:
//! [`STALL_FACTOR`] × the p99 of the last [`WINDOW`] answers on that slot,
//! at least [`STALL_FLOOR`] and at most the request timeout (the request
//! timeout until [`MIN_SAMPLES`] answers were seen). Past it the stream is
//! closed (`holdfast_arbiter_keepalive_streams_stalled_total`) and its
//! renewals go to a fresh one. A renewal that still gets no answer fails
//! for its own session only: the client drains that session and tries again
//! at its next keepalive. Only a failure to reach etcd at all (opening a
//! stream) pauses granting. etcd 3.6 also ends a stream when one of
//! its renewals' permission checks straddles a change to etcd's users or
//! roles ("revision of auth store is old"; nothing was renewed): callers
//! then go on trying on new streams for as long as such a refused request
//! is sent again elsewhere ([`AUTH_RACE_BUDGET`]).

use crate::Refusal;
use crate::etcd::{AUTH_RACE_BUDGET, Etcd, auth_raced, note_auth_race_resend, retry_auth_race};
use etcd_client::{LeaseKeepAliveResponse, LeaseKeepAliveStream, LeaseKeeper};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};

/// After a failed attempt to open the stream, other renewals fail at once
/// for this long instead of each waiting for etcd in turn.
const REOPEN_BACKOFF: Duration = Duration::from_millis(250);

/// A stream is stalled once a renewal waited this many times its p99.
pub const STALL_FACTOR: u32 = 4;
/// The shortest stall bound: a renewal is never given up on sooner (a
/// busy 2-core box answers within this even at 40,000 sessions, p99 60 ms).
pub const STALL_FLOOR: Duration = Duration::from_millis(250);
/// Answers per slot the p99 is taken over.
pub const WINDOW: usize = 256;
/// Answers a slot needs before its p99 sets its bound.
pub const MIN_SAMPLES: usize = 32;

/// How long a renewal's first try waits for its answer: [`STALL_FACTOR`] ×
/// `p99`, within [[`STALL_FLOOR`], `timeout`]; `timeout` without a p99.
pub fn stall_bound(p99: Option<Duration>, timeout: Duration) -> Duration {
    match p99 {
        Some(p) => (p * STALL_FACTOR).max(STALL_FLOOR).min(timeout),
        None => timeout,
    }
}

/// The last [`WINDOW`] answer latencies of one slot's streams, in µs.
struct Latencies {
    ring: Vec<u32>,
    next: usize,
}

impl Latencies {
    fn new() -> Self {
        Latencies { ring: Vec::with_capacity(WINDOW), next: 0 }
    }

    fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u32::MAX as u128) as u32;
        if self.ring.len() < WINDOW {
            self.ring.push(us);
        } else {
            self.ring[self.next] = us;
        }
        self.next = (self.next + 1) % WINDOW;
    }

    /// The 99th percentile, once [`MIN_SAMPLES`] answers were seen.
    fn p99(&self) -> Option<Duration> {
        if self.ring.len() < MIN_SAMPLES {
            return None;
        }
        // A copy on the stack: this runs on every renewal's first try.
        let mut copy = [0u32; WINDOW];
        let v = &mut copy[..self.ring.len()];
        v.copy_from_slice(&self.ring);
        let i = (v.len() * 99).div_ceil(100) - 1;
        let (_, p, _) = v.select_nth_unstable(i);
        Some(Duration::from_micros(*p as u64))
    }
}

/// The answer to one renewal.
pub enum Renewal {
    /// etcd answered; `sent_at` is just before the request was handed to the
    /// stream.
    Answered { sent_at: Instant, resp: LeaseKeepAliveResponse },
    /// etcd no longer knows the lease (it expired or was revoked).
    NotFound,
}

/// Why a stream ended under the callers waiting on it.
#[derive(Clone, Copy)]
enum Ended {
    /// etcd refused a renewal whose permission check straddled a change to
    /// its users or roles, and closed the stream with that refusal.
    AuthRace,
    /// Anything else: etcd closed it, the connection went, no answer came.
    Other,
}

/// What a waiting caller is handed: etcd's answer, or why the stream ended.
type Answer = Result<LeaseKeepAliveResponse, Ended>;

/// Callers waiting for an answer, per lease, oldest first; `None` once the
/// stream has ended.
type Waiting = Arc<Mutex<Option<HashMap<i64, VecDeque<oneshot::Sender<Answer>>>>>>;

struct Stream {
    /// Sends requests; any lease ID may be sent on it.
    sender: LeaseKeeper,
    waiting: Waiting,
    /// Which opening of the stream this is.
    generation: u64,
}

enum Slot {
    Closed,
    Open(Stream),
    /// The last attempt to open failed, at this instant, with this refusal.
    Failed(Instant, Refusal),
}

/// Streams a session's renewals may go over: a session always uses the
/// same one (its lease ID modulo this). etcd answers one stream's requests
/// one after another, so a renewal that waits in etcd (for the applied index,
/// or a leadership check while its Raft loop lags) holds up only its own
/// stream's; and etcd's writer scans at most 64 streams per frame, not one
/// per session.
pub const STREAMS: usize = 64;

/// The shared keepalive streams of this arbiter.
pub struct Renewer {
    etcd: Etcd,
    slots: Vec<tokio::sync::Mutex<Slot>>,
    latencies: Vec<Mutex<Latencies>>,
    opened: std::sync::atomic::AtomicU64,
}

impl Renewer {
    pub fn new(etcd: Etcd) -> Self {
        Renewer {
            etcd,
            slots: (0..STREAMS).map(|_| tokio::sync::Mutex::new(Slot::Closed)).collect(),
            latencies: (0..STREAMS).map(|_| Mutex::new(Latencies::new())).collect(),
            opened: Default::default(),
        }
    }

    fn index(lease: i64) -> usize {
        (lease as u64 % STREAMS as u64) as usize
    }

    fn slot(&self, lease: i64) -> &tokio::sync::Mutex<Slot> {
        &self.slots[Self::index(lease)]
    }

    fn latencies(&self, lease: i64) -> std::sync::MutexGuard<'_, Latencies> {
        self.latencies[Self::index(lease)].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews `lease` once: etcd's answer, or a refusal if etcd could not be
    /// asked, or did not answer within the stall bound and then, on fresh
    /// streams, within what is left of its request timeout.
    pub async fn renew(&self, lease: i64) -> Result<Renewal, Refusal> {
        let started = Instant::now();
        let mut retried = false;
        loop {
            let (sent_at, answer, generation) = match self.send(lease).await? {
                Sent::NotFound => return Ok(Renewal::NotFound),
                Sent::Waiting { sent_at, answer, generation } => (sent_at, answer, generation),
            };
            let left = self.etcd.timeout.saturating_sub(started.elapsed());
            let wait = if retried { left.max(STALL_FLOOR) } else { stall_bound(self.latencies(lease).p99(), self.etcd.timeout) };
            match tokio::time::timeout(wait, answer).await {
                Ok(Ok(Ok(resp))) => {
                    self.latencies(lease).record(sent_at.elapsed());
                    if resp.ttl() <= 0 {
                        return Ok(Renewal::NotFound);
                    }
                    return Ok(Renewal::Answered { sent_at, resp });
                }
                // Refused, not renewed, because an operator changed etcd's
                // users or roles: again on a new stream, within the budget.
                Ok(Ok(Err(Ended::AuthRace))) if started.elapsed() < AUTH_RACE_BUDGET => note_auth_race_resend(),
                // The stream ended under this request (etcd closed it, or
                // another renewal found it stalled and replaced it): again on
                // the new one while the request timeout lasts. At 40,000
                // sessions one retry was not enough: a retry's stream was
                // often closed by another renewal's stall bound.
                Ok(_) if started.elapsed() < self.etcd.timeout => retried = true,
                Ok(_) => return Err(Refusal::renewal("etcd closed the keepalive stream under every try within the request timeout")),
                Err(_) => {
                    // Stalled: the stream is replaced (every renewal waiting on
                    // it tries again on the new one, which may reach another
                    // member), and so is this request.
                    if self.close(lease, generation).await {
                        crate::metrics::inc(|m| &m.keepalive_streams_stalled);
                        tracing::info!(
                            waited_ms = wait.as_millis() as u64,
                            "etcd keepalive stream stalled; its renewals moved to a new stream"
                        );
                    }
                    if started.elapsed() + STALL_FLOOR <= self.etcd.timeout {
                        retried = true;
                        continue;
                    }
                    return Err(Refusal::renewal("keepalive not acknowledged in time"));
                }
            }
        }
    }

    /// Ends `lease`'s stream if it is still the `generation`th opened (true
    /// then); its waiters try again on a new one.
    async fn close(&self, lease: i64, generation: u64) -> bool {
        let mut slot = self.slot(lease).lock().await;
        if let Slot::Open(s) = &*slot
            && s.generation == generation
        {
            end(&s.waiting, Ended::Other);
            *slot = Slot::Closed;
            return true;
        }
        false
    }

    /// Queues a waiter for `lease` and sends its request, opening the stream
    /// first if there is none. Holding the slot's lock across the send keeps
    /// each lease's requests in the order of its waiters.
    async fn send(&self, lease: i64) -> Result<Sent, Refusal> {
        let mut slot = self.slot(lease).lock().await;
        let mut opened = false;
        loop {
            match &*slot {
                Slot::Open(s) => {
                    if let Some(rx) = s.queue(lease) {
                        let sent_at = Instant::now();
                        let mut keeper = LeaseKeeper { id: lease, sender: s.sender.sender.clone() };
                        if keeper.keep_alive().await.is_ok() {
                            return Ok(Sent::Waiting { sent_at, answer: rx, generation: s.generation });
                        }
                        // The request side is gone: the stream has ended.
                        end(&s.waiting, Ended::Other);
                    }
                    *slot = Slot::Closed;
                    if opened {
                        return Err(Refusal::unavailable("etcd closed the keepalive stream as it was opened"));
                    }
                }
                Slot::Failed(at, why) if at.elapsed() < REOPEN_BACKOFF => return Err(why.clone()),
                Slot::Failed(..) | Slot::Closed => {}
            }
            // Opening renews `lease` once (etcd-client sends a first request
            // and reads its answer); the request sent after opening is the
            // one whose answer, with its own header, the caller gets.
            let open = || {
                let mut c = self.etcd.client.clone();
                async move { c.lease_keep_alive(lease).await }
            };
            match retry_auth_race(open).await {
                Ok((keeper, stream)) => {
                    let generation = self.opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    *slot = Slot::Open(start(keeper, stream, generation));
                    opened = true;
                }
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => return Ok(Sent::NotFound),
                Err(e) => {
                    let why = Refusal::etcd(e);
                    *slot = Slot::Failed(Instant::now(), why.clone());
                    return Err(why);
                }
            }
        }
    }
}

impl Stream {
    /// A place in `lease`'s queue, or `None` if the stream has ended.
    fn queue(&self, lease: i64) -> Option<oneshot::Receiver<Answer>> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let (tx, rx) = oneshot::channel();
        waiting.as_mut()?.entry(lease).or_default().push_back(tx);
        Some(rx)
    }
}

enum Sent {
    Waiting { sent_at: Instant, answer: oneshot::Receiver<Answer>, generation: u64 },
    NotFound,
}

/// Starts the task that hands each answer to the oldest waiter of its lease.
fn start(sender: LeaseKeeper, mut stream: LeaseKeepAliveStream, generation: u64) -> Stream {
    let waiting: Waiting = Arc::new(Mutex::new(Some(HashMap::new())));
    let w = waiting.clone();
    #[cfg(feature = "mutations")]
    let mut stall = fault::stall_after(generation);
    tokio::spawn(async move {
        let why = loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Err(e) if auth_raced(&e) => break Ended::AuthRace,
                _ => break Ended::Other,
            };
            #[cfg(feature = "mutations")]
            if fault::stalled(&mut stall) {
                continue;
            }
            let waiter = {
                let mut guard = w.lock().unwrap_or_else(|e| e.into_inner());
                let Some(map) = guard.as_mut() else { break Ended::Other };
                let id = resp.id();
                let waiter = map.get_mut(&id).and_then(VecDeque::pop_front);
                if map.get(&id).is_some_and(VecDeque::is_empty) {
                    map.remove(&id);
                }
                waiter
            };
            // A waiter that gave up has dropped its receiver: its answer is
            // consumed here all the same.
            if let Some(tx) = waiter {
                let _ = tx.send(Ok(resp));
            }
        };
        end(&w, why);
    });
    Stream { sender, waiting, generation }
}

/// Marks the stream ended and tells every waiter why (once: a stream
/// already ended keeps the first reason).
fn end(waiting: &Waiting, why: Ended) {
    let ended = waiting.lock().unwrap_or_else(|e| e.into_inner()).take();
    for tx in ended.into_iter().flat_map(HashMap::into_values).flatten() {
        let _ = tx.send(Err(why));
    }
}

/// Test builds only (the `mutations` feature): a stalled etcd stream, for
/// the tests of stall detection. With `HOLDFAST_FAULT_STALL_KEEPALIVE_AFTER=N`
/// in the arbiter's environment, the first keepalive stream it opens hands
/// on N answers and then none, as a stream whose next request waits inside
/// etcd does (etcd answers a stream in order). A build without the feature
/// has none of this code.
#[cfg(feature = "mutations")]
mod fault {
    /// Answers the stream of `generation` still hands on (None: all).
    pub fn stall_after(generation: u64) -> Option<u64> {
        let n = std::env::var("HOLDFAST_FAULT_STALL_KEEPALIVE_AFTER").ok()?.parse().ok()?;
        (generation == 1).then_some(n)
    }

    /// True if this answer is held back (the stream has stalled).
    pub fn stalled(left: &mut Option<u64>) -> bool {
        match left {
            Some(0) => true,
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_bound_is_four_p99s_between_the_floor_and_the_request_timeout() {
        let timeout = Duration::from_secs(5);
        assert_eq!(stall_bound(None, timeout), timeout, "no p99 yet: the request timeout");
        assert_eq!(stall_bound(Some(Duration::from_millis(10)), timeout), STALL_FLOOR);
        assert_eq!(stall_bound(Some(Duration::from_millis(100)), timeout), Duration::from_millis(400));
        assert_eq!(stall_bound(Some(Duration::from_secs(2)), timeout), timeout);
    }

    #[test]
    fn the_p99_is_of_the_last_window_of_answers_once_there_are_enough() {
        let mut l = Latencies::new();
        for _ in 0..MIN_SAMPLES - 1 {
            l.record(Duration::from_millis(5));
        }
        assert_eq!(l.p99(), None);
        l.record(Duration::from_millis(5));
        assert_eq!(l.p99(), Some(Duration::from_millis(5)));
        // 1 slow answer in 100: the p99 is a fast one; 3 in 100 make it slow.
        let mut l = Latencies::new();
        for i in 0..100 {
            l.record(Duration::from_millis(if i == 50 { 900 } else { 10 }));
        }
        assert_eq!(l.p99(), Some(Duration::from_millis(10)));
        for _ in 0..2 {
            l.record(Duration::from_millis(800));
        }
        assert_eq!(l.p99(), Some(Duration::from_millis(800)));
        // Older answers leave the window.
        for _ in 0..WINDOW {
            l.record(Duration::from_millis(20));
        }
        assert_eq!(l.p99(), Some(Duration::from_millis(20)));
    }
}

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
//! answered with an error, the connection was replaced) or stops answering
//! within etcd's request timeout, every waiting caller is told at once and
//! tries once more on a new stream. etcd 3.6 also ends a stream when one of
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
    opened: std::sync::atomic::AtomicU64,
}

impl Renewer {
    pub fn new(etcd: Etcd) -> Self {
        Renewer { etcd, slots: (0..STREAMS).map(|_| tokio::sync::Mutex::new(Slot::Closed)).collect(), opened: Default::default() }
    }

    fn slot(&self, lease: i64) -> &tokio::sync::Mutex<Slot> {
        &self.slots[(lease as u64 % STREAMS as u64) as usize]
    }

    /// Renews `lease` once: etcd's answer, or a refusal if etcd could not be
    /// asked or did not answer within its request timeout.
    pub async fn renew(&self, lease: i64) -> Result<Renewal, Refusal> {
        let started = Instant::now();
        let mut retried = false;
        loop {
            let (sent_at, answer, generation) = match self.send(lease).await? {
                Sent::NotFound => return Ok(Renewal::NotFound),
                Sent::Waiting { sent_at, answer, generation } => (sent_at, answer, generation),
            };
            match tokio::time::timeout(self.etcd.timeout, answer).await {
                Ok(Ok(Ok(resp))) if resp.ttl() <= 0 => return Ok(Renewal::NotFound),
                Ok(Ok(Ok(resp))) => return Ok(Renewal::Answered { sent_at, resp }),
                // Refused, not renewed, because an operator changed etcd's
                // users or roles: again on a new stream, within the budget.
                Ok(Ok(Err(Ended::AuthRace))) if started.elapsed() < AUTH_RACE_BUDGET => note_auth_race_resend(),
                // The stream ended under this request: once more on a new one.
                Ok(_) if !retried => retried = true,
                Ok(_) => return Err(Refusal::unavailable("etcd closed the keepalive stream")),
                Err(_) => {
                    // A stream that stops answering (its member hangs) is
                    // replaced: the next renewal opens a new one, which may
                    // reach another member.
                    self.close(lease, generation).await;
                    return Err(Refusal::unavailable("keepalive not acknowledged in time"));
                }
            }
        }
    }

    /// Ends `lease`'s stream if it is still the `generation`th opened; its
    /// waiters try once more on a new one.
    async fn close(&self, lease: i64, generation: u64) {
        let mut slot = self.slot(lease).lock().await;
        if let Slot::Open(s) = &*slot
            && s.generation == generation
        {
            end(&s.waiting, Ended::Other);
            *slot = Slot::Closed;
        }
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
    tokio::spawn(async move {
        let why = loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Err(e) if auth_raced(&e) => break Ended::AuthRace,
                _ => break Ended::Other,
            };
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

use crate::{Client, Error};
use holdfast_model::{LockKey, Token};
use holdfast_proto::v1::{AcquireRequest, CloseSessionRequest, KeepAliveRequest, ReleaseRequest};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// Margin kept between the local deadline and the server's expiry.
pub const FENCE_MARGIN: Duration = Duration::from_secs(1);

/// What the session knows about its own liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The last keepalive was acknowledged.
    Healthy,
    /// A keepalive failed; the session may still be alive on the server.
    /// Do not start new work.
    Degraded,
    /// The local deadline passed, or the server said the session is gone.
    /// Treat every hold of this session as lost.
    Lost,
}

/// What became of one keepalive, for a [`KeepaliveObserver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepaliveOutcome {
    /// Renewed, in a confirmed Raft term: the local deadline moved.
    Renewed,
    /// The server says the session is gone: the keepalive renewed nothing.
    Gone,
    /// No usable answer (timeout, lost stream, or renewed in an unconfirmed
    /// term): it may or may not have renewed the lease.
    Unknown,
}

/// Sees every keepalive a session sends (recorders such as the correctness
/// gate use it; applications do not need it).
pub trait KeepaliveObserver: Send + Sync {
    /// A keepalive of `session` is about to be sent; the value returned is
    /// handed back with its outcome.
    fn sent(&self, session: u64) -> u64;
    /// The outcome of the keepalive `sent` returned `mark` for. Not called
    /// when the keepalive was abandoned because the local deadline passed.
    fn answered(&self, session: u64, mark: u64, outcome: KeepaliveOutcome);
    /// The session's local deadline is now `until`: until then the session
    /// treats every hold as alive (set when the session opens and after
    /// every renewal). Recorders compare it with the lease's real end.
    fn deadline(&self, _session: u64, _until: Instant) {}
}

struct Clock {
    /// Monotonic send time of the last acknowledged keepalive + TTL − margin.
    deadline: Instant,
}

/// A session: one lease on the server, renewed in the background.
pub struct Session {
    /// The arbiter the session was opened on (closing goes there first).
    client: Client,
    id: u64,
    ttl: Duration,
    /// The tier the session lives on ("entity" or "coord").
    pub(crate) tier: String,
    /// Opened without etcd (see [`Session::unprotected`]).
    pub(crate) unprotected: bool,
    health: watch::Receiver<Health>,
    clock: Arc<Mutex<Clock>>,
    task: tokio::task::JoinHandle<()>,
}

impl Session {
    /// `opened_at` is when the open call was sent: the lease cannot have
    /// started earlier, so the first deadline counts from there.
    /// Keepalives go to `clients[0]` and fail over to the others in turn.
    pub(crate) fn start(
        clients: Vec<Client>,
        id: u64,
        ttl: Duration,
        opened_at: Instant,
        observer: Option<Arc<dyn KeepaliveObserver>>,
    ) -> Self {
        let (tx, rx) = watch::channel(Health::Healthy);
        let deadline = fence_deadline(opened_at, ttl);
        // An open answered after its deadline (the process stopped while the
        // call was in flight) promises nothing: the loop ends the session.
        if let Some(o) = &observer
            && deadline > Instant::now()
        {
            o.deadline(id, deadline);
        }
        let clock = Arc::new(Mutex::new(Clock { deadline }));
        let client = clients[0].clone();
        let task = tokio::spawn(keepalive_loop(clients, id, ttl, tx, clock.clone(), observer));
        Session { client, id, ttl, tier: "entity".into(), unprotected: false, health: rx, clock, task }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The tier the session lives on, "entity" or "coord" (the tier of the
    /// class it was opened for): it can hold keys of that tier's classes.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// True for an **unprotected** session: the arbiter opened it from
    /// memory because etcd was out of its reach and the class has
    /// `on_quorum_loss = "open"`. Its grants carry token 0 and exclude
    /// other holders only on that arbiter; it is lost once etcd is back.
    pub fn unprotected(&self) -> bool {
        self.unprotected
    }

    /// Watch this to learn when the session degrades or is lost.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// True while keepalives are acknowledged: new work may start.
    pub fn can_start(&self) -> bool {
        *self.health.borrow() == Health::Healthy
    }

    /// Time left before the local deadline (zero once lost).
    pub fn remaining_ttl(&self) -> Duration {
        self.clock.lock().unwrap_or_else(|e| e.into_inner()).deadline.saturating_duration_since(Instant::now())
    }

    /// Acquires `key`, waiting up to `wait` while another session holds it.
    /// Refused locally once the session is lost.
    pub async fn acquire(&self, key: &LockKey, wait: Duration) -> Result<Hold, Error> {
        self.acquire_on(&self.client, key, wait).await
    }

    /// Acquires through a chosen arbiter (any arbiter serves any session).
    /// Whether the wait is recorded in etcd (its order surviving an arbiter
    /// restart) is the key's class's `fairness`.
    pub async fn acquire_on(&self, client: &Client, key: &LockKey, wait: Duration) -> Result<Hold, Error> {
        self.ensure_alive()?;
        let req = AcquireRequest {
            session_id: self.id,
            namespace: key.namespace().into(),
            key: key.key().into(),
            wait_millis: wait.as_millis() as u64,
        };
        let resp = client.rpc.clone().acquire(req).await?.into_inner();
        let token = if resp.unprotected {
            Token::unprotected()
        } else {
            Token::from_wire(resp.token).map_err(|e| Error::Config(format!("the arbiter returned a malformed token ({e})")))?
        };
        let hold = Hold { client: client.clone(), session_id: self.id, key: key.clone(), token };
        if let Err(e) = self.ensure_alive() {
            // Lost while the grant was in flight: the hold cannot be trusted.
            let _ = hold.release().await;
            return Err(e);
        }
        Ok(hold)
    }

    fn ensure_alive(&self) -> Result<(), Error> {
        if *self.health.borrow() == Health::Lost || self.remaining_ttl().is_zero() {
            return Err(Error::Refused {
                code: tonic::Code::FailedPrecondition,
                reason: holdfast_proto::ErrorReason::SessionNotFound,
                field: String::new(),
                message: "the session is lost (its local deadline passed); open a new session".into(),
                retry_after: None,
            });
        }
        Ok(())
    }

    /// Ends the session and every hold on it.
    pub async fn close(&self) -> Result<(), Error> {
        self.task.abort();
        self.client.rpc.clone().close_session(CloseSessionRequest { session_id: self.id }).await?;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One granted hold. The token is a capability: pass it to the resource.
#[derive(Debug)]
pub struct Hold {
    client: Client,
    session_id: u64,
    key: LockKey,
    token: Token,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

impl Hold {
    /// The fencing token ([`Token::unprotected`] for an unprotected grant).
    pub fn token(&self) -> Token {
        self.token
    }

    /// True for a grant made without etcd: token 0, one holder per key on
    /// the granting arbiter only (see [`Session::unprotected`]).
    pub fn unprotected(&self) -> bool {
        self.token.is_unprotected()
    }

    pub fn key(&self) -> &LockKey {
        &self.key
    }

    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    /// Releases this hold. `Ok(false)`: it was already gone (expired or
    /// released), and nothing else was touched.
    pub async fn release(self) -> Result<bool, Error> {
        let req = ReleaseRequest {
            session_id: self.session_id,
            namespace: self.key.namespace().into(),
            key: self.key.key().into(),
            token: self.token.expose(),
        };
        Ok(self.client.rpc.clone().release(req).await?.into_inner().released)
    }
}

type KeepAliveStream = (tokio::sync::mpsc::Sender<KeepAliveRequest>, tonic::Streaming<holdfast_proto::v1::KeepAliveResponse>);

enum Round {
    /// Acknowledged; the monotonic time the keepalive was sent.
    Acked(Instant),
    /// The server says the session no longer exists.
    Gone,
    /// No acknowledgement: error, closed stream or timeout.
    Failed,
}

/// Opens the stream if needed, sends one keepalive and waits for its answer.
async fn round(
    client: &Client,
    id: u64,
    stream: &mut Option<KeepAliveStream>,
    period: Duration,
    observer: Option<&dyn KeepaliveObserver>,
) -> Round {
    let mark = observer.map(|o| o.sent(id));
    let r = round_inner(client, id, stream, period).await;
    if let (Some(o), Some(mark)) = (observer, mark) {
        let outcome = match r {
            Round::Acked(_) => KeepaliveOutcome::Renewed,
            Round::Gone => KeepaliveOutcome::Gone,
            Round::Failed => KeepaliveOutcome::Unknown,
        };
        o.answered(id, mark, outcome);
    }
    r
}

async fn round_inner(client: &Client, id: u64, stream: &mut Option<KeepAliveStream>, period: Duration) -> Round {
    if stream.is_none() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut rpc = client.rpc.clone();
        let call = rpc.keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx));
        match tokio::time::timeout(period, call).await {
            Ok(Ok(resp)) => *stream = Some((tx, resp.into_inner())),
            _ => return Round::Failed,
        }
    }
    let Some((tx, incoming)) = stream.as_mut() else { return Round::Failed };
    let sent_at = Instant::now();
    let answer = tokio::time::timeout(period, async {
        tx.send(KeepAliveRequest { session_id: id }).await.ok()?;
        incoming.next().await
    })
    .await;
    match answer {
        Ok(Some(Ok(resp))) if resp.ttl_millis > 0 && resp.confirmed => Round::Acked(sent_at),
        // Renewed by a leader whose term was not confirmed: does not count.
        Ok(Some(Ok(resp))) if resp.ttl_millis > 0 => Round::Failed,
        Ok(Some(Ok(_))) => Round::Gone,
        // The arbiter knows the session is gone (expired, closed, revoked).
        Ok(Some(Err(status))) if holdfast_proto::reason_of(&status).map(|r| r.0) == Some(holdfast_proto::ErrorReason::SessionNotFound) => {
            Round::Gone
        }
        _ => Round::Failed,
    }
}

/// Renews the session every TTL/3. The local deadline is the monotonic
/// *send* time of the last acknowledged keepalive + TTL − [`FENCE_MARGIN`]:
/// the server cannot have extended the lease before that keepalive was sent,
/// so the deadline always falls before the server's expiry. When it passes,
/// the session is [`Health::Lost`] at once, whatever call is in flight.
async fn keepalive_loop(
    clients: Vec<Client>,
    id: u64,
    ttl: Duration,
    health: watch::Sender<Health>,
    clock: Arc<Mutex<Clock>>,
    observer: Option<Arc<dyn KeepaliveObserver>>,
) {
    let period = keepalive_period(ttl);
    let mut stream = None;
    let mut current = 0;
    loop {
        let deadline = clock.lock().unwrap_or_else(|e| e.into_inner()).deadline;
        let outcome = tokio::select! {
            _ = tokio::time::sleep_until(deadline) => Round::Gone,
            r = round(&clients[current], id, &mut stream, period, observer.as_deref()) => r,
        };
        match outcome {
            Round::Acked(sent_at) => {
                let deadline = fence_deadline(fence_anchor(sent_at), ttl);
                if deadline <= Instant::now() {
                    // The answer was read only after the deadline it sets
                    // (the process was stopped while it waited in the
                    // socket): it extends nothing, so the session is lost,
                    // neither healthy again nor reporting that deadline.
                    let _ = health.send(Health::Lost);
                    return;
                }
                clock.lock().unwrap_or_else(|e| e.into_inner()).deadline = deadline;
                if let Some(o) = &observer {
                    o.deadline(id, deadline);
                }
                let _ = health.send_if_modified(|h| std::mem::replace(h, Health::Healthy) != Health::Healthy);
                tokio::time::sleep_until(sent_at + period).await;
            }
            Round::Gone => {
                let _ = health.send(Health::Lost);
                return;
            }
            Round::Failed => {
                // Try the next arbiter: any arbiter renews any session.
                stream = None;
                current = (current + 1) % clients.len();
                let _ = health.send_if_modified(degrade);
                tokio::time::sleep_until((Instant::now() + Duration::from_millis(250)).min(deadline)).await;
            }
        }
    }
}

/// How often a session of this TTL sends a keepalive: TTL/3, at least
/// 500 ms.
pub fn keepalive_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(500))
}

/// The local deadline a keepalive sent at `sent_at` and confirmed sets:
/// `sent_at` + TTL − [`FENCE_MARGIN`]. The arbiter cannot have extended the
/// lease before the keepalive was sent, so the deadline falls before the
/// lease's end.
pub fn fence_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(FENCE_MARGIN)
}

/// Where the local deadline counts from: the acknowledged keepalive's send
/// time. (The `fence_from_receive_time` mutation counts from the answer's
/// arrival instead: see [`crate::mutations`].)
fn fence_anchor(sent_at: Instant) -> Instant {
    #[cfg(feature = "mutations")]
    if crate::mutations::fence_from_receive_time() {
        return Instant::now();
    }
    sent_at
}

fn degrade(h: &mut Health) -> bool {
    if *h == Health::Healthy {
        *h = Health::Degraded;
        true
    } else {
        false
    }
}

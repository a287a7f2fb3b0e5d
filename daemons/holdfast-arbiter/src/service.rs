//! The lock.v1 service. Every request is checked here, at the boundary,
//! before anything reaches etcd: bad input is refused with InvalidArgument
//! naming the field, and writes nothing.

use crate::cluster::{self, Cluster, Clusters};
use crate::grant;
use crate::seal::Serve;
use crate::{Refusal, identity};
use holdfast_model::{LockKey, Token, ttl};
use holdfast_policy::{Action, Tier};
use holdfast_proto::v1::*;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, Span};

/// Longest wait a single Acquire may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// Sessions one keepalive stream may renew.
pub const MAX_SESSIONS_PER_STREAM: usize = 1024;

#[derive(Clone)]
pub struct LockService {
    /// The etcd clusters, and which one each tier's keys live on.
    pub clusters: Clusters,
    /// Becomes true on SIGTERM: waits and keepalive streams end so the
    /// drain finishes promptly.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The published class set, enforced before any etcd read.
    pub policy: Arc<crate::policy::Policy>,
    /// The per-identity request rate and the session and hold quotas.
    pub limits: Arc<crate::limits::Limits>,
    /// The SPIFFE trust domain callers must belong to (`tls.trust_domain`).
    pub trust_domain: Arc<str>,
    /// Sessions and holds of open classes granted from memory while etcd
    /// is out of reach.
    pub unprotected: Arc<crate::unprotected::Unprotected>,
}

impl LockService {
    /// The session (`parse_session` of its wire ID) if it exists and is the
    /// caller's: its cluster and the session.
    async fn owned(&self, (tier, lease): (Tier, i64), who: &str) -> Result<(&Arc<Cluster>, crate::session::Owned), Refusal> {
        let c = self.clusters.of(tier);
        let session = c.seen(c.sessions.owned(&c.etcd, lease, who, tier).await)?;
        Ok((c, session))
    }

    /// The caller's SPIFFE ID, once its request is within its rate.
    fn admit<T>(&self, req: &Request<T>) -> Result<String, Refusal> {
        self.admit_until(req).map(|(who, _)| who)
    }

    /// [`Self::admit`], and the end of the caller's certificate (Unix
    /// seconds), for a stream that checks it again on each message.
    fn admit_until<T>(&self, req: &Request<T>) -> Result<(String, i64), Refusal> {
        let (who, not_after) = caller(req, &self.trust_domain)?;
        self.limits.admit(&who)?;
        Ok((who, not_after))
    }

    async fn until_stopping(&self) {
        let mut s = self.stopping.clone();
        let _ = s.wait_for(|v| *v).await;
    }
}

/// The caller's SPIFFE ID, from the verified client certificate, and the
/// certificate's end; refused once it has expired.
fn caller<T>(req: &Request<T>, trust_domain: &str) -> Result<(String, i64), Refusal> {
    let certs = req.peer_certs().ok_or_else(|| Refusal::unauthenticated("no client certificate; connect with mTLS and an X.509 SVID"))?;
    let leaf = certs.first().ok_or_else(|| Refusal::unauthenticated("no client certificate; connect with mTLS and an X.509 SVID"))?;
    let (who, not_after) = identity::identify(leaf.as_ref(), trust_domain).map_err(Refusal::unauthenticated)?;
    if let Some(why) = identity::expired(not_after, identity::now()) {
        return Err(Refusal::unauthenticated(why));
    }
    Ok((who, not_after))
}

fn lock_key(namespace: &str, key: &str) -> Result<LockKey, Refusal> {
    LockKey::new(namespace, key).map_err(|e| Refusal::invalid(e.field, e.message))
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<KeepAliveResponse, Status>> + Send>>;

/// The span of one lock.v1 call, exported over OTLP when tracing is on
/// (see [`crate::telemetry`]). Fields are filled in once the request has been
/// checked: validated namespace and key, the session once it is known to
/// exist, and the outcome. Never a token, a revision or a request message.
macro_rules! rpc_span {
    ($method:literal) => {
        tracing::info_span!(
            concat!("lock.v1.Lock/", $method),
            otel.kind = "server",
            rpc.system = "grpc",
            namespace = tracing::field::Empty,
            key = tracing::field::Empty,
            session = tracing::field::Empty,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    };
}

/// Records a call's outcome on its span: a fixed word on success, the
/// refusal's reason otherwise (only an unavailable etcd marks it an error).
fn finish<T>(span: &Span, r: &Result<T, Refusal>, ok: impl FnOnce(&T) -> &'static str) {
    match r {
        Ok(v) => span.record("outcome", ok(v)),
        Err(e) => {
            if e.reason == holdfast_proto::ErrorReason::Unavailable {
                span.record("otel.status_code", "error");
            }
            span.record("outcome", e.outcome())
        }
    };
}

fn record_key(span: &Span, key: &LockKey) {
    span.record("namespace", key.namespace());
    span.record("key", key.key());
}

fn record_session(span: &Span, lease: i64) {
    span.record("session", format!("{lease:x}"));
}

#[tonic::async_trait]
impl holdfast_proto::Lock for LockService {
    async fn open_session(&self, req: Request<OpenSessionRequest>) -> Result<Response<OpenSessionResponse>, Status> {
        let span = rpc_span!("OpenSession");
        let r = async {
            let who = self.admit(&req)?;
            let requested = Duration::from_millis(req.get_ref().ttl_millis);
            let namespace = &req.get_ref().namespace;
            let (ttl, tier) = if namespace.is_empty() {
                let ttl = ttl::session_ttl(requested).map_err(|m| Refusal::invalid("ttl_millis", m))?;
                self.policy.may_open_session(&who)?;
                (ttl, Tier::Entity)
            } else {
                lock_key(namespace, "x")?;
                let class = self.policy.class_for_session(&who, namespace)?;
                if !requested.is_zero() && requested != class.ttl {
                    return Err(Refusal::invalid(
                        "ttl_millis",
                        format!(
                            "{}s is not the TTL of class {} (namespace {namespace:?}), which is {}s; leave the TTL out, or use a namespace whose class has the TTL you need",
                            requested.as_secs_f64(),
                            class.name,
                            class.ttl.as_secs()
                        ),
                    ));
                }
                if self.unprotected.applies(self.clusters.of(class.tier), &class) {
                    let id = self.unprotected.open(&who, &class, self.limits.max_sessions_per_identity())?;
                    record_session(&span, (id & !cluster::COORD_SESSION) as i64);
                    return Ok(OpenSessionResponse {
                        session_id: id,
                        ttl_millis: class.ttl.as_millis() as u64,
                        tier: cluster::tier_name(class.tier).into(),
                        unprotected: true,
                    });
                }
                (class.ttl, class.tier)
            };
            let c = self.clusters.of(tier);
            let slot = self.limits.session_quota(&who, c.ledger).await?;
            let (lease, granted, revision, term) = c.seen(c.sessions.open(&c.etcd, &who, ttl, tier).await)?;
            c.deposed.granted(lease, term);
            slot.opened(revision);
            record_session(&span, lease);
            tracing::debug!(identity = %who, session = format!("{lease:x}"), ttl_s = granted, cluster = c.name(), "session opened");
            Ok(OpenSessionResponse {
                session_id: cluster::session_id(tier, lease),
                ttl_millis: granted as u64 * 1000,
                tier: cluster::tier_name(tier).into(),
                unprotected: false,
            })
        }
        .instrument(span.clone())
        .await;
        finish(&span, &r, |_| "opened");
        Ok(Response::new(r?))
    }

    type KeepAliveStream = KeepAliveStream;

    async fn keep_alive(&self, req: Request<Streaming<KeepAliveRequest>>) -> Result<Response<Self::KeepAliveStream>, Status> {
        let (who, not_after) = match self.admit_until(&req) {
            Ok(caller) => caller,
            Err(e) => {
                finish(&rpc_span!("KeepAlive"), &Err::<(), _>(e.clone()), |_| "");
                return Err(e.into());
            }
        };
        let mut incoming = req.into_inner();
        let svc = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        // The stream ends when the certificate expires, renewal or not (a
        // class of 300 s renews only every 100 s).
        let left = Duration::from_secs(u64::try_from(not_after - identity::now()).unwrap_or(0) + 1);
        let expires = tokio::time::Instant::now() + left;
        tokio::spawn(async move {
            let mut known = Known::new();
            loop {
                let msg = tokio::select! {
                    m = incoming.next() => m,
                    _ = svc.until_stopping() => None,
                    _ = tokio::time::sleep_until(expires) => {
                        let refused = Refusal::unauthenticated(identity::expired(not_after, identity::now()).unwrap_or_default());
                        finish(&rpc_span!("KeepAlive"), &Err::<(), _>(refused.clone()), |_| "");
                        let _ = tx.send(Err(refused.into())).await;
                        break;
                    }
                };
                let Some(Ok(msg)) = msg else { break };
                // One span per renewal: the stream itself lives as long as the session.
                let span = rpc_span!("KeepAlive");
                let reply = svc.renew(&who, msg.session_id, &mut known, &span).instrument(span.clone()).await;
                finish(&span, &reply, |r| if r.ttl_millis > 0 { "renewed" } else { "expired" });
                drop(span);
                if tx.send(reply.map_err(Status::from)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn close_session(&self, req: Request<CloseSessionRequest>) -> Result<Response<CloseSessionResponse>, Status> {
        let span = rpc_span!("CloseSession");
        let r = async {
            let who = self.admit(&req)?;
            let id = req.get_ref().session_id;
            if self.unprotected.is_local(id) {
                return self.unprotected.close(&self.clusters, id, &who).await.map(|()| CloseSessionResponse {});
            }
            let (c, session) = self.owned(cluster::parse_session(id)?, &who).await?;
            record_session(&span, session.lease);
            c.deposed.forget(session.lease);
            c.seen(c.sessions.close(&c.etcd, session.lease).await)?;
            Ok(CloseSessionResponse {})
        }
        .instrument(span.clone())
        .await;
        finish(&span, &r, |_| "closed");
        Ok(Response::new(r?))
    }

    async fn acquire(&self, req: Request<AcquireRequest>) -> Result<Response<AcquireResponse>, Status> {
        let span = rpc_span!("Acquire");
        let r = self.acquire_call(req, &span).instrument(span.clone()).await;
        finish(&span, &r, |_| "granted");
        Ok(Response::new(r?))
    }

    async fn release(&self, req: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let span = rpc_span!("Release");
        let r = async {
            let who = self.admit(&req)?;
            let r = req.get_ref();
            let key = lock_key(&r.namespace, &r.key)?;
            record_key(&span, &key);
            if self.unprotected.is_local(r.session_id) {
                if r.token != 0 {
                    return Err(Refusal::invalid("token", "an unprotected hold's token is 0"));
                }
                let (tier, _) = cluster::parse_session(r.session_id)?;
                return self
                    .unprotected
                    .release(self.clusters.of(tier), r.session_id, &who, &key)
                    .await
                    .map(|released| ReleaseResponse { released });
            }
            let id = cluster::parse_session(r.session_id)?;
            let token = Token::from_wire(r.token).map_err(|_| Refusal::invalid("token", "is not a token any arbiter minted"))?;
            // The hold lives where its session lives.
            let (c, session) = self.owned(id, &who).await?;
            record_session(&span, session.lease);
            let hold_key = holdfast_model::layout::hold_key(&key);
            let released = c.seen(grant::release(c.waiters.committer(), &c.guard, &session, &hold_key, token).await)?;
            if released {
                c.waiters.released(&hold_key, token.revision() as i64);
            }
            Ok(ReleaseResponse { released })
        }
        .instrument(span.clone())
        .await;
        finish(&span, &r, |r| if r.released { "released" } else { "not_held" });
        Ok(Response::new(r?))
    }

    async fn inspect(&self, req: Request<InspectRequest>) -> Result<Response<InspectResponse>, Status> {
        let span = rpc_span!("Inspect");
        let r = async {
            let who = self.admit(&req)?;
            let r = req.get_ref();
            let key = lock_key(&r.namespace, &r.key)?;
            record_key(&span, &key);
            let class = self.policy.authorize(&who, &key, Action::Inspect)?;
            let c = self.clusters.of(class.tier);
            let waiters = c.waiters.count(&holdfast_model::layout::hold_key(&key));
            let epoch = match c.guard.state() {
                Serve::Serving(c) => c.record.epoch,
                _ => 0,
            };
            Ok(match c.seen(grant::inspect(&c.etcd, &key).await)? {
                Some((hold, lease)) => InspectResponse {
                    held: true,
                    holder_identity: hold.spiffe_id,
                    session_id: cluster::session_id(class.tier, lease),
                    waiters,
                    epoch: hold.epoch,
                    since_unix_ms: hold.granted_unix_ms,
                },
                None => InspectResponse { held: false, waiters, epoch, ..Default::default() },
            })
        }
        .instrument(span.clone())
        .await;
        finish(&span, &r, |r| if r.held { "held" } else { "free" });
        Ok(Response::new(r?))
    }

    async fn validate_token(&self, req: Request<ValidateTokenRequest>) -> Result<Response<ValidateTokenResponse>, Status> {
        let span = rpc_span!("ValidateToken");
        let r = async {
            let who = self.admit(&req)?;
            let r = req.get_ref();
            let key = lock_key(&r.namespace, &r.key)?;
            record_key(&span, &key);
            // Resources check tokens for keys they may inspect; the check is
            // in memory, so it comes before the rate limit.
            let class = self.policy.authorize(&who, &key, Action::Inspect)?;
            if let Err(limited) = self.limits.admit_validate(&who) {
                let refused = Err(limited);
                crate::validate::count(&class, &refused);
                return refused.map(|valid| ValidateTokenResponse { valid });
            }
            // The token is compared, never recorded: not on the span, not in a log.
            let c = self.clusters.of(class.tier);
            let valid = c.seen(crate::validate::check(&c.etcd, &c.guard, &key, r.token).await);
            crate::validate::count(&class, &valid);
            valid.map(|valid| ValidateTokenResponse { valid })
        }
        .instrument(span.clone())
        .await;
        finish(&span, &r, |r| if r.valid { "valid" } else { "invalid" });
        Ok(Response::new(r?))
    }

    async fn server_status(&self, req: Request<ServerStatusRequest>) -> Result<Response<ServerStatusResponse>, Status> {
        self.admit(&req)?;
        let entity = &self.clusters.entity;
        let etcd_version = entity.guard.etcd_version();
        let clusters = self.clusters.all().into_iter().map(|c| cluster_state(c)).collect();
        let served = entity
            .guard
            .served
            .all()
            .into_iter()
            .map(|(cluster, r)| ServedEpoch { cluster, epoch: r.epoch, cluster_id: format!("{:x}", r.cluster_id) })
            .collect();
        let cluster = entity.name().to_string();
        let resp = match entity.guard.state() {
            Serve::Serving(c) => ServerStatusResponse {
                epoch: c.record.epoch,
                cluster_id: format!("{:x}", c.record.cluster_id),
                sealed: false,
                sealed_reason: String::new(),
                etcd_version,
                serving: true,
                grant_attempts: crate::metrics::METRICS.counter(|m| &m.grant_attempts),
                served,
                cluster,
                clusters,
            },
            Serve::Sealed { reason, .. } => {
                ServerStatusResponse { sealed: true, sealed_reason: reason, etcd_version, served, cluster, clusters, ..Default::default() }
            }
            Serve::Unverified(why) => ServerStatusResponse {
                sealed_reason: format!("not serving yet: {why}"),
                etcd_version,
                served,
                cluster,
                clusters,
                ..Default::default()
            },
        };
        Ok(Response::new(resp))
    }
}

impl LockService {
    async fn acquire_call(&self, req: Request<AcquireRequest>, span: &Span) -> Result<AcquireResponse, Refusal> {
        let who = self.admit(&req)?;
        let r = req.get_ref();
        let key = lock_key(&r.namespace, &r.key)?;
        record_key(span, &key);
        let (tier, lease) = cluster::parse_session(r.session_id)?;
        let wait = Duration::from_millis(r.wait_millis);
        if wait > MAX_WAIT {
            return Err(Refusal::invalid("wait_millis", "is over one hour; wait in shorter steps"));
        }
        // Before anything is read from etcd: a denial cannot depend on the key.
        let class = self.policy.authorize(&who, &key, Action::Lock).inspect_err(|_| crate::metrics::inc(|m| &m.denied))?;
        if tier != class.tier {
            crate::metrics::inc(|m| &m.denied);
            return Err(crate::policy::class_tier(&key, &class, tier));
        }
        if self.unprotected.is_local(r.session_id) {
            record_session(span, lease);
            let deadline = tokio::time::Instant::now() + wait;
            let c = self.clusters.of(tier);
            let granted = tokio::select! {
                r = self.unprotected.acquire(c, r.session_id, &who, &key, &class, deadline) => r,
                _ = self.until_stopping() => return Err(Refusal::not_serving("this arbiter is shutting down; retry on another")),
            };
            count_outcome(&granted, &class);
            granted?;
            return Ok(AcquireResponse { token: 0, epoch: 0, revision: 0, unprotected: true });
        }
        self.limits.hold_quota(&who, &key).await?;
        let (c, session) = self.owned((tier, lease), &who).await?;
        record_session(span, lease);
        if session.record.ttl_secs != class.ttl.as_secs() {
            crate::metrics::inc(|m| &m.denied);
            return Err(crate::policy::class_ttl(&key, &class, session.record.ttl_secs));
        }
        let deadline = tokio::time::Instant::now() + wait;
        let wait = async {
            // The class decides, never the request (a caller cannot make a
            // best-effort class write /q/, nor skip a durable class's queue).
            if class.fairness == holdfast_policy::Fairness::Durable {
                let quota = crate::waiting::WaiterQuota { limits: &self.limits, ledger: c.ledger };
                crate::waiting::acquire_durable(c.waiters.committer(), &c.etcd, &c.guard, &session, &key, quota, deadline).await
            } else {
                c.waiters.acquire(&c.etcd, &c.guard, &session, &key, deadline).await
            }
        };
        let token = tokio::select! {
            r = wait => {
                let r = c.seen(r);
                count_outcome(&r, &class);
                r?
            }
            _ = self.until_stopping() => return Err(Refusal::not_serving("this arbiter is shutting down; retry on another")),
        };
        c.expiries.granted(&holdfast_model::layout::hold_key(&key), token);
        self.limits.wrote(c.ledger, token.revision() as i64);
        Ok(AcquireResponse { token: token.expose(), epoch: token.epoch(), revision: token.revision(), unprotected: false })
    }
}

/// One counter per acquire outcome (outcomes are metric names, not
/// labels): granted, contention and leak per class, the rest process-wide.
fn count_outcome<T>(r: &Result<T, Refusal>, class: &holdfast_policy::Class) {
    use crate::metrics::{inc, inc_class};
    use holdfast_proto::ErrorReason as R;
    match r {
        Ok(_) => inc_class(|m| &m.granted, class),
        Err(e) => match e.reason {
            R::Contention => inc_class(|m| &m.contention, class),
            R::Leak => inc_class(|m| &m.leak, class),
            R::Sealed | R::Unavailable => inc(|m| &m.sealed_refusals),
            _ => inc(|m| &m.denied),
        },
    }
}

/// The sessions (wire IDs) one client keepalive stream has renewed: each
/// checked once as the caller's own.
type Known = std::collections::HashSet<u64>;

/// One cluster's state for ServerStatus.
fn cluster_state(c: &Cluster) -> ClusterState {
    let (name, tiers) = (c.name().to_string(), c.tiers.to_string());
    match c.guard.state() {
        Serve::Serving(s) => ClusterState {
            name,
            tiers,
            epoch: s.record.epoch,
            cluster_id: format!("{:x}", s.record.cluster_id),
            serving: true,
            ..Default::default()
        },
        Serve::Sealed { reason, epoch } => {
            ClusterState { name, tiers, epoch: epoch.unwrap_or(0), sealed: true, sealed_reason: reason, ..Default::default() }
        }
        Serve::Unverified(why) => ClusterState { name, tiers, sealed_reason: format!("not serving yet: {why}"), ..Default::default() },
    }
}

impl LockService {
    /// Renews one session through the arbiter's shared etcd keepalive stream
    /// ([`crate::renewal`]).
    async fn renew(&self, who: &str, id: u64, known: &mut Known, span: &Span) -> Result<KeepAliveResponse, Refusal> {
        if let Some(ttl) = self.unprotected.renew(id, who)? {
            record_session(span, (id & !cluster::COORD_SESSION) as i64);
            // Answered by this arbiter, the only place the session exists.
            return Ok(KeepAliveResponse { session_id: id, ttl_millis: ttl.as_millis() as u64, confirmed: !ttl.is_zero() });
        }
        let (tier, lease) = cluster::parse_session(id)?;
        let c = self.clusters.of(tier);
        if !known.contains(&id) {
            if known.len() >= MAX_SESSIONS_PER_STREAM {
                return Err(Refusal::invalid(
                    "session_id",
                    format!("one keepalive stream renews at most {MAX_SESSIONS_PER_STREAM} sessions; open another stream"),
                ));
            }
            c.seen(c.sessions.owned(&c.etcd, lease, who, tier).await)?;
            known.insert(id);
        }
        // Known to this stream: checked as the caller's own session, now or before.
        record_session(span, lease);
        let outcome = async {
            let (sent_at, resp) = match c.renewer.renew(lease).await? {
                crate::renewal::Renewal::Answered { sent_at, resp } => (sent_at, resp),
                crate::renewal::Renewal::NotFound => return Ok((0, false)),
            };
            let acked_term = resp.header().map(|h| h.raft_term());
            #[cfg(feature = "mutations")]
            let (unconfirmed_counts, deposed_ignored) = (
                holdfast_store::mutation::on(&holdfast_store::mutation::NO_KEEPALIVE_CONFIRMATION),
                holdfast_store::mutation::on(&holdfast_store::mutation::NO_DEPOSED_LEADER_CHECK),
            );
            #[cfg(not(feature = "mutations"))]
            let (unconfirmed_counts, deposed_ignored) = (false, false);
            let confirmed =
                resp.ttl() > 0 && (unconfirmed_counts || (acked_term.is_some() && c.confirmer.term_after(sent_at).await == acked_term));
            if resp.ttl() > 0 && !confirmed {
                crate::metrics::inc(|m| &m.unconfirmed_keepalives);
                tracing::warn!(
                    session = format!("{lease:x}"),
                    "keepalive acknowledged in a Raft term a quorum read did not confirm; not counted"
                );
            }
            // Counted only once no deposed leader can revoke the lease
            // ([`crate::deposed`]); waited for within a quarter of the TTL
            // (the client's keepalive waits a third).
            let within = Duration::from_millis(ttl_of(&resp) * 250);
            let confirmed = confirmed
                && (deposed_ignored || c.deposed.count(lease, acked_term.unwrap_or(u64::MAX), within).await || {
                    crate::metrics::inc(|m| &m.keepalives_held_for_deposed_leader);
                    false
                });
            Ok::<(i64, bool), Refusal>((resp.ttl(), confirmed))
        }
        .await;
        match outcome {
            Ok((ttl, confirmed)) if ttl > 0 => Ok(KeepAliveResponse { session_id: id, ttl_millis: ttl as u64 * 1000, confirmed }),
            Ok(_) => {
                known.remove(&id);
                c.sessions.forget(lease);
                c.deposed.forget(lease);
                Ok(KeepAliveResponse { session_id: id, ttl_millis: 0, confirmed: false })
            }
            Err(e) => {
                crate::metrics::inc(|m| &m.renewal_failures);
                known.remove(&id);
                c.seen(Err(e))
            }
        }
    }
}

/// The TTL etcd renewed a lease to, in seconds (at least 1).
fn ttl_of(resp: &etcd_client::LeaseKeepAliveResponse) -> u64 {
    resp.ttl().max(1) as u64
}

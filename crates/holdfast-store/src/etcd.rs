//! Connecting to etcd: one balanced client for grants, one for long-lived
//! watches that requires a leader, and one client per member for the Status
//! calls that restore detection needs.
//!
//! Over `https://` the TLS is ours, not etcd-client's: every new connection
//! goes through a [`holdfast_tls::Dialer`] that re-reads `etcd.cert_file`,
//! `etcd.key_file` and `etcd.ca_file`, so a daemon's etcd certificate can be
//! rotated on disk without a restart (connections already open keep theirs;
//! etcd takes the user from the certificate at the handshake). The balanced
//! channel is built like tonic's own (power of two choices over lazily
//! connected channels, one per endpoint), with that dialer.

use anyhow::Context;
use etcd_client::{BalancedChannelBuilder, Client, ConnectOptions};
use holdfast_config::EtcdConfig;
use holdfast_model::seal::LogPosition;
use holdfast_tls::{Dialer, Files, Reloading};
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::StreamExt;

#[derive(Clone)]
pub struct Etcd {
    /// Balanced over every endpoint; used for grants, releases and reads.
    pub client: Client,
    /// Balanced over every endpoint, for long-lived watches: every request
    /// carries etcd's require-leader metadata (`hasleader`), so a member
    /// that has lost its leader refuses a new watch, and cancels one it
    /// carries (etcd's `monitorLeader` in `api/v3rpc/interceptor.go` ends
    /// such streams after 3 election timeouts without a leader) instead of
    /// holding it open and silent while the majority moves on. The watch
    /// loops then watch again, from where they stopped, on a member that
    /// has one. No request timeout: the streams are meant to last.
    pub watch: Client,
    /// One client per member, in the order of the configured endpoints.
    pub members: Vec<(String, Client)>,
    pub timeout: Duration,
    /// Each member's endpoint as the balanced clients know it (over TLS,
    /// the `http://` form our dialer takes), in the order of `members`.
    balanced: Vec<String>,
    /// The members [`Etcd::route_around`] left out of `client` and `watch`.
    left_out: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

/// A member [`Etcd::route_around`] left out of the balanced clients, or
/// took back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rerouted {
    /// The member's endpoint as configured.
    pub member: String,
    /// Taken back (it has a leader again); otherwise left out.
    pub back: bool,
    /// Why the balanced clients could not be changed, if they could not.
    pub error: Option<String>,
}

/// One member's Status answer.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub endpoint: String,
    pub position: LogPosition,
    pub cluster_id: u64,
    pub member_id: u64,
    pub leader: u64,
    pub raft_term: u64,
    pub version: String,
}

/// How long a request refused by [`auth_raced`] is sent again for. An
/// operator's script may change users or roles back to back for a while;
/// every write proposed while one of those changes is in flight is refused.
/// Below etcd's default request timeout here (5 s).
pub const AUTH_RACE_BUDGET: Duration = Duration::from_secs(2);

/// The longest wait between two tries; the waits double from 1 ms up to
/// it. etcd's Go client waits 25 ms between its tries too.
pub const AUTH_RACE_MAX_WAIT: Duration = Duration::from_millis(25);

/// Whether etcd refused the request because a change to its users or roles
/// (any `role grant-permission`, `user add`…) landed between the request's
/// arrival and its permission check: "etcdserver: revision of auth store is
/// old". etcd checks before it applies, so nothing of the request took
/// effect; etcd's own Go client retries such a request.
pub fn auth_raced(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::InvalidArgument && s.message().contains("revision of auth store is old"))
}

/// Called for each request sent again after [`auth_raced`] (the arbiter
/// counts them in a metric). Set once, at start; unset, nothing is counted.
pub static ON_AUTH_RACE_RESEND: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Counts one request sent again after [`auth_raced`] (see
/// [`ON_AUTH_RACE_RESEND`]).
pub fn note_auth_race_resend() {
    if let Some(f) = ON_AUTH_RACE_RESEND.get() {
        f()
    }
}

/// Sends a request again, for up to [`AUTH_RACE_BUDGET`], while etcd
/// refuses it as [`auth_raced`]: an operator changing etcd's users or roles
/// must not fail the lock calls in flight. Any other outcome is returned
/// as it is, and so is the last refusal once the budget is spent.
pub async fn retry_auth_race<T, Fut>(mut send: impl FnMut() -> Fut) -> Result<T, etcd_client::Error>
where
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let started = tokio::time::Instant::now();
    let mut wait = Duration::from_millis(1);
    loop {
        match send().await {
            Err(e) if auth_raced(&e) && started.elapsed() + wait < AUTH_RACE_BUDGET => {
                note_auth_race_resend();
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(AUTH_RACE_MAX_WAIT);
            }
            outcome => return outcome,
        }
    }
}

impl Etcd {
    /// A transaction, sent again while etcd refuses it as [`auth_raced`].
    pub async fn txn(&self, txn: etcd_client::Txn) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
        retry_auth_race(|| {
            let (mut c, t) = (self.client.clone(), txn.clone());
            async move { c.txn(t).await }
        })
        .await
    }

    /// A range read, sent again while etcd refuses it as [`auth_raced`].
    pub async fn get(&self, key: &str, options: Option<etcd_client::GetOptions>) -> Result<etcd_client::GetResponse, etcd_client::Error> {
        retry_auth_race(|| {
            let (mut c, o) = (self.client.clone(), options.clone());
            async move { c.get(key, o).await }
        })
        .await
    }

    pub async fn connect(cfg: &EtcdConfig) -> anyhow::Result<Self> {
        let transport = Transport::new(cfg)?;
        let context = || format!("connecting to etcd at {}", cfg.endpoints.join(","));
        let client = transport.client(&cfg.endpoints, Calls::Bounded).await.with_context(context)?;
        let watch = transport.client(&cfg.endpoints, Calls::Watches).await.with_context(context)?;
        let mut members = Vec::new();
        for e in &cfg.endpoints {
            let c = transport
                .client(std::slice::from_ref(e), Calls::Bounded)
                .await
                .with_context(|| format!("connecting to etcd member {e}"))?;
            members.push((e.clone(), c));
        }
        let balanced =
            cfg.endpoints.iter().map(|e| if transport.tls.is_some() { e.replacen("https://", "http://", 1) } else { e.clone() }).collect();
        Ok(Etcd { client, watch, members, timeout: cfg.request_timeout, balanced, left_out: Default::default() })
    }

    /// Leaves out of the balanced clients (`client` and `watch`) every
    /// member whose Status answer in `answers` (as [`Etcd::member_status`]
    /// returns them) names no leader, or that did not answer, and takes back
    /// every one that answers with a leader again. A member cut off from the
    /// quorum keeps its client port open: without this, the calls the
    /// balancer sends it (one in three, with three members) wait out their
    /// request timeout, and each failure pauses granting. If no member has a
    /// leader, every member is used: nothing better is known. Returns what
    /// changed, for the caller to log.
    pub async fn route_around(&self, answers: &[Result<MemberStatus, String>]) -> Vec<Rerouted> {
        let with_leader: Vec<bool> = answers.iter().map(|a| matches!(a, Ok(s) if s.leader != 0)).collect();
        let any = with_leader.iter().any(|h| *h);
        let mut changes = Vec::new();
        {
            let mut out = self.left_out.lock().unwrap_or_else(|e| e.into_inner());
            for (uri, ok) in self.balanced.iter().zip(&with_leader) {
                let leave_out = any && !ok;
                if leave_out && out.insert(uri.clone()) {
                    changes.push((uri.clone(), false));
                } else if !leave_out && out.remove(uri) {
                    changes.push((uri.clone(), true));
                }
            }
        }
        let mut rerouted = Vec::new();
        for (uri, back) in changes {
            let member = self.members.iter().zip(&self.balanced).find(|(_, b)| **b == uri).map_or(uri.clone(), |((e, _), _)| e.clone());
            let mut error = None;
            for c in [&self.client, &self.watch] {
                let done = if back { c.add_endpoint(&uri).await } else { c.remove_endpoint(&uri).await };
                if let Err(e) = done {
                    error = Some(e.to_string());
                }
            }
            rerouted.push(Rerouted { member, back, error });
        }
        rerouted
    }

    /// Asks every member for its Status, concurrently, each within the
    /// request timeout. Members that fail are reported as errors.
    pub async fn member_status(&self) -> Vec<Result<MemberStatus, String>> {
        self.member_status_within(self.timeout).await
    }

    /// [`Etcd::member_status`], each answer waited for at most `timeout`.
    /// An error keeps its whole cause chain (a refused connection says so).
    pub async fn member_status_within(&self, timeout: Duration) -> Vec<Result<MemberStatus, String>> {
        let calls = self.members.iter().map(|(endpoint, client)| {
            let mut client = client.clone();
            let endpoint = endpoint.clone();
            async move {
                let status = tokio::time::timeout(timeout, client.status())
                    .await
                    .map_err(|_| format!("{endpoint}: no answer within {timeout:?}"))?
                    .map_err(|e| format!("{endpoint}: {}", holdfast_model::error_chain(&e)))?;
                let header = status.header().ok_or_else(|| format!("{endpoint}: status without header"))?;
                Ok(MemberStatus {
                    position: LogPosition { applied_index: status.raft_applied_index(), revision: header.revision() },
                    cluster_id: header.cluster_id(),
                    member_id: header.member_id(),
                    leader: status.leader(),
                    raft_term: status.raft_term(),
                    version: status.version().to_string(),
                    endpoint,
                })
            }
        });
        futures::future::join_all(calls).await
    }

    /// A lower bound of every member's log offset, or why there is none.
    ///
    /// One Status answer reads the revision and the applied index at two
    /// moments (etcd 3.6 reads the revision first), so its offset can exceed
    /// the true one by the writes applied in between: a floor raised to such
    /// a reading would later make an intact cluster look rewound. Two rounds
    /// bound it: the revision of the second round is at least the revision
    /// at the moment the first round read the applied index, so
    /// `applied(first) − revision(second)` never exceeds the member's true
    /// offset at that moment — and offsets never decrease.
    pub async fn offset_lower_bounds(&self) -> Result<Vec<i64>, String> {
        let first = self.member_status().await;
        let second = self.member_status().await;
        let mut bounds = Vec::new();
        for (a, b) in first.into_iter().zip(second) {
            let (a, b) = (a?, b?);
            bounds.push(a.position.applied_index as i64 - b.position.revision);
        }
        Ok(bounds)
    }
}

/// A balanced client whose calls have no overall deadline (connects and
/// keepalive pings still time out): for calls that wait by design, like an
/// election campaign, which answers only once the caller is elected.
pub async fn connect_for_waiting_calls(cfg: &EtcdConfig) -> anyhow::Result<Client> {
    Transport::new(cfg)?
        .client(&cfg.endpoints, Calls::Waiting)
        .await
        .with_context(|| format!("connecting to etcd at {}", cfg.endpoints.join(",")))
}

/// One etcd client over `cfg.endpoints` with `cfg`'s timeouts and TLS, for
/// tools that need a plain [`Client`] rather than an [`Etcd`].
pub async fn connect_client(cfg: &EtcdConfig) -> anyhow::Result<Client> {
    Transport::new(cfg)?
        .client(&cfg.endpoints, Calls::Bounded)
        .await
        .with_context(|| format!("connecting to etcd at {}", cfg.endpoints.join(",")))
}

/// What a client's calls are for, which decides its options.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// Each call within the request timeout.
    Bounded,
    /// Calls that wait by design (an election campaign): no overall deadline.
    Waiting,
    /// Long-lived watches: no overall deadline, and a leader required.
    Watches,
}

/// How a daemon reaches etcd: timeouts, keepalives, and (for `https://`
/// endpoints) the reloading TLS files.
struct Transport {
    cfg: EtcdConfig,
    tls: Option<Arc<Reloading<rustls::ClientConfig>>>,
}

impl Transport {
    fn new(cfg: &EtcdConfig) -> anyhow::Result<Self> {
        if let Some(e) = cfg.endpoints.iter().find(|e| holdfast_config::etcd::plaintext_off_host(e)) {
            anyhow::bail!("etcd endpoint {e:?} {}", holdfast_config::etcd::PLAINTEXT_OFF_HOST);
        }
        let https = cfg.endpoints.iter().filter(|e| e.starts_with("https://")).count();
        if https != 0 && https != cfg.endpoints.len() {
            anyhow::bail!("etcd.endpoints mixes https:// and other URLs; use https:// for every member");
        }
        let tls = if https == 0 {
            None
        } else {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let ca = cfg.ca_file.clone().context("etcd.endpoints are https:// but etcd.ca_file is not set; point it at the etcd CA")?;
            let (cert, key) = match (&cfg.cert_file, &cfg.key_file) {
                (Some(c), Some(k)) => (c.clone(), k.clone()),
                _ => anyhow::bail!(
                    "etcd.endpoints are https:// but etcd.cert_file and etcd.key_file are not both set; etcd runs with \
                     --client-cert-auth: give this tool the client certificate of its etcd user"
                ),
            };
            let files = Files { cert, key, ca };
            Some(Arc::new(Reloading::load(files, client_config).context("etcd TLS (etcd.ca_file, cert_file, key_file)")?))
        };
        Ok(Transport { cfg: cfg.clone(), tls })
    }

    fn options(&self, calls: Calls) -> ConnectOptions {
        let mut options = ConnectOptions::new().with_require_leader(calls == Calls::Watches);
        if calls == Calls::Bounded {
            options = options.with_timeout(self.cfg.request_timeout);
        }
        options
            .with_connect_timeout(self.cfg.request_timeout)
            .with_keep_alive(Duration::from_secs(5), self.cfg.request_timeout)
            .with_keep_alive_while_idle(true)
    }

    async fn client(&self, endpoints: &[String], calls: Calls) -> Result<Client, etcd_client::Error> {
        let options = Some(self.options(calls));
        match &self.tls {
            None => Client::connect(endpoints, options).await,
            Some(tls) => {
                // The TLS is the dialer's: etcd-client sees http:// URLs.
                let plain: Vec<String> = endpoints.iter().map(|e| e.replacen("https://", "http://", 1)).collect();
                Client::connect_with_balanced_channel(plain, options, ReloadingTls(tls.clone())).await
            }
        }
    }
}

/// etcd's client config: the tool's certificate (its CN is its etcd user),
/// trusting the etcd CA. gRPC over HTTP/2. No session resumption: etcd
/// verifies the certificate on every connection, so a replaced one is never
/// carried on by a resumed session.
fn client_config(pem: &holdfast_tls::Pem) -> Result<rustls::ClientConfig, holdfast_tls::TlsError> {
    let mut config = holdfast_tls::client_config(pem)?;
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

/// A balanced channel over lazily connected per-endpoint channels that dial
/// through the reloading [`Dialer`].
struct ReloadingTls(Arc<Reloading<rustls::ClientConfig>>);

type TonicChange = tonic::transport::channel::Change<http::Uri, tonic::transport::Endpoint>;

/// HTTP/2 flow-control windows of an etcd connection. The HTTP/2 library
/// (h2) closes a connection on which more small DATA frames wait unread than
/// a budget of half the connection window: at the default 64 KiB that is
/// about 145 keepalive answers, 18 ms of them at 40,000 sessions, and an
/// arbiter at that scale lost its etcd connection once to a scheduling
/// hiccup ("too_many_data_frames", `docs/benchmarks.md`, "Scale").
const CONNECTION_WINDOW: u32 = 8 << 20;
const STREAM_WINDOW: u32 = 1 << 20;

impl BalancedChannelBuilder for ReloadingTls {
    // Never returned: building the channel cannot fail.
    type Error = etcd_client::Error;

    fn balanced_channel(self, buffer_size: usize) -> Result<(etcd_client::Channel, tokio::sync::mpsc::Sender<TonicChange>), Self::Error> {
        let (tx, rx) = tokio::sync::mpsc::channel::<TonicChange>(buffer_size);
        let dialer = Dialer::new(self.0, None, "etcd client certificate (etcd.cert_file, key_file, ca_file)");
        let discover = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |change| {
            Ok::<_, tower::BoxError>(match change {
                TonicChange::Insert(uri, endpoint) => {
                    let channel = endpoint
                        .initial_connection_window_size(CONNECTION_WINDOW)
                        .initial_stream_window_size(STREAM_WINDOW)
                        .connect_with_connector_lazy(dialer.clone());
                    tower::discover::Change::Insert(uri, tower::load::Constant::new(channel, 0usize))
                }
                TonicChange::Remove(uri) => tower::discover::Change::Remove(uri),
            })
        });
        let balance = tower::balance::p2c::Balance::new(discover);
        let service = tower::buffer::Buffer::new(tower::util::BoxService::new(balance), buffer_size);
        Ok((etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(service)), tx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn raced() -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument("etcdserver: revision of auth store is old"))
    }

    /// Counts the sends; the first `refusals` are refused with `error`.
    async fn send_with(refusals: u32, error: fn() -> etcd_client::Error) -> (Result<u32, etcd_client::Error>, u32) {
        let sent = AtomicU32::new(0);
        let r = retry_auth_race(|| {
            let n = sent.fetch_add(1, Ordering::SeqCst) + 1;
            async move { if n <= refusals { Err(error()) } else { Ok(n) } }
        })
        .await;
        (r, sent.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn an_auth_race_is_sent_again_until_it_goes_through() {
        let (r, sent) = send_with(3, raced).await;
        assert_eq!(r.unwrap(), 4);
        assert_eq!(sent, 4);
    }

    #[tokio::test]
    async fn an_auth_race_that_persists_is_returned_once_the_budget_is_spent() {
        let started = std::time::Instant::now();
        let (r, sent) = send_with(u32::MAX, raced).await;
        let took = started.elapsed();
        assert!(auth_raced(&r.unwrap_err()));
        // 1, 2, 4, 8, 16 ms, then 25 ms apart: about 80 sends in 2 s, fewer
        // if the machine is slow to wake the sleeper.
        assert!(sent > 20, "{sent} sends");
        assert!(took + AUTH_RACE_MAX_WAIT >= AUTH_RACE_BUDGET, "gave up after {took:?}");
        assert!(took < AUTH_RACE_BUDGET + Duration::from_secs(1), "went on for {took:?}");
    }

    #[tokio::test]
    async fn other_refusals_are_returned_at_once() {
        let denied = || etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("etcdserver: permission denied"));
        let (r, sent) = send_with(u32::MAX, denied).await;
        assert!(!auth_raced(&r.unwrap_err()));
        assert_eq!(sent, 1);
        // The same words under another code are not the race either.
        let other = || etcd_client::Error::GRpcStatus(tonic::Status::unavailable("revision of auth store is old"));
        assert_eq!(send_with(u32::MAX, other).await.1, 1);
    }
}

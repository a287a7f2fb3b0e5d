use crate::Error;
use crate::session::Session;
use holdfast_model::{LockKey, Token};
use holdfast_proto::LockClient;
use holdfast_proto::v1::{
    InspectRequest, InspectResponse, OpenSessionRequest, ServerStatusRequest, ServerStatusResponse, ValidateTokenRequest,
};
use holdfast_tls::{Dialer, Files, Reloading};
use rustls::pki_types::ServerName;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Where the arbiter is and the mTLS material to reach it.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` or `https://host:port`.
    pub endpoint: String,
    /// CA bundle that signed the arbiter's certificate.
    pub ca: PathBuf,
    /// This workload's X.509 SVID and key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientConfig {
    /// Reads `HOLDFAST_ENDPOINT`, `HOLDFAST_CA`, `HOLDFAST_CERT`, `HOLDFAST_KEY`.
    pub fn from_env() -> Result<Self, Error> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| Error::Config(format!("{name} is not set; `source DIR/env` from `holdfastctl dev`, or set it")))
        };
        Ok(ClientConfig {
            endpoint: var("HOLDFAST_ENDPOINT")?,
            ca: var("HOLDFAST_CA")?.into(),
            cert: var("HOLDFAST_CERT")?.into(),
            key: var("HOLDFAST_KEY")?.into(),
        })
    }
}

/// A connection to one arbiter.
#[derive(Clone)]
pub struct Client {
    pub(crate) rpc: LockClient<Channel>,
    /// The same connection, for the standard services beside lock.v1.
    channel: Channel,
}

impl Client {
    /// Connects now; fails if the arbiter cannot be reached.
    pub async fn connect(cfg: &ClientConfig) -> Result<Self, Error> {
        let (endpoint, dialer) = Self::endpoint(cfg)?;
        let channel = endpoint
            .connect_with_connector(dialer)
            .await
            .map_err(|e| Error::Connect { endpoint: cfg.endpoint.clone(), message: holdfast_model::error_chain(&e) })?;
        Ok(Client { rpc: LockClient::new(channel.clone()), channel })
    }

    /// Connects on first use and reconnects as needed: calls fail with
    /// `Unavailable` while the arbiter is down.
    pub fn connect_lazy(cfg: &ClientConfig) -> Result<Self, Error> {
        let (endpoint, dialer) = Self::endpoint(cfg)?;
        let channel = endpoint.connect_with_connector_lazy(dialer);
        Ok(Client { rpc: LockClient::new(channel.clone()), channel })
    }

    /// The endpoint tonic speaks HTTP/2 to, and the dialer that makes its
    /// TLS connections: every (re)connection reads the SVID files again, so
    /// a rotated SVID is used without a new `Client`.
    fn endpoint(cfg: &ClientConfig) -> Result<(Endpoint, Dialer), Error> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rest = cfg.endpoint.split_once("://").map_or(cfg.endpoint.as_str(), |(scheme, rest)| if scheme == "https" { rest } else { "" });
        if rest.is_empty() {
            return Err(Error::Config(format!(
                "endpoint {:?}: the arbiter speaks mTLS only; use host:port or https://host:port",
                cfg.endpoint
            )));
        }
        let host = rest.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']']).to_string()).unwrap_or_default();
        let server_name = ServerName::try_from(host.clone())
            .map_err(|e| Error::Config(format!("endpoint {:?}: {host:?} is not a host name or IP address ({e})", cfg.endpoint)))?;
        let files = Files { cert: cfg.cert.clone(), key: cfg.key.clone(), ca: cfg.ca.clone() };
        let tls = Reloading::load(files, holdfast_tls::client_config).map_err(|e| Error::Config(e.to_string()))?;
        // TLS is the dialer's: tonic sees plain HTTP/2 over the TLS stream.
        let url = format!("http://{rest}");
        let endpoint = Endpoint::from_shared(url)
            .map_err(|e| Error::Config(format!("endpoint {:?} is not a URL: {e}", cfg.endpoint)))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        Ok((endpoint, Dialer::new(Arc::new(tls), Some(server_name), "client SVID (HOLDFAST_CERT, HOLDFAST_KEY, HOLDFAST_CA)")))
    }

    /// Opens a session with the given TTL (zero: the 15 s default). Keys can
    /// be acquired on it only in classes with that TTL; prefer
    /// [`Client::open_session_for`].
    pub async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        self.open_session_with(ttl, "", Vec::new(), None).await
    }

    /// Opens a session for the class of `namespace`: its TTL is the class's.
    /// `ttl`, if given, must equal it (the arbiter refuses another, naming
    /// the class).
    pub async fn open_session_for(&self, namespace: &str, ttl: Option<Duration>) -> Result<Session, Error> {
        self.open_session_with(ttl.unwrap_or_default(), namespace, Vec::new(), None).await
    }

    /// Opens a session whose every keepalive `observer` sees (recorders).
    pub async fn open_session_observed(
        &self,
        ttl: Duration,
        observer: std::sync::Arc<dyn crate::KeepaliveObserver>,
    ) -> Result<Session, Error> {
        self.open_session_with(ttl, "", Vec::new(), Some(observer)).await
    }

    /// [`Client::open_session_for`] with every keepalive seen by `observer`.
    pub async fn open_session_for_observed(
        &self,
        namespace: &str,
        ttl: Duration,
        observer: std::sync::Arc<dyn crate::KeepaliveObserver>,
    ) -> Result<Session, Error> {
        self.open_session_with(ttl, namespace, Vec::new(), Some(observer)).await
    }

    /// Opens a session here whose keepalives fail over to `others`.
    pub(crate) async fn open_session_with(
        &self,
        ttl: Duration,
        namespace: &str,
        others: Vec<Client>,
        observer: Option<std::sync::Arc<dyn crate::KeepaliveObserver>>,
    ) -> Result<Session, Error> {
        let opened_at = tokio::time::Instant::now();
        let req = OpenSessionRequest { ttl_millis: ttl.as_millis() as u64, namespace: namespace.to_string() };
        let resp = self.rpc.clone().open_session(req).await?.into_inner();
        let mut clients = vec![self.clone()];
        clients.extend(others);
        let mut session = Session::start(clients, resp.session_id, Duration::from_millis(resp.ttl_millis), opened_at, observer);
        // An arbiter of before tiers says none: its sessions are the entity tier's.
        session.tier = if resp.tier.is_empty() { "entity".into() } else { resp.tier };
        session.unprotected = resp.unprotected;
        Ok(session)
    }

    pub async fn inspect(&self, key: &LockKey) -> Result<InspectResponse, Error> {
        let req = InspectRequest { namespace: key.namespace().into(), key: key.key().into() };
        Ok(self.rpc.clone().inspect(req).await?.into_inner())
    }

    /// Whether `token` is the token of the hold on `key` now, as a
    /// linearizable read on the arbiter sees it: for resources that cannot
    /// store a fence mark. `false` for a free key, an earlier holder's token
    /// or another epoch's. The arbiter rate-limits this call (a refusal with
    /// [`crate::ErrorReason::Unavailable`]); a sealed arbiter refuses it.
    pub async fn validate_token(&self, key: &LockKey, token: Token) -> Result<bool, Error> {
        let req = ValidateTokenRequest { namespace: key.namespace().into(), key: key.key().into(), token: token.expose() };
        Ok(self.rpc.clone().validate_token(req).await?.into_inner().valid)
    }

    pub async fn server_status(&self) -> Result<ServerStatusResponse, Error> {
        Ok(self.rpc.clone().server_status(ServerStatusRequest {}).await?.into_inner())
    }

    /// The arbiter's standard gRPC health check (`grpc.health.v1`) for
    /// `service` ("" for the whole server, or "lock.v1.Lock"): true when it
    /// answers SERVING, i.e. it grants now; false while it is sealed, has
    /// not verified etcd, or is draining.
    pub async fn health(&self, service: &str) -> Result<bool, Error> {
        use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
        let reply = HealthClient::new(self.channel.clone()).check(HealthCheckRequest { service: service.to_string() }).await?.into_inner();
        Ok(reply.status == ServingStatus::Serving as i32)
    }

    /// The raw generated client, for callers that need a call this library
    /// does not wrap.
    pub fn rpc(&self) -> LockClient<Channel> {
        self.rpc.clone()
    }

    /// The connection itself (mTLS, this client's identity), for a call
    /// the generated client cannot make: another gRPC service, or a message
    /// of another shape.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }
}

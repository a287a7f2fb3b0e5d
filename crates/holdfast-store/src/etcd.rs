//! Connecting to etcd: one balanced client for grants, and one client per
//! member for the Status calls that restore detection needs.

use anyhow::Context;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use holdfast_config::EtcdConfig;
use holdfast_model::seal::LogPosition;
use std::time::Duration;

#[derive(Clone)]
pub struct Etcd {
    /// Balanced over every endpoint; used for grants, releases and reads.
    pub client: Client,
    /// One client per member, in the order of the configured endpoints.
    pub members: Vec<(String, Client)>,
    pub timeout: Duration,
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

impl Etcd {
    pub async fn connect(cfg: &EtcdConfig) -> anyhow::Result<Self> {
        let options = connect_options(cfg)?;
        let client = Client::connect(&cfg.endpoints, Some(options.clone()))
            .await
            .with_context(|| format!("connecting to etcd at {}", cfg.endpoints.join(",")))?;
        let mut members = Vec::new();
        for e in &cfg.endpoints {
            let c = Client::connect([e], Some(options.clone())).await.with_context(|| format!("connecting to etcd member {e}"))?;
            members.push((e.clone(), c));
        }
        Ok(Etcd { client, members, timeout: cfg.request_timeout })
    }

    /// Asks every member for its Status, concurrently, each within the
    /// request timeout. Members that fail are reported as errors.
    pub async fn member_status(&self) -> Vec<Result<MemberStatus, String>> {
        let calls = self.members.iter().map(|(endpoint, client)| {
            let mut client = client.clone();
            let endpoint = endpoint.clone();
            let timeout = self.timeout;
            async move {
                let status = tokio::time::timeout(timeout, client.status())
                    .await
                    .map_err(|_| format!("{endpoint}: no answer within {timeout:?}"))?
                    .map_err(|e| format!("{endpoint}: {e}"))?;
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
    let options = connect_options_with(cfg, false)?;
    Client::connect(&cfg.endpoints, Some(options)).await.with_context(|| format!("connecting to etcd at {}", cfg.endpoints.join(",")))
}

fn connect_options(cfg: &EtcdConfig) -> anyhow::Result<ConnectOptions> {
    connect_options_with(cfg, true)
}

fn connect_options_with(cfg: &EtcdConfig, request_timeout: bool) -> anyhow::Result<ConnectOptions> {
    let mut options = ConnectOptions::new();
    if request_timeout {
        options = options.with_timeout(cfg.request_timeout);
    }
    let mut options = options
        .with_connect_timeout(cfg.request_timeout)
        .with_keep_alive(Duration::from_secs(5), cfg.request_timeout)
        .with_keep_alive_while_idle(true);
    if cfg.endpoints.iter().any(|e| e.starts_with("https://")) {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &cfg.ca_file {
            let pem = std::fs::read(ca).with_context(|| format!("reading etcd.ca_file {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) {
            let c = std::fs::read(cert).with_context(|| format!("reading etcd.cert_file {}", cert.display()))?;
            let k = std::fs::read(key).with_context(|| format!("reading etcd.key_file {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(c, k));
        }
        options = options.with_tls(tls);
    }
    Ok(options)
}

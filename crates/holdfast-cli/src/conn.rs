//! Connection flags shared by every command that talks to an arbiter or to
//! etcd, in holdfastctl and in holdfast-pausetest.

use crate::exit;
use holdfast_client::{Client, ClientConfig, Error, ErrorReason};
use holdfast_config::EtcdConfig;
use std::path::PathBuf;
use std::time::Duration;

/// The running program's name (`holdfastctl`, `holdfast-pausetest`), which
/// starts every message.
pub fn program() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "holdfastctl".into())
}

#[derive(clap::Args, Clone)]
pub struct ConnArgs {
    /// Arbiter address, host:port; for `lock exec`, a comma-separated list
    /// of every arbiter (each key goes to its rendezvous-hashed arbiter).
    #[arg(long, id = "conn_endpoint", value_name = "HOST:PORT", global = true, env = "HOLDFAST_ENDPOINT")]
    pub endpoint: Option<String>,
    /// CA bundle that signed the arbiter's certificate.
    #[arg(long, id = "conn_ca", value_name = "FILE", global = true, env = "HOLDFAST_CA")]
    pub ca: Option<PathBuf>,
    /// Your client certificate (an X.509 SVID with a spiffe:// URI SAN).
    #[arg(long, id = "conn_cert", value_name = "FILE", global = true, env = "HOLDFAST_CERT")]
    pub cert: Option<PathBuf>,
    /// The key of --cert.
    #[arg(long, id = "conn_key", value_name = "FILE", global = true, env = "HOLDFAST_KEY")]
    pub key: Option<PathBuf>,
}

impl ConnArgs {
    /// A Locker over every endpoint in --endpoint.
    pub fn locker(&self, on_fence: impl Fn(holdfast_client::Fenced) + Send + Sync + 'static) -> Result<holdfast_client::Locker, u8> {
        let cfg = self.config()?;
        let endpoints = cfg.endpoint.split(',').map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
        holdfast_client::Locker::new(holdfast_client::LockerConfig { endpoints, ca: cfg.ca, cert: cfg.cert, key: cfg.key }, on_fence)
            .map_err(|e| report(&e))
    }

    pub async fn connect(&self) -> Result<Client, u8> {
        let mut cfg = self.config()?;
        // Commands that talk to one arbiter use the first one listed.
        cfg.endpoint = cfg.endpoint.split(',').next().unwrap_or_default().trim().to_string();
        Client::connect(&cfg).await.map_err(|e| report(&e))
    }

    /// The settings, or (after printing which flag is missing) the exit status.
    pub fn config(&self) -> Result<ClientConfig, u8> {
        let missing = |flag: &str, env: &str| {
            eprintln!(
                "{}: {flag} is not set. Pass {flag} or set {env}; with a dev appliance, `source DIR/env` (see `holdfastctl dev --help`).",
                program()
            );
            exit::USAGE
        };
        let cfg = ClientConfig {
            endpoint: self.endpoint.clone().ok_or_else(|| missing("--endpoint", "HOLDFAST_ENDPOINT"))?,
            ca: self.ca.clone().ok_or_else(|| missing("--ca", "HOLDFAST_CA"))?,
            cert: self.cert.clone().ok_or_else(|| missing("--cert", "HOLDFAST_CERT"))?,
            key: self.key.clone().ok_or_else(|| missing("--key", "HOLDFAST_KEY"))?,
        };
        Ok(cfg)
    }
}

/// Prints an error with what to do next and returns the exit status.
pub fn report(e: &Error) -> u8 {
    let (hint, code) = match e.reason() {
        Some(ErrorReason::Contention) => ("", exit::CONTENTION),
        Some(ErrorReason::Leak) => ("", exit::LEAK),
        Some(ErrorReason::Sealed) => (" Check `holdfastctl epoch status`; a sealed arbiter needs an epoch advance.", exit::UNAVAILABLE),
        Some(ErrorReason::Unavailable) => (
            " Is the arbiter running (`systemctl status holdfast-arbiter` on its host, `holdfastctl dev` locally), and is the endpoint (--endpoint, HOLDFAST_ENDPOINT) right?",
            exit::UNAVAILABLE,
        ),
        Some(ErrorReason::Unauthenticated) => {
            (" Check --cert/--key: the certificate must come from the arbiter's client CA.", exit::NOPERM)
        }
        Some(ErrorReason::Denied) => ("", exit::NOPERM),
        Some(ErrorReason::NoPolicy) => (" `holdfastctl status` shows the class set and any refused change.", exit::UNAVAILABLE),
        Some(ErrorReason::WrongRegion) => ("", exit::UNAVAILABLE),
        Some(ErrorReason::ClassTtl) | Some(ErrorReason::ClassTier) => ("", exit::USAGE),
        Some(ErrorReason::RateLimited) => (" Retry after a short backoff.", exit::UNAVAILABLE),
        Some(ErrorReason::Quota) => ("", exit::UNAVAILABLE),
        // The message says when to retry.
        Some(ErrorReason::Moving) => ("", exit::UNAVAILABLE),
        Some(ErrorReason::SessionNotFound) => ("", exit::UNAVAILABLE),
        Some(ErrorReason::InvalidArgument) => ("", exit::USAGE),
        _ => match e {
            Error::Config(_) => ("", exit::CONFIG),
            _ => ("", exit::SOFTWARE),
        },
    };
    eprintln!("{}: {e}.{hint}", program());
    code
}

/// Flags for talking to etcd directly (epoch init, pause-test records).
#[derive(clap::Args, Clone)]
pub struct EtcdArgs {
    /// etcd client URLs, comma-separated: list every member.
    #[arg(long, env = "HOLDFAST_ETCD_ENDPOINT", value_delimiter = ',', required = true)]
    pub etcd_endpoint: Vec<String>,
    /// CA of the etcd server certificates (https endpoints).
    #[arg(long, env = "HOLDFAST_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long, env = "HOLDFAST_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// Key of --etcd-cert.
    #[arg(long, env = "HOLDFAST_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdArgs {
    pub fn config(&self) -> EtcdConfig {
        EtcdConfig {
            endpoints: self.etcd_endpoint.clone(),
            request_timeout: Duration::from_secs(5),
            ca_file: self.etcd_ca.clone(),
            cert_file: self.etcd_cert.clone(),
            key_file: self.etcd_key.clone(),
        }
    }
}

/// Flags naming the coord cluster, where epochs are allocated and approval
/// nonces recorded, when it is another cluster than --etcd-endpoint's (the
/// entity cluster). Left out, one cluster serves both tiers.
#[derive(clap::Args, Clone, Default)]
pub struct CoordArgs {
    /// Client URLs of the coord cluster, comma-separated: list every
    /// member. Default: the --etcd-endpoint cluster serves the coord tier too.
    #[arg(long, env = "HOLDFAST_COORD_ENDPOINT", value_delimiter = ',')]
    pub coord_endpoint: Vec<String>,
    /// CA of the coord cluster's server certificates (default: --etcd-ca).
    #[arg(long, env = "HOLDFAST_COORD_CA")]
    pub coord_ca: Option<PathBuf>,
    /// Client certificate for the coord cluster (default: --etcd-cert).
    #[arg(long, env = "HOLDFAST_COORD_CERT")]
    pub coord_cert: Option<PathBuf>,
    /// Key of --coord-cert (default: --etcd-key).
    #[arg(long, env = "HOLDFAST_COORD_KEY")]
    pub coord_key: Option<PathBuf>,
}

impl CoordArgs {
    /// The coord cluster's settings, or `None` when no --coord-endpoint is
    /// given; credentials not given are the entity cluster's.
    pub fn config(&self, etcd: &EtcdArgs) -> Option<EtcdConfig> {
        let endpoints: Vec<String> = self.coord_endpoint.iter().map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
        if endpoints.is_empty() {
            return None;
        }
        Some(EtcdConfig {
            endpoints,
            request_timeout: Duration::from_secs(5),
            ca_file: self.coord_ca.clone().or_else(|| etcd.etcd_ca.clone()),
            cert_file: self.coord_cert.clone().or_else(|| etcd.etcd_cert.clone()),
            key_file: self.coord_key.clone().or_else(|| etcd.etcd_key.clone()),
        })
    }
}

//! Who the direct etcd paths run as. A workload that uses etcd directly in
//! production pays what the arbiter pays: TLS to etcd, and an etcd user
//! whose every request etcd authenticates and checks against its role.
//! etcd's `root` skips the per-key permission check, and plain HTTP skips
//! TLS, so neither is a fair baseline.
//!
//! Against a `holdfastctl dev` appliance (`--dev-dir`), the bench makes its
//! own etcd user, [`USER`], whose role [`ROLE`] holds only the key ranges
//! the direct paths touch, and issues its client certificate (the CN is the
//! user, as for every holdfast tool) from the appliance's etcd CA. Otherwise
//! the direct paths run as the `--etcd-*` user given, and [`probe`] says
//! whether etcd really checks that user.

use anyhow::Context;
use holdfast_config::EtcdConfig;
use holdfast_model::layout;
use holdfast_store::roles::{self, Range, Role};
use std::path::Path;

/// The etcd user (and role) of the direct paths.
pub const USER: &str = "holdfast-bench";

/// Where etcd's Lock RPC keeps the bench's locks.
pub const LOCK_RPC_PREFIX: &str = "/bench-v3lock/";

/// What the direct paths need, and nothing else: the compared `/sys/` keys
/// and drain markers (read), holds and session records (the arbiter's own transactions), and
/// the Lock RPC's prefix.
pub const ROLE: Role = Role {
    name: USER,
    used_by: "holdfast-bench's direct etcd paths (the arbiter's transactions sent straight to etcd; etcd's Lock RPC)",
    read: &[
        Range::Key(layout::EPOCH_KEY),
        Range::Key(layout::SEAL_KEY),
        Range::Key(layout::WATERMARK_KEY),
        Range::Prefix(layout::DRAIN_PREFIX),
    ],
    read_write: &[Range::Prefix(layout::HOLD_PREFIX), Range::Prefix(layout::SESSION_PREFIX), Range::Prefix(LOCK_RPC_PREFIX)],
};

/// Refuses, before any cell runs, an etcd user that may not write what the
/// direct paths write ([`ROLE`]'s read-write ranges). One transaction whose
/// compare never holds (no create revision is below 0) carries a put into
/// each range: etcd checks the permission of every operation in it, and
/// writes nothing.
pub async fn check_writes(client: &etcd_client::Client, user: Option<&str>) -> anyhow::Result<()> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let probe = |prefix: &str| format!("{prefix}.holdfast-bench-preflight");
    let names: Vec<&str> = ROLE.read_write.iter().filter_map(|r| if let Range::Prefix(p) = r { Some(*p) } else { None }).collect();
    let puts: Vec<TxnOp> = names.iter().map(|p| TxnOp::put(probe(p), "", None)).collect();
    let never = Compare::create_revision(probe(LOCK_RPC_PREFIX), CompareOp::Less, 0);
    let txn = Txn::new().when(vec![never]).and_then(puts);
    match client.clone().txn(txn).await {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().to_lowercase().contains("permission denied") => anyhow::bail!(
            "the direct etcd paths write under {} and etcd refuses etcd user {} that: give --dev-dir DIR (a \
             `holdfastctl dev --dir`: the bench makes its own user {USER} there) or --etcd-cert/--etcd-key of \
             a user that may (a dev shell's HOLDFAST_ETCD_* are the read-only observer's)",
            names.join(", "),
            user.unwrap_or("(no client certificate)")
        ),
        Err(e) => Err(e).context("checking that the direct etcd paths may write"),
    }
}

/// Makes [`USER`] and its role in the dev appliance's etcd (with the
/// appliance's root certificate), issues the user's certificate from
/// `DIR/etcd-tls` if absent, and returns how to reach `endpoints` as it.
pub async fn dev_user(dev_dir: &Path, endpoints: Vec<String>) -> anyhow::Result<EtcdConfig> {
    let tls = dev_dir.join("etcd-tls");
    if !tls.join("ca-key.pem").is_file() {
        anyhow::bail!("{} has no etcd CA (ca-key.pem): is {} a `holdfastctl dev --dir`?", tls.display(), dev_dir.display());
    }
    let pki = holdfast_devkit::pki::EtcdPki::open_or_create(&tls)?;
    let root = pki.config_as(roles::ROOT, endpoints.clone())?;
    let mut c = holdfast_store::etcd::connect_client(&root).await.context("connecting to etcd as root to make the bench's user")?;
    roles::ensure_one(&mut c, &ROLE).await.with_context(|| format!("making the etcd role and user {USER}"))?;
    pki.config_as(USER, endpoints)
}

/// How the direct paths reached etcd.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Identity {
    /// The etcd user: the CN of the client certificate (etcd runs with
    /// `--client-cert-auth`), `None` without one.
    pub user: Option<String>,
    /// `https` or `http`, of the first endpoint.
    pub scheme: String,
    /// Whether etcd refused this user an administrator's request
    /// (`UserList`): auth is on and the user is not root, so every request
    /// pays etcd's permission check as a workload's would.
    pub auth_enforced: bool,
}

/// Asks etcd who the direct paths are: a `UserList` refused with
/// "permission denied" shows auth on and a user other than root.
pub async fn probe(client: &etcd_client::Client, cfg: &EtcdConfig) -> Identity {
    let auth_enforced = match client.clone().user_list().await {
        Ok(_) => false,
        Err(e) => e.to_string().to_lowercase().contains("permission denied"),
    };
    let scheme = cfg.endpoints.first().and_then(|e| e.split_once("://")).map(|(s, _)| s.to_string()).unwrap_or_else(|| "http".into());
    Identity { user: cfg.cert_file.as_deref().and_then(certificate_cn), scheme, auth_enforced }
}

/// The common name of the first certificate in a PEM file.
fn certificate_cn(path: &Path) -> Option<String> {
    let pem = std::fs::read(path).ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

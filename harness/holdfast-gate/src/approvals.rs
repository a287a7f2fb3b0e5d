//! The gate advances the epoch the way operators do: a request signed by
//! two approvers with real `ssh-keygen -Y sign` signatures, verified by
//! `holdfast-approval`, carried out by the transaction the
//! `holdfast-epoch-advance@` unit runs (`holdfast_store::epoch::approved_target`
//! and `advance_txn_to`). Only the revocation of the old leases is the
//! gate's own, so it can run late on purpose.

use anyhow::{Context, bail};
use holdfast_approval::{Approved, Approvers, NAMESPACE, Operation, Request};
use holdfast_model::layout::EpochRecord;
use holdfast_store::epoch::{self, Advanced};
use holdfast_store::etcd::Etcd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Two dr-operators with their keys, in the run's directory.
pub struct Approvals {
    dir: PathBuf,
    approvers: Approvers,
    keys: Vec<PathBuf>,
    requests: std::sync::atomic::AtomicU32,
}

const NAMES: [&str; 2] = ["gate-requester", "gate-approver"];

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?} (is openssh-client installed?)"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Approvals {
    /// New ed25519 keys for two approvers, and their approvers.toml.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        let dir = dir.join("approvals");
        std::fs::create_dir_all(&dir)?;
        let mut text = String::new();
        let mut keys = Vec::new();
        for name in NAMES {
            let key = dir.join(name);
            if !key.exists() {
                run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"]).arg(&key))?;
            }
            let public = std::fs::read_to_string(key.with_extension("pub"))?;
            text.push_str(&format!("[approver.{name}]\nroles = [\"dr-operator\"]\nkeys = [{:?}]\n\n", public.trim()));
            keys.push(key);
        }
        std::fs::write(dir.join("approvers.toml"), &text)?;
        let approvers = Approvers::parse(&text).map_err(|p| anyhow::anyhow!("approvers.toml: {}", p.join("; ")))?;
        Ok(Approvals { dir, approvers, keys, requests: Default::default() })
    }

    /// A request to advance cluster `cluster` (reached through `etcd`) from
    /// `from` to `to`, above `highest_known`, signed by both approvers and
    /// verified.
    pub async fn approve(
        &self,
        etcd: &Etcd,
        cluster: &str,
        from: u32,
        to: u32,
        highest_known: u32,
        reason: &str,
    ) -> anyhow::Result<Approved> {
        let cluster_id =
            etcd.member_status().await.into_iter().find_map(Result::ok).map(|m| m.cluster_id).context("no etcd member answered Status")?;
        let op = Operation::EpochAdvance { cluster: cluster.into(), expected_epoch: from, new_epoch: to, cluster_id, highest_known };
        let request = Request::new(NAMES[0], reason, op, now_unix(), Duration::from_secs(600)).map_err(anyhow::Error::msg)?;
        let n = self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = self.dir.join(format!("request-{n}.toml"));
        std::fs::write(&file, request.render())?;
        let mut signatures = Vec::new();
        for (i, key) in self.keys.iter().enumerate() {
            let copy = self.dir.join(format!("request-{n}-{i}"));
            std::fs::copy(&file, &copy)?;
            run(Command::new("ssh-keygen").args(["-Y", "sign", "-n", NAMESPACE, "-f"]).arg(key).arg(&copy))?;
            signatures.push(std::fs::read_to_string(copy.with_extension("sig"))?);
        }
        let bytes = std::fs::read(&file)?;
        holdfast_approval::verify(&bytes, &signatures, &self.approvers, now_unix()).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
    }

    /// The whole advance of cluster `name` as the restore procedure runs it:
    /// a request from `from` to `to` above `highest_known` (`epochs`),
    /// signed by both approvers, the unit's transaction (see
    /// [`Approvals::advance_txn`]), then the old sessions' leases revoked.
    pub async fn advance(
        &self,
        etcd: &Etcd,
        coord: &Etcd,
        name: &str,
        epochs: (u32, u32, u32),
        reason: &str,
    ) -> anyhow::Result<EpochRecord> {
        let (from, to, highest_known) = epochs;
        let approved = self.approve(etcd, name, from, to, highest_known, reason).await?;
        let done = Self::advance_txn(etcd, coord, &approved).await?;
        epoch::revoke_sessions(etcd, &done.old_leases).await;
        Ok(done.record)
    }

    /// The approved advance's transaction alone (the old leases are the
    /// caller's to revoke). The epoch is allocated and the nonce recorded
    /// on `coord` (which may be `etcd` itself: the coord cluster's own
    /// advance).
    pub async fn advance_txn(etcd: &Etcd, coord: &Etcd, approved: &Approved) -> anyhow::Result<Advanced> {
        let target = epoch::approved_target(approved, now_unix())?;
        Ok(epoch::advance_txn_via(etcd, Some(coord), &target).await?)
    }
}

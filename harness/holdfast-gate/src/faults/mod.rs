//! Fault injection. Every fault is confirmed to have taken effect (the
//! leader changed, the process is stopped, packets were dropped, the proxy
//! held traffic, strace injected delays, the client's clock moved) and then
//! healed; the record says how it was confirmed.
//!
//! One file per family, each injecting its kinds: `process` (SIGSTOP and
//! kill -9 of members, arbiters and clients), `network` (iptables:
//! partitions, isolation, asymmetric drops, packet loss), `proxy` (delay
//! and stall at the gate's TCP proxies, arbiter 1 to etcd and client 0 to
//! the arbiters), `disk` (fsync delay by strace),
//! `clock` (libfaketime jumps), `epoch` (an epoch advance under load) and
//! `restore` (the snapshot half of the restore fault; the restore itself
//! runs after the episode's workload, in `crate::restore`) and `quorum`
//! (a majority stopped past the arbiters' fail-open bound) and `drain`
//! (drain markers on the entity cluster, as a move's source has them).
//! This file holds what they share and [`inject`], which dispatches.

mod clock;
mod disk;
mod drain;
mod epoch;
mod network;
mod process;
mod proxy;
mod quorum;
mod restore;

pub use restore::Pending as PendingRestore;

use super::cluster::{self, Cluster, ELECTION_TIMEOUT};
use super::net::Net;
use anyhow::{Context, bail};
use holdfast_config::EtcdConfig;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGSTOP the etcd leader past the election timeout, for up to two
    /// TTLs (it wakes with leases it thinks expired).
    LeaderPause,
    /// kill -9 an etcd member, restart it.
    MemberKill,
    /// SIGSTOP a client for 2–3× its TTL (a zombie when it resumes).
    ClientPause,
    /// SIGSTOP an arbiter past the session TTL.
    ArbiterPause,
    /// kill -9 an arbiter while its transactions are in flight, restart it.
    ArbiterKill,
    /// Cut the etcd leader off from the other members.
    LeaderIsolation,
    /// Cut one follower off from the other members.
    MinorityPartition,
    /// The arbiters reach only one member, which is cut off from the majority.
    MajorityPartition,
    /// An arbiter's requests reach etcd but the answers are dropped.
    AsymmetricArbiterEtcd,
    /// Random packet loss everywhere.
    PacketLoss,
    /// Delay every chunk between arbiter 1 and etcd (TCP proxy).
    ProxyDelay,
    /// Stall all traffic between arbiter 1 and etcd (TCP proxy).
    ProxyStall,
    /// Client 0's link to the arbiters (TCP proxies): answers arrive late
    /// (just under its keepalive timeout), then its requests are held past
    /// its TTL while the late answers still arrive. Its session must end
    /// with the client already treating it as lost.
    ClientLink,
    /// Delay fdatasync on the leader (strace fault injection).
    FsyncDelay,
    /// Stall the leader's disk (each fdatasync held for TTL + 4 s) while
    /// its gRPC keeps serving: a new leader takes over, and the stalled one
    /// may keep answering keepalives in its old term (etcd #15247).
    LeaderDiskStall,
    /// Jump the clocks of arbiter 1 and the clock-faulted clients forward (libfaketime).
    ClockJump,
    /// Advance the epoch under load; the old sessions' leases are revoked
    /// 1–3 s after the advance transaction (as when the advancing tool is
    /// cut off after its transaction), so they live on without records.
    /// The clients race the arbiters' switch to the new epoch, or (every
    /// other advance) are frozen until both arbiters serve it.
    EpochAdvance,
    /// Snapshot a member mid-run. After the episode's workload, stop every
    /// member, restore each from the snapshot with the same cluster token
    /// and peer URLs, and start clients again: both arbiters must seal, the
    /// epoch is advanced with the advance transaction, and every token
    /// granted afterwards must be above every token granted before.
    Restore,
    /// Stop a majority of the entity cluster past the arbiters'
    /// `fail_open.after`: the open class is granted from memory with token
    /// 0 and every such grant reaches `/sys/unprotected/` once, across a
    /// kill -9 of an arbiter mid-outage; the correctness class is refused.
    QuorumLoss,
    /// Write drain markers (`/sys/drain/<unit>`) on the entity cluster for
    /// a third of the keys, or the whole namespace, as a rebalancer does on
    /// a move's source; delete them after the hold. No grant of a drained
    /// key may commit meanwhile.
    Drain,
}

impl FaultKind {
    pub fn all() -> Vec<FaultKind> {
        <FaultKind as clap::ValueEnum>::value_variants().to_vec()
    }
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map(|v| v.get_name().to_string()).unwrap_or_default()
    }
}

/// A gate client process, as the fault injector sees it.
pub struct ClientProc {
    pub pid: u32,
    pub clock_file: Option<PathBuf>,
    pub clock_report: Option<PathBuf>,
    /// Reads `w` while the client is in the middle of a write.
    pub state_file: PathBuf,
    pub ttl: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub seed: u64,
    pub at_ms: u64,
    pub what: String,
    pub confirmed: String,
    pub healed_after_ms: u64,
}

/// What a fault acts on: the network, the cluster and the episode's
/// clients; and the run's start, from which fault times are counted.
pub struct FaultCtx<'a> {
    pub net: &'a Net,
    pub cluster: &'a mut Cluster,
    pub clients: &'a [ClientProc],
    /// The episode's entity-tier lock keys (`gate/<stem><n>`).
    pub keys: &'a [String],
    pub t0: Instant,
    /// Where the restore fault leaves its snapshot for the episode's
    /// restore phase (`crate::restore`).
    pub pending_restore: &'a mut Option<PendingRestore>,
    /// `--leader-pause-max`: the longest leader stop (default:
    /// [`process::leader_stop_bound`] of the clients' TTL).
    pub leader_pause_max: Option<Duration>,
    /// What a fault's own checks found broken (the fault itself took
    /// effect): each is a violation of the run.
    pub violations: Vec<String>,
}

/// What a family's injector did, and how it saw the fault take effect.
struct Effect {
    what: String,
    confirmed: String,
}

/// Injects `kind`, confirms it, keeps it for `hold`, heals it.
pub async fn inject(ctx: &mut FaultCtx<'_>, kind: FaultKind, seed: u64, rng: &mut StdRng, hold: Duration) -> anyhow::Result<FaultRecord> {
    let at_ms = ctx.t0.elapsed().as_millis() as u64;
    let hold = hold.max(ELECTION_TIMEOUT * 4);
    let Effect { what, confirmed } = match kind {
        FaultKind::LeaderPause => process::leader_pause(ctx, rng, hold).await?,
        FaultKind::MemberKill => process::member_kill(ctx, hold).await?,
        FaultKind::ClientPause => process::client_pause(ctx, rng).await?,
        FaultKind::ArbiterPause => process::arbiter_pause(ctx, rng).await?,
        FaultKind::ArbiterKill => process::arbiter_kill(ctx, rng).await?,
        FaultKind::LeaderIsolation => network::leader_isolation(ctx, hold).await?,
        FaultKind::MinorityPartition | FaultKind::MajorityPartition => network::partition(ctx, kind, rng, hold).await?,
        FaultKind::AsymmetricArbiterEtcd => network::asymmetric_arbiter_etcd(ctx, rng, hold).await?,
        FaultKind::PacketLoss => network::packet_loss(ctx, rng, hold).await?,
        FaultKind::ProxyDelay | FaultKind::ProxyStall => proxy::slow(ctx, kind, rng, hold).await?,
        FaultKind::ClientLink => proxy::client_link(ctx, rng).await?,
        FaultKind::FsyncDelay => disk::fsync_delay(ctx, rng, hold, at_ms).await?,
        FaultKind::LeaderDiskStall => disk::leader_disk_stall(ctx, at_ms).await?,
        FaultKind::ClockJump => clock::jump(ctx, rng, hold).await?,
        FaultKind::EpochAdvance => epoch::advance(ctx, rng).await?,
        FaultKind::Restore => restore::snapshot(ctx, rng).await?,
        FaultKind::QuorumLoss => quorum::quorum_loss(ctx, rng).await?,
        FaultKind::Drain => drain::drain(ctx, rng, hold).await?,
    };
    // Healed: etcd has a leader again and both arbiters run.
    let healed = Instant::now();
    current_leader(ctx.cluster).await.context("after healing")?;
    Ok(FaultRecord { kind, seed, at_ms, what, confirmed, healed_after_ms: healed.elapsed().as_millis() as u64 })
}

fn signal(pid: u32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), sig);
}

/// Polls `f` every 100 ms until it is true (true) or `timeout` passes (false).
pub(crate) async fn wait_for<F: std::future::Future<Output = bool>>(timeout: Duration, mut f: impl FnMut() -> F) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn current_leader(c: &Cluster) -> anyhow::Result<usize> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) = c.leader().await {
            return Ok(l);
        }
        if Instant::now() > end {
            bail!("the etcd cluster has no agreed leader");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader as named by the members in `among` (the others may be cut off).
async fn leader_among(c: &Cluster, among: &[usize]) -> Option<usize> {
    let observer = c.etcd_config(holdfast_store::roles::OBSERVER.name).ok()?;
    let sub: Vec<String> = among.iter().map(|i| observer.endpoints[*i].clone()).collect();
    // A leader outside `among` (the isolated old leader) maps to None.
    cluster::leader_of(&EtcdConfig { endpoints: sub, ..observer }).await.map(|j| among[j])
}

/// A libfaketime timestamp file: an offset from the real clock, and the
/// rate the faked clock runs at. The rate is set when the process starts
/// and never changed: libfaketime 0.9.10 computes a faked clock as
/// `start + elapsed × rate + offset`, so a rate changed at run time moves
/// the clock by `elapsed × Δrate` at once (backwards when slowing down,
/// even with FAKETIME_XRESET). Offsets only ever grow (see `ClockJump`).
fn clock_spec(offset_s: i64, rate: f64) -> String {
    format!("{offset_s:+}s x{rate:.2}\n")
}

/// Writes a timestamp file atomically (aside, then renamed): libfaketime
/// re-reads it every second and must never see half of it (a missing rate
/// would move the clock by `elapsed × Δrate`).
pub fn write_clock_spec(path: &Path, offset_s: i64, rate: f64) -> std::io::Result<()> {
    write_aside(path, &clock_spec(offset_s, rate))
}

/// Writes `path` whole or not at all: aside (`<path>.new`), then renamed
/// over it, so that a reader in another process never sees half of it.
pub fn write_aside(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Reads a timestamp file written by [`clock_spec`].
pub fn read_clock_spec(path: &Path) -> (i64, f64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut it = text.split_whitespace();
    let offset = it.next().and_then(|o| o.trim_end_matches('s').parse().ok()).unwrap_or(0);
    let rate = it.next().and_then(|r| r.strip_prefix('x')?.parse().ok()).unwrap_or(1.0);
    (offset, rate)
}

/// A process's clock report: (its own CLOCK_MONOTONIC, the raw one), in ns.
pub fn clock_report(report: &Path) -> Option<(i128, i128)> {
    let text = std::fs::read_to_string(report).ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<i128>().ok());
    Some((it.next()??, it.next()??))
}

//! Disk faults: fdatasync/fsync on the etcd leader delayed (or held for
//! seconds: a stalled disk) by strace's fault injection, confirmed by the
//! delayed calls in strace's log.

use super::{Effect, FaultCtx, current_leader, leader_among, signal};
use crate::cluster::Cluster;
use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use std::time::Duration;

/// Delay every fdatasync/fsync of the etcd leader by 50–300 ms for `hold`;
/// strace logs to `strace-<at_ms>.log` in the cluster's directory.
pub async fn fsync_delay(ctx: &FaultCtx<'_>, rng: &mut StdRng, hold: Duration, at_ms: u64) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let l = current_leader(c).await?;
    let delay_us = rng.random_range(50_000..300_000u64);
    let (out, injected) = delay_syncs(c, l, delay_us, hold, at_ms).await?;
    if injected == 0 {
        bail!("strace injected no fdatasync delay into e{l} (see {})", out.display());
    }
    Ok(Effect {
        what: format!("delay fdatasync/fsync on leader e{l} by {}ms for {hold:?}", delay_us / 1000),
        confirmed: format!("{injected} delayed syncs"),
    })
}

/// `LeaderDiskStall`: each fdatasync/fsync of the etcd leader is held for
/// TTL + 4 s while strace stays attached for as long. Its Raft loop stops
/// at its next sync, so the others elect a new leader, which refreshes
/// every lease once and then lets expire the ones nobody renews through
/// it. The stalled member's gRPC keeps answering keepalives: etcd before
/// 3.4.25 and 3.5.8 renews them in the stalled leader's memory (etcd
/// #15247), in its old Raft term. The arbiter's keepalive confirmation (a
/// quorum read after the keepalive must report the same term) refuses
/// those answers; without it, a client whose session's keepalives ride on
/// the stalled member believes in a lease the new leader has expired (C1
/// `DeadlinePastSessionEnd`). etcd 3.6 answers no such keepalive.
/// Confirmed by the delayed syncs and by another member leading while the
/// old leader was stalled.
pub async fn leader_disk_stall(ctx: &FaultCtx<'_>, at_ms: u64) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let ttl = ctx.clients.first().map(|p| p.ttl).unwrap_or(Duration::from_secs(5));
    let stall = ttl + Duration::from_secs(4);
    let l = current_leader(c).await?;
    let others: Vec<usize> = (0..c.members.len()).filter(|i| *i != l).collect();
    let watch_for_successor = async {
        let end = std::time::Instant::now() + stall;
        while std::time::Instant::now() < end {
            if let Some(n) = leader_among(c, &others).await {
                return Some(n);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    };
    let (delayed, successor) = tokio::join!(delay_syncs(c, l, stall.as_micros() as u64, stall, at_ms), watch_for_successor);
    let (out, injected) = delayed?;
    if injected == 0 {
        bail!("strace held no fdatasync of e{l} (see {})", out.display());
    }
    let Some(n) = successor else {
        bail!("no other member took over while e{l}'s disk was stalled for {stall:?} ({injected} syncs held)");
    };
    Ok(Effect {
        what: format!("stall leader e{l}'s fdatasync/fsync for {stall:?} while its gRPC serves"),
        confirmed: format!("{injected} syncs held; e{n} took over while e{l} was stalled"),
    })
}

/// Runs strace on member `m` for `hold`, delaying each fdatasync/fsync by
/// `delay_us`; returns its log and how many calls it delayed (with a delay
/// as long as `hold`: how many it held).
async fn delay_syncs(c: &Cluster, m: usize, delay_us: u64, hold: Duration, at_ms: u64) -> anyhow::Result<(std::path::PathBuf, usize)> {
    let pid = c.member_pid(m).context("the member has no process")?;
    let out = c.dir.join(format!("strace-{at_ms}.log"));
    let mut strace = std::process::Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-p",
            &pid.to_string(),
            "-e",
            "trace=fdatasync,fsync",
            "-e",
            &format!("inject=fdatasync,fsync:delay_enter={delay_us}"),
            "-o",
        ])
        .arg(&out)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting strace")?;
    tokio::time::sleep(hold).await;
    signal(strace.id(), Signal::SIGINT); // detaches cleanly
    let _ = strace.wait();
    let log = std::fs::read_to_string(&out).unwrap_or_default();
    // A delayed call that returned is marked DELAYED; one still held when
    // strace detached never returned in its log, so count the calls made.
    let count = |held: bool| {
        log.lines().filter(|l| if held { l.contains("fdatasync(") || l.contains("fsync(") } else { l.contains("DELAYED") }).count()
    };
    Ok((out, count(delay_us >= hold.as_micros() as u64)))
}

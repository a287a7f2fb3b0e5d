//! Disk faults: fdatasync/fsync on the etcd leader delayed by strace's
//! fault injection, confirmed by the delayed calls in strace's log.

use super::{Effect, FaultCtx, current_leader, signal};
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
    let pid = c.member_pid(l).context("the leader has no process")?;
    let delay_us = rng.random_range(50_000..300_000u64);
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
    let injected = std::fs::read_to_string(&out).unwrap_or_default().lines().filter(|l| l.contains("DELAYED")).count();
    if injected == 0 {
        bail!("strace injected no fdatasync delay into e{l} (see {})", out.display());
    }
    Ok(Effect {
        what: format!("delay fdatasync/fsync on leader e{l} by {}ms for {hold:?}", delay_us / 1000),
        confirmed: format!("{injected} delayed syncs"),
    })
}

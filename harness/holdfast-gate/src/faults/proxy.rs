//! Proxy faults: arbiter 1 reaches etcd, and client 0 the arbiters, through
//! the gate's TCP proxies, which delay every chunk or hold traffic;
//! confirmed by the chunks the proxies held.

use super::{Effect, FaultCtx, FaultKind};
use crate::cluster::Cluster;
use anyhow::bail;
use rand::Rng;
use rand::rngs::StdRng;
use std::time::Duration;

/// Delay every chunk between arbiter 1 and etcd (`ProxyDelay`), or stall
/// all of them (`ProxyStall`), for `hold`.
pub async fn slow(ctx: &FaultCtx<'_>, kind: FaultKind, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let before: u64 = c.proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum();
    let delay = Duration::from_millis(rng.random_range(50..400));
    for p in &c.proxies {
        if kind == FaultKind::ProxyDelay {
            p.set_delay(delay);
        } else {
            p.set_stalled(true);
        }
    }
    tokio::time::sleep(hold).await;
    for p in &c.proxies {
        p.clear();
    }
    let after: u64 = c.proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum();
    if after == before {
        bail!("no traffic went through the proxies");
    }
    let what = if kind == FaultKind::ProxyDelay {
        format!("delay arbiter 1 <-> etcd by {delay:?} per chunk for {hold:?}")
    } else {
        format!("stall arbiter 1 <-> etcd for {hold:?}")
    };
    Ok(Effect { what, confirmed: format!("{} chunks held", after - before) })
}

/// `ClientLink`: the arbiters' answers to client 0 arrive 80–95 % of its
/// keepalive timeout (TTL/3) late for two keepalive periods, so its
/// keepalives are acknowledged late but in time; then its requests are held
/// for 1.5 TTL + 1 s while the answers already on their way still arrive.
/// The last keepalive that got through renewed the lease before its late
/// answer came, so a client that counts its deadline from the answer
/// instead of the send believes in a lease that has ended (C1
/// `DeadlinePastSessionEnd`); a correct client gives the session up in
/// time. Its requests held meanwhile arrive when the fault heals, on a
/// session that has ended.
pub async fn client_link(ctx: &FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let ttl = ctx.clients.first().map(|p| p.ttl).ok_or_else(|| anyhow::anyhow!("client-link needs at least one client"))?;
    let period = (ttl / 3).max(Duration::from_millis(500));
    let latency = period.mul_f64(rng.random_range(0.80..0.95));
    let count = |c: &Cluster| -> u64 { c.client_proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum() };
    let before = count(c);
    for p in &c.client_proxies {
        p.set_reply_latency(latency);
    }
    tokio::time::sleep(period * 2).await;
    let late = count(c) - before;
    let hold = ttl.mul_f64(1.5) + Duration::from_secs(1);
    for p in &c.client_proxies {
        p.set_requests_stalled(true);
    }
    tokio::time::sleep(hold).await;
    for p in &c.client_proxies {
        p.clear();
    }
    let held = count(c) - before - late;
    if late == 0 || held == 0 {
        bail!("client 0 sent nothing through its proxies ({late} answers delayed, {held} chunks held)");
    }
    Ok(Effect {
        what: format!("answers to client 0 {latency:?} late for {:?}, then its requests held for {hold:?}", period * 2),
        confirmed: format!("{late} answer chunks delayed, then {held} chunks delayed or held"),
    })
}

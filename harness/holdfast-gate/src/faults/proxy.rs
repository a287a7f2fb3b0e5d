//! Proxy faults: arbiter 1 reaches etcd through the gate's TCP proxies,
//! which delay every chunk or hold all traffic; confirmed by the chunks the
//! proxies held.

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

//! Network faults, made with iptables in the hosts' namespaces: the leader
//! isolated, minority and majority partitions, etcd's answers to an arbiter
//! dropped, random packet loss. Confirmed by a new leader, a stalled
//! applied index or dropped-packet counters; healed by flushing the rules.

use super::{Effect, FaultCtx, FaultKind, current_leader, leader_among, wait_for};
use crate::cluster::Cluster;
use crate::net::Host;
use anyhow::{Context, bail};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use std::time::Duration;

/// Cut the etcd leader off from its peers for `hold`; the majority must
/// elect a new leader.
pub async fn leader_isolation(ctx: &FaultCtx<'_>, hold: Duration) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let net = ctx.net;
    let l = current_leader(c).await?;
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    for o in &others {
        net.cut(&net.hosts[l], &net.hosts[*o])?;
    }
    let changed = wait_for(Duration::from_secs(10), || async { leader_among(c, &others).await.is_some_and(|n| n != l) }).await;
    tokio::time::sleep(hold).await;
    net.heal()?;
    if !changed {
        bail!("leader e{l} isolated but the others elected no new leader within 10 s");
    }
    Ok(Effect { what: format!("isolate leader e{l} from its peers for {hold:?}"), confirmed: "the majority elected a new leader".into() })
}

/// Cut a follower off from the other members for `hold` (`MinorityPartition`),
/// or also the arbiters from the majority (`MajorityPartition`); the lone
/// member's applied index must not move.
pub async fn partition(ctx: &FaultCtx<'_>, kind: FaultKind, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let net = ctx.net;
    let l = current_leader(c).await?;
    // Minority: a follower alone. Majority: the arbiters see only
    // the lone member, cut off from the two that keep the quorum.
    let lone = *(0..3).filter(|i| *i != l).collect::<Vec<_>>().choose(rng).context("no follower")?;
    let rest: Vec<usize> = (0..3).filter(|i| *i != lone).collect();
    for r in &rest {
        net.cut(&net.hosts[lone], &net.hosts[*r])?;
    }
    if kind == FaultKind::MajorityPartition {
        for a in 3..5 {
            for r in &rest {
                net.cut(&net.hosts[a], &net.hosts[*r])?;
            }
        }
        // Arbiter 1 reaches etcd through the proxies: stall those to the majority.
        for r in &rest {
            c.proxies[*r].set_stalled(true);
        }
    }
    let before = c.applied().await;
    tokio::time::sleep(hold).await;
    let after = c.applied().await;
    let dropped = net.dropped(&net.hosts[lone]);
    net.heal()?;
    for p in &c.proxies {
        p.clear();
    }
    let lone_moved = matches!((before[lone], after[lone]), (Some(b), Some(a)) if a > b);
    let rest_moved = rest.iter().any(|r| matches!((before[*r], after[*r]), (Some(b), Some(a)) if a > b));
    let confirmed = format!(
        "lone member e{lone} applied index {}, majority {}; packets dropped at e{lone}: {dropped}",
        if lone_moved { "moved" } else { "stalled" },
        if rest_moved { "moved" } else { "stalled" }
    );
    if lone_moved {
        bail!("partition of e{lone} did not take effect: {confirmed}");
    }
    let what = if kind == FaultKind::MinorityPartition {
        format!("partition e{lone} | {rest:?} for {hold:?}")
    } else {
        format!("partition e{lone}+arbiters | {rest:?} for {hold:?}")
    };
    Ok(Effect { what, confirmed })
}

/// Drop etcd's answers to one arbiter for `hold` (its requests still
/// arrive); some packets must be dropped.
pub async fn asymmetric_arbiter_etcd(ctx: &FaultCtx<'_>, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    let net = ctx.net;
    let a = rng.random_range(0..2usize);
    let host = &net.hosts[3 + a];
    let members: Vec<&Host> = net.hosts[0..3].iter().collect();
    net.drop_from(host, &members)?;
    if a == 1 {
        // Arbiter 1 reaches etcd through the proxies on the gateway.
        net.drop_from(host, &[&Host { ns: String::new(), ip: net.gateway.clone() }])?;
    }
    tokio::time::sleep(hold).await;
    let dropped = net.dropped(host);
    net.heal()?;
    if dropped == 0 {
        bail!("no answer from etcd to arbiter {a} was dropped");
    }
    Ok(Effect {
        what: format!("drop etcd's answers to arbiter {a} (its requests still arrive) for {hold:?}"),
        confirmed: format!("{dropped} packets dropped"),
    })
}

/// Drop 5–25 % of packets on every host for `hold`.
pub async fn packet_loss(ctx: &FaultCtx<'_>, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    let net = ctx.net;
    let p = rng.random_range(0.05..0.25);
    for h in &net.hosts {
        net.lossy(h, p)?;
    }
    tokio::time::sleep(hold).await;
    let dropped: u64 = net.hosts.iter().map(|h| net.dropped(h)).sum();
    net.heal()?;
    if dropped == 0 {
        bail!("packet loss dropped nothing");
    }
    Ok(Effect {
        what: format!("drop {:.0}% of packets everywhere for {hold:?}", p * 100.0),
        confirmed: format!("{dropped} packets dropped"),
    })
}

//! The epoch-advance fault: the epoch advanced under load, the old
//! sessions' leases revoked late; confirmed by both arbiters logging that
//! they serve the new epoch.

use super::{Effect, FaultCtx, signal, wait_for};
use crate::cluster::{self, Cluster};
use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use std::time::Duration;

/// Advance the entity cluster's epoch above every epoch allocated through a signed request (as the DR unit does),
/// revoke the old sessions' leases 1–3 s later; both arbiters must serve the
/// new epoch within 10 s.
pub async fn advance(ctx: &FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    // Two orders, alternating by epoch: the clients race the
    // arbiters' switch to the new epoch (a grant in the old epoch
    // after the advance is what the epoch compare prevents), or the
    // clients are frozen across the switch and come back to an
    // arbiter serving the new epoch with sessions whose records the
    // advance deleted but whose leases still live (a grant on them
    // is what the session-record compare prevents). In production
    // the second is the common case: an arbiter re-checks within a
    // second, and most clients' next call comes later.
    let c: &Cluster = ctx.cluster;
    let clients = ctx.clients;
    let etcd = c.holdfast_etcd().await?;
    let coord = c.coord_etcd().await?;
    let from = cluster::epoch_of(&etcd).await?;
    // Above every epoch allocated (the coord cluster's own epoch among
    // them), as the request reads it.
    let known = from.max(holdfast_store::epoch::highest_allocated(&etcd, Some(&coord)).await?);
    let to = known + 1;
    let frozen = to % 2 == 1;
    let late = Duration::from_millis(rng.random_range(1000..3000));
    // Signed before the clients freeze: two approvals, as operators give them.
    let approved = c.approvals.approve(&etcd, cluster::ENTITY_CLUSTER, from, to, known, "the gate's epoch-advance fault").await?;
    if frozen {
        for p in clients {
            signal(p.pid, Signal::SIGSTOP);
        }
    }
    let advanced = crate::approvals::Approvals::advance_txn(&etcd, &coord, &approved).await;
    let switched = wait_for(Duration::from_secs(10), || async { c.all_serve(to) }).await;
    if frozen {
        for p in clients {
            signal(p.pid, Signal::SIGCONT);
        }
    }
    let advanced = advanced.context("the advance transaction")?;
    tokio::time::sleep(late).await;
    let revoked = holdfast_store::epoch::revoke_sessions(&etcd, &advanced.old_leases).await;
    if !switched {
        bail!("epoch {to} committed but not every arbiter serves it within 10 s");
    }
    let order = if frozen { "clients frozen until both arbiters served it" } else { "clients racing the arbiters' switch" };
    Ok(Effect {
        what: format!(
            "advance epoch {from} -> {to} ({order}); the {} old sessions' leases revoked {late:?} later",
            advanced.old_leases.len()
        ),
        confirmed: format!("both arbiters serve epoch {to}; {revoked} old leases were still alive at the revoke"),
    })
}

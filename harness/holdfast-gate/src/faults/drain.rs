//! The drain fault: drain markers on the entity cluster, as a rebalancer
//! writes them on a move's source, kept for the fault's hold, then deleted
//! (the move undone). While a marker exists no grant of a key it covers
//! may commit on this cluster (C1's `GrantWhileDraining`). The rebalancer's
//! role does not exist yet, so the gate writes them as etcd's root.

use super::{Effect, FaultCtx};
use anyhow::{Context, bail};
use holdfast_model::layout::{self, DrainRecord};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::time::Duration;

/// Drains a third of the episode's entity keys (each its own unit, as a
/// key of one segment homes by itself), or one time in four the whole
/// namespace, for `hold`; confirmed by reading the markers back.
pub async fn drain(ctx: &FaultCtx<'_>, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    let units: Vec<String> = if rng.random_range(0..4) == 0 {
        vec![crate::cluster::GATE_NAMESPACE.to_string()]
    } else {
        let mut keys = ctx.keys.to_vec();
        keys.shuffle(rng);
        keys.truncate((ctx.keys.len() / 3).max(1));
        keys
    };
    let mut etcd = ctx.cluster.etcd().await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let record = layout::encode(&DrainRecord { since_unix_ms: now, until_unix_ms: now + hold.as_millis() as u64 });
    let mut from = 0;
    for u in &units {
        let put = etcd.put(layout::drain_key(u), record.clone(), None).await.with_context(|| format!("writing the drain marker of {u}"))?;
        if from == 0 {
            from = put.header().map_or(0, |h| h.revision());
        }
    }
    let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
    let seen = etcd.get(layout::DRAIN_PREFIX, Some(opts)).await.context("reading the drain markers back")?.count();
    tokio::time::sleep(hold).await;
    let deleted = etcd
        .delete(layout::DRAIN_PREFIX, Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .context("deleting the drain markers")?;
    let to = deleted.header().map_or(0, |h| h.revision());
    if seen != units.len() as i64 || deleted.deleted() != units.len() as i64 {
        bail!("{} drain markers written, {seen} read back, {} deleted", units.len(), deleted.deleted());
    }
    let what = match units.as_slice() {
        [one] if one == crate::cluster::GATE_NAMESPACE => format!("drain the whole namespace {one} for {hold:?}"),
        _ => format!("drain {} of the {} entity keys for {hold:?}", units.len(), ctx.keys.len()),
    };
    Ok(Effect { what, confirmed: format!("{seen} markers in etcd from revision {from} to {to}") })
}

//! The one-client hop, taken apart (`--only hop`): where the extra time of
//! an acquire+release pair through the arbiter goes.
//!
//! One client runs rounds for `--duration`. Each round, back to back:
//! acquire and release through the arbiter (each timed on its own); the same
//! grant and release transactions sent straight to etcd; an arbiter call
//! that does not touch etcd (`ServerStatus`); and an etcd call that writes
//! nothing (a serializable read of `/sys/epoch`). Interleaving them puts
//! every path under the same noise. The arbiter's own etcd time per grant
//! comes from its `holdfast_arbiter_grant_latency_seconds` histogram (sum
//! and count over the window), so the added time splits into:
//!
//! - **transport**: one client→arbiter TLS/HTTP/2 round trip per call (the
//!   empty arbiter call), paid twice per pair;
//! - **etcd from the arbiter**: the arbiter's grant transaction against the
//!   same transaction sent by this process;
//! - **the arbiter's own work**: what is left of the acquire (policy, quota,
//!   session lookup, the grant's checks, and waiting for a core).
//!
//! Means are used for the split because the arbiter's histogram gives only a
//! mean; the p50s are reported beside them.

use crate::{BENCH_NAMESPACE, Ctx, histogram_totals, mean_ms_between, percentile, rand_u64, raw_session, round};
use holdfast_model::LockKey;
use holdfast_model::layout::{self, HoldRecord};
use std::time::{Duration, Instant};

/// The figures of one hop run, in milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Hop {
    pub rounds: usize,
    pub errors: u64,
    pub arbiter_acquire: Stat,
    pub arbiter_release: Stat,
    pub direct_grant: Stat,
    pub direct_release: Stat,
    /// `ServerStatus` through the arbiter: no etcd behind it.
    pub arbiter_empty_call: Stat,
    /// A serializable read of `/sys/epoch` straight from etcd: no Raft.
    pub etcd_empty_call: Stat,
    /// The arbiter's grant transactions, timed by the arbiter (mean over the
    /// window), when its metrics could be read.
    pub arbiter_grant_txn_mean_ms: Option<f64>,
    /// Pair through the arbiter minus pair sent directly (p50s).
    pub added_pair_p50_ms: f64,
    /// The same, from the means; the split below adds up to it.
    pub added_pair_mean_ms: f64,
    /// Two client→arbiter round trips (2 × the empty call's mean).
    pub split_transport_ms: f64,
    /// The arbiter's grant transaction minus the direct one (means).
    pub split_etcd_from_arbiter_ms: Option<f64>,
    /// What is left: the arbiter's own work on both calls (and any
    /// difference in the release transaction's etcd time, which the arbiter
    /// does not time).
    pub split_arbiter_work_ms: Option<f64>,
}

/// p50 and mean of one timed call, in milliseconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Stat {
    pub p50_ms: f64,
    pub mean_ms: f64,
}

impl Stat {
    fn of(mut v: Vec<Duration>) -> Stat {
        v.sort();
        let mean = if v.is_empty() { 0.0 } else { v.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e3 / v.len() as f64 };
        Stat { p50_ms: round(percentile(&v, 0.5)), mean_ms: round(mean) }
    }
}

/// The arbiter's histogram of its grant transactions' etcd time.
const GRANT_TXN: &str = "holdfast_arbiter_grant_latency_seconds";

async fn grant_txn_totals(url: Option<&str>) -> Option<(f64, f64)> {
    histogram_totals(url?, GRANT_TXN).await
}

/// Runs the rounds for `duration`. `arbiter_metrics` is the arbiter's
/// Prometheus URL, if known.
pub(crate) async fn run(ctx: &Ctx, arbiter_metrics: Option<&str>, duration: Duration) -> anyhow::Result<Hop> {
    let key = LockKey::new(BENCH_NAMESPACE, &format!("hop-{:x}", rand_u64()))?;
    let direct_key = LockKey::new(BENCH_NAMESPACE, &format!("hop-direct-{:x}", rand_u64()))?;
    let session = ctx.client.open_session_for(BENCH_NAMESPACE, None).await?;
    let identity = "spiffe://holdfast.bench/direct";
    let (lease, session_bytes) = raw_session(&ctx.etcd, identity, duration).await?;
    let hold = layout::encode(&HoldRecord { spiffe_id: identity.into(), session: lease, epoch: ctx.epoch, granted_unix_ms: 0 });
    let hold_key = layout::hold_key(&direct_key);
    // The arbiter's own transaction, drain-marker compares included.
    let drains = layout::drain_keys(&direct_key);
    let mut etcd = ctx.etcd.client.clone();
    let serializable = etcd_client::GetOptions::new().with_serializable();

    let (mut acq, mut rel, mut dg, mut dr, mut ae, mut ee) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut errors = 0u64;
    let before = grant_txn_totals(arbiter_metrics).await;
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let t = Instant::now();
        match session.acquire(&key, Duration::ZERO).await {
            Ok(h) => {
                acq.push(t.elapsed());
                let t = Instant::now();
                match h.release().await {
                    Ok(_) => rel.push(t.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            Err(_) => errors += 1,
        }
        let t = Instant::now();
        let txn = holdfast_store::txn::grant_txn(&hold_key, &ctx.epoch_bytes, lease, &session_bytes, &hold, None, &drains);
        match etcd.txn(txn).await {
            Ok(r) if r.succeeded() => {
                dg.push(t.elapsed());
                let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                let t = Instant::now();
                match etcd.txn(holdfast_store::txn::release_txn_for(&hold_key, lease, rev)).await {
                    Ok(r) if r.succeeded() => dr.push(t.elapsed()),
                    _ => errors += 1,
                }
            }
            _ => errors += 1,
        }
        let t = Instant::now();
        match ctx.client.server_status().await {
            Ok(_) => ae.push(t.elapsed()),
            Err(_) => errors += 1,
        }
        let t = Instant::now();
        match etcd.get(layout::EPOCH_KEY, Some(serializable.clone())).await {
            Ok(_) => ee.push(t.elapsed()),
            Err(_) => errors += 1,
        }
    }
    let after = grant_txn_totals(arbiter_metrics).await;
    let _ = session.close().await;
    let _ = etcd.lease_revoke(lease).await;

    let rounds = acq.len().min(rel.len()).min(dg.len()).min(dr.len()).min(ae.len()).min(ee.len());
    if rounds == 0 {
        anyhow::bail!("no hop round completed ({errors} calls failed)");
    }
    let arbiter_grant_txn_mean_ms = mean_ms_between(before, after).map(round);
    let (acq, rel, dg, dr, ae, ee) = (Stat::of(acq), Stat::of(rel), Stat::of(dg), Stat::of(dr), Stat::of(ae), Stat::of(ee));
    let added_pair_mean_ms = (acq.mean_ms + rel.mean_ms) - (dg.mean_ms + dr.mean_ms);
    let split_transport_ms = 2.0 * ae.mean_ms;
    let split_etcd_from_arbiter_ms = arbiter_grant_txn_mean_ms.map(|a| a - dg.mean_ms);
    let split_arbiter_work_ms = split_etcd_from_arbiter_ms.map(|e| added_pair_mean_ms - split_transport_ms - e);
    Ok(Hop {
        rounds,
        errors,
        arbiter_acquire: acq,
        arbiter_release: rel,
        direct_grant: dg,
        direct_release: dr,
        arbiter_empty_call: ae,
        etcd_empty_call: ee,
        arbiter_grant_txn_mean_ms,
        added_pair_p50_ms: round((acq.p50_ms + rel.p50_ms) - (dg.p50_ms + dr.p50_ms)),
        added_pair_mean_ms: round(added_pair_mean_ms),
        split_transport_ms: round(split_transport_ms),
        split_etcd_from_arbiter_ms: split_etcd_from_arbiter_ms.map(round),
        split_arbiter_work_ms: split_arbiter_work_ms.map(round),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_the_median_and_the_mean_in_milliseconds() {
        let ms = |x: u64| Duration::from_micros(x * 1000);
        let s = Stat::of(vec![ms(3), ms(1), ms(2), ms(10)]);
        assert_eq!(s.mean_ms, 4.0);
        assert!(s.p50_ms >= 2.0 && s.p50_ms <= 3.0, "{s:?}");
        let empty = Stat::of(vec![]);
        assert_eq!(empty.mean_ms, 0.0);
    }
}

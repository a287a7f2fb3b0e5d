//! The restore fault's second half, after the episode's workload stopped and
//! its history was checked: every arbiter stopped, every member stopped and
//! restored from the snapshot the fault took mid-run (same cluster token and
//! peer URLs, so the cluster and member IDs are unchanged and only the log
//! offset shows the rewind), the coord cluster restored from the snapshot
//! taken with it (its allocator and nonces go back too), every arbiter
//! started again (as a reboot during
//! the incident would: what each served is on its disk, not in its memory),
//! clients started on fresh keys of both tiers, both arbiters confirmed
//! sealed on both clusters, each cluster's epoch advanced the way the
//! two-person DR procedure does (above the highest epoch the restored
//! records, the allocators and every arbiter report, then the unit's
//! transaction: the entity cluster's first, then the coord cluster's own),
//! and the clients' grants on each restored cluster checked on their own
//! and against every grant of the same tier before the restore: C1's
//! `TokenNotAboveRestore` proves that no token issued after the restore is
//! at or below one issued before it.
//!
//! The snapshot is older than the episode's epoch advances (the episode
//! takes it before them), so the restored epoch record and both allocators
//! are behind the epochs already used: only the arbiters' own records keep the
//! new epoch above them. `--mutation advance_from_restored_record` advances
//! by one from the restored record instead; `forget_served_epochs` makes
//! the arbiters forget what they served.

use crate::episode::{self, Episode, LogStarts, Setup, Tier, Tiers};
use crate::faults::{FaultKind, FaultRecord, PendingRestore, wait_for};
use crate::summary::Summary;
use crate::{CLIENT_TTL, cluster, say};
use holdfast_checkers::etcd_log;
use std::time::{Duration, Instant};

/// How long the clients run on the restored cluster after the advance.
const AFTER_ADVANCE: Duration = Duration::from_secs(10);

/// How long a read of the restored clusters is tried again.
const SETTLE: Duration = Duration::from_secs(20);

/// A read of the restored clusters: right after every member was restored
/// and restarted they may still be electing a leader, and under a loaded
/// machine a read then times out (a CI run's restore went unconfirmed on
/// one such timeout). Tried again every half second for [`SETTLE`].
async fn settled<T, F: std::future::Future<Output = anyhow::Result<T>>>(what: &str, read: impl Fn() -> F) -> anyhow::Result<T> {
    let end = Instant::now() + SETTLE;
    loop {
        match read().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < end => {
                say(&format!("restore: {what} not answered yet ({e:#}); trying again"));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.context(format!("{what}, tried for {} s after the restore", SETTLE.as_secs()))),
        }
    }
}

/// Runs the restore and checks the restored cluster's history; adds to the
/// summary and returns whether everything passed.
pub async fn phase(
    setup: &mut Setup<'_>,
    ep: &Episode,
    pending: PendingRestore,
    before: &Tiers,
    seed: u64,
    summary: &mut Summary,
    all_faults: &mut Vec<FaultRecord>,
) -> anyhow::Result<bool> {
    let args = setup.args;
    let at_ms = setup.t0.elapsed().as_millis() as u64;
    std::fs::create_dir_all(&ep.dir)?;
    let before_epoch = cluster::epoch_of(&setup.cluster.holdfast_etcd().await?).await?;
    // Seals from here until the advance are expected, not false.
    let log_marks: Vec<u64> =
        setup.cluster.arbiters.iter().map(|a| std::fs::metadata(&a.launch.log).map(|m| m.len()).unwrap_or(0)).collect();
    let arbiters = setup.cluster.arbiters.len();
    for a in 0..arbiters {
        setup.cluster.kill_arbiter(a);
    }
    setup.cluster.restore(&pending.file, setup.net).await?;
    setup.cluster.restore_coord(&pending.coord_file).await?;
    for a in 0..arbiters {
        setup.cluster.start_arbiter(a, setup.net)?;
    }
    say(&format!(
        "restored every member from the snapshot of e{} (revision {}) and the coord cluster from its snapshot; both arbiters restarted",
        pending.member, pending.revision
    ));
    let c: &cluster::Cluster = setup.cluster;
    let from = settled("the entity epoch", || async { cluster::epoch_of(&c.holdfast_etcd().await?).await }).await?;
    let coord_from = settled("the coord epoch", || async { cluster::epoch_of(&c.coord_etcd().await?).await }).await?;

    // Clients on fresh keys, racing the arbiters' seal.
    let mut procs = episode::spawn_clients(ep, setup.cluster, args, setup.resource, seed ^ 0x7265_7374_6f72_6521)?;
    let restored = Instant::now();
    let sealed_in = wait_for(Duration::from_secs(20), || c.all_sealed()).await.then(|| restored.elapsed());
    let etcd = c.holdfast_etcd().await?;
    let coord = c.coord_etcd().await?;
    // What `holdfastctl epoch advance-request` reads: the restored record,
    // the allocators (both restored) and every arbiter's report of what it
    // served.
    let allocated =
        settled("the allocators", || async { Ok(holdfast_store::epoch::highest_allocated(&etcd, Some(&coord)).await?) }).await?;
    let served = settled("what the arbiters served", || c.served_high()).await?;
    let highest_known = from.max(allocated).max(served);
    let mutated = args.mutation.as_deref() == Some("advance_from_restored_record");
    let (to, highest_known) = if mutated { (from + 1, from) } else { (highest_known + 1, highest_known) };
    let reason = "the gate's restore fault";
    let advanced = c.approvals.advance(&etcd, &coord, cluster::ENTITY_CLUSTER, (from, to, highest_known), reason).await;
    // The coord cluster's own advance: above everything known, the entity
    // cluster's new epoch included (its allocator is coord's own).
    let coord_allocated =
        settled("the coord allocator", || async { Ok(holdfast_store::epoch::highest_allocated(&coord, None).await?) }).await?;
    let coord_known = coord_from.max(coord_allocated).max(served).max(to);
    let (coord_to, coord_known) = if mutated { (coord_from + 1, coord_from) } else { (coord_known + 1, coord_known) };
    let coord_advanced = c.approvals.advance(&coord, &coord, cluster::COORD_CLUSTER, (coord_from, coord_to, coord_known), reason).await;
    let switched = wait_for(Duration::from_secs(15), || c.all_serving_now(to, coord_to)).await;
    for (a, mark) in log_marks.iter().enumerate() {
        let now = std::fs::metadata(&setup.cluster.arbiters[a].launch.log).map(|m| m.len()).unwrap_or(*mark);
        setup.cluster.expected_seals.push((a, *mark, now));
    }
    let what = format!(
        "every member restored from the snapshot of e{} at revision {} (epoch {from}; the cluster had reached {before_epoch}) \
         and the coord cluster from its own (the allocator, the nonces and the coord tier's holds went back too), both arbiters \
         restarted; epoch {from} -> {to} (entity) and {coord_from} -> {coord_to} (coord) advanced after the seal",
        pending.member, pending.revision
    );
    match (&sealed_in, &advanced, &coord_advanced, switched) {
        (Some(t), Ok(_), Ok(_), true) => {
            let confirmed = format!(
                "both arbiters sealed on both clusters {:.1} s after the restore; both serve epoch {to} (entity) and {coord_to} (coord)",
                t.as_secs_f64()
            );
            say(&format!("[{:>7.1}s] restore: {what} — {confirmed}", at_ms as f64 / 1000.0));
            *summary.faults.entry(FaultKind::Restore.name()).or_default() += 1;
            all_faults.push(FaultRecord { kind: FaultKind::Restore, seed, at_ms, what, confirmed, healed_after_ms: 0 });
        }
        _ => {
            let outcome = |a: &anyhow::Result<holdfast_model::layout::EpochRecord>| match a {
                Ok(r) => format!("epoch {}", r.epoch),
                Err(e) => format!("{e:#}"),
            };
            let why = format!(
                "sealed on both clusters: {}; entity advance: {}; coord advance: {}; both serve epochs {to} and {coord_to}: {switched}",
                sealed_in.map(|t| format!("after {:.1} s", t.as_secs_f64())).unwrap_or_else(|| "not within 20 s".into()),
                outcome(&advanced),
                outcome(&coord_advanced)
            );
            say(&format!("restore NOT confirmed: {why}"));
            summary.faults_unconfirmed.push(format!("restore: {why}"));
        }
    }

    // Work on the restored cluster, then stop and check.
    tokio::time::sleep(AFTER_ADVANCE).await;
    let healed = Instant::now();
    std::fs::write(ep.dir.join("stop"), "")?;
    let budget = CLIENT_TTL + cluster::ELECTION_TIMEOUT + Duration::from_secs(5);
    let (worst, failures) = episode::liveness(setup.cluster, ep, healed, budget).await?;
    for p in &mut procs {
        episode::wait_child(&mut p.child, Duration::from_secs(60));
    }
    summary.liveness_max_ms = summary.liveness_max_ms.max(worst.as_millis() as u64);
    summary.liveness_failures += failures;
    let passed = failures == 0;
    // Each restored log from the first revision after its snapshot; the
    // epoch in force there is the one before the advance.
    let starts = LogStarts { entity: (pending.revision + 1, from), coord: (pending.coord_revision + 1, coord_from) };
    let after = episode::collect(ep, setup.cluster, &starts, setup.resource, &args.fence).await?;
    let checked = episode::check_tiers(&ep.dir, &after, setup.resource.is_some(), summary, |tier, history| {
        let before = if tier == Tier::Coord { &before.coord } else { &before.entity };
        Some(etcd_log::check_restore(before, history))
    })?;
    if !checked {
        say("VIOLATIONS or INCONCLUSIVE keys after the restore");
    }
    Ok(passed && checked)
}

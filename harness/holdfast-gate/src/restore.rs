//! The restore fault's second half, after the episode's workload stopped and
//! its history was checked: every arbiter stopped, every member stopped and
//! restored from the snapshot the fault took mid-run (same cluster token and
//! peer URLs, so the cluster and member IDs are unchanged and only the log
//! offset shows the rewind), the coord cluster restored from the snapshot
//! taken with it (its allocator and nonces go back too), every arbiter
//! started again (as a reboot during
//! the incident would: what each served is on its disk, not in its memory),
//! clients started on fresh keys, both arbiters confirmed sealed, the epoch
//! advanced the way the two-person DR procedure does (above the highest
//! epoch the restored record, the allocator and every arbiter report, then
//! the unit's transaction), and the clients' grants on the restored cluster
//! checked on their own and against every grant before the restore: C1's
//! `TokenNotAboveRestore` proves that no token issued after the restore is
//! at or below one issued before it.
//!
//! The snapshot is older than the episode's epoch advances (the episode
//! takes it before them), so the restored epoch record and both allocators
//! are behind the epochs already used: only the arbiters' own records keep the
//! new epoch above them. `--mutation advance_from_restored_record` advances
//! by one from the restored record instead; `forget_served_epochs` makes
//! the arbiters forget what they served.

use crate::episode::{self, Episode, Setup};
use crate::faults::{FaultKind, FaultRecord, PendingRestore, wait_for};
use crate::summary::Summary;
use crate::{CLIENT_TTL, cluster, say};
use holdfast_checkers::etcd_log;
use holdfast_checkers::history::History;
use holdfast_checkers::report::Report;
use std::time::{Duration, Instant};

/// How long the clients run on the restored cluster after the advance.
const AFTER_ADVANCE: Duration = Duration::from_secs(10);

/// Runs the restore and checks the restored cluster's history; adds to the
/// summary and returns whether everything passed.
pub async fn phase(
    setup: &mut Setup<'_>,
    ep: &Episode,
    pending: PendingRestore,
    before: &History,
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
    let from = cluster::epoch_of(&setup.cluster.holdfast_etcd().await?).await?;

    // Clients on fresh keys, racing the arbiters' seal.
    let mut procs = episode::spawn_clients(ep, setup.cluster, args, setup.resource, seed ^ 0x7265_7374_6f72_6521)?;
    let c: &cluster::Cluster = setup.cluster;
    let restored = Instant::now();
    let sealed_in = wait_for(Duration::from_secs(20), || c.all_sealed()).await.then(|| restored.elapsed());
    let etcd = c.holdfast_etcd().await?;
    let coord = c.coord_etcd().await?;
    // What `holdfastctl epoch advance-request` reads: the restored record,
    // the allocators (both restored) and every arbiter's report of what it
    // served.
    let allocated = holdfast_store::epoch::highest_allocated(&etcd, Some(&coord)).await?;
    let highest_known = from.max(allocated).max(c.served_high().await?);
    let (to, highest_known) = if args.mutation.as_deref() == Some("advance_from_restored_record") {
        (from + 1, from)
    } else {
        (highest_known + 1, highest_known)
    };
    let advanced = match c.approvals.approve(&etcd, from, to, highest_known, "the gate's restore fault").await {
        Ok(approved) => match crate::approvals::Approvals::advance_txn(&etcd, &coord, &approved).await {
            Ok(done) => {
                holdfast_store::epoch::revoke_sessions(&etcd, &done.old_leases).await;
                Ok(done.record)
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    let switched = wait_for(Duration::from_secs(15), || c.all_serving_now(to)).await;
    for (a, mark) in log_marks.iter().enumerate() {
        let now = std::fs::metadata(&setup.cluster.arbiters[a].launch.log).map(|m| m.len()).unwrap_or(*mark);
        setup.cluster.expected_seals.push((a, *mark, now));
    }
    let what = format!(
        "every member restored from the snapshot of e{} at revision {} (epoch {from}; the cluster had reached {before_epoch}) \
         and the coord cluster from its own (the allocator and nonces went back too), both arbiters restarted; \
         epoch {from} -> {to} advanced after the seal",
        pending.member, pending.revision
    );
    match (&sealed_in, &advanced, switched) {
        (Some(t), Ok(_), true) => {
            let confirmed = format!("both arbiters sealed {:.1} s after the restore; both serve epoch {to}", t.as_secs_f64());
            say(&format!("[{:>7.1}s] restore: {what} — {confirmed}", at_ms as f64 / 1000.0));
            *summary.faults.entry(FaultKind::Restore.name()).or_default() += 1;
            all_faults.push(FaultRecord { kind: FaultKind::Restore, seed, at_ms, what, confirmed, healed_after_ms: 0 });
        }
        _ => {
            let why = format!(
                "sealed: {}; advance: {}; both serve epoch {to}: {switched}",
                sealed_in.map(|t| format!("after {:.1} s", t.as_secs_f64())).unwrap_or_else(|| "not within 20 s".into()),
                advanced.as_ref().map(|r| format!("epoch {}", r.epoch)).unwrap_or_else(|e| e.to_string())
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
    let mut passed = failures == 0;
    // The restored log from the first revision after the snapshot; the
    // epoch in force there is the one before the advance.
    let after = episode::collect(ep, setup.cluster, pending.revision + 1, from, setup.resource, &args.fence).await?;
    summary.count_history(&after.stats());
    let mut reports = episode::check(&after, setup.resource.is_some());
    reports.push(etcd_log::check_restore(before, &after));
    std::fs::write(ep.dir.join("history.json"), serde_json::to_vec(&after)?)?;
    summary.count_reports(&reports);
    summary.withdrawals += after.etcd.withdrawals.len();
    if !reports.iter().all(Report::passed) {
        passed = false;
        say(&format!("VIOLATIONS or INCONCLUSIVE keys after the restore; history kept in {}", ep.dir.join("history.json").display()));
        episode::report_failures(&after, &reports);
    }
    Ok(passed)
}

//! `--only group-commit`: what `[grants] group_commit` buys where etcd is
//! the bottleneck, as on a dedicated etcd host. etcd is pinned to one CPU
//! (`taskset`, restored afterwards) and two arbiters are started on the
//! appliance's etcd, one without group commit and one with it
//! ([`DevArbiter`]). Through each, at `--clients` clients (the most, up to
//! 64):
//!
//! - **grants only**: every client takes distinct keys one after the other
//!   and keeps them (they are released when its session closes, after the
//!   window), so the Raft proposals committed in the window divided by the
//!   grants are the proposals per grant;
//! - **pairs**: acquire+release pairs/s and proposals per pair, as the
//!   uncontended cell measures them (group commit batches releases too),
//!   beside the direct transactions under the same pinning.
//!
//! Needs `--dev-dir` (the arbiters are started from its `arbiter.toml`) and
//! etcd's pid (found from its port, or `--etcd-pid`).

use crate::scale::DevArbiter;
use crate::{BENCH_NAMESPACE, Ctx, Variant, cpu, measured_window, percentile, rand_u64, round, uncontended};
use anyhow::{Context, bail};
use holdfast_model::LockKey;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// etcd's threads pinned to one CPU until this is dropped, which restores
/// the affinity they had.
pub struct Pinned {
    pid: u32,
    mask: String,
}

impl Pinned {
    /// `taskset -a -p -c CPU PID`, after reading the current mask.
    pub fn pin(pid: u32, cpu: usize) -> anyhow::Result<Self> {
        let mask = affinity(pid)?;
        let out = Command::new("taskset")
            .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
            .output()
            .context("running taskset (util-linux)")?;
        if !out.status.success() {
            bail!("taskset could not pin pid {pid} to CPU {cpu}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(Pinned { pid, mask })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let restored = Command::new("taskset").args(["-a", "-p", &self.mask, &self.pid.to_string()]).output();
        if !restored.is_ok_and(|o| o.status.success()) {
            eprintln!("holdfast-bench: could not restore the CPU affinity of pid {} to mask {}", self.pid, self.mask);
        }
    }
}

/// The hexadecimal affinity mask of `pid` (`taskset -p`).
pub fn affinity(pid: u32) -> anyhow::Result<String> {
    let out = Command::new("taskset").args(["-p", &pid.to_string()]).output().context("running taskset (util-linux)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().rsplit_once(": ") {
        Some((_, mask)) if out.status.success() => Ok(mask.to_string()),
        _ => bail!("taskset -p {pid}: {}{}", text.trim(), String::from_utf8_lossy(&out.stderr).trim()),
    }
}

/// One arbiter's grants-only window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Grants {
    pub group_commit: bool,
    pub clients: usize,
    pub grants_per_sec: f64,
    pub p50_ms: f64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposals_per_grant: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_cpu_us_per_grant: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_cpu_us_per_grant: Option<f64>,
}

/// Grants only: each client acquires `g-RUN-CLIENT-N` for N = 0, 1, … until
/// `duration` has passed, keeping every hold; the sessions close (and so
/// release them) after the window.
async fn grants(ctx: &Arc<Ctx>, group_commit: bool, clients: usize, duration: Duration) -> anyhow::Result<Grants> {
    let run = format!("{:x}", rand_u64());
    let phase = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (ctx, phase, run) = (ctx.clone(), phase.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            let session = ctx.client.open_session_for(BENCH_NAMESPACE, None).await;
            phase.wait().await; // set up
            phase.wait().await; // go
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut holds = Vec::new();
            if let Ok(session) = &session {
                let end = Instant::now() + duration;
                let mut n = 0u64;
                while Instant::now() < end {
                    // (A bad key ends this client's loop, never its phases.)
                    let Ok(key) = LockKey::new(BENCH_NAMESPACE, &format!("g-{run}-{i}-{n}")) else {
                        errors += 1;
                        break;
                    };
                    n += 1;
                    let t = Instant::now();
                    match session.acquire(&key, Duration::ZERO).await {
                        Ok(h) => {
                            lat.push(t.elapsed());
                            holds.push(h);
                        }
                        Err(_) => errors += 1,
                    }
                }
            }
            phase.wait().await; // stopped
            phase.wait().await; // close
            let session = session?;
            drop(holds);
            let _ = session.close().await;
            Ok::<_, anyhow::Error>((lat, errors))
        }));
    }
    let (mut lat, errors, window) = measured_window(ctx, &phase, tasks).await?;
    lat.sort();
    Ok(Grants {
        group_commit,
        clients,
        grants_per_sec: round(lat.len() as f64 / window.elapsed.as_secs_f64()),
        p50_ms: round(percentile(&lat, 0.5)),
        errors,
        proposals_per_grant: window.proposals_per_pair.map(round),
        arbiter_cpu_us_per_grant: window.cpu.arbiter.map(round),
        etcd_cpu_us_per_grant: window.cpu.etcd.map(round),
    })
}

/// The part: pins etcd, starts both arbiters, measures, and adds its
/// figures to `summary`.
pub(crate) async fn run(
    ctx: &Arc<Ctx>,
    conn: &holdfast_cli::conn::ConnArgs,
    dev_dir: Option<&std::path::Path>,
    cpu: usize,
    clients: usize,
    duration: Duration,
    summary: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    let dir = dev_dir.context("--only group-commit starts two arbiters from a dev appliance's arbiter.toml: give --dev-dir")?;
    let etcd = ctx.pids.etcd.context("--only group-commit pins etcd to one CPU: give --etcd-pid (it was not found from etcd's port)")?;
    let pinned = Pinned::pin(etcd, cpu)?;
    let before = pinned.mask.clone();
    eprintln!("  group commit: etcd (pid {etcd}) pinned to CPU {cpu} (mask was {before}), {clients} clients, {duration:?} per window");
    let mut cells = Vec::new();
    let mut pair_cells = Vec::new();
    for on in [false, true] {
        let name = if on { "arbiter-group-commit" } else { "arbiter-no-group-commit" };
        let arbiter = DevArbiter::start_tuned(dir, name, &|c| {
            c.grants.group_commit = on;
            c.limits.max_holds_per_identity = u64::MAX / 2;
            c.limits.max_holds_per_namespace = u64::MAX / 2;
        })?;
        let mut conn = conn.clone();
        conn.endpoint = Some(arbiter.endpoint.clone());
        let client = conn.connect().await.map_err(|code| anyhow::anyhow!("cannot connect to the {name} arbiter (exit {code})"))?;
        let sub = Arc::new(Ctx {
            client,
            etcd: ctx.etcd.clone(),
            epoch_bytes: ctx.epoch_bytes.clone(),
            epoch: ctx.epoch,
            etcd_version: ctx.etcd_version.clone(),
            metrics_url: ctx.metrics_url.clone(),
            pids: cpu::Pids { arbiter: arbiter.pid(), etcd: ctx.pids.etcd },
        });
        let g = grants(&sub, on, clients, duration).await?;
        let p = uncontended(&sub, Variant::Arbiter, clients, duration).await?;
        let label = if on { "on " } else { "off" };
        let opt = |x: Option<f64>| x.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
        eprintln!(
            "  group commit {label}: {:>8.0} grants/s, {} proposals/grant, CPU us/grant arbiter {} etcd {}; {:>8.0} pairs/s, {} proposals/pair ({} errors)",
            g.grants_per_sec,
            opt(g.proposals_per_grant),
            opt(g.arbiter_cpu_us_per_grant),
            opt(g.etcd_cpu_us_per_grant),
            p.pairs_per_sec,
            opt(p.proposals_per_pair),
            g.errors + p.errors
        );
        pair_cells.push(p);
        cells.push(g);
    }
    let direct = uncontended(ctx, Variant::EtcdTxn, clients, duration).await?;
    eprintln!(
        "  group commit: direct transactions under the same pinning {:>8.0} pairs/s, {} proposals/pair",
        direct.pairs_per_sec,
        direct.proposals_per_pair.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into())
    );
    drop(pinned);
    let after = affinity(etcd)?;
    if after != before {
        bail!("etcd's CPU affinity is {after} after the run, not {before} as before it");
    }

    let (off, on) = (&cells[0], &cells[1]);
    summary.insert("group_commit_clients".into(), clients.into());
    summary.insert("group_commit_etcd_cpu".into(), cpu.into());
    let put = |s: &mut serde_json::Map<String, serde_json::Value>, k: &str, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            s.insert(k.into(), round(v).into());
        }
    };
    put(summary, "proposals_per_grant_off", off.proposals_per_grant);
    put(summary, "proposals_per_grant_on", on.proposals_per_grant);
    put(
        summary,
        "group_commit_proposal_cut",
        off.proposals_per_grant.zip(on.proposals_per_grant).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b),
    );
    put(summary, "grants_per_sec_off", Some(off.grants_per_sec));
    put(summary, "grants_per_sec_on", Some(on.grants_per_sec));
    put(summary, "etcd_cpu_us_per_grant_off", off.etcd_cpu_us_per_grant);
    put(summary, "etcd_cpu_us_per_grant_on", on.etcd_cpu_us_per_grant);
    let (pairs_off, pairs_on) = (&pair_cells[0], &pair_cells[1]);
    put(summary, "pinned_pairs_per_sec_off", Some(pairs_off.pairs_per_sec));
    put(summary, "pinned_pairs_per_sec_on", Some(pairs_on.pairs_per_sec));
    put(summary, "pinned_pairs_per_sec_direct", Some(direct.pairs_per_sec));
    put(summary, "pinned_proposals_per_pair_off", pairs_off.proposals_per_pair);
    put(summary, "pinned_proposals_per_pair_on", pairs_on.proposals_per_pair);
    put(summary, "pinned_proposals_per_pair_direct", direct.proposals_per_pair);
    put(
        summary,
        "group_commit_vs_direct_pairs",
        Some(pairs_on.pairs_per_sec).filter(|_| direct.pairs_per_sec > 0.0).map(|p| p / direct.pairs_per_sec),
    );
    summary.insert("group_commit".into(), serde_json::to_value(&cells)?);
    Ok(())
}

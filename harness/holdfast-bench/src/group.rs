//! `--only group-commit`: what `[grants] group_commit` buys where etcd is
//! the bottleneck, as on a dedicated etcd host. etcd is pinned to one CPU
//! (`taskset`, restored afterwards) and two arbiters are started on the
//! appliance's etcd, one without group commit and one with it
//! ([`DevArbiter`]). Through each, at every `--clients` level up to 64 (the
//! top-level `--json` figures are the most clients'; `group_commit_curve`
//! holds every level, and `--plot` draws it):
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

/// One client level of the curve.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Point {
    pub clients: usize,
    pub proposals_per_grant_off: Option<f64>,
    pub proposals_per_grant_on: Option<f64>,
    pub grants_per_sec_off: f64,
    pub grants_per_sec_on: f64,
    pub pairs_per_sec_off: f64,
    pub pairs_per_sec_on: f64,
    pub pairs_per_sec_direct: f64,
    pub proposals_per_pair_off: Option<f64>,
    pub proposals_per_pair_on: Option<f64>,
    pub proposals_per_pair_direct: Option<f64>,
}

/// The part: pins etcd, starts both arbiters, measures every level in
/// `levels` (client counts), and adds its figures to `summary`: the
/// top-level ones of the last (most clients) level, and every level under
/// `group_commit_curve`. Returns the curve.
pub(crate) async fn run(
    ctx: &Arc<Ctx>,
    conn: &holdfast_cli::conn::ConnArgs,
    dev_dir: Option<&std::path::Path>,
    cpu: usize,
    levels: &[usize],
    duration: Duration,
    summary: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<Vec<Point>> {
    let dir = dev_dir.context("--only group-commit starts two arbiters from a dev appliance's arbiter.toml: give --dev-dir")?;
    let etcd = ctx.pids.etcd.context("--only group-commit pins etcd to one CPU: give --etcd-pid (it was not found from etcd's port)")?;
    anyhow::ensure!(!levels.is_empty(), "--only group-commit needs at least one --clients level of 64 or fewer");
    let pinned = Pinned::pin(etcd, cpu)?;
    let before = pinned.mask.clone();
    eprintln!("  group commit: etcd (pid {etcd}) pinned to CPU {cpu} (mask was {before}), clients {levels:?}, {duration:?} per window");
    // [off, on] per level.
    let mut cells: Vec<Vec<Grants>> = vec![Vec::new(); levels.len()];
    let mut pair_cells: Vec<Vec<crate::Cell>> = vec![Vec::new(); levels.len()];
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
        for (i, &clients) in levels.iter().enumerate() {
            let g = grants(&sub, on, clients, duration).await?;
            let p = uncontended(&sub, Variant::Arbiter, clients, duration).await?;
            let label = if on { "on " } else { "off" };
            let opt = |x: Option<f64>| x.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
            eprintln!(
                "  group commit {label} {clients:>3} clients: {:>8.0} grants/s, {} proposals/grant, CPU us/grant arbiter {} etcd {}; {:>8.0} pairs/s, {} proposals/pair ({} errors)",
                g.grants_per_sec,
                opt(g.proposals_per_grant),
                opt(g.arbiter_cpu_us_per_grant),
                opt(g.etcd_cpu_us_per_grant),
                p.pairs_per_sec,
                opt(p.proposals_per_pair),
                g.errors + p.errors
            );
            pair_cells[i].push(p);
            cells[i].push(g);
        }
    }
    let mut directs = Vec::new();
    for &clients in levels {
        let direct = uncontended(ctx, Variant::EtcdTxn, clients, duration).await?;
        eprintln!(
            "  group commit: direct transactions under the same pinning, {clients:>3} clients: {:>8.0} pairs/s, {} proposals/pair",
            direct.pairs_per_sec,
            direct.proposals_per_pair.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into())
        );
        directs.push(direct);
    }
    drop(pinned);
    let after = affinity(etcd)?;
    if after != before {
        bail!("etcd's CPU affinity is {after} after the run, not {before} as before it");
    }

    let curve: Vec<Point> = levels
        .iter()
        .enumerate()
        .map(|(i, &clients)| {
            let (off, on, direct) = (&cells[i][0], &cells[i][1], &directs[i]);
            let (pairs_off, pairs_on) = (&pair_cells[i][0], &pair_cells[i][1]);
            Point {
                clients,
                proposals_per_grant_off: off.proposals_per_grant,
                proposals_per_grant_on: on.proposals_per_grant,
                grants_per_sec_off: round(off.grants_per_sec),
                grants_per_sec_on: round(on.grants_per_sec),
                pairs_per_sec_off: round(pairs_off.pairs_per_sec),
                pairs_per_sec_on: round(pairs_on.pairs_per_sec),
                pairs_per_sec_direct: round(direct.pairs_per_sec),
                proposals_per_pair_off: pairs_off.proposals_per_pair,
                proposals_per_pair_on: pairs_on.proposals_per_pair,
                proposals_per_pair_direct: direct.proposals_per_pair,
            }
        })
        .collect();
    let last = levels.len() - 1;
    let (off, on) = (&cells[last][0], &cells[last][1]);
    let (pairs_off, pairs_on, direct) = (&pair_cells[last][0], &pair_cells[last][1], &directs[last]);
    summary.insert("group_commit_clients".into(), levels[last].into());
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
    summary.insert("group_commit".into(), serde_json::to_value(cells.concat())?);
    summary.insert("group_commit_curve".into(), serde_json::to_value(&curve)?);
    Ok(curve)
}

/// A line of the group-commit plot: its legend, colour and value.
type Line = (&'static str, plotters::style::RGBColor, fn(&Point) -> Option<f64>);

/// Draws the group-commit curve: Raft proposals per grant (off, on) and
/// acquire+release pairs/s (off, on, the direct transactions) against the
/// number of clients (log scale), etcd pinned to one CPU.
pub fn plot(path: &std::path::Path, curve: &[Point]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    anyhow::ensure!(!curve.is_empty(), "no group-commit levels to plot");
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let proposals: [Line; 2] = [("off", RED, |p| p.proposals_per_grant_off), ("group commit on", BLUE, |p| p.proposals_per_grant_on)];
    panel(&left, "Raft proposals per grant vs clients (etcd on one CPU)", curve, &proposals, 1.3)?;
    let pairs: [Line; 3] = [
        ("off", RED, |p| Some(p.pairs_per_sec_off)),
        ("group commit on", BLUE, |p| Some(p.pairs_per_sec_on)),
        ("direct transactions", GREEN, |p| Some(p.pairs_per_sec_direct)),
    ];
    panel(&right, "acquire+release pairs/s vs clients (etcd on one CPU)", curve, &pairs, 1.2)?;
    root.present()?;
    Ok(())
}

/// One panel: `lines` against clients (log scale), from 0 to `headroom`
/// times the largest value.
fn panel(
    area: &plotters::drawing::DrawingArea<plotters::prelude::SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    curve: &[Point],
    lines: &[Line],
    headroom: f64,
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let xs = |p: &Point| p.clients.max(1) as f64;
    let xmin = curve.iter().map(xs).fold(f64::INFINITY, f64::min) / 1.5;
    let xmax = curve.iter().map(xs).fold(1.0, f64::max) * 1.5;
    let ymax = curve.iter().flat_map(|p| lines.iter().filter_map(move |(_, _, f)| f(p))).fold(1.0, f64::max) * headroom;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax)?;
    chart.configure_mesh().draw()?;
    for &(name, color, pick) in lines {
        let pts: Vec<(f64, f64)> = curve.iter().filter_map(|p| Some((xs(p), pick(p)?))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        chart.draw_series(pts.iter().map(|q| Circle::new(*q, 3, color.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    Ok(())
}

/// The group-commit curve of a saved `--json` summary
/// ([`crate::last_summary`]).
pub fn curve_from_summary(summary: &serde_json::Value) -> anyhow::Result<Vec<Point>> {
    let curve =
        summary.get("group_commit_curve").context("the summary has no \"group_commit_curve\" (was it an --only group-commit run?)")?;
    serde_json::from_value(curve.clone()).context("the \"group_commit_curve\" levels do not have the fields this bench writes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_commit_curve_reads_back_and_plots_both_panels() {
        let point = |clients: usize, on: f64| Point {
            clients,
            proposals_per_grant_off: Some(1.0),
            proposals_per_grant_on: Some(on),
            grants_per_sec_off: 1000.0,
            grants_per_sec_on: 2000.0,
            pairs_per_sec_off: 600.0,
            pairs_per_sec_on: 1800.0,
            pairs_per_sec_direct: 1000.0,
            proposals_per_pair_off: Some(2.0),
            proposals_per_pair_on: Some(2.0 * on),
            proposals_per_pair_direct: Some(2.0),
        };
        let curve = vec![point(1, 1.0), point(16, 0.3), point(64, 0.1)];
        let text = serde_json::to_string(&serde_json::json!({ "group_commit_curve": curve })).unwrap();
        let back = curve_from_summary(&crate::last_summary(&format!("progress line\n{text}\n")).unwrap()).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[2].proposals_per_grant_on, Some(0.1));
        let dir = std::env::temp_dir().join(format!("hf-group-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("group.svg");
        plot(&svg, &back).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        for label in ["Raft proposals per grant", "pairs/s vs clients", "group commit on", "direct transactions"] {
            assert!(drawn.contains(label), "{label} missing from the plot");
        }
        assert!(plot(&svg, &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `--scale`: many sessions through one arbiter. For each level of
//! `--scale-sessions` the bench opens that many sessions (TTL 15 s, so a
//! keepalive every 5 s each), spread over connections of at most
//! `--scale-per-connection` keepalive streams, holds them for
//! `--scale-hold` while a small lock workload runs, then closes them. It
//! reports the arbiter's RSS per session, the arbiter's and etcd's CPU,
//! keepalive latency p50/p99 and false fences: sessions that were lost
//! (deadline passed or the server said gone) although nothing failed.
//! Those must be 0.
//!
//! With `--dev-dir` the sessions go to a second arbiter started for the
//! run ([`DevArbiter`]) on the appliance's etcd, with the appliance's own
//! arbiter config except its ports and the per-identity session limit (the
//! dev config allows one identity 1,000 sessions; the bench has one).

use crate::{BENCH_NAMESPACE, cpu, percentile, rand_u64, round};
use anyhow::Context;
use futures::StreamExt;
use holdfast_client::{Client, Health, KeepaliveObserver, KeepaliveOutcome, Session};
use holdfast_devkit::arbiter::{self, ArbiterProcess, Launch};
use holdfast_model::LockKey;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The sessions' TTL: the arbiter's default, keepalives every 5 s.
const TTL: Duration = Duration::from_secs(15);

/// Session opens and closes in flight at once.
const IN_FLIGHT: usize = 64;

/// Clients of the lock workload that runs while the sessions are held.
const WORKLOAD_CLIENTS: usize = 4;

/// Sees every keepalive of every session of a level.
struct Recorder {
    origin: Instant,
    recording: AtomicBool,
    latencies: Mutex<Vec<Duration>>,
    gone: AtomicU64,
    unknown: AtomicU64,
}

impl KeepaliveObserver for Recorder {
    fn sent(&self, _session: u64) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn answered(&self, _session: u64, mark: u64, outcome: KeepaliveOutcome) {
        match outcome {
            KeepaliveOutcome::Renewed => {
                if self.recording.load(Ordering::Relaxed) {
                    let took = self.origin.elapsed().saturating_sub(Duration::from_micros(mark));
                    self.latencies.lock().unwrap_or_else(|e| e.into_inner()).push(took);
                }
            }
            KeepaliveOutcome::Gone => {
                self.gone.fetch_add(1, Ordering::Relaxed);
            }
            KeepaliveOutcome::Unknown => {
                self.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One level of the curve.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Level {
    pub sessions: usize,
    pub opened: usize,
    pub connections: usize,
    /// The first failure to connect or open, if any (what limited the level).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    pub open_per_sec: f64,
    pub hold_secs: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_kib_per_session: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_cpu_cores: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_cpu_cores: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bench_cpu_cores: Option<f64>,
    pub keepalives_per_sec: f64,
    pub keepalive_p50_ms: f64,
    pub keepalive_p99_ms: f64,
    /// Keepalives without a usable answer (the session may still live).
    pub keepalives_unanswered: u64,
    /// Keepalives the server answered "gone" (the session was lost).
    pub keepalives_gone: u64,
    /// Sessions lost by the end of the hold although nothing failed.
    pub false_fences: u64,
    pub workload_pairs_per_sec: f64,
    pub workload_p99_ms: f64,
    pub workload_errors: u64,
    /// The scale arbiter's own counts over the level (with `--dev-dir`):
    /// renewals it failed (`holdfast_arbiter_renewal_failures_total`),
    /// answers in an unconfirmed term, and keepalive streams it replaced as
    /// stalled — where the unanswered keepalives came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arbiter_renewal_failures: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arbiter_unconfirmed_keepalives: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arbiter_keepalive_streams_stalled: Option<f64>,
}

/// The arbiter's resident set in KiB (`VmRSS` of `/proc/<pid>/status`).
pub(crate) fn rss_kib(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs one level: open `n` sessions, hold them for `hold` under a lock
/// workload, close them.
pub async fn level(conn: &holdfast_cli::conn::ConnArgs, pids: cpu::Pids, n: usize, hold: Duration, per_conn: usize) -> Level {
    let per_conn = per_conn.max(1);
    let rss0 = rss_kib(pids.arbiter);
    let mut limit = None;
    let mut clients = Vec::new();
    for _ in 0..n.div_ceil(per_conn) {
        match conn.connect().await {
            Ok(c) => clients.push(c),
            Err(code) => {
                limit = Some(format!("connection {} to the arbiter failed (exit {code})", clients.len() + 1));
                break;
            }
        }
    }
    let clients = Arc::new(clients);
    let recorder = Arc::new(Recorder {
        origin: Instant::now(),
        recording: AtomicBool::new(false),
        latencies: Mutex::default(),
        gone: AtomicU64::new(0),
        unknown: AtomicU64::new(0),
    });
    let opening = Instant::now();
    let reachable = n.min(clients.len() * per_conn);
    let results: Vec<Result<Session, String>> = futures::stream::iter(0..reachable)
        .map(|i| {
            let (clients, recorder) = (clients.clone(), recorder.clone());
            async move {
                let observer: Arc<dyn KeepaliveObserver> = recorder;
                clients[i / per_conn].open_session_observed(TTL, observer).await.map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let open_secs = opening.elapsed().as_secs_f64();
    let mut sessions = Vec::new();
    for r in results {
        match r {
            Ok(s) => sessions.push(s),
            Err(e) => {
                limit.get_or_insert(format!("opening a session failed: {e}"));
            }
        }
    }
    // One keepalive round for every session before the window opens.
    tokio::time::sleep(TTL / 3 + Duration::from_secs(1)).await;
    let rss1 = rss_kib(pids.arbiter);

    let workload_client = conn.connect().await.ok();
    let c0 = pids.sample();
    let started = Instant::now();
    recorder.recording.store(true, Ordering::Relaxed);
    let workload = match workload_client {
        Some(c) => run_workload(&c, hold).await,
        None => {
            tokio::time::sleep(hold).await;
            (0, 0.0, WORKLOAD_CLIENTS as u64)
        }
    };
    recorder.recording.store(false, Ordering::Relaxed);
    let c1 = pids.sample();
    let window = started.elapsed().as_secs_f64();

    let lost = sessions.iter().filter(|s| *s.health().borrow() == Health::Lost).count() as u64;
    let closed: Vec<()> = futures::stream::iter(sessions)
        .map(|s| async move {
            let _ = s.close().await;
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let opened = closed.len();

    let mut lat = std::mem::take(&mut *recorder.latencies.lock().unwrap_or_else(|e| e.into_inner()));
    lat.sort();
    let cores = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if window > 0.0 => Some(round((b - a) / window)),
        _ => None,
    };
    Level {
        sessions: n,
        opened,
        connections: clients.len(),
        limit,
        open_per_sec: round(opened as f64 / open_secs.max(1e-9)),
        hold_secs: round(window),
        arbiter_rss_kib_per_session: match (rss0, rss1) {
            (Some(a), Some(b)) if opened > 0 => Some(round((b - a) / opened as f64)),
            _ => None,
        },
        arbiter_rss_mib: rss1.map(|r| round(r / 1024.0)),
        arbiter_cpu_cores: cores(c0.arbiter, c1.arbiter),
        etcd_cpu_cores: cores(c0.etcd, c1.etcd),
        bench_cpu_cores: cores(c0.bench, c1.bench),
        keepalives_per_sec: round(lat.len() as f64 / window.max(1e-9)),
        keepalive_p50_ms: round(percentile(&lat, 0.5)),
        keepalive_p99_ms: round(percentile(&lat, 0.99)),
        keepalives_unanswered: recorder.unknown.load(Ordering::Relaxed),
        keepalives_gone: recorder.gone.load(Ordering::Relaxed),
        false_fences: lost,
        workload_pairs_per_sec: round(workload.0 as f64 / window.max(1e-9)),
        workload_p99_ms: round(workload.1),
        workload_errors: workload.2,
        arbiter_renewal_failures: None,
        arbiter_unconfirmed_keepalives: None,
        arbiter_keepalive_streams_stalled: None,
    }
}

/// A few clients taking and releasing locks (bench class) for `hold`:
/// (pairs, p99 ms, errors).
async fn run_workload(client: &Client, hold: Duration) -> (usize, f64, u64) {
    let run = rand_u64();
    let end = Instant::now() + hold;
    let tasks: Vec<_> = (0..WORKLOAD_CLIENTS)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let (Ok(key), Ok(session)) =
                    (LockKey::new(BENCH_NAMESPACE, &format!("scale-{run:x}-{i}")), client.open_session_for(BENCH_NAMESPACE, None).await)
                else {
                    tokio::time::sleep_until(end.into()).await;
                    return (lat, 1);
                };
                while Instant::now() < end {
                    let t = Instant::now();
                    let released = match session.acquire(&key, Duration::ZERO).await {
                        Ok(h) => h.release().await.is_ok(),
                        Err(_) => false,
                    };
                    if released {
                        lat.push(t.elapsed());
                    } else {
                        errors += 1;
                    }
                }
                let _ = session.close().await;
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        match t.await {
            Ok((lat, e)) => {
                all.extend(lat);
                errors += e;
            }
            Err(_) => errors += 1,
        }
    }
    all.sort();
    (all.len(), percentile(&all, 0.99), errors)
}

/// A second arbiter for the scale part, on a dev appliance's etcd; stopped
/// when dropped.
pub struct DevArbiter {
    process: ArbiterProcess,
    /// Its `host:port`.
    pub endpoint: String,
    /// Its Prometheus metrics (plain HTTP on loopback).
    pub metrics_url: String,
}

impl DevArbiter {
    /// Starts `holdfast-arbiter` (next to this program, or
    /// `$HOLDFAST_ARBITER_BIN`) with `DIR/arbiter.toml` on free ports, one
    /// identity allowed twice `sessions` sessions and more (a level starts
    /// while the previous level's closed sessions may still be counted, and
    /// a close that failed leaves its session until its TTL); files
    /// `DIR/arbiter-scale.*`.
    pub fn start(dir: &std::path::Path, sessions: usize) -> anyhow::Result<Self> {
        let most = 2 * sessions as u64 + WORKLOAD_CLIENTS as u64;
        Self::start_tuned(dir, "arbiter-scale", &|c| {
            c.limits.max_sessions_per_identity = c.limits.max_sessions_per_identity.max(most);
        })
    }

    /// Starts `holdfast-arbiter` with `DIR/arbiter.toml` on free ports,
    /// changed by `tune`; files `DIR/NAME.*`.
    pub fn start_tuned(dir: &std::path::Path, name: &str, tune: &dyn Fn(&mut holdfast_config::ArbiterConfig)) -> anyhow::Result<Self> {
        let path = dir.join("arbiter.toml");
        let mut config = holdfast_config::ArbiterConfig::load(&path).with_context(|| format!("reading {}", path.display()))?;
        let port = holdfast_devkit::ports::free_port();
        config.listen = ([127, 0, 0, 1], port).into();
        let metrics_port = holdfast_devkit::ports::free_port();
        config.metrics_listen = ([127, 0, 0, 1], metrics_port).into();
        config.state_dir = dir.join(format!("{name}-state"));
        tune(&mut config);
        let mut launch = Launch::new(arbiter::locate()?, config, dir, name);
        launch.written_by = "Written by `holdfast-bench`".into();
        let process = ArbiterProcess::start(&launch, Duration::from_secs(60))
            .with_context(|| format!("starting a second arbiter; see {}", dir.join(format!("{name}.log")).display()))?;
        Ok(DevArbiter { process, endpoint: format!("127.0.0.1:{port}"), metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics") })
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

impl Drop for DevArbiter {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(15));
    }
}

/// Draws the scale curve as SVG: keepalive latency p50 and p99 (ms, log
/// scale) against sessions (log scale), and the arbiter's RSS per session;
/// a level that did not hold (sessions lost or not all opened) is marked
/// with a cross.
pub fn plot(path: &std::path::Path, levels: &[Level]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    anyhow::ensure!(!levels.is_empty(), "no scale levels to plot");
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let xs = |l: &Level| l.sessions.max(1) as f64;
    let xmin = levels.iter().map(xs).fold(f64::INFINITY, f64::min) / 2.0;
    let xmax = levels.iter().map(xs).fold(1.0, f64::max) * 2.0;
    let held = |l: &Level| l.opened == l.sessions && l.false_fences == 0;

    let ymax = levels.iter().map(|l| l.keepalive_p99_ms).fold(1.0, f64::max) * 2.0;
    let ymin = levels.iter().map(|l| l.keepalive_p50_ms).filter(|v| *v > 0.0).fold(ymax, f64::min) / 2.0;
    let mut chart = ChartBuilder::on(&left)
        .caption("keepalive latency (ms) vs sessions", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d((xmin..xmax).log_scale(), (ymin.max(0.01)..ymax).log_scale())?;
    chart.configure_mesh().draw()?;
    for (name, color, pick) in
        [("p50", BLUE, (|l: &Level| l.keepalive_p50_ms) as fn(&Level) -> f64), ("p99", RED, |l: &Level| l.keepalive_p99_ms)]
    {
        let pts: Vec<(f64, f64)> = levels.iter().map(|l| (xs(l), pick(l).max(ymin.max(0.01)))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        chart.draw_series(levels.iter().zip(&pts).filter(|(l, _)| !held(l)).map(|(_, p)| Cross::new(*p, 6, BLACK)))?;
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;

    let ymax = levels.iter().filter_map(|l| l.arbiter_rss_kib_per_session).fold(1.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(&right)
        .caption("arbiter RSS per session (KiB) vs sessions", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax)?;
    chart.configure_mesh().draw()?;
    let pts: Vec<(f64, f64)> = levels.iter().filter_map(|l| Some((xs(l), l.arbiter_rss_kib_per_session?))).collect();
    chart
        .draw_series(LineSeries::new(pts.clone(), GREEN))?
        .label("KiB per session")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], GREEN));
    chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, GREEN.filled())))?;
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// The scale levels of a saved `--json` summary ([`crate::last_summary`]).
pub fn levels_from_summary(summary: &serde_json::Value) -> anyhow::Result<Vec<Level>> {
    let scale = summary.get("scale").context("the summary has no \"scale\" levels (was it a --scale run?)")?;
    serde_json::from_value(scale.clone()).context("the \"scale\" levels do not have the fields this bench writes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(sessions: usize, p50: f64, p99: f64, kib: f64, false_fences: u64) -> Level {
        Level {
            sessions,
            opened: sessions,
            connections: sessions / 150 + 1,
            limit: None,
            open_per_sec: 500.0,
            hold_secs: 60.0,
            arbiter_rss_kib_per_session: Some(kib),
            arbiter_rss_mib: Some(kib * sessions as f64 / 1024.0),
            arbiter_cpu_cores: Some(0.2),
            etcd_cpu_cores: Some(0.6),
            bench_cpu_cores: Some(0.1),
            keepalives_per_sec: sessions as f64 / 5.0,
            keepalive_p50_ms: p50,
            keepalive_p99_ms: p99,
            keepalives_unanswered: 0,
            keepalives_gone: 0,
            false_fences,
            workload_pairs_per_sec: 300.0,
            workload_p99_ms: 50.0,
            workload_errors: 0,
            arbiter_renewal_failures: None,
            arbiter_unconfirmed_keepalives: None,
            arbiter_keepalive_streams_stalled: None,
        }
    }

    #[test]
    fn a_scale_summary_reads_back_and_plots() {
        let levels = vec![level(1000, 13.0, 77.0, 47.0, 0), level(10000, 187.0, 1650.0, 42.0, 0), level(40000, 46.0, 313.0, 25.0, 34968)];
        let summary = serde_json::json!({ "scale": levels, "scale_largest_held": 10000 });
        let text = format!("progress line\n{summary}\n");
        let back = levels_from_summary(&crate::last_summary(&text).unwrap()).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[2].false_fences, 34968);
        assert_eq!(back[1].keepalive_p99_ms, 1650.0);

        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("scale.svg");
        plot(&svg, &back).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.starts_with("<svg"), "{}", &drawn[..drawn.len().min(200)]);
        for label in ["keepalive latency (ms) vs sessions", "arbiter RSS per session (KiB) vs sessions", "p99", "KiB per session"] {
            assert!(drawn.contains(label), "{label} missing from the plot");
        }
        assert!(levels_from_summary(&serde_json::json!({ "uncontended": [] })).unwrap_err().to_string().contains("no \"scale\""));
        assert!(plot(&svg, &[]).is_err());
    }
}

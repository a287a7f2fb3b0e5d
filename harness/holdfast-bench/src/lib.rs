//! `holdfast-bench`: lock-specific figures, measured side by side against
//! what a user would otherwise pick, on the same etcd in the same run.
//!
//! - **uncontended**: acquire+release pairs/s and p50/p99 per concurrency, on
//!   distinct keys: (a) through the arbiter; (b) the same grant and release
//!   transactions sent straight to etcd from this process (the arbiter's own
//!   transaction builders); (c) etcd's built-in Lock/Unlock RPC, each client
//!   with its own lease (a second Lock by the same lease is a no-op).
//! - **contended**: N waiters on one key: handoffs/s, release→next-grant
//!   latency, and etcd transactions per handoff; arbiter vs Lock RPC.
//! - **renewal**: S sessions × H holds; keepalive messages/s and Raft
//!   proposals/s read from etcd's /metrics, for H = 1 and H = 500.
//!
//! Figures are reported as ratios to the baselines measured in the same run;
//! absolute numbers depend on the machine.

use holdfast_cli::conn::ConnArgs;
use holdfast_cli::exit;
use holdfast_client::{Client, Session};
use holdfast_model::LockKey;
use holdfast_model::layout::{self, HoldRecord, SessionRecord};
use holdfast_store::etcd::Etcd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(after_long_help = "\
Example, against a dev appliance (the direct etcd paths need etcd's root,
whose certificate env-etcd-root exports):
  holdfastctl dev --detach --dir /tmp/hf && source /tmp/hf/env && source /tmp/hf/env-etcd-root
  holdfast-bench --plot /tmp/bench.svg
  holdfast-bench --only renewal --json | tail -n1")]
pub struct BenchArgs {
    /// The arbiter's etcd cluster and credentials to reach it directly.
    #[command(flatten)]
    etcd: holdfast_cli::conn::EtcdArgs,
    /// etcd's plain-HTTP metrics URL (`--listen-metrics-urls`); default:
    /// `/metrics` on the first endpoint, which works only for `http://`.
    #[arg(long, env = "HOLDFAST_ETCD_METRICS")]
    etcd_metrics: Option<String>,
    /// How long each uncontended and contended cell runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    duration: Duration,
    /// Concurrency levels for the uncontended runs.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    clients: Vec<usize>,
    /// Waiters on the one key in the contended runs.
    #[arg(long, default_value_t = 16)]
    waiters: usize,
    /// Sessions in the renewal runs.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// Measurement window of each renewal run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "12s")]
    renewal_window: Duration,
    /// Run only these parts.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Write an SVG plot of throughput and p99 against concurrency.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print the summary as one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Uncontended,
    Contended,
    Renewal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Arbiter,
    EtcdTxn,
    LockRpc,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Arbiter => "arbiter",
            Variant::EtcdTxn => "etcd txn (direct)",
            Variant::LockRpc => "etcd Lock RPC",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct Cell {
    variant: &'static str,
    clients: usize,
    pairs_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn summarize(variant: Variant, clients: usize, mut lat: Vec<Duration>, errors: u64, elapsed: Duration) -> Cell {
    lat.sort();
    Cell {
        variant: variant.name(),
        clients,
        pairs_per_sec: lat.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        errors,
    }
}

pub async fn run(conn: &ConnArgs, args: BenchArgs) -> u8 {
    match bench(conn, args).await {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("holdfast-bench: {e:#}");
            exit::UNAVAILABLE
        }
    }
}

struct Ctx {
    client: Client,
    etcd: Etcd,
    epoch_bytes: Vec<u8>,
    epoch: u32,
    etcd_version: String,
    metrics_url: String,
}

async fn bench(conn: &ConnArgs, args: BenchArgs) -> anyhow::Result<()> {
    let client = conn.connect().await.map_err(|code| anyhow::anyhow!("cannot connect to the arbiter (exit {code})"))?;
    let cfg = holdfast_config::EtcdConfig { request_timeout: Duration::from_secs(10), ..args.etcd.config() };
    let etcd = Etcd::connect(&cfg).await?;
    let sys = holdfast_store::epoch::read_sys(&etcd).await?;
    let (record, epoch_bytes) = sys.epoch.ok_or_else(|| anyhow::anyhow!("the epoch is not initialised"))?;
    let etcd_version = etcd.member_status().await.into_iter().find_map(Result::ok).map(|m| m.version).unwrap_or_default();
    let ctx = Arc::new(Ctx {
        client,
        etcd,
        epoch_bytes,
        epoch: record.epoch,
        etcd_version,
        metrics_url: args.etcd_metrics.clone().unwrap_or_else(|| format!("{}/metrics", cfg.endpoints[0].trim_end_matches('/'))),
    });
    let want = |p: Part| args.only.is_empty() || args.only.contains(&p);
    // Progress and the table go to stderr, so `--json | tail -n1` is clean.
    let say = |m: String| eprintln!("{m}");
    say(format!("holdfast bench against etcd {} ({}), {:?} per cell", ctx.etcd_version, cfg.endpoints.join(","), args.duration));

    let mut summary = serde_json::Map::new();
    summary.insert("etcd_version".into(), ctx.etcd_version.clone().into());
    let mut cells = Vec::new();
    if want(Part::Uncontended) {
        for &c in &args.clients {
            for v in [Variant::Arbiter, Variant::EtcdTxn, Variant::LockRpc] {
                let cell = uncontended(&ctx, v, c, args.duration).await?;
                say(format!(
                    "  uncontended {:>3} clients  {:<18} {:>9.0} pairs/s  p50 {:>7.2} ms  p99 {:>7.2} ms{}",
                    c,
                    cell.variant,
                    cell.pairs_per_sec,
                    cell.p50_ms,
                    cell.p99_ms,
                    if cell.errors > 0 { format!("  ({} errors)", cell.errors) } else { String::new() }
                ));
                cells.push(cell);
            }
        }
        let find = |v: Variant, c: usize| cells.iter().find(|x| x.variant == v.name() && x.clients == c).cloned();
        let ratio_at = |c: usize, base: Variant| match (find(Variant::Arbiter, c), find(base, c)) {
            (Some(a), Some(b)) if b.pairs_per_sec > 0.0 => Some(a.pairs_per_sec / b.pairs_per_sec),
            _ => None,
        };
        let top = args.clients.iter().copied().filter(|c| *c <= 64).max().unwrap_or(1);
        if let Some(r) = ratio_at(64, Variant::EtcdTxn).or_else(|| ratio_at(top, Variant::EtcdTxn)) {
            summary.insert("arbiter_vs_etcd_txn_64".into(), round(r).into());
        }
        if let Some(r) = ratio_at(64, Variant::LockRpc).or_else(|| ratio_at(top, Variant::LockRpc)) {
            summary.insert("arbiter_vs_lock_rpc_64".into(), round(r).into());
        }
        if let (Some(a), Some(b)) = (find(Variant::Arbiter, 1), find(Variant::EtcdTxn, 1)) {
            summary.insert("hop_p50_added_ms".into(), round(a.p50_ms - b.p50_ms).into());
        }
        summary.insert("uncontended".into(), serde_json::to_value(&cells)?);
        if let Some(path) = &args.plot {
            plot(path, &cells, &args.clients)?;
            say(format!("  plot written to {}", path.display()));
        }
    }
    if want(Part::Contended) {
        let a = contended_arbiter(&ctx, args.waiters, args.duration).await?;
        let l = contended_lock_rpc(&ctx, args.waiters, args.duration).await?;
        say(format!(
            "  contended {} waiters  arbiter {:>7.0} handoffs/s (p50 {:.2} ms release->grant, {:.2} txns/handoff)  Lock RPC {:>7.0} handoffs/s (p50 {:.2} ms)",
            args.waiters, a.0, a.1, a.2, l.0, l.1
        ));
        if l.0 > 0.0 {
            summary.insert("contended_vs_lock_rpc".into(), round(a.0 / l.0).into());
        }
        summary.insert("txns_per_handoff".into(), round(a.2).into());
        summary.insert("contended_arbiter_handoffs_per_sec".into(), round(a.0).into());
        summary.insert("contended_lock_rpc_handoffs_per_sec".into(), round(l.0).into());
        summary.insert("handoff_p50_ms_arbiter".into(), round(a.1).into());
        summary.insert("handoff_p50_ms_lock_rpc".into(), round(l.1).into());
    }
    if want(Part::Renewal) {
        let one = renewal(&ctx, args.sessions, 1, args.renewal_window).await?;
        let many = renewal(&ctx, args.sessions, 500, args.renewal_window).await?;
        say(format!(
            "  renewal {} sessions: H=1 {:.2} keepalives/s {:.2} proposals/s; H=500 {:.2} keepalives/s {:.2} proposals/s",
            args.sessions, one.0, one.1, many.0, many.1
        ));
        if one.0 > 0.0 {
            summary.insert("keepalive_ratio_500_vs_1".into(), round(many.0 / one.0).into());
        }
        if one.1 > 0.0 {
            summary.insert("proposal_ratio_500_vs_1".into(), round(many.1 / one.1).into());
        }
        summary.insert("keepalives_per_sec_h1".into(), round(one.0).into());
        summary.insert("keepalives_per_sec_h500".into(), round(many.0).into());
        summary.insert("proposals_per_sec_h1".into(), round(one.1).into());
        summary.insert("proposals_per_sec_h500".into(), round(many.1).into());
    }
    if args.json {
        println!("{}", serde_json::Value::Object(summary));
    } else {
        println!("{}", serde_json::to_string_pretty(&serde_json::Value::Object(summary))?);
    }
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The namespace of every key the bench locks: its class (`bench` in the
/// dev set, `config/classes.d/dev.toml`, 60 s) gives every session's TTL.
pub const BENCH_NAMESPACE: &str = "bench";

/// A session plus its etcd lease, for the direct variants.
async fn raw_session(etcd: &Etcd, identity: &str) -> anyhow::Result<(i64, Vec<u8>)> {
    let mut c = etcd.client.clone();
    let lease = c.lease_grant(60, None).await?.id();
    let record = layout::encode(&SessionRecord { spiffe_id: identity.into(), ttl_secs: 60 });
    c.put(layout::session_key(lease), record.clone(), Some(etcd_client::PutOptions::new().with_lease(lease))).await?;
    Ok((lease, record))
}

async fn uncontended(ctx: &Arc<Ctx>, variant: Variant, clients: usize, duration: Duration) -> anyhow::Result<Cell> {
    let run = format!("{:x}", Instant::now().elapsed().as_nanos() ^ std::process::id() as u128 ^ rand_u64() as u128);
    let mut tasks = Vec::new();
    let start_gate = Arc::new(tokio::sync::Barrier::new(clients + 1));
    for i in 0..clients {
        let ctx = ctx.clone();
        let gate = start_gate.clone();
        let key = LockKey::new(BENCH_NAMESPACE, &format!("u-{run}-{i}"))?;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            match variant {
                Variant::Arbiter => {
                    let session = ctx.client.open_session_for(BENCH_NAMESPACE, None).await?;
                    gate.wait().await;
                    let end = Instant::now() + duration;
                    while Instant::now() < end {
                        let t = Instant::now();
                        match session.acquire(&key, Duration::ZERO).await {
                            Ok(h) => match h.release().await {
                                Ok(_) => lat.push(t.elapsed()),
                                Err(_) => errors += 1,
                            },
                            Err(_) => errors += 1,
                        }
                    }
                    let _ = session.close().await;
                }
                Variant::EtcdTxn => {
                    let identity = "spiffe://holdfast.bench/direct";
                    let (lease, session_bytes) = raw_session(&ctx.etcd, identity).await?;
                    let hold_key = layout::hold_key(&key);
                    let hold =
                        layout::encode(&HoldRecord { spiffe_id: identity.into(), session: lease, epoch: ctx.epoch, granted_unix_ms: 0 });
                    let mut c = ctx.etcd.client.clone();
                    gate.wait().await;
                    let end = Instant::now() + duration;
                    while Instant::now() < end {
                        let t = Instant::now();
                        let txn = holdfast_store::txn::grant_txn(&hold_key, &ctx.epoch_bytes, lease, &session_bytes, &hold, None);
                        match c.txn(txn).await {
                            Ok(r) if r.succeeded() => {
                                let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                                match c.txn(holdfast_store::txn::release_txn_for(&hold_key, lease, rev)).await {
                                    Ok(r) if r.succeeded() => lat.push(t.elapsed()),
                                    _ => errors += 1,
                                }
                            }
                            _ => errors += 1,
                        }
                    }
                    let _ = c.lease_revoke(lease).await;
                }
                Variant::LockRpc => {
                    let mut c = ctx.etcd.client.clone();
                    let lease = c.lease_grant(60, None).await?.id();
                    let name = format!("/bench-v3lock/{}", key.key());
                    gate.wait().await;
                    let end = Instant::now() + duration;
                    while Instant::now() < end {
                        let t = Instant::now();
                        match c.lock(name.as_str(), Some(etcd_client::LockOptions::new().with_lease(lease))).await {
                            Ok(r) => match c.unlock(r.key().to_vec()).await {
                                Ok(_) => lat.push(t.elapsed()),
                                Err(_) => errors += 1,
                            },
                            Err(_) => errors += 1,
                        }
                    }
                    let _ = c.lease_revoke(lease).await;
                }
            }
            Ok::<_, anyhow::Error>((lat, errors))
        }));
    }
    start_gate.wait().await;
    let started = Instant::now();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await??;
        all.extend(lat);
        errors += e;
    }
    let elapsed = started.elapsed().max(duration);
    Ok(summarize(variant, clients, all, errors, elapsed))
}

fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    t.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15
}

/// (handoffs/s, p50 release→next grant in ms, etcd txns per handoff)
async fn contended_arbiter(ctx: &Arc<Ctx>, waiters: usize, duration: Duration) -> anyhow::Result<(f64, f64, f64)> {
    let key = LockKey::new(BENCH_NAMESPACE, &format!("hot-{:x}", rand_u64()))?;
    let events: Arc<Mutex<Vec<(Instant, bool)>>> = Arc::default();
    let attempts_before = ctx.client.server_status().await?.grant_attempts;
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let (ctx, key, events) = (ctx.clone(), key.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            let session: Session = ctx.client.open_session_for(BENCH_NAMESPACE, None).await?;
            let mut releases = 0u64;
            while Instant::now() < end {
                let left = end.saturating_duration_since(Instant::now());
                let Ok(h) = session.acquire(&key, left).await else { break };
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), true));
                let released = h.release().await;
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), false));
                if released.is_ok() {
                    releases += 1;
                }
            }
            let _ = session.close().await;
            Ok::<u64, anyhow::Error>(releases)
        }));
    }
    let mut releases = 0;
    for t in tasks {
        releases += t.await??;
    }
    let attempts = ctx.client.server_status().await?.grant_attempts - attempts_before;
    let (handoffs, p50) = handoff_stats(&events.lock().unwrap_or_else(|e| e.into_inner()));
    let txns = (attempts + releases) as f64 / releases.max(1) as f64;
    Ok((handoffs as f64 / duration.as_secs_f64(), p50, txns))
}

async fn contended_lock_rpc(ctx: &Arc<Ctx>, waiters: usize, duration: Duration) -> anyhow::Result<(f64, f64)> {
    let name = format!("/bench-v3lock/hot-{:x}", rand_u64());
    let events: Arc<Mutex<Vec<(Instant, bool)>>> = Arc::default();
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let (ctx, name, events) = (ctx.clone(), name.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = ctx.etcd.client.clone();
            let lease = c.lease_grant(60, None).await?.id();
            while Instant::now() < end {
                let left = end.saturating_duration_since(Instant::now());
                let lock = c.lock(name.as_str(), Some(etcd_client::LockOptions::new().with_lease(lease)));
                let Ok(Ok(r)) = tokio::time::timeout(left, lock).await else { break };
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), true));
                let _ = c.unlock(r.key().to_vec()).await;
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), false));
            }
            let _ = c.lease_revoke(lease).await;
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let (handoffs, p50) = handoff_stats(&events.lock().unwrap_or_else(|e| e.into_inner()));
    Ok((handoffs as f64 / duration.as_secs_f64(), p50))
}

/// Grants after a release, and the p50 gap from a release to the next grant.
fn handoff_stats(events: &[(Instant, bool)]) -> (usize, f64) {
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.0);
    let mut gaps = Vec::new();
    let mut last_release: Option<Instant> = None;
    for (t, grant) in sorted {
        if grant {
            if let Some(r) = last_release.take() {
                gaps.push(t.saturating_duration_since(r));
            }
        } else {
            last_release = Some(t);
        }
    }
    gaps.sort();
    (gaps.len(), percentile(&gaps, 0.5))
}

/// Sums a counter from etcd's Prometheus text, over every label set whose
/// labels contain `filter`.
async fn scrape(url: &str, metric: &str, filter: &str) -> anyhow::Result<f64> {
    let body = http_get(url).await?;
    Ok(body
        .lines()
        .filter(|l| {
            l.starts_with(metric) && (l[metric.len()..].starts_with('{') || l[metric.len()..].starts_with(' ')) && l.contains(filter)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// A plain HTTP/1.0 GET of etcd's /metrics (loopback, no TLS).
async fn http_get(url: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        anyhow::anyhow!("{url}: only http:// can be scraped; point --etcd-metrics (HOLDFAST_ETCD_METRICS) at etcd's --listen-metrics-urls")
    })?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let mut s = tokio::net::TcpStream::connect(host).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or(text))
}

/// (keepalive messages/s received by etcd, Raft proposals committed/s)
async fn renewal(ctx: &Arc<Ctx>, sessions: usize, holds: usize, window: Duration) -> anyhow::Result<(f64, f64)> {
    let mut open = Vec::new();
    let run = rand_u64();
    for s in 0..sessions {
        let session = ctx.client.open_session_for(BENCH_NAMESPACE, None).await?;
        let mut held = Vec::new();
        for h in 0..holds {
            held.push(session.acquire(&LockKey::new(BENCH_NAMESPACE, &format!("r-{run:x}-{s}-{h}"))?, Duration::ZERO).await?);
        }
        open.push((session, held));
    }
    // Let the holds' own writes settle before the window opens.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ka = "grpc_server_msg_received_total";
    let k0 = scrape(&ctx.metrics_url, ka, "LeaseKeepAlive").await?;
    let p0 = scrape(&ctx.metrics_url, "etcd_server_proposals_committed_total", "").await?;
    tokio::time::sleep(window).await;
    let k1 = scrape(&ctx.metrics_url, ka, "LeaseKeepAlive").await?;
    let p1 = scrape(&ctx.metrics_url, "etcd_server_proposals_committed_total", "").await?;
    for (session, held) in open {
        for h in held {
            let _ = h.release().await;
        }
        let _ = session.close().await;
    }
    let secs = window.as_secs_f64();
    Ok(((k1 - k0) / secs, (p1 - p0) / secs))
}

fn plot(path: &std::path::Path, cells: &[Cell], clients: &[usize]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let xs: Vec<f64> = clients.iter().map(|c| (*c as f64).log2()).collect();
    let xmax = xs.iter().cloned().fold(1.0, f64::max);
    let colors = [RED, BLUE, GREEN];
    let variants = [Variant::Arbiter, Variant::EtcdTxn, Variant::LockRpc];
    for (area, title, pick) in [
        (&left, "pairs/s vs log2(clients)", (|c: &Cell| c.pairs_per_sec) as fn(&Cell) -> f64),
        (&right, "p99 ms vs log2(clients)", |c: &Cell| c.p99_ms),
    ] {
        let ymax = cells.iter().map(pick).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
        chart.configure_mesh().draw()?;
        for (v, color) in variants.iter().zip(colors) {
            let pts: Vec<(f64, f64)> = clients
                .iter()
                .filter_map(|c| cells.iter().find(|x| x.variant == v.name() && x.clients == *c).map(|x| ((*c as f64).log2(), pick(x))))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, color))?
                .label(v.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        }
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

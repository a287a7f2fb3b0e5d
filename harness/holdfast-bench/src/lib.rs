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
//! Every uncontended cell also reports the CPU time the arbiter, etcd and
//! the benchmark's clients spend per acquire+release pair (`/proc/<pid>/stat`
//! over the measured window, [`cpu`]) and the Raft proposals per pair (etcd's
//! metrics): per-operation costs that hold on a shared machine, where
//! throughput does not. The direct paths run as an authenticated, non-root
//! etcd user over the same TLS endpoint as the arbiter ([`baseline`]).
//!
//! Figures are reported as ratios to the baselines measured in the same run
//! and as costs per operation; absolute throughput depends on the machine.

pub mod baseline;
pub mod cpu;
pub mod group;
pub mod hop;
pub mod many;
pub mod scale;

use anyhow::Context;
use holdfast_cli::conn::ConnArgs;
use holdfast_cli::exit;
use holdfast_client::{Client, ErrorReason, Session};
use holdfast_model::LockKey;
use holdfast_model::layout::{self, HoldRecord, SessionRecord};
use holdfast_store::etcd::Etcd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(after_long_help = "\
Example, against a dev appliance:
  holdfastctl dev --detach --dir /tmp/hf && source /tmp/hf/env
  holdfast-bench --dev-dir /tmp/hf --plot /tmp/bench.svg
  holdfast-bench --dev-dir /tmp/hf --only renewal --json | tail -n1
  holdfast-bench --dev-dir /tmp/hf --only holds,queue --holds 100000 --queue 1000
  holdfast-bench --dev-dir /tmp/hf --only hop --duration 20s

With --dev-dir the direct etcd paths run as the etcd user holdfast-bench
(made with the appliance's root certificate; its role reads /sys/epoch,
/sys/seal and /sys/watermark and writes /l/, /s/ and /bench-v3lock/ only),
over the same TLS endpoint the arbiter uses. Without it they run as the
--etcd-* user, and the run says whether etcd checks that user's
permissions (it does not for root, nor with auth off).

CPU per pair: the arbiter and etcd are the processes given by --arbiter-pid
and --etcd-pid, else the processes listening on the arbiter's and etcd's
endpoint ports (found through /proc/net/tcp and /proc/<pid>/fd, so they
must run on this machine as this user). Where a pid is unknown its CPU
figures are left out, never estimated.")]
pub struct BenchArgs {
    /// The arbiter's etcd cluster and credentials to reach it directly.
    #[command(flatten)]
    etcd: holdfast_cli::conn::EtcdArgs,
    /// A `holdfastctl dev --dir` directory: run the direct etcd paths as the
    /// etcd user holdfast-bench, made (and its certificate issued) with the
    /// appliance's etcd CA and root certificate.
    #[arg(long, env = "HOLDFAST_DEV_DIR")]
    dev_dir: Option<PathBuf>,
    /// The arbiter's pid, for its CPU time per pair; default: the process
    /// listening on the arbiter endpoint's port.
    #[arg(long, env = "HOLDFAST_ARBITER_PID")]
    arbiter_pid: Option<u32>,
    /// etcd's pid, for its CPU time per pair; default: the process
    /// listening on the first etcd endpoint's port.
    #[arg(long, env = "HOLDFAST_ETCD_PID")]
    etcd_pid: Option<u32>,
    /// etcd's plain-HTTP metrics URL (`--listen-metrics-urls`); default:
    /// `/metrics` on the first endpoint, which works only for `http://`.
    #[arg(long, env = "HOLDFAST_ETCD_METRICS")]
    etcd_metrics: Option<String>,
    /// The arbiter's plain-HTTP metrics URL (`metrics_listen`), for the hop
    /// part's split; default with --dev-dir: from its arbiter.toml.
    #[arg(long, env = "HOLDFAST_ARBITER_METRICS")]
    arbiter_metrics: Option<String>,
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
    /// Run the scale part only: for each --scale-sessions level, open that
    /// many sessions (TTL 15 s) through the one arbiter, hold them for
    /// --scale-hold under a small lock workload, and report the arbiter's
    /// RSS per session, CPU, keepalive latency and false fences.
    #[arg(long)]
    scale: bool,
    /// Session counts of the scale curve.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,40000")]
    scale_sessions: Vec<usize>,
    /// How long each scale level holds its sessions.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3m")]
    scale_hold: Duration,
    /// Sessions (keepalive streams) per connection to the arbiter in the
    /// scale part: below HTTP/2's usual 200 concurrent streams.
    #[arg(long, default_value_t = 150)]
    scale_per_connection: usize,
    /// Run only these parts. `group-commit` runs only when named: it pins
    /// etcd to one CPU (--pin-etcd-cpu) and starts two arbiters from
    /// --dev-dir's arbiter.toml, without and with `[grants] group_commit`,
    /// and reports proposals per grant and pairs/s through each, beside the
    /// direct transactions under the same pinning (at the most --clients,
    /// up to 64). `holds` and `queue` also run only when named; each starts
    /// a second arbiter from --dev-dir's arbiter.toml with its hold quotas
    /// and request rate raised: `holds` takes --holds holds over
    /// --holds-sessions sessions (memory per hold), `queue` puts --queue
    /// waiters on one key (handoffs/s, memory per waiter). `hop` also runs
    /// only when named: one client, the pair's added time split into
    /// transport, etcd as the arbiter sees it and the arbiter's own work.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// The CPU etcd is pinned to in the group-commit part (`taskset`; its
    /// affinity is restored afterwards).
    #[arg(long, default_value_t = 0)]
    pin_etcd_cpu: usize,
    /// Holds taken (on distinct keys) in the holds part.
    #[arg(long, default_value_t = 100_000)]
    holds: usize,
    /// Sessions the holds part spreads its holds over.
    #[arg(long, default_value_t = 1_000)]
    holds_sessions: usize,
    /// Waiters on one key in the queue part, each with its own session.
    #[arg(long, default_value_t = 1_000)]
    queue: usize,
    /// Write an SVG plot: throughput, p99, CPU per pair and Raft proposals
    /// per pair against concurrency; with --scale the keepalive latency and
    /// RSS per session against sessions; with `--only group-commit` the
    /// proposals per grant and pairs/s, off and on, against clients.
    /// `holdfast-bench --replot SAVED --plot OUT.svg` draws the scale or
    /// group-commit plot from a saved `--json` output without measuring.
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
    /// Only when named: etcd pinned to one CPU, two more arbiters (see
    /// `--pin-etcd-cpu`).
    GroupCommit,
    /// Only when named: --holds holds over --holds-sessions sessions
    /// through a second arbiter (memory per hold).
    Holds,
    /// Only when named: --queue waiters on one key through a second
    /// arbiter (handoff rate and memory per waiter).
    Queue,
    /// Only when named: one client for --duration; the added time of an
    /// acquire+release pair through the arbiter, split into transport, etcd
    /// as the arbiter sees it, and the arbiter's own work.
    Hop,
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
    /// CPU microseconds per acquire+release pair over the measured window,
    /// each left out where the process is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    arbiter_cpu_us_per_pair: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    etcd_cpu_us_per_pair: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bench_cpu_us_per_pair: Option<f64>,
    /// Raft proposals committed per pair (etcd's metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    proposals_per_pair: Option<f64>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// What one uncontended window measured besides the latencies.
struct Window {
    elapsed: Duration,
    cpu: cpu::PerPair,
    proposals_per_pair: Option<f64>,
}

fn summarize(variant: Variant, clients: usize, mut lat: Vec<Duration>, errors: u64, w: Window) -> Cell {
    lat.sort();
    let r = |x: Option<f64>| x.map(round);
    Cell {
        variant: variant.name(),
        clients,
        pairs_per_sec: lat.len() as f64 / w.elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        errors,
        arbiter_cpu_us_per_pair: r(w.cpu.arbiter),
        etcd_cpu_us_per_pair: r(w.cpu.etcd),
        bench_cpu_us_per_pair: r(w.cpu.bench),
        proposals_per_pair: r(w.proposals_per_pair),
    }
}

/// `holdfast-bench --replot SAVED --plot OUT.svg`: the scale plot of a saved
/// `--scale --json` output, or the group-commit plot of a saved `--only
/// group-commit --json` output, drawn without measuring (no arbiter or etcd).
#[derive(clap::Parser)]
#[command(name = "holdfast-bench")]
pub struct Replot {
    /// A file whose last JSON line is a `holdfast-bench --scale --json` or
    /// `--only group-commit --json` summary.
    #[arg(long)]
    pub replot: PathBuf,
    /// Where to write the SVG.
    #[arg(long)]
    pub plot: PathBuf,
}

/// The summary of a saved `--json` output: its last line holding a JSON
/// object (progress lines may come before it).
pub fn last_summary(text: &str) -> anyhow::Result<serde_json::Value> {
    let line = text.lines().rev().find(|l| l.trim_start().starts_with('{')).context("no JSON summary line in the file")?;
    serde_json::from_str(line).context("the summary line is not JSON")
}

/// Draws [`Replot`]; the exit status.
pub fn replot(r: &Replot) -> u8 {
    let drawn = std::fs::read_to_string(&r.replot).with_context(|| format!("reading {}", r.replot.display())).and_then(|text| {
        let summary = last_summary(&text)?;
        if summary.get("group_commit_curve").is_some() && summary.get("scale").is_none() {
            group::plot(&r.plot, &group::curve_from_summary(&summary)?)
        } else {
            scale::plot(&r.plot, &scale::levels_from_summary(&summary)?)
        }
    });
    match drawn {
        Ok(()) => {
            eprintln!("holdfast-bench: plot written to {}", r.plot.display());
            exit::OK
        }
        Err(e) => {
            eprintln!("holdfast-bench: {}: {e:#}", r.replot.display());
            exit::INVALID
        }
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
    pids: cpu::Pids,
}

async fn bench(conn: &ConnArgs, args: BenchArgs) -> anyhow::Result<()> {
    let client = conn.connect().await.map_err(|code| anyhow::anyhow!("cannot connect to the arbiter (exit {code})"))?;
    let given = args.etcd.config();
    let cfg = match &args.dev_dir {
        Some(dir) => baseline::dev_user(dir, given.endpoints.clone()).await?,
        None => given,
    };
    let cfg = holdfast_config::EtcdConfig { request_timeout: Duration::from_secs(10), ..cfg };
    let etcd = Etcd::connect(&cfg).await?;
    let identity = baseline::probe(&etcd.client, &cfg).await;
    baseline::check_writes(&etcd.client, identity.user.as_deref()).await?;
    let sys = holdfast_store::epoch::read_sys(&etcd).await?;
    let (record, epoch_bytes) = sys.epoch.ok_or_else(|| anyhow::anyhow!("the epoch is not initialised"))?;
    let etcd_version = etcd.member_status().await.into_iter().find_map(Result::ok).map(|m| m.version).unwrap_or_default();
    let port_pid = |endpoint: Option<&String>| endpoint.and_then(|e| cpu::endpoint_port(e)).and_then(cpu::listener_pid);
    let pids = cpu::Pids {
        arbiter: args.arbiter_pid.or_else(|| port_pid(conn.endpoint.as_ref())),
        etcd: args.etcd_pid.or_else(|| port_pid(cfg.endpoints.first())),
    };
    let ctx = Arc::new(Ctx {
        client,
        etcd,
        epoch_bytes,
        epoch: record.epoch,
        etcd_version,
        metrics_url: args.etcd_metrics.clone().unwrap_or_else(|| format!("{}/metrics", cfg.endpoints[0].trim_end_matches('/'))),
        pids,
    });
    let named_only = [Part::GroupCommit, Part::Holds, Part::Queue, Part::Hop];
    let want = |p: Part| if args.only.is_empty() { !named_only.contains(&p) } else { args.only.contains(&p) };
    // Progress and the table go to stderr, so `--json | tail -n1` is clean.
    let say = |m: String| eprintln!("{m}");
    say(format!("holdfast bench against etcd {} ({}), {:?} per cell", ctx.etcd_version, cfg.endpoints.join(","), args.duration));
    say(format!(
        "  direct etcd paths run as etcd user {} over {}: {}",
        identity.user.as_deref().unwrap_or("(no client certificate)"),
        identity.scheme,
        if identity.auth_enforced {
            "etcd authenticates it and checks its role on every request, as a workload's"
        } else {
            "NOT a fair baseline: etcd does not check this user's permissions (root, or auth off); use --dev-dir or a workload's user"
        }
    ));
    let show = |p: Option<u32>| p.map(|p| p.to_string()).unwrap_or_else(|| "unknown: no CPU figures".into());
    say(format!("  CPU per pair from /proc: arbiter pid {}, etcd pid {}, this bench", show(pids.arbiter), show(pids.etcd)));

    let mut summary = serde_json::Map::new();
    summary.insert("etcd_version".into(), ctx.etcd_version.clone().into());
    summary.insert("baseline_etcd_user".into(), identity.user.clone().into());
    summary.insert("baseline_etcd_scheme".into(), identity.scheme.clone().into());
    summary.insert("baseline_auth_enforced".into(), identity.auth_enforced.into());
    if args.scale {
        let most = args.scale_sessions.iter().copied().max().unwrap_or(0);
        let dev_arbiter = match &args.dev_dir {
            Some(dir) => Some(scale::DevArbiter::start(dir, most)?),
            None => None,
        };
        let mut scale_conn = conn.clone();
        let mut pids = ctx.pids;
        if let Some(a) = &dev_arbiter {
            say(format!(
                "  scale: a second arbiter at {} (pid {}) on the appliance's etcd, {most} sessions allowed",
                a.endpoint,
                show(a.pid())
            ));
            scale_conn.endpoint = Some(a.endpoint.clone());
            pids.arbiter = a.pid();
        }
        let mut levels = Vec::new();
        for &n in &args.scale_sessions {
            say(format!("  scale: opening {n} sessions, holding them {:?}", args.scale_hold));
            const COUNTERS: [&str; 3] = [
                "holdfast_arbiter_renewal_failures_total",
                "holdfast_arbiter_unconfirmed_keepalives_total",
                "holdfast_arbiter_keepalive_streams_stalled_total",
            ];
            let counts = || async {
                let mut v = Vec::new();
                for c in COUNTERS {
                    v.push(match &dev_arbiter {
                        Some(a) => scrape(&a.metrics_url, c, "").await.ok(),
                        None => None,
                    });
                }
                v
            };
            let before = counts().await;
            let mut l = scale::level(&scale_conn, pids, n, args.scale_hold, args.scale_per_connection).await;
            let after = counts().await;
            let delta = |i: usize| Some(after[i]? - before[i]?);
            (l.arbiter_renewal_failures, l.arbiter_unconfirmed_keepalives, l.arbiter_keepalive_streams_stalled) =
                (delta(0), delta(1), delta(2));
            if let (Some(f), Some(u), Some(st)) = (delta(0), delta(1), delta(2)) {
                say(format!(
                    "  scale {n:>6} sessions: the arbiter failed {f} renewals, {u} answers were in an unconfirmed term, {st} etcd keepalive streams stalled"
                ));
            }
            let opt = |x: Option<f64>, unit: &str| x.map(|x| format!("{x:.2}{unit}")).unwrap_or_else(|| "-".into());
            say(format!(
                "  scale {:>6} sessions ({} opened, {} connections, {:.0} opens/s): arbiter RSS {} ({} per session), CPU arbiter {} etcd {} bench {}; keepalives {:.0}/s p50 {:.2} ms p99 {:.2} ms, {} unanswered, {} gone; false fences {}; workload {:.0} pairs/s p99 {:.2} ms ({} errors){}",
                n,
                l.opened,
                l.connections,
                l.open_per_sec,
                opt(l.arbiter_rss_mib, " MiB"),
                opt(l.arbiter_rss_kib_per_session, " KiB"),
                opt(l.arbiter_cpu_cores, " cores"),
                opt(l.etcd_cpu_cores, " cores"),
                opt(l.bench_cpu_cores, " cores"),
                l.keepalives_per_sec,
                l.keepalive_p50_ms,
                l.keepalive_p99_ms,
                l.keepalives_unanswered,
                l.keepalives_gone,
                l.false_fences,
                l.workload_pairs_per_sec,
                l.workload_p99_ms,
                l.workload_errors,
                l.limit.as_ref().map(|x| format!("; limited by: {x}")).unwrap_or_default()
            ));
            levels.push(l);
        }
        let held = levels.iter().filter(|l| l.opened == l.sessions && l.false_fences == 0).map(|l| l.sessions).max().unwrap_or(0);
        summary.insert("scale_largest_held".into(), held.into());
        summary.insert("scale_false_fences".into(), levels.iter().map(|l| l.false_fences).sum::<u64>().into());
        summary.insert("scale".into(), serde_json::to_value(&levels)?);
        if let Some(path) = &args.plot {
            scale::plot(path, &levels)?;
            say(format!("  plot written to {}", path.display()));
        }
        println!("{}", serde_json::Value::Object(summary));
        return Ok(());
    }
    let mut cells = Vec::new();
    if want(Part::Uncontended) {
        for &c in &args.clients {
            for v in [Variant::Arbiter, Variant::EtcdTxn, Variant::LockRpc] {
                let cell = uncontended(&ctx, v, c, args.duration).await?;
                say(format!(
                    "  uncontended {:>3} clients  {:<18} {:>9.0} pairs/s  p50 {:>7.2} ms  p99 {:>7.2} ms  CPU us/pair arbiter {:>5} etcd {:>5} bench {:>5}  proposals/pair {}{}",
                    c,
                    cell.variant,
                    cell.pairs_per_sec,
                    cell.p50_ms,
                    cell.p99_ms,
                    us(cell.arbiter_cpu_us_per_pair),
                    us(cell.etcd_cpu_us_per_pair),
                    us(cell.bench_cpu_us_per_pair),
                    cell.proposals_per_pair.map(|p| format!("{p:.2}")).unwrap_or_else(|| "-".into()),
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
        // The per-pair costs at 64 clients (else the most clients below 64
        // that ran; `cost_clients` says which).
        let at = top;
        let mut put = |name: &str, x: Option<f64>| {
            if let Some(x) = x.filter(|x| x.is_finite()) {
                summary.insert(format!("{name}_64"), round(x).into());
            }
        };
        let (a, d, l) = (find(Variant::Arbiter, at), find(Variant::EtcdTxn, at), find(Variant::LockRpc, at));
        let pick = |c: &Option<Cell>, f: fn(&Cell) -> Option<f64>| c.as_ref().and_then(f);
        put("arbiter_cpu_us_per_pair", pick(&a, |c| c.arbiter_cpu_us_per_pair));
        put("etcd_cpu_us_per_pair_arbiter", pick(&a, |c| c.etcd_cpu_us_per_pair));
        put("etcd_cpu_us_per_pair_direct", pick(&d, |c| c.etcd_cpu_us_per_pair));
        put("etcd_cpu_us_per_pair_lock_rpc", pick(&l, |c| c.etcd_cpu_us_per_pair));
        put("bench_cpu_us_per_pair_arbiter", pick(&a, |c| c.bench_cpu_us_per_pair));
        put("bench_cpu_us_per_pair_direct", pick(&d, |c| c.bench_cpu_us_per_pair));
        put("bench_cpu_us_per_pair_lock_rpc", pick(&l, |c| c.bench_cpu_us_per_pair));
        put("proposals_per_pair", pick(&a, |c| c.proposals_per_pair));
        put("proposals_per_pair_direct", pick(&d, |c| c.proposals_per_pair));
        put("proposals_per_pair_lock_rpc", pick(&l, |c| c.proposals_per_pair));
        // The target: the arbiter's CPU per pair against etcd's in the same cells.
        if let (Some(x), Some(y)) = (pick(&a, |c| c.arbiter_cpu_us_per_pair), pick(&a, |c| c.etcd_cpu_us_per_pair))
            && y > 0.0
        {
            put("arbiter_vs_etcd_cpu_per_pair", Some(x / y));
        }
        summary.insert("cost_clients".into(), at.into());
        summary.insert("uncontended".into(), serde_json::to_value(&cells)?);
        if let Some(path) = &args.plot {
            plot(path, &cells, &args.clients)?;
            say(format!("  plot written to {}", path.display()));
        }
    }
    if want(Part::Contended) {
        let fsync0 = histogram_totals(&ctx.metrics_url, WAL_FSYNC).await;
        let a = contended_arbiter(&ctx, args.waiters, args.duration).await?;
        let fsync1 = histogram_totals(&ctx.metrics_url, WAL_FSYNC).await;
        let l = contended_lock_rpc(&ctx, args.waiters, args.duration).await?;
        // The arbiter's handoff is two etcd commits one after the other
        // (release, then the next grant), so its rate follows etcd's WAL
        // fsync time; said beside it so runs on different disks compare.
        let fsync_ms = mean_ms_between(fsync0, fsync1);
        say(format!(
            "  contended {} waiters  arbiter {:>7.0} handoffs/s (p50 {:.2} ms release->grant, {:.3} txns/handoff, {} in the middle half, etcd WAL fsync mean {})  Lock RPC {:>7.0} handoffs/s (p50 {:.2} ms)",
            args.waiters,
            a.handoffs_per_sec,
            a.p50_ms,
            a.txns_per_handoff,
            a.steady.as_ref().map(|x| format!("{:.3}", x.txns_per_handoff)).unwrap_or_else(|| "-".into()),
            fsync_ms.map(|x| format!("{x:.2} ms")).unwrap_or_else(|| "-".into()),
            l.handoffs_per_sec,
            l.p50_ms
        ));
        say(format!(
            "    CPU us per handoff: arbiter {}, etcd {} (Lock RPC: etcd {}), bench {} (Lock RPC: {})",
            us(a.cpu.arbiter),
            us(a.cpu.etcd),
            us(l.cpu.etcd),
            us(a.cpu.bench),
            us(l.cpu.bench)
        ));
        if let Some(x) = fsync_ms {
            summary.insert("contended_wal_fsync_mean_ms".into(), round(x).into());
        }
        for (name, x) in [
            ("contended_arbiter_cpu_us_per_handoff", a.cpu.arbiter),
            ("contended_etcd_cpu_us_per_handoff_arbiter", a.cpu.etcd),
            ("contended_etcd_cpu_us_per_handoff_lock_rpc", l.cpu.etcd),
            ("contended_bench_cpu_us_per_handoff_arbiter", a.cpu.bench),
            ("contended_bench_cpu_us_per_handoff_lock_rpc", l.cpu.bench),
        ] {
            if let Some(x) = x {
                summary.insert(name.into(), round(x).into());
            }
        }
        if let Some(first) = a.errors.first() {
            say(format!("  contended: {} acquires or releases failed; the first: {first}", a.errors.len()));
        }
        if let Some(first) = l.errors.first() {
            say(format!("  contended: {} Lock RPC waiters stopped on a failed call; the first: {first}", l.errors.len()));
        }
        if l.handoffs_per_sec > 0.0 {
            summary.insert("contended_vs_lock_rpc".into(), round(a.handoffs_per_sec / l.handoffs_per_sec).into());
        }
        summary.insert("txns_per_handoff".into(), round(a.txns_per_handoff).into());
        summary.insert("contended_releases".into(), a.releases.into());
        summary.insert("contended_errors".into(), a.errors.len().into());
        summary.insert("contended_lock_rpc_errors".into(), l.errors.len().into());
        if let Some(x) = &a.steady {
            summary.insert("txns_per_handoff_after_warmup".into(), round(x.txns_per_handoff).into());
            summary.insert("handoffs_after_warmup".into(), x.handoffs.into());
        }
        summary.insert("contended_arbiter_handoffs_per_sec".into(), round(a.handoffs_per_sec).into());
        summary.insert("contended_lock_rpc_handoffs_per_sec".into(), round(l.handoffs_per_sec).into());
        summary.insert("handoff_p50_ms_arbiter".into(), round(a.p50_ms).into());
        summary.insert("handoff_p50_ms_lock_rpc".into(), round(l.p50_ms).into());
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
    if want(Part::GroupCommit) {
        let mut levels: Vec<usize> = args.clients.iter().copied().filter(|c| (1..=64).contains(c)).collect();
        levels.sort_unstable();
        levels.dedup();
        if levels.is_empty() {
            levels.push(64);
        }
        let curve = group::run(&ctx, conn, args.dev_dir.as_deref(), args.pin_etcd_cpu, &levels, args.duration, &mut summary).await?;
        // The uncontended part owns --plot when it ran.
        if let Some(path) = args.plot.as_ref().filter(|_| !want(Part::Uncontended)) {
            group::plot(path, &curve)?;
            say(format!("  plot written to {}", path.display()));
        }
    }
    if want(Part::Holds) {
        let h = many::holds(conn, args.dev_dir.as_deref(), &ctx.metrics_url, args.holds_sessions, args.holds).await?;
        let opt = |x: Option<f64>, unit: &str| x.map(|x| format!("{x:.0}{unit}")).unwrap_or_else(|| "-".into());
        say(format!(
            "  holds {} over {} sessions: {} granted ({:.0}/s, {} errors{}), arbiter RSS {} ({} per session, {} per hold), etcd db {} per hold, false fences {}",
            h.holds,
            h.sessions,
            h.granted,
            h.grants_per_sec,
            h.errors,
            h.first_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default(),
            h.arbiter_rss_mib.map(|x| format!("{x:.1} MiB")).unwrap_or_else(|| "-".into()),
            opt(h.arbiter_rss_kib_per_session, " KiB"),
            opt(h.arbiter_rss_bytes_per_hold, " B"),
            opt(h.etcd_db_bytes_per_hold, " B"),
            h.false_fences
        ));
        summary.insert("holds".into(), serde_json::to_value(&h)?);
    }
    if want(Part::Queue) {
        let q = many::queue(conn, args.dev_dir.as_deref(), args.queue).await?;
        say(format!(
            "  queue of {} waiters on one key ({} counted waiting): {} granted, {:.0} handoffs/s, release->grant p50 {:.2} ms p99 {:.2} ms, out of arrival order {}, arbiter RSS {} ({} B per waiter), {} errors{}",
            q.waiters,
            q.queued,
            q.granted,
            q.handoffs_per_sec,
            q.handoff_p50_ms,
            q.handoff_p99_ms,
            q.out_of_order.map(|n| n.to_string()).unwrap_or_else(|| "not judged".into()),
            q.arbiter_rss_mib.map(|x| format!("{x:.1} MiB")).unwrap_or_else(|| "-".into()),
            q.arbiter_rss_bytes_per_waiter.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into()),
            q.errors,
            q.first_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
        ));
        summary.insert("queue".into(), serde_json::to_value(&q)?);
    }
    if want(Part::Hop) {
        let url = args.arbiter_metrics.clone().or_else(|| {
            let dir = args.dev_dir.as_ref()?;
            let c = holdfast_config::ArbiterConfig::load(&dir.join("arbiter.toml")).ok()?;
            Some(format!("http://{}/metrics", c.metrics_listen))
        });
        let h = hop::run(&ctx, url.as_deref(), args.duration).await?;
        let opt = |x: Option<f64>| x.map(|x| format!("{x:.2} ms")).unwrap_or_else(|| "- (no arbiter metrics)".into());
        say(format!(
            "  hop, one client, {} rounds ({} errors): pair through the arbiter adds {:.2} ms p50, {:.2} ms mean = transport {:.2} (2 x empty arbiter call; empty etcd call {:.2}) + etcd from the arbiter {} + the arbiter's own work {}",
            h.rounds,
            h.errors,
            h.added_pair_p50_ms,
            h.added_pair_mean_ms,
            h.split_transport_ms,
            h.etcd_empty_call.mean_ms,
            opt(h.split_etcd_from_arbiter_ms),
            opt(h.split_arbiter_work_ms)
        ));
        say(format!(
            "    p50/mean ms: acquire {:.2}/{:.2} release {:.2}/{:.2}; direct grant {:.2}/{:.2} release {:.2}/{:.2}; the arbiter's grant txn {}",
            h.arbiter_acquire.p50_ms,
            h.arbiter_acquire.mean_ms,
            h.arbiter_release.p50_ms,
            h.arbiter_release.mean_ms,
            h.direct_grant.p50_ms,
            h.direct_grant.mean_ms,
            h.direct_release.p50_ms,
            h.direct_release.mean_ms,
            opt(h.arbiter_grant_txn_mean_ms)
        ));
        summary.insert("hop".into(), serde_json::to_value(&h)?);
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

/// The TTL of a lease a direct path holds through a window of `window`:
/// the window plus a minute for setting up and closing. The direct paths
/// send no keepalives, so the lease must outlive the window (a fixed 60 s
/// ended inside longer windows: a 120 s contended run counted the Lock RPC
/// at 63 handoffs/s instead of 125).
pub fn direct_lease_ttl(window: Duration) -> i64 {
    60 + window.as_secs_f64().ceil() as i64
}

/// A session plus its etcd lease, for the direct variants, held through a
/// window of `window`.
async fn raw_session(etcd: &Etcd, identity: &str, window: Duration) -> anyhow::Result<(i64, Vec<u8>)> {
    let mut c = etcd.client.clone();
    let ttl = direct_lease_ttl(window);
    let lease = c.lease_grant(ttl, None).await?.id();
    let record = layout::encode(&SessionRecord { spiffe_id: identity.into(), ttl_secs: ttl as u64, coord: false });
    c.put(layout::session_key(lease), record.clone(), Some(etcd_client::PutOptions::new().with_lease(lease))).await?;
    Ok((lease, record))
}

/// One client of an uncontended cell, set up before the window opens.
enum Worker {
    Arbiter {
        session: Session,
        key: LockKey,
    },
    /// `drains`: the key's drain markers, compared as the arbiter does.
    EtcdTxn {
        c: etcd_client::Client,
        lease: i64,
        hold_key: String,
        drains: Vec<String>,
        session_bytes: Vec<u8>,
        hold: Vec<u8>,
    },
    LockRpc {
        c: etcd_client::Client,
        lease: i64,
        name: String,
    },
}

impl Worker {
    async fn open(ctx: &Ctx, variant: Variant, key: LockKey, window: Duration) -> anyhow::Result<Self> {
        Ok(match variant {
            Variant::Arbiter => Worker::Arbiter { session: ctx.client.open_session_for(BENCH_NAMESPACE, None).await?, key },
            Variant::EtcdTxn => {
                let identity = "spiffe://holdfast.bench/direct";
                let (lease, session_bytes) = raw_session(&ctx.etcd, identity, window).await?;
                let hold = layout::encode(&HoldRecord { spiffe_id: identity.into(), session: lease, epoch: ctx.epoch, granted_unix_ms: 0 });
                Worker::EtcdTxn {
                    c: ctx.etcd.client.clone(),
                    lease,
                    hold_key: layout::hold_key(&key),
                    drains: layout::drain_keys(&key),
                    session_bytes,
                    hold,
                }
            }
            Variant::LockRpc => {
                let mut c = ctx.etcd.client.clone();
                let lease = c.lease_grant(direct_lease_ttl(window), None).await?.id();
                Worker::LockRpc { c, lease, name: format!("{}{}", baseline::LOCK_RPC_PREFIX, key.key()) }
            }
        })
    }

    /// Acquire+release pairs until `duration` has passed: each pair's
    /// latency, and the failed pairs.
    async fn run(&mut self, ctx: &Ctx, duration: Duration) -> (Vec<Duration>, u64) {
        let mut lat = Vec::new();
        let mut errors = 0u64;
        let end = Instant::now() + duration;
        while Instant::now() < end {
            let t = Instant::now();
            let ok = match self {
                Worker::Arbiter { session, key } => match session.acquire(key, Duration::ZERO).await {
                    Ok(h) => h.release().await.is_ok(),
                    Err(_) => false,
                },
                Worker::EtcdTxn { c, lease, hold_key, drains, session_bytes, hold } => {
                    let txn = holdfast_store::txn::grant_txn(hold_key, &ctx.epoch_bytes, *lease, session_bytes, hold, None, drains);
                    match c.txn(txn).await {
                        Ok(r) if r.succeeded() => {
                            let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                            matches!(c.txn(holdfast_store::txn::release_txn_for(hold_key, *lease, rev)).await, Ok(r) if r.succeeded())
                        }
                        _ => false,
                    }
                }
                Worker::LockRpc { c, lease, name } => {
                    match c.lock(name.as_str(), Some(etcd_client::LockOptions::new().with_lease(*lease))).await {
                        Ok(r) => c.unlock(r.key().to_vec()).await.is_ok(),
                        Err(_) => false,
                    }
                }
            };
            if ok {
                lat.push(t.elapsed());
            } else {
                errors += 1;
            }
        }
        (lat, errors)
    }

    async fn close(self) {
        match self {
            Worker::Arbiter { session, .. } => {
                let _ = session.close().await;
            }
            Worker::EtcdTxn { mut c, lease, .. } | Worker::LockRpc { mut c, lease, .. } => {
                let _ = c.lease_revoke(lease).await;
            }
        }
    }
}

/// Raft proposals etcd has committed, or `None` (said once) if its metrics
/// cannot be read.
async fn proposals(ctx: &Ctx) -> Option<f64> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    match scrape(&ctx.metrics_url, "etcd_server_proposals_committed_total", "").await {
        Ok(p) => Some(p),
        Err(e) => {
            WARNED.call_once(|| eprintln!("  no proposals per pair: {e:#}"));
            None
        }
    }
}

/// One uncontended cell. Every client opens its session (or lease) first;
/// the window (CPU samples, proposal counts, the clock) spans only the
/// acquire+release loop, and the sessions close after it.
async fn uncontended(ctx: &Arc<Ctx>, variant: Variant, clients: usize, duration: Duration) -> anyhow::Result<Cell> {
    let run = format!("{:x}", Instant::now().elapsed().as_nanos() ^ std::process::id() as u128 ^ rand_u64() as u128);
    // Four phases, all clients and this task: set up, run, stop, close.
    let phase = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (ctx, phase) = (ctx.clone(), phase.clone());
        let key = LockKey::new(BENCH_NAMESPACE, &format!("u-{run}-{i}"))?;
        tasks.push(tokio::spawn(async move {
            // A client that fails to set up still passes every phase, so
            // the others are not left waiting; its error is reported below.
            let mut worker = Worker::open(&ctx, variant, key, duration).await;
            phase.wait().await;
            phase.wait().await;
            let ran = match &mut worker {
                Ok(w) => w.run(&ctx, duration).await,
                Err(_) => (Vec::new(), 0),
            };
            phase.wait().await;
            phase.wait().await;
            let worker = worker?;
            worker.close().await;
            Ok::<_, anyhow::Error>(ran)
        }));
    }
    let (all, errors, window) = measured_window(ctx, &phase, tasks).await?;
    Ok(summarize(variant, clients, all, errors, window))
}

/// One client task of a measured window: its operations' latencies and
/// failures.
type ClientTask = tokio::task::JoinHandle<anyhow::Result<(Vec<Duration>, u64)>>;

/// The measured window of clients that pass `phase` four times (set up,
/// go, stopped, close) and return their operations' latencies and
/// failures: the CPU samples and proposal counts are taken between set-up
/// and stop only. Returns every latency, the failures, and the window's
/// costs per operation.
async fn measured_window(ctx: &Ctx, phase: &tokio::sync::Barrier, tasks: Vec<ClientTask>) -> anyhow::Result<(Vec<Duration>, u64, Window)> {
    phase.wait().await; // every client is set up
    let p0 = proposals(ctx).await;
    let c0 = ctx.pids.sample();
    let started = Instant::now();
    phase.wait().await; // go
    phase.wait().await; // every client has stopped
    let c1 = ctx.pids.sample();
    let elapsed = started.elapsed();
    let p1 = proposals(ctx).await;
    phase.wait().await; // close
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await??;
        all.extend(lat);
        errors += e;
    }
    let n = all.len();
    let proposals_per_pair = match (p0, p1) {
        (Some(a), Some(b)) if n > 0 && b >= a => Some((b - a) / n as f64),
        _ => None,
    };
    Ok((all, errors, Window { elapsed, cpu: cpu::PerPair::between(&c0, &c1, n), proposals_per_pair }))
}

fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    t.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15
}

/// The contended cell through the arbiter.
pub struct Contended {
    pub handoffs_per_sec: f64,
    /// From a release to the next grant.
    pub p50_ms: f64,
    /// Over the whole window.
    pub txns_per_handoff: f64,
    pub releases: u64,
    pub steady: Option<Steady>,
    /// Acquires and releases that failed for another reason than the window
    /// ending.
    pub errors: Vec<String>,
    /// CPU time per handoff (per release) of the arbiter, etcd and this
    /// benchmark over the cell.
    pub cpu: cpu::PerPair,
}

/// The steady state of a contended cell: etcd transactions per handoff
/// between the end of the first quarter of the window and the start of the
/// last, and the handoffs counted there.
pub struct Steady {
    pub txns_per_handoff: f64,
    pub handoffs: u64,
}

/// The contended cell through the arbiter: handoffs/s, the p50 from a
/// release to the next grant, etcd transactions (grant attempts and
/// releases) per handoff over the whole window, and the steady state. Each
/// waiter's first acquire finds no queue yet and tries at once, and so does
/// a waiter coming back to a queue that emptied as others stopped at the
/// end; those tries are not handoffs, and the steady state leaves them out.
/// Its edges can each be off by one transaction: a release the bench has
/// seen returned whose next grant the arbiter's counter has not yet seen.
async fn contended_arbiter(ctx: &Arc<Ctx>, waiters: usize, duration: Duration) -> anyhow::Result<Contended> {
    let key = LockKey::new(BENCH_NAMESPACE, &format!("hot-{:x}", rand_u64()))?;
    let events: Arc<Mutex<Vec<(Instant, bool)>>> = Arc::default();
    let attempts_before = ctx.client.server_status().await?.grant_attempts;
    let end = Instant::now() + duration;
    let marks = {
        let ctx = ctx.clone();
        let start = Instant::now();
        tokio::spawn(async move {
            let mut marks = Vec::new();
            for at in [start + duration / 4, start + duration * 3 / 4] {
                tokio::time::sleep_until(at.into()).await;
                marks.push(ctx.client.server_status().await.ok().map(|s| (Instant::now(), s.grant_attempts))?);
            }
            Some((marks[0], marks[1]))
        })
    };
    let cpu0 = ctx.pids.sample();
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let (ctx, key, events) = (ctx.clone(), key.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            let session: Session = ctx.client.open_session_for(BENCH_NAMESPACE, None).await?;
            let (mut releases, mut errors) = (0u64, Vec::new());
            while Instant::now() < end {
                let left = end.saturating_duration_since(Instant::now());
                let h = match session.acquire(&key, left).await {
                    Ok(h) => h,
                    // The window ended while another waiter held the key
                    // (all waiters are one identity: a leak, to the arbiter).
                    Err(e) if matches!(e.reason(), Some(ErrorReason::Contention | ErrorReason::Leak)) => break,
                    Err(e) => {
                        errors.push(format!("acquire: {e}"));
                        break;
                    }
                };
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), true));
                let released = h.release().await;
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), false));
                match released {
                    Ok(_) => releases += 1,
                    Err(e) => errors.push(format!("release: {e}")),
                }
            }
            let _ = session.close().await;
            Ok::<(u64, Vec<String>), anyhow::Error>((releases, errors))
        }));
    }
    let (mut releases, mut errors) = (0, Vec::new());
    for t in tasks {
        let (r, e) = t.await??;
        releases += r;
        errors.extend(e);
    }
    let cpu = cpu::PerPair::between(&cpu0, &ctx.pids.sample(), releases as usize);
    let attempts_after = ctx.client.server_status().await?.grant_attempts;
    let attempts = attempts_after - attempts_before;
    let events = std::mem::take(&mut *events.lock().unwrap_or_else(|e| e.into_inner()));
    let (handoffs, p50) = handoff_stats(&events);
    let txns = (attempts + releases) as f64 / releases.max(1) as f64;
    let steady = marks.await.ok().flatten().and_then(|((t1, a1), (t2, a2))| {
        let released = events.iter().filter(|(t, grant)| !grant && *t > t1 && *t <= t2).count() as u64;
        (released > 0).then(|| Steady { txns_per_handoff: (a2 - a1 + released) as f64 / released as f64, handoffs: released })
    });
    Ok(Contended {
        handoffs_per_sec: handoffs as f64 / duration.as_secs_f64(),
        p50_ms: p50,
        txns_per_handoff: txns,
        releases,
        steady,
        errors,
        cpu,
    })
}

/// The contended part's baseline, etcd's Lock RPC.
struct LockRpcContended {
    handoffs_per_sec: f64,
    /// From a release to the next grant.
    p50_ms: f64,
    /// Failed Lock or Unlock calls. A waiter whose call fails stops, so any
    /// failure understates the baseline's rate; it is reported.
    errors: Vec<String>,
    /// CPU time per handoff (etcd's and this benchmark's; the arbiter idles).
    cpu: cpu::PerPair,
}

async fn contended_lock_rpc(ctx: &Arc<Ctx>, waiters: usize, duration: Duration) -> anyhow::Result<LockRpcContended> {
    let name = format!("{}hot-{:x}", baseline::LOCK_RPC_PREFIX, rand_u64());
    let events: Arc<Mutex<Vec<(Instant, bool)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let end = Instant::now() + duration;
    let cpu0 = ctx.pids.sample();
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let (ctx, name, events, errors) = (ctx.clone(), name.clone(), events.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = ctx.etcd.client.clone();
            let lease = c.lease_grant(direct_lease_ttl(duration), None).await?.id();
            let failed = |what: &str, e: etcd_client::Error| errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{what}: {e}"));
            while Instant::now() < end {
                let left = end.saturating_duration_since(Instant::now());
                let lock = c.lock(name.as_str(), Some(etcd_client::LockOptions::new().with_lease(lease)));
                let r = match tokio::time::timeout(left, lock).await {
                    Err(_) => break,
                    Ok(Err(e)) => {
                        failed("lock", e);
                        break;
                    }
                    Ok(Ok(r)) => r,
                };
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), true));
                if let Err(e) = c.unlock(r.key().to_vec()).await {
                    failed("unlock", e);
                    break;
                }
                events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), false));
            }
            let _ = c.lease_revoke(lease).await;
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let cpu1 = ctx.pids.sample();
    let (handoffs, p50_ms) = handoff_stats(&events.lock().unwrap_or_else(|e| e.into_inner()));
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|e| e.into_inner()));
    let cpu = cpu::PerPair::between(&cpu0, &cpu1, handoffs);
    Ok(LockRpcContended { handoffs_per_sec: handoffs as f64 / duration.as_secs_f64(), p50_ms, errors, cpu })
}

/// CPU microseconds for a printed line: whole, or "-" where not measured.
fn us(x: Option<f64>) -> String {
    x.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into())
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

/// A Prometheus histogram's (sum, count), if the endpoint can be read.
async fn histogram_totals(url: &str, histogram: &str) -> Option<(f64, f64)> {
    let sum = scrape(url, &format!("{histogram}_sum"), "").await.ok()?;
    let count = scrape(url, &format!("{histogram}_count"), "").await.ok()?;
    Some((sum, count))
}

/// The mean of a histogram between two readings, in milliseconds.
fn mean_ms_between(a: Option<(f64, f64)>, b: Option<(f64, f64)>) -> Option<f64> {
    match (a, b) {
        (Some((s0, c0)), Some((s1, c1))) if c1 > c0 => Some((s1 - s0) * 1e3 / (c1 - c0)),
        _ => None,
    }
}

const WAL_FSYNC: &str = "etcd_disk_wal_fsync_duration_seconds";

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

/// Four panels against log2(clients): pairs/s, p99, CPU per pair (etcd's
/// for every path and the arbiter's own for the arbiter path) and Raft
/// proposals per pair. A path without a figure (an unknown process, no
/// metrics) draws no line in that panel.
fn plot(path: &std::path::Path, cells: &[Cell], clients: &[usize]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    type Pick = fn(&Cell) -> Option<f64>;
    let root = SVGBackend::new(path, (960, 840)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let xmax = clients.iter().map(|c| (*c as f64).log2()).fold(1.0, f64::max);
    let variants = [(Variant::Arbiter, RED), (Variant::EtcdTxn, BLUE), (Variant::LockRpc, GREEN)];
    // (label, colour, path, figure)
    type Line = (String, RGBColor, Variant, Pick);
    type Points = Vec<(f64, f64)>;
    let mut cpu_lines: Vec<Line> =
        variants.iter().map(|(v, c)| (format!("etcd, {}", v.name()), *c, *v, (|x: &Cell| x.etcd_cpu_us_per_pair) as Pick)).collect();
    cpu_lines.push(("the arbiter process, arbiter".into(), MAGENTA, Variant::Arbiter, |x: &Cell| x.arbiter_cpu_us_per_pair));
    let each = |pick: Pick| -> Vec<Line> { variants.iter().map(|(v, c)| (v.name().to_string(), *c, *v, pick)).collect() };
    let specs: [(&str, Vec<Line>); 4] = [
        ("pairs/s vs log2(clients)", each(|c| Some(c.pairs_per_sec))),
        ("p99 ms vs log2(clients)", each(|c| Some(c.p99_ms))),
        ("CPU us per pair vs log2(clients)", cpu_lines),
        ("Raft proposals per pair vs log2(clients)", each(|c| c.proposals_per_pair)),
    ];
    for (area, (title, lines)) in panels.iter().zip(specs) {
        let series: Vec<(String, RGBColor, Points)> = lines
            .iter()
            .map(|(label, color, variant, pick)| {
                let pts = clients
                    .iter()
                    .filter_map(|c| {
                        cells
                            .iter()
                            .find(|x| x.variant == variant.name() && x.clients == *c)
                            .and_then(|x| Some(((*c as f64).log2(), pick(x)?)))
                    })
                    .collect();
                (label.clone(), *color, pts)
            })
            .collect();
        let ymax = series.iter().flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y)).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
        chart.configure_mesh().draw()?;
        for (label, color, pts) in series.into_iter().filter(|(_, _, p)| !p.is_empty()) {
            chart
                .draw_series(LineSeries::new(pts, color))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        }
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direct_paths_lease_outlives_its_window() {
        // etcd ends a lease after its TTL without keepalives: the window
        // plus a minute for setting up and closing.
        for secs in [1u64, 10, 59, 60, 120, 600] {
            let ttl = direct_lease_ttl(Duration::from_secs(secs));
            assert!(ttl >= secs as i64 + 60, "{secs} s window: TTL {ttl} s");
        }
        assert_eq!(direct_lease_ttl(Duration::from_millis(2500)), 63);
    }

    #[test]
    fn a_histogram_mean_is_taken_over_the_window_only() {
        // 10 observations summing 5 ms before; 30 more summing 90 ms in the window.
        assert_eq!(mean_ms_between(Some((0.005, 10.0)), Some((0.095, 40.0))).map(round), Some(3.0));
        assert_eq!(mean_ms_between(Some((0.005, 10.0)), Some((0.005, 10.0))), None, "nothing observed");
        assert_eq!(mean_ms_between(None, Some((1.0, 1.0))), None, "unreadable before");
        assert_eq!(mean_ms_between(Some((1.0, 5.0)), Some((0.0, 0.0))), None, "counter reset: no figure");
    }

    fn cell(variant: Variant, clients: usize, arbiter_cpu: Option<f64>, etcd_cpu: f64, proposals: Option<f64>) -> Cell {
        Cell {
            variant: variant.name(),
            clients,
            pairs_per_sec: 100.0 * clients as f64,
            p50_ms: 1.0,
            p99_ms: 2.0,
            errors: 0,
            arbiter_cpu_us_per_pair: arbiter_cpu,
            etcd_cpu_us_per_pair: Some(etcd_cpu),
            bench_cpu_us_per_pair: Some(30.0),
            proposals_per_pair: proposals,
        }
    }

    #[test]
    fn the_plot_draws_cpu_and_proposals_per_pair_for_every_path() {
        let mut cells = Vec::new();
        for c in [1, 64] {
            cells.push(cell(Variant::Arbiter, c, Some(150.0), 220.0, Some(2.5)));
            cells.push(cell(Variant::EtcdTxn, c, None, 190.0, Some(2.0)));
            // No proposals figure for this path: its line is left out.
            cells.push(cell(Variant::LockRpc, c, None, 170.0, None));
        }
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("bench.svg");
        plot(&svg, &cells, &[1, 64]).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.starts_with("<svg"), "{}", &drawn[..drawn.len().min(200)]);
        for label in [
            "pairs/s vs log2(clients)",
            "p99 ms vs log2(clients)",
            "CPU us per pair vs log2(clients)",
            "Raft proposals per pair vs log2(clients)",
            "etcd, etcd Lock RPC",
            "the arbiter process, arbiter",
        ] {
            assert!(drawn.contains(label), "{label} missing from the plot");
        }
        // The Lock RPC path is a line in the pairs/s and p99 panels (and, as
        // "etcd, …", in the CPU one), not in the proposals one.
        assert_eq!(drawn.matches("\netcd Lock RPC\n").count(), 2, "pairs/s and p99 only");
    }
}

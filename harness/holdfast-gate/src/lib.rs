//! `holdfast-gate`: the correctness gate on one machine. A 3-member etcd
//! cluster and two arbiters in network namespaces, several client processes
//! taking locks and writing to a fenced resource, faults injected and
//! confirmed, and the recorded history checked by C1 (against etcd's log),
//! C2 (at the fence) and C3 (per-key linearizability).
//!
//! The parts: [`GateArgs`] and [`run`] here, with the run's setup and
//! teardown (`gate`); `episode` (one episode: clients, faults, liveness,
//! the history checked); `faults` (one file per fault family); `summary`
//! (what the gate prints); `cluster`, `net` and `proxy` (the system under
//! test); `client` and `resource` (the workload and the fenced resource);
//! `audit` (`--audit`: the audit tailer's store checked against etcd's log).

mod approvals;
mod audit;
pub mod catalog;
pub mod client;
mod cluster;
mod episode;
mod faults;
mod net;
mod proxy;
pub mod resource;
mod restore;
mod summary;

use anyhow::Context;
use faults::{FaultKind, FaultRecord};
use holdfast_checkers::history::History;
use holdfast_checkers::report::Report;
use holdfast_checkers::{etcd_log, fence, linearizable};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use summary::{Summary, print_table};

#[derive(clap::Args)]
#[command(after_long_help = "\
Profiles:
  short   one episode in which every fault kind strikes once (a few minutes);
          runs in the default test suite
  long    20 episodes of --duration (default 60s) with faults drawn at random;
          for releases

Clocks: arbiter 1 runs with its clock 10% slow, client 0 15% slow and
client 1 15% fast (libfaketime, from their start); the clock-jump fault
moves those clocks forward. The epoch-advance fault advances the epoch under
load and revokes the old sessions' leases 1-3 s late.

Needs root (network namespaces, iptables), strace and libfaketime
(scripts/install-deps installs them), and an etcd binary (HOLDFAST_ETCD_BIN,
or etcd on PATH). Nothing outside the namespaces it creates is touched:
members live on 10.213.N.0/24 behind a bridge of its own.

The resource: --resource postgres-local starts a throwaway PostgreSQL cluster
from Debian's packages; --resource postgres://... uses the database given.
Each lock key has a counter row guarded by the reference fence (--fence
correct), by a deliberately wrong one (less-or-equal, two-statements), or by
none at all (--fence unfenced: the gate then shows the lost updates). Without --resource, clients only take locks (C2 is skipped
and nothing is counted as a stale write).

Exit status: 0 no violation; 1 a checker found a violation (the history is
kept, and a timeline of the offending key printed); 2 the gate could not run.

Examples:
  sudo holdfast-gate --profile short --resource postgres-local
  sudo holdfast-gate --profile long --duration 60s --json
  holdfast-gate --list-faults --list-mutations    (no root needed)")]
pub struct GateArgs {
    #[command(subcommand)]
    action: Option<GateAction>,
    /// short: every fault kind once, a few minutes; long: 20 episodes.
    #[arg(long, value_enum, default_value_t = Profile::Short)]
    profile: Profile,
    /// Length of each long-profile episode.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    duration: Duration,
    /// Number of long-profile episodes.
    #[arg(long, default_value_t = 20)]
    episodes: u32,
    /// Seed of every random choice (logged; rerun with it to replay the plan).
    #[arg(long)]
    seed: Option<u64>,
    /// Client processes.
    #[arg(long, default_value_t = 8)]
    clients: u64,
    /// Lock keys per episode (shared by every client).
    #[arg(long, default_value_t = 32)]
    keys: usize,
    /// Only these fault kinds (comma-separated); default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    /// The fenced resource the clients write to: postgres-local (a
    /// throwaway cluster) or postgres://USER@HOST:PORT/DB.
    #[arg(long)]
    resource: Option<String>,
    /// The fence at the resource: correct, less-or-equal, two-statements or
    /// unfenced (the wrong ones exist to be caught).
    #[arg(long, default_value = "correct")]
    fence: String,
    /// Keep logs, histories and etcd data here (default: a temporary
    /// directory, removed after a passing run).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the summary as one JSON object on the last line.
    #[arg(long)]
    json: bool,
    /// Run the arbiters with group commit on (`[grants] group_commit`).
    #[arg(long)]
    group_commit: bool,
    /// Also run holdfast-tailer and, at the end, check its audit store
    /// against etcd's log: the same changes, each once, every hold's end
    /// classified as etcd's log says (not with the restore fault: the
    /// tailer refuses a rewound etcd).
    #[arg(long)]
    audit: bool,
    /// Stop the etcd leader for up to this long in `leader-pause` (default:
    /// two TTLs, 10 s at TTL 5 s). A stop past about TTL − TTL/3 makes the
    /// woken leader revoke leases the new leader renewed; the arbiter does
    /// not count keepalives while that can happen (docs/gate.md).
    #[arg(long, value_parser = humantime::parse_duration)]
    leader_pause_max: Option<Duration>,
    /// Test builds only: run the arbiters with this deliberate bug
    /// (`[mutation]` in their config: release_unguarded, token_from_counter,
    /// no_epoch_compare, no_session_compare, no_seal_check,
    /// no_withdrawal_marker, no_keepalive_confirmation, no_deposed_leader_check,
    /// forget_served_epochs, fail_open_any_class, no_drain_compare), or the clients
    /// (`holdfast_client::mutations`: fence_from_receive_time), or the
    /// gate's own restore procedure (advance_from_restored_record), to show
    /// that the gate catches it.
    #[arg(long, hide = true)]
    mutation: Option<String>,
    /// Print every fault kind (how it strikes, what confirms it) as a
    /// Markdown table, and exit: docs/correctness-gate.md's table is this output.
    #[arg(long)]
    list_faults: bool,
    /// Print every mutation (what it breaks, the faults its test runs, what
    /// catches it) as a Markdown table, and exit: docs/correctness-gate.md's
    /// table is this output.
    #[arg(long)]
    list_mutations: bool,
}

#[derive(clap::Subcommand)]
enum GateAction {
    /// One client process of the gate (started by the gate itself).
    #[command(hide = true)]
    Client(Box<client::ClientArgs>),
    /// Run the checkers again over a kept history (episode-N/history.json).
    /// Exit status 0 only if no checker found a violation and no key was
    /// inconclusive (too large for the linearizability search).
    Check {
        history: PathBuf,
        /// Give up on a key's linearizability search after this many steps
        /// (inconclusive, which fails the check).
        #[arg(long, default_value_t = linearizable::Config::default().max_steps_per_key)]
        max_steps_per_key: u64,
        /// Keys with more operations than this are inconclusive without a
        /// search (which fails the check).
        #[arg(long, default_value_t = linearizable::Config::default().max_ops_per_key)]
        max_ops_per_key: usize,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Profile {
    Short,
    Long,
}

pub async fn run(args: GateArgs) -> u8 {
    match args.action {
        Some(GateAction::Client(c)) => return client::run(*c).await,
        Some(GateAction::Check { history, max_steps_per_key, max_ops_per_key }) => {
            return check_file(&history, &linearizable::Config { max_steps_per_key, max_ops_per_key });
        }
        None => {}
    }
    if args.list_faults || args.list_mutations {
        if args.list_faults {
            print!("{}", catalog::faults_table());
        }
        if args.list_mutations {
            if args.list_faults {
                println!();
            }
            print!("{}", catalog::mutations_table());
        }
        return 0;
    }
    // Interrupted: dropping the run's future removes the namespaces and
    // stops every process it started.
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("holdfast-gate: cannot watch for SIGTERM: {e}");
            return 2;
        }
    };
    let result = tokio::select! {
        r = gate(args) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; cleaned up")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated; cleaned up")),
    };
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("holdfast-gate: {e:#}");
            2
        }
    }
}

/// The clients' session TTL.
pub const CLIENT_TTL: Duration = Duration::from_secs(5);

/// A progress line on stderr.
fn say(m: &str) {
    eprintln!("gate: {m}");
}

/// Mutations of the gate's own operator procedure, not of a daemon:
/// `advance_from_restored_record` advances by one from the restored epoch
/// record after a restore, instead of above every epoch the arbiters and
/// the allocator report (the older-snapshot case then mints an epoch
/// again).
pub const GATE_MUTATIONS: [&str; 1] = ["advance_from_restored_record"];

fn now_tag() -> u32 {
    std::process::id() % 250
}

/// The whole run: the cluster, the leader-change monitor and the resource
/// set up once, the episodes, the false-seal check, the summary printed.
async fn gate(args: GateArgs) -> anyhow::Result<bool> {
    net::preflight()?;
    if let Some(m) = args.mutation.as_deref().filter(|m| client::is_client_mutation(m)) {
        client::check_client_mutation(m)?;
    }
    let bin = holdfast_devkit::etcd::EtcdBinary::locate()?;
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let (dir, temp) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("holdfast-gate-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    say(&format!("seed {seed}; etcd {} ({}); state in {}", bin.version_string(), bin.etcd.display(), dir.display()));
    let net = net::Net::create(now_tag(), &["e0", "e1", "e2", "a0", "a1"])?;
    let arbiter_mutation = args.mutation.clone().filter(|m| !client::is_client_mutation(m));
    let options = cluster::ArbiterOptions { group_commit: args.group_commit, mutation: arbiter_mutation };
    let mut cluster = cluster::Cluster::start(&dir, &net, bin.clone(), &options, &say).await?;
    say(&format!("cluster up: members {:?}, arbiters {:?}", cluster.spec.client_urls(), cluster.arbiter_endpoints()));
    // Every fault kind on every etcd target: the leader-disk-stall that
    // 3.4.23 once failed is closed by the arbiter (docs/gate.md, "A deposed
    // leader's revokes").
    let kinds = if args.faults.is_empty() { FaultKind::all() } else { args.faults.clone() };
    if args.audit && kinds.contains(&FaultKind::Restore) {
        anyhow::bail!("--audit cannot run with the restore fault (the tailer refuses a rewound etcd); pass --faults without restore");
    }
    let audit = if args.audit { Some(audit::Audit::start(&cluster, &dir)?) } else { None };
    let leader_changes = Arc::new(AtomicU64::new(0));
    let monitor = tokio::spawn(count_leader_changes(cluster.etcd_config(holdfast_store::roles::OBSERVER.name)?, leader_changes.clone()));
    let (_pg, resource_url) = start_resource(&args, &dir).await?;

    let t0 = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let episodes = if args.profile == Profile::Short { 1 } else { args.episodes };
    let mut summary = Summary {
        profile: if args.profile == Profile::Short { "short" } else { "long" }.into(),
        seed,
        etcd_version: bin.version_string(),
        episodes,
        resource: args.resource.as_deref().map(redact_url).unwrap_or_else(|| "none".into()),
        mutation: args.mutation.clone(),
        leader_pause_max_s: args.leader_pause_max.map(|d| d.as_secs_f64()),
        group_commit: args.group_commit,
        fence: args.fence.clone(),
        dir: dir.display().to_string(),
        clock_rates_set: (0..args.clients.min(episode::CLIENT_CLOCK_RATES.len() as u64) as usize)
            .map(|p| (format!("client{p}"), episode::CLIENT_CLOCK_RATES[p]))
            .chain([("arbiter1".to_string(), cluster::ARBITER1_CLOCK_RATE)])
            .collect(),
        ..Summary::default()
    };
    let mut all_faults: Vec<FaultRecord> = Vec::new();
    let mut passed = true;
    let mut setup = episode::Setup {
        args: &args,
        dir: &dir,
        net: &net,
        cluster: &mut cluster,
        resource: resource_url.as_deref(),
        kinds: &kinds,
        t0,
        restore: None,
    };
    for episode in 0..episodes {
        let ep_seed = rng.random::<u64>();
        if !episode::run(&mut setup, episode, ep_seed, &mut summary, &mut all_faults).await? {
            passed = false;
        }
    }
    monitor.abort();
    if !summary.fault_violations.is_empty() {
        passed = false;
    }
    if let Some(audit) = &audit {
        let report = audit.check(&cluster).await?;
        say(&format!(
            "audit store: {} changes compared ({} withheld: their hold was live), {} hold ends cross-checked, {} unprotected records; missing {:?}, extra {:?}, misclassified {:?}, live holds' revisions stored {:?}",
            report.compared,
            report.withheld,
            report.ends_compared,
            report.unprotected,
            report.missing,
            report.extra,
            report.misclassified,
            report.live_stored
        ));
        if !report.passed() {
            passed = false;
        }
        summary.audit = Some(report);
    }
    summary.false_seals = false_seals(&cluster);
    if summary.false_seals > 0 {
        passed = false;
    }
    summary.leader_changes = leader_changes.load(Ordering::Relaxed);
    summary.duration_s = t0.elapsed().as_secs_f64();
    std::fs::write(dir.join("faults.json"), serde_json::to_vec_pretty(&all_faults)?)?;
    print_table(&summary);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    drop(cluster);
    drop(net);
    if passed && temp {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(passed)
}

/// Leader changes, seen from outside: polls the members for their leader
/// and counts every change, until aborted.
async fn count_leader_changes(observer: holdfast_config::EtcdConfig, changes: Arc<AtomicU64>) {
    let mut last = None;
    loop {
        if let Some(l) = cluster::leader_of(&observer).await {
            if last.is_some_and(|p| p != l) {
                changes.fetch_add(1, Ordering::Relaxed);
            }
            last = Some(l);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// The resource: a throwaway PostgreSQL cluster (kept running while the
/// first value lives), or the one given; prepared for `--fence`.
async fn start_resource(
    args: &GateArgs,
    dir: &std::path::Path,
) -> anyhow::Result<(Option<holdfast_fixtures::postgres::PgCluster>, Option<String>)> {
    let mut pg = None;
    let resource_url = match args.resource.as_deref() {
        Some("postgres-local") => {
            let cluster = holdfast_fixtures::postgres::PgCluster::start(&dir.join("postgres.log"))
                .context("starting a throwaway PostgreSQL cluster")?;
            let url = cluster.url();
            pg = Some(cluster);
            Some(url)
        }
        other => other.map(str::to_string),
    };
    if let Some(url) = &resource_url {
        resource::setup(url, &args.fence).await.context("preparing the resource")?;
        say(&format!("resource {} with fence {}", redact_url(url), args.fence));
    }
    Ok((pg, resource_url))
}

/// An arbiter that sealed itself outside a restore (see
/// `Cluster::expected_seals`) judged an intact cluster rewound (a false
/// seal), which the gate fails. Returns how many arbiters did.
fn false_seals(cluster: &cluster::Cluster) -> usize {
    let mut seals = 0;
    for (a, arbiter) in cluster.arbiters.iter().enumerate() {
        let log = std::fs::read_to_string(&arbiter.launch.log).unwrap_or_default();
        let mut offset = 0u64;
        for line in log.split_inclusive('\n') {
            let at = offset;
            offset += line.len() as u64;
            let expected = cluster.expected_seals.iter().any(|&(x, from, to)| x == a && (from..to).contains(&at));
            if line.contains("state=sealed") && !expected {
                say(&format!("FALSE SEAL: an arbiter sealed itself although nothing was restored: {}", line.trim_end()));
                seals += 1;
                break;
            }
        }
    }
    seals
}

fn check_file(path: &std::path::Path, c3: &linearizable::Config) -> u8 {
    let history: History = match std::fs::read(path).map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice(&b)?)) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("holdfast-gate check: cannot read {}: {e:#}", path.display());
            return 2;
        }
    };
    if let Err(e) = history.validate() {
        eprintln!("holdfast-gate check: {} is malformed: {e}", path.display());
        return 2;
    }
    let reports = [etcd_log::check(&history), fence::check(&history), linearizable::check(&history, c3)];
    for r in &reports {
        println!("{:?}: {} checked, {} violations, {} inconclusive", r.checker, r.checked, r.violations.len(), r.inconclusive.len());
        for v in &r.violations {
            println!("  {:?} on {}: {}", v.rule, v.key, v.explanation);
        }
        for i in &r.inconclusive {
            println!("  inconclusive on {}: {}", i.key, i.reason);
        }
    }
    // An inconclusive key proves nothing: it fails like a violation.
    if reports.iter().all(Report::passed) { 0 } else { 1 }
}

/// Hides a password in a resource URL.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}@{}", &url[..s + 3], user, &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

//! `holdfast-gate`: the correctness gate on one machine. A 3-member etcd
//! cluster and two arbiters in network namespaces, several client processes
//! taking locks and writing to a fenced resource, faults injected and
//! confirmed, and the recorded history checked by C1 (against etcd's log),
//! C2 (at the fence) and C3 (per-key linearizability).

pub mod client;
mod cluster;
mod faults;
mod net;
mod proxy;
pub mod resource;

use anyhow::Context;
use faults::{ClientProc, FaultKind, FaultRecord};
use holdfast_checkers::history::{ClientOp, FenceEntry, History, OpKind, Outcome};
use holdfast_checkers::{etcd_log, fence, linearizable};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
  sudo holdfast-gate --profile long --duration 60s --json")]
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
    /// Test builds only: run the arbiters with this deliberate bug
    /// (`[mutation]` in their config: release_unguarded, token_from_counter,
    /// no_epoch_compare, no_session_compare) to show that the gate catches it.
    #[arg(long, hide = true)]
    mutation: Option<String>,
}

#[derive(clap::Subcommand)]
enum GateAction {
    /// One client process of the gate (started by the gate itself).
    #[command(hide = true)]
    Client(Box<client::ClientArgs>),
    /// Run the checkers again over a kept history (episode-N/history.json).
    Check { history: PathBuf },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Profile {
    Short,
    Long,
}

#[derive(Serialize, Default)]
struct Summary {
    profile: String,
    seed: u64,
    etcd_version: String,
    episodes: u32,
    duration_s: f64,
    ops: usize,
    lock_ops: usize,
    ok_grants: usize,
    unknown_ops: usize,
    expiries: usize,
    stale_rejected: usize,
    accepted_writes: usize,
    leader_changes: u64,
    faults: BTreeMap<String, usize>,
    faults_unconfirmed: Vec<String>,
    violations: usize,
    /// Violations counted by checker/rule, e.g. "C2/LostUpdate".
    violations_by_rule: BTreeMap<String, usize>,
    /// The first 20 violations, with their keys.
    violation_rules: Vec<String>,
    inconclusive: usize,
    liveness_max_ms: u64,
    /// Clock rates set with libfaketime, by process ("client0", "arbiter1").
    clock_rates_set: BTreeMap<String, f64>,
    /// The rates the clients' clocks were seen running at (their own
    /// CLOCK_MONOTONIC against the raw one, jumps taken out), last episode.
    clock_rates_measured: BTreeMap<String, f64>,
    /// Arbiters that sealed themselves (nothing is restored in the gate).
    false_seals: usize,
    liveness_failures: usize,
    resource: String,
    fence: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    mutation: Option<String>,
    group_commit: bool,
    dir: String,
}

pub async fn run(args: GateArgs) -> u8 {
    match args.action {
        Some(GateAction::Client(c)) => return client::run(*c).await,
        Some(GateAction::Check { history }) => return check_file(&history),
        None => {}
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

fn now_tag() -> u32 {
    std::process::id() % 250
}

async fn gate(args: GateArgs) -> anyhow::Result<bool> {
    net::preflight()?;
    let bin = holdfast_devkit::etcd::EtcdBinary::locate()?;
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let (dir, temp) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("holdfast-gate-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let say = |m: &str| eprintln!("gate: {m}");
    say(&format!("seed {seed}; etcd {} ({}); state in {}", bin.version_string(), bin.etcd.display(), dir.display()));
    let net = net::Net::create(now_tag(), &["e0", "e1", "e2", "a0", "a1"])?;
    let options = cluster::ArbiterOptions { group_commit: args.group_commit, mutation: args.mutation.clone() };
    let mut cluster = cluster::Cluster::start(&dir, &net, bin.clone(), &options, &say).await?;
    say(&format!("cluster up: members {:?}, arbiters {:?}", cluster.spec.client_urls(), cluster.arbiter_endpoints()));

    // Leader changes, seen from outside.
    let leader_changes = Arc::new(AtomicU64::new(0));
    let monitor = {
        let urls = cluster.spec.client_urls();
        let changes = leader_changes.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                if let Some(l) = cluster::leader_of(&urls).await {
                    if last.is_some_and(|p| p != l) {
                        changes.fetch_add(1, Ordering::Relaxed);
                    }
                    last = Some(l);
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    };

    // The resource: a throwaway PostgreSQL cluster, or the one given.
    let mut _pg = None;
    let resource_url = match args.resource.as_deref() {
        Some("postgres-local") => {
            let pg = holdfast_fixtures::postgres::PgCluster::start(&dir.join("postgres.log"))
                .context("starting a throwaway PostgreSQL cluster")?;
            let url = pg.url();
            _pg = Some(pg);
            Some(url)
        }
        other => other.map(str::to_string),
    };
    if let Some(url) = &resource_url {
        resource::setup(url, &args.fence).await.context("preparing the resource")?;
        say(&format!("resource {} with fence {}", redact_url(url), args.fence));
    }

    let t0 = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kinds = if args.faults.is_empty() { FaultKind::all() } else { args.faults.clone() };
    let episodes = if args.profile == Profile::Short { 1 } else { args.episodes };
    let mut summary = Summary {
        profile: if args.profile == Profile::Short { "short" } else { "long" }.into(),
        seed,
        etcd_version: bin.version_string(),
        episodes,
        resource: args.resource.as_deref().map(redact_url).unwrap_or_else(|| "none".into()),
        mutation: args.mutation.clone(),
        group_commit: args.group_commit,
        fence: args.fence.clone(),
        dir: dir.display().to_string(),
        clock_rates_set: (0..args.clients.min(CLIENT_CLOCK_RATES.len() as u64) as usize)
            .map(|p| (format!("client{p}"), CLIENT_CLOCK_RATES[p]))
            .chain([("arbiter1".to_string(), cluster::ARBITER1_CLOCK_RATE)])
            .collect(),
        ..Summary::default()
    };
    let mut all_faults: Vec<FaultRecord> = Vec::new();
    let mut passed = true;
    for episode in 0..episodes {
        let ep_seed = rng.random::<u64>();
        let mut ep_rng = rand::rngs::StdRng::seed_from_u64(ep_seed);
        let plan: Vec<FaultKind> = if args.profile == Profile::Short {
            let mut k = kinds.clone();
            k.shuffle(&mut ep_rng);
            k
        } else {
            (0..64).map(|_| kinds[ep_rng.random_range(0..kinds.len())]).collect()
        };
        say(&format!(
            "episode {episode} (seed {ep_seed}): {} faults planned",
            if args.profile == Profile::Short { plan.len().to_string() } else { "random".into() }
        ));
        let ep = Episode { dir: dir.join(format!("episode-{episode}")), keys: args.keys, prefix: format!("gate/e{episode}k") };
        std::fs::create_dir_all(&ep.dir)?;
        let start_rev = cluster.etcd().await?.get("/", None).await?.header().map(|h| h.revision()).unwrap_or(1);
        let start_epoch = cluster::epoch_of(&cluster.holdfast_etcd().await?).await?;
        let ep_start = Instant::now();
        let mut procs = spawn_clients(&ep, &cluster, &args, resource_url.as_deref(), ep_seed)?;
        let views: Vec<ClientProc> = procs.iter().map(|p| p.view()).collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let clocks_at_start = clock_samples(&procs);
        let ep_end = Instant::now() + if args.profile == Profile::Short { Duration::from_secs(3600) } else { args.duration };
        for kind in plan {
            if args.profile == Profile::Long && Instant::now() + Duration::from_secs(12) > ep_end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(ep_rng.random_range(300..1500))).await;
            let fault_seed = ep_rng.random::<u64>();
            let mut f_rng = rand::rngs::StdRng::seed_from_u64(fault_seed);
            let hold = Duration::from_millis(f_rng.random_range(2000..4000));
            match faults::inject(kind, fault_seed, &mut f_rng, &net, &mut cluster, &views, hold, t0).await {
                Ok(r) => {
                    say(&format!("[{:>7.1}s] {}: {} — {}", r.at_ms as f64 / 1000.0, kind.name(), r.what, r.confirmed));
                    *summary.faults.entry(kind.name()).or_default() += 1;
                    all_faults.push(r);
                }
                Err(e) => {
                    say(&format!("{} (seed {fault_seed}) NOT confirmed: {e:#}", kind.name()));
                    summary.faults_unconfirmed.push(format!("{}: {e:#}", kind.name()));
                    let _ = net.heal();
                    for p in &cluster.proxies {
                        p.clear();
                    }
                }
            }
            // A killed arbiter or member that did not come back is restarted.
            for a in 0..cluster.arbiters.len() {
                if cluster.arbiter_pid(a).is_none() {
                    cluster.start_arbiter(a, &net)?;
                }
            }
        }
        // Let the workload run on the healed system (the short profile for
        // at least SHORT_MIN in all, so its counts mean something), then stop
        // the clients.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if args.profile == Profile::Short && args.faults.is_empty() {
            tokio::time::sleep(SHORT_MIN.saturating_sub(ep_start.elapsed())).await;
        }
        for (p, rate) in measured_rates(&clocks_at_start, &clock_samples(&procs)) {
            summary.clock_rates_measured.insert(format!("client{p}"), rate);
        }
        // From here on no fault and no new work: the clock of the liveness check.
        let healed = Instant::now();
        std::fs::write(ep.dir.join("stop"), "")?;
        // Liveness: every key grantable within TTL + election timeout + 5 s
        // of healing, while the clients wind down (their zombies' holds end
        // with their leases).
        let budget = CLIENT_TTL + cluster::ELECTION_TIMEOUT + Duration::from_secs(5);
        let (worst, failures) = liveness(&cluster, &ep, healed, budget).await?;
        for p in &mut procs {
            wait_child(&mut p.child, Duration::from_secs(60));
        }
        summary.liveness_max_ms = summary.liveness_max_ms.max(worst.as_millis() as u64);
        summary.liveness_failures += failures;
        if failures > 0 {
            say(&format!("{failures} keys were not grantable within {budget:?} of healing"));
            passed = false;
        }

        // The history.
        let history = collect(&ep, &cluster, start_rev, start_epoch, resource_url.as_deref(), &args.fence).await?;
        let stats = history.stats();
        summary.ops += stats.ops;
        summary.lock_ops += stats.lock_ops;
        summary.ok_grants += stats.ok_grants;
        summary.unknown_ops += stats.unknown_ops;
        summary.expiries += stats.expiries;
        summary.stale_rejected += stats.stale_rejected;
        summary.accepted_writes += stats.accepted_writes;
        let mut reports = vec![etcd_log::check(&history), linearizable::check(&history, &linearizable::Config::default())];
        if resource_url.is_some() {
            reports.push(fence::check(&history));
        }
        let file = ep.dir.join("history.json");
        std::fs::write(&file, serde_json::to_vec(&history)?)?;
        for r in &reports {
            summary.inconclusive += r.inconclusive.len();
            for v in &r.violations {
                summary.violations += 1;
                *summary.violations_by_rule.entry(format!("{:?}/{:?}", v.checker, v.rule)).or_default() += 1;
                if summary.violation_rules.len() < 20 {
                    summary.violation_rules.push(format!("{:?}/{:?} on {}", v.checker, v.rule, v.key));
                }
            }
        }
        if reports.iter().any(|r| !r.violations.is_empty()) {
            passed = false;
            say(&format!("VIOLATIONS in episode {episode}; history kept in {}", file.display()));
            for r in &reports {
                for v in r.violations.iter().take(3) {
                    eprintln!("  {:?} {:?} on {}: {}", v.checker, v.rule, v.key, v.explanation);
                    eprint!("{}", timeline(&history, &v.key));
                }
            }
        }
    }
    monitor.abort();
    // No restore happens in the gate: an arbiter that sealed itself judged
    // an intact cluster rewound (a false seal), which the gate fails.
    for a in &cluster.arbiters {
        let log = std::fs::read_to_string(&a.launch.log).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("state=sealed")) {
            say(&format!("FALSE SEAL: an arbiter sealed itself although nothing was restored: {line}"));
            summary.false_seals += 1;
            passed = false;
        }
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

fn check_file(path: &std::path::Path) -> u8 {
    let history: History = match std::fs::read(path).map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice(&b)?)) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("holdfast-gate check: cannot read {}: {e:#}", path.display());
            return 2;
        }
    };
    let reports = [etcd_log::check(&history), fence::check(&history), linearizable::check(&history, &linearizable::Config::default())];
    let mut bad = false;
    for r in &reports {
        println!("{:?}: {} checked, {} violations, {} inconclusive", r.checker, r.checked, r.violations.len(), r.inconclusive.len());
        for v in &r.violations {
            bad = true;
            println!("  {:?} on {}: {}", v.rule, v.key, v.explanation);
        }
    }
    if bad { 1 } else { 0 }
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

pub const CLIENT_TTL: Duration = Duration::from_secs(5);
/// The first clients run under libfaketime with clocks this much slow and
/// fast, from their start (and take the clock jumps).
const CLIENT_CLOCK_RATES: [f64; 2] = [0.85, 1.15];
/// The short profile's least length of workload.
const SHORT_MIN: Duration = Duration::from_secs(120);

struct Episode {
    dir: PathBuf,
    keys: usize,
    prefix: String,
}

struct ClientChild {
    child: Child,
    state_file: PathBuf,
    clock_file: Option<PathBuf>,
    clock_report: Option<PathBuf>,
}

impl Drop for ClientChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl ClientChild {
    fn view(&self) -> ClientProc {
        ClientProc {
            pid: self.child.id(),
            clock_file: self.clock_file.clone(),
            clock_report: self.clock_report.clone(),
            state_file: self.state_file.clone(),
            ttl: CLIENT_TTL,
        }
    }
}

/// Per faked client: its clock report (own, raw ns) and its offset now.
type ClockSample = Option<((i128, i128), i64)>;

fn clock_samples(procs: &[ClientChild]) -> Vec<ClockSample> {
    procs
        .iter()
        .map(|p| {
            let report = faults::clock_report(p.clock_report.as_ref()?)?;
            Some((report, faults::read_clock_spec(p.clock_file.as_ref()?).0))
        })
        .collect()
}

/// The rate each faked client's clock ran at between two samples, with the
/// jumps (offset changes) in between taken out.
fn measured_rates(before: &[ClockSample], after: &[ClockSample]) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    for (p, (b, a)) in before.iter().zip(after).enumerate() {
        if let (Some(((own0, raw0), off0)), Some(((own1, raw1), off1))) = (b, a) {
            let raw = (raw1 - raw0) as f64;
            if raw > 1e9 {
                let own = (own1 - own0) as f64 - (off1 - off0) as f64 * 1e9;
                out.push((p, (own / raw * 1000.0).round() / 1000.0));
            }
        }
    }
    out
}

/// Starts the client processes; the first two run under libfaketime.
fn spawn_clients(
    ep: &Episode,
    cluster: &cluster::Cluster,
    args: &GateArgs,
    resource: Option<&str>,
    seed: u64,
) -> anyhow::Result<Vec<ClientChild>> {
    let exe = std::env::current_exe()?;
    let mut out = Vec::new();
    for p in 0..args.clients {
        let faked = (p as usize) < CLIENT_CLOCK_RATES.len();
        let clock_file = faked.then(|| ep.dir.join(format!("client{p}.faketime")));
        let clock_report = faked.then(|| ep.dir.join(format!("client{p}.clock")));
        let mut cmd = Command::new(&exe);
        cmd.args(["client", "--arbiters", &cluster.arbiter_endpoints().join(",")])
            .arg("--client-ca")
            .arg(cluster.ca.ca_path())
            .arg("--client-cert")
            .arg(&cluster.client_cert.cert)
            .arg("--client-key")
            .arg(&cluster.client_cert.key)
            .args(["--process", &p.to_string(), "--seed", &(seed ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_string()])
            .args(["--keys", &ep.keys.to_string(), "--key-prefix", &ep.prefix])
            .args(["--duration", "2h", "--ttl", &humantime::format_duration(CLIENT_TTL).to_string()])
            .arg("--stop-file")
            .arg(ep.dir.join("stop"))
            .arg("--out")
            .arg(ep.dir.join(format!("client{p}.jsonl")))
            .args(["--fence", &args.fence])
            .arg("--state-file")
            .arg(ep.dir.join(format!("client{p}.state")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(ep.dir.join(format!("client{p}.log")))?);
        if let Some(r) = resource {
            cmd.args(["--resource", r]);
        }
        if let (Some(f), Some(r)) = (&clock_file, &clock_report) {
            faults::write_clock_spec(f, 0, CLIENT_CLOCK_RATES[p as usize])?;
            cmd.arg("--clock-report").arg(r);
            cmd.env("LD_PRELOAD", cluster::LIBFAKETIME).env("FAKETIME_TIMESTAMP_FILE", f).env("FAKETIME_CACHE_DURATION", "1");
        }
        out.push(ClientChild {
            child: cmd.spawn().context("starting a gate client")?,
            state_file: ep.dir.join(format!("client{p}.state")),
            clock_file,
            clock_report,
        });
    }
    Ok(out)
}

fn wait_child(child: &mut Child, timeout: Duration) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Acquires every key of the episode once; returns the slowest time from
/// `healed` to its grant and the number of keys not granted within `budget`.
async fn liveness(cluster: &cluster::Cluster, ep: &Episode, healed: Instant, budget: Duration) -> anyhow::Result<(Duration, usize)> {
    let endpoint = cluster.arbiter_endpoints()[0].clone();
    let client = holdfast_client::Client::connect(&holdfast_client::ClientConfig {
        endpoint,
        ca: cluster.ca.ca_path(),
        cert: cluster.client_cert.cert.clone(),
        key: cluster.client_cert.key.clone(),
    })
    .await?;
    let session = client.open_session(CLIENT_TTL).await?;
    // Recorded like any client (process 1000): its grants are in etcd's log.
    let log = client::Log::create(&ep.dir.join("liveness.jsonl"), 1000)?;
    let mut keys = Vec::new();
    for k in 0..ep.keys {
        keys.push(holdfast_model::LockKey::parse(&format!("{}{k}", ep.prefix))?);
    }
    let mut worst = Duration::ZERO;
    let mut failures = 0;
    let waits = keys.iter().map(|k| {
        let session = &session;
        let (log, client_ref) = (&log, &client);
        async move {
            // Retried until the budget is spent: "grantable" means a client
            // that keeps asking gets it in time.
            loop {
                let left = budget.saturating_sub(healed.elapsed());
                if left.is_zero() {
                    return (false, healed.elapsed());
                }
                let invoke = client::raw_monotonic_ns();
                let r = session.acquire(k, left).await;
                let at = healed.elapsed();
                let acquire = OpKind::Acquire { key: k.to_string() };
                match r {
                    Ok(h) => {
                        let token = h.token().expose();
                        log.push(acquire, Some(session.id()), Some(token), invoke, Outcome::Ok);
                        client::release(log, client_ref, k, session.id(), token).await;
                        return (true, at);
                    }
                    Err(e) => {
                        log.push(acquire, Some(session.id()), None, invoke, client::outcome_of(&e));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    });
    for (ok, at) in futures::future::join_all(waits).await {
        worst = worst.max(at);
        if !ok || at > budget {
            failures += 1;
        }
    }
    let _ = session.close().await;
    Ok((worst, failures))
}

/// Reads the clients' operation logs, etcd's log and the fence log.
async fn collect(
    ep: &Episode,
    cluster: &cluster::Cluster,
    start_rev: i64,
    start_epoch: u32,
    resource: Option<&str>,
    fence: &str,
) -> anyhow::Result<History> {
    let mut ops: Vec<ClientOp> = Vec::new();
    for entry in std::fs::read_dir(&ep.dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            for line in std::fs::read_to_string(&path)?.lines().filter(|l| !l.trim().is_empty()) {
                ops.push(serde_json::from_str(line).with_context(|| format!("a line of {}", path.display()))?);
            }
        }
    }
    ops.sort_by_key(|o| o.invoke_ns);
    let etcd = holdfast_fixtures::etcdlog::read_log(&cluster.etcd().await?, &ep.prefix, start_rev, start_epoch as u64).await?;
    let mut history = History { ops, etcd, ..Default::default() };
    if let Some(url) = resource {
        let res = resource::open(url, fence).await?;
        let rejected: Vec<&ClientOp> =
            history.ops.iter().filter(|o| matches!(o.kind, OpKind::Write { .. }) && o.outcome == Outcome::Fail).collect();
        let mut fence_log = Vec::new();
        for k in 0..ep.keys {
            let record = resource::record_of(&format!("{}{k}", ep.prefix));
            for token in res.accepted_log(&record).await? {
                fence_log.push(FenceEntry { record: record.clone(), token, accepted: true, at_ns: 0, op: None });
            }
            history.final_counters.insert(record.clone(), res.counter(&record).await?);
        }
        for o in rejected {
            if let (OpKind::Write { record, .. }, Some(token)) = (&o.kind, o.token) {
                fence_log.push(FenceEntry { record: record.clone(), token, accepted: false, at_ns: o.invoke_ns, op: None });
            }
        }
        history.fence = fence_log;
    }
    Ok(history)
}

/// The operations and etcd events of one key, in order: what a reader needs
/// to see a violation.
fn timeline(history: &History, key: &str) -> String {
    let mut out = String::new();
    let etcd_key = holdfast_checkers::history::etcd_key_of(key);
    out.push_str(&format!("  timeline of {key} (client ops by invoke time; tokens shown as epoch/revision):\n"));
    for o in history.ops.iter().filter(|o| o.key() == Some(key)).take(60) {
        let tok = o
            .token
            .map(|t| format!("{}/{}", holdfast_checkers::history::token_epoch(t), holdfast_checkers::history::token_revision(t)))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "    {:>14} .. {:>14}  p{:<3} {:<40} {:?} {}\n",
            o.invoke_ns,
            o.complete_ns.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
            o.process,
            format!("{:?}", o.kind),
            o.outcome,
            tok
        ));
    }
    for e in history.etcd.events.iter().filter(|e| e.key == etcd_key).take(60) {
        out.push_str(&format!(
            "    etcd rev {:>8} {:?} create {} lease {:x} expired {:?}\n",
            e.revision, e.kind, e.create_revision, e.lease, e.expired
        ));
    }
    out
}

fn print_table(s: &Summary) {
    println!("holdfast gate — profile {}, seed {}, etcd {}", s.profile, s.seed, s.etcd_version);
    println!("  episodes            {:>8}   ({:.0} s)", s.episodes, s.duration_s);
    println!("  operations          {:>8}   (lock ops {}, grants {}, unknown {})", s.ops, s.lock_ops, s.ok_grants, s.unknown_ops);
    println!("  expiries            {:>8}", s.expiries);
    println!(
        "  stale writes reject {:>8}   (accepted {}; resource {}, fence {})",
        s.stale_rejected, s.accepted_writes, s.resource, s.fence
    );
    println!("  leader changes      {:>8}", s.leader_changes);
    for (k, n) in &s.faults {
        println!("  fault {:<22} {:>3}", k, n);
    }
    for u in &s.faults_unconfirmed {
        println!("  fault NOT CONFIRMED: {u}");
    }
    println!("  liveness            worst {} ms after healing, {} keys late", s.liveness_max_ms, s.liveness_failures);
    let rates: Vec<String> = s
        .clock_rates_set
        .iter()
        .map(|(p, set)| match s.clock_rates_measured.get(p) {
            Some(m) => format!("{p} x{set:.2} (seen x{m:.3})"),
            None => format!("{p} x{set:.2}"),
        })
        .collect();
    println!("  clock rates         {}", rates.join(", "));
    println!("  violations          {:>8}   {}", s.violations, s.violation_rules.join("; "));
    println!("  false seals         {:>8}", s.false_seals);
    if s.inconclusive > 0 {
        println!("  inconclusive keys   {:>8}", s.inconclusive);
    }
}

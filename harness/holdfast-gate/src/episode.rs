//! One episode of the gate: client processes started on fresh keys, the
//! planned faults injected one after another, the workload stopped, every
//! key checked grantable again (liveness), and the recorded history
//! collected and checked.

use crate::cluster::{self, Cluster};
use crate::faults::{self, ClientProc, FaultCtx, FaultKind, FaultRecord};
use crate::net::Net;
use crate::summary::{Summary, timeline};
use crate::{CLIENT_TTL, GateArgs, Profile, client, resource, say};
use anyhow::Context;
use holdfast_checkers::history::{ClientOp, FenceEntry, History, OpKind, Outcome};
use holdfast_checkers::report::Report;
use holdfast_checkers::{etcd_log, fence, linearizable};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The first clients run under libfaketime with clocks this much slow and
/// fast, from their start (and take the clock jumps).
pub const CLIENT_CLOCK_RATES: [f64; 2] = [0.85, 1.15];
/// The short profile's least length of workload.
const SHORT_MIN: Duration = Duration::from_secs(120);

/// What every episode runs against, set up once by the gate.
pub struct Setup<'a> {
    pub args: &'a GateArgs,
    /// The run's state directory; each episode keeps its own under it.
    pub dir: &'a Path,
    pub net: &'a Net,
    pub cluster: &'a mut Cluster,
    /// The fenced resource's URL, if any.
    pub resource: Option<&'a str>,
    /// The fault kinds to draw from.
    pub kinds: &'a [FaultKind],
    /// The run's start, from which fault times are counted.
    pub t0: Instant,
    /// A snapshot the restore fault took in this episode, restored after
    /// its workload.
    pub restore: Option<faults::PendingRestore>,
}

/// Runs episode `episode` with its own `seed`, adding its counts to
/// `summary` and its faults to `all_faults`. Returns whether it passed: every
/// key grantable in time after healing, and no checker found a violation.
pub async fn run(
    setup: &mut Setup<'_>,
    episode: u32,
    seed: u64,
    summary: &mut Summary,
    all_faults: &mut Vec<FaultRecord>,
) -> anyhow::Result<bool> {
    let args = setup.args;
    let mut passed = true;
    let mut ep_rng = StdRng::seed_from_u64(seed);
    let plan = plan(args.profile, setup.kinds, &mut ep_rng);
    say(&format!(
        "episode {episode} (seed {seed}): {} faults planned",
        if args.profile == Profile::Short { plan.len().to_string() } else { "random".into() }
    ));
    let ep = Episode::new(setup.dir.join(format!("episode-{episode}")), args.keys, &format!("e{episode}k"));
    std::fs::create_dir_all(&ep.dir)?;
    let entity_keys: Vec<String> = ep.all_keys().into_iter().filter(|(t, _)| *t == Tier::Entity).map(|(_, k)| k).collect();
    let starts = LogStarts::now(setup.cluster).await?;
    let ep_start = Instant::now();
    let mut procs = spawn_clients(&ep, setup.cluster, args, setup.resource, seed)?;
    let views: Vec<ClientProc> = procs.iter().map(|p| p.view()).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let clocks_at_start = clock_samples(&procs);
    let ep_end = Instant::now() + if args.profile == Profile::Short { Duration::from_secs(3600) } else { args.duration };
    for kind in older_snapshot_first(plan) {
        if args.profile == Profile::Long && Instant::now() + Duration::from_secs(12) > ep_end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(ep_rng.random_range(300..1500))).await;
        strike(setup, &views, &entity_keys, kind, &mut ep_rng, summary, all_faults).await?;
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
    let (worst, failures) = liveness(setup.cluster, &ep, healed, budget).await?;
    for p in &mut procs {
        wait_child(&mut p.child, Duration::from_secs(60));
    }
    summary.liveness_max_ms = summary.liveness_max_ms.max(worst.as_millis() as u64);
    summary.liveness_failures += failures;
    if failures > 0 {
        say(&format!("{failures} keys were not grantable within {budget:?} of healing"));
        passed = false;
    }

    // The history, one per tier. A violation fails the gate, and so does
    // an inconclusive key: a key whose history the search could not decide
    // proves nothing.
    let tiers = collect(&ep, setup.cluster, &starts, setup.resource, &args.fence).await?;
    if !check_tiers(&ep.dir, &tiers, setup.resource.is_some(), summary, |_, _| None)? {
        passed = false;
    }
    if let Some(pending) = setup.restore.take() {
        let ep_after = Episode::new(ep.dir.join("after-restore"), args.keys, &format!("e{episode}r"));
        if !crate::restore::phase(setup, &ep_after, pending, &tiers, seed, summary, all_faults).await? {
            passed = false;
        }
    }
    Ok(passed)
}

/// Prints the first violations and inconclusive keys of each report, with
/// a timeline of each offending key.
pub(crate) fn report_failures(history: &History, reports: &[Report]) {
    for r in reports {
        for v in r.violations.iter().take(3) {
            eprintln!("  {:?} {:?} on {}: {}", v.checker, v.rule, v.key, v.explanation);
            eprint!("{}", timeline(history, &v.key));
        }
        for i in r.inconclusive.iter().take(3) {
            eprintln!("  {:?} inconclusive on {}: {}", r.checker, i.key, i.reason);
        }
    }
}

/// The plan with its first restore fault (the episode's end restores its
/// oldest snapshot) moved before its first epoch advance, if one follows: the restored snapshot is then older than
/// that advance, the case in which the restored epoch record and allocator
/// are behind epochs already used and only the arbiters' own records keep
/// the next epoch above them.
fn older_snapshot_first(mut plan: Vec<FaultKind>) -> Vec<FaultKind> {
    let restore = plan.iter().position(|k| *k == FaultKind::Restore);
    let advance = plan.iter().position(|k| *k == FaultKind::EpochAdvance);
    if let (Some(r), Some(a)) = (restore, advance)
        && a < r
    {
        let kind = plan.remove(r);
        plan.insert(a, kind);
    }
    plan
}

/// The faults of an episode: every kind once in random order (short
/// profile), or 64 drawn at random, as many as fit (long profile).
fn plan(profile: Profile, kinds: &[FaultKind], rng: &mut StdRng) -> Vec<FaultKind> {
    if profile == Profile::Short {
        let mut k = kinds.to_vec();
        k.shuffle(rng);
        k
    } else {
        (0..64).map(|_| kinds[rng.random_range(0..kinds.len())]).collect()
    }
}

/// Injects one fault with its own seed, drawn from the episode's `rng`,
/// and records it (or that it was not confirmed, after healing what it
/// may have left); restarts an arbiter that did not come back.
async fn strike(
    setup: &mut Setup<'_>,
    clients: &[ClientProc],
    keys: &[String],
    kind: FaultKind,
    rng: &mut StdRng,
    summary: &mut Summary,
    all_faults: &mut Vec<FaultRecord>,
) -> anyhow::Result<()> {
    let fault_seed = rng.random::<u64>();
    let mut f_rng = StdRng::seed_from_u64(fault_seed);
    let hold = Duration::from_millis(f_rng.random_range(2000..4000));
    let mut ctx = FaultCtx {
        net: setup.net,
        cluster: setup.cluster,
        clients,
        keys,
        t0: setup.t0,
        pending_restore: &mut setup.restore,
        leader_pause_max: setup.args.leader_pause_max,
        violations: Vec::new(),
    };
    let injected = faults::inject(&mut ctx, kind, fault_seed, &mut f_rng, hold).await;
    let found = std::mem::take(&mut ctx.violations);
    for v in &found {
        say(&format!("{} VIOLATION: {v}", kind.name()));
    }
    summary.count_fault_violations(&kind.name(), found);
    match injected {
        Ok(r) => {
            say(&format!("[{:>7.1}s] {}: {} — {}", r.at_ms as f64 / 1000.0, kind.name(), r.what, r.confirmed));
            // The restore fault counts once its restore phase confirms it.
            if kind != FaultKind::Restore {
                *summary.faults.entry(kind.name()).or_default() += 1;
            }
            all_faults.push(r);
        }
        Err(e) => {
            say(&format!("{} (seed {fault_seed}) NOT confirmed: {e:#}", kind.name()));
            summary.faults_unconfirmed.push(format!("{}: {e:#}", kind.name()));
            let _ = setup.net.heal();
            for p in &setup.cluster.proxies {
                p.clear();
            }
        }
    }
    // A killed arbiter or member that did not come back is restarted.
    for a in 0..setup.cluster.arbiters.len() {
        if setup.cluster.arbiter_pid(a).is_none() {
            setup.cluster.start_arbiter(a, setup.net)?;
        }
    }
    Ok(())
}

/// C1 and C3 over the history, and C2 when there is a fenced resource.
pub(crate) fn check(history: &History, fenced: bool) -> Vec<Report> {
    let mut reports = vec![etcd_log::check(history), linearizable::check(history, &linearizable::Config::default())];
    if fenced {
        reports.push(fence::check(history));
    }
    reports
}

/// Checks each tier's history ([`check`], plus what `extra` adds for the
/// tier), keeps it in `dir` (`history.json`, `coord-history.json`), adds
/// its counts and verdicts to `summary` and prints its failures. Returns
/// whether both passed.
pub(crate) fn check_tiers(
    dir: &Path,
    tiers: &Tiers,
    fenced: bool,
    summary: &mut Summary,
    extra: impl Fn(Tier, &History) -> Option<Report>,
) -> anyhow::Result<bool> {
    let mut passed = true;
    for (tier, history) in tiers.each() {
        let stats = history.stats();
        summary.count_history(&stats);
        if tier == Tier::Coord {
            summary.coord_grants += stats.ok_grants;
        }
        let mut reports = check(history, fenced);
        reports.extend(extra(tier, history));
        let file = dir.join(tier.file());
        std::fs::write(&file, serde_json::to_vec(history)?)?;
        summary.count_reports(&reports);
        summary.withdrawals += history.etcd.withdrawals.len();
        if !reports.iter().all(Report::passed) {
            passed = false;
            say(&format!("VIOLATIONS or INCONCLUSIVE keys on the {} tier; history kept in {}", tier.name(), file.display()));
            report_failures(history, &reports);
        }
    }
    Ok(passed)
}

/// The keys of an episode (or of its restore phase): `keys` entity-tier
/// keys `gate/<stem><n>` and as many coord-tier keys `gatecoord/<stem><n>`.
pub(crate) struct Episode {
    pub(crate) dir: PathBuf,
    pub(crate) keys: usize,
    pub(crate) prefix: String,
    pub(crate) coord_prefix: String,
}

impl Episode {
    pub(crate) fn new(dir: PathBuf, keys: usize, stem: &str) -> Self {
        Episode {
            dir,
            keys,
            prefix: format!("{}/{stem}", cluster::GATE_NAMESPACE),
            coord_prefix: format!("{}/{stem}", cluster::COORD_NAMESPACE),
        }
    }

    /// Every key, with the tier it lives on.
    fn all_keys(&self) -> Vec<(Tier, String)> {
        let mut out: Vec<(Tier, String)> = (0..self.keys).map(|k| (Tier::Entity, format!("{}{k}", self.prefix))).collect();
        out.extend((0..self.keys).map(|k| (Tier::Coord, format!("{}{k}", self.coord_prefix))));
        out
    }
}

/// The gate's two tiers: the entity cluster (three members, every
/// fault) and the coord cluster (one member outside the network faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    Entity,
    Coord,
}

impl Tier {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Tier::Entity => "entity",
            Tier::Coord => "coord",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Tier::Entity => "history.json",
            Tier::Coord => "coord-history.json",
        }
    }
}

/// An episode's history split by tier: each cluster has its own revisions
/// and epochs, so each tier's operations are checked against its own
/// cluster's log. Coord-tier session IDs carry the top bit
/// (`OpenSessionResponse.session_id`); in the coord history it is cleared,
/// so that a session is its lease ID there as on the entity tier.
pub(crate) struct Tiers {
    pub(crate) entity: History,
    pub(crate) coord: History,
}

impl Tiers {
    pub(crate) fn each(&self) -> [(Tier, &History); 2] {
        [(Tier::Entity, &self.entity), (Tier::Coord, &self.coord)]
    }
}

/// Where each cluster's log is read from: its revision and epoch when the
/// workload started.
pub(crate) struct LogStarts {
    pub(crate) entity: (i64, u32),
    pub(crate) coord: (i64, u32),
}

impl LogStarts {
    pub(crate) async fn now(cluster: &Cluster) -> anyhow::Result<Self> {
        let rev = cluster.etcd().await?.get("/", None).await?.header().map(|h| h.revision()).unwrap_or(1);
        let epoch = cluster::epoch_of(&cluster.holdfast_etcd().await?).await?;
        let coord = cluster.coord_etcd().await?;
        let coord_rev = coord.client.clone().get("/", None).await?.header().map(|h| h.revision()).unwrap_or(1);
        Ok(LogStarts { entity: (rev, epoch), coord: (coord_rev, cluster::epoch_of(&coord).await?) })
    }
}

pub(crate) struct ClientChild {
    pub(crate) child: Child,
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
pub(crate) fn spawn_clients(
    ep: &Episode,
    cluster: &Cluster,
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
        cmd.args(["client", "--arbiters", &cluster.arbiter_endpoints_for(p).join(",")])
            .arg("--client-ca")
            .arg(cluster.ca.ca_path())
            .arg("--client-cert")
            .arg(&cluster.client_cert.cert)
            .arg("--client-key")
            .arg(&cluster.client_cert.key)
            .args(["--process", &p.to_string(), "--seed", &(seed ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_string()])
            .args(["--keys", &ep.keys.to_string(), "--key-prefix", &ep.prefix, "--coord-key-prefix", &ep.coord_prefix])
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
        if let Some(m) = args.mutation.as_deref().filter(|m| super::client::is_client_mutation(m)) {
            cmd.args(["--mutation", m]);
        }
        if let (Some(f), Some(r)) = (&clock_file, &clock_report) {
            faults::write_clock_spec(f, 0, CLIENT_CLOCK_RATES[p as usize])?;
            cmd.arg("--clock-report").arg(r).args(["--clock-rate", &CLIENT_CLOCK_RATES[p as usize].to_string()]);
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

pub(crate) fn wait_child(child: &mut Child, timeout: Duration) {
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
pub(crate) async fn liveness(cluster: &Cluster, ep: &Episode, healed: Instant, budget: Duration) -> anyhow::Result<(Duration, usize)> {
    let endpoint = cluster.arbiter_endpoints()[0].clone();
    let client = holdfast_client::Client::connect(&holdfast_client::ClientConfig {
        endpoint,
        ca: cluster.ca.ca_path(),
        cert: cluster.client_cert.cert.clone(),
        key: cluster.client_cert.key.clone(),
    })
    .await?;
    // Opened like the keys are acquired: retried until the budget is spent
    // (right after a fault heals, the arbiter may still be re-checking etcd
    // and answer UNAVAILABLE); never opened in time, every key counts as
    // not granted.
    // One session per tier.
    let all = ep.all_keys();
    let mut sessions = Vec::new();
    for namespace in [cluster::GATE_NAMESPACE, cluster::COORD_NAMESPACE] {
        sessions.push(loop {
            match client.open_session_for(namespace, Some(CLIENT_TTL)).await {
                Ok(s) => break s,
                Err(_) if healed.elapsed() < budget => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(_) => return Ok((healed.elapsed(), all.len())),
            }
        });
    }
    // Recorded like any client (process 1000): its grants are in etcd's log.
    let log = client::Log::create(&ep.dir.join("liveness.jsonl"), 1000)?;
    let mut keys = Vec::new();
    for (tier, k) in &all {
        keys.push((&sessions[usize::from(*tier == Tier::Coord)], holdfast_model::LockKey::parse(k)?));
    }
    let mut worst = Duration::ZERO;
    let mut failures = 0;
    let waits = keys.iter().map(|(session, k)| {
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
    for s in sessions {
        let _ = s.close().await;
    }
    Ok((worst, failures))
}

/// Reads the clients' operation logs, both clusters' logs and the fence
/// log, split by tier.
pub(crate) async fn collect(
    ep: &Episode,
    cluster: &Cluster,
    starts: &LogStarts,
    resource: Option<&str>,
    fence: &str,
) -> anyhow::Result<Tiers> {
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
    let coord_ns = format!("{}/", cluster::COORD_NAMESPACE);
    let (mut coord_ops, entity_ops): (Vec<ClientOp>, Vec<ClientOp>) = ops.into_iter().partition(|o| match o.key() {
        Some(k) => k.starts_with(&coord_ns),
        None => o.session.is_some_and(|s| s < 0),
    });
    for o in &mut coord_ops {
        o.session = o.session.map(|s| s & i64::MAX);
    }
    let (rev, epoch) = starts.entity;
    let etcd = holdfast_fixtures::etcdlog::read_log(&cluster.etcd().await?, &ep.prefix, rev, epoch as u64).await?;
    let entity = History { ops: entity_ops, etcd, ..Default::default() };
    let (rev, epoch) = starts.coord;
    let etcd = holdfast_fixtures::etcdlog::read_log(&cluster.coord_etcd().await?.client, &ep.coord_prefix, rev, epoch as u64).await?;
    let coord = History { ops: coord_ops, etcd, ..Default::default() };
    let mut tiers = Tiers { entity, coord };
    for (tier, history) in tiers.each() {
        history
            .validate()
            .map_err(|e| anyhow::anyhow!("the clients' logs in {} are malformed ({} tier): {e}", ep.dir.display(), tier.name()))?;
    }
    if let Some(url) = resource {
        let res = resource::open(url, fence).await?;
        for (tier, key) in ep.all_keys() {
            let history = if tier == Tier::Coord { &mut tiers.coord } else { &mut tiers.entity };
            let record = resource::record_of(&key);
            for token in res.accepted_log(&record).await? {
                history.fence.push(FenceEntry { record: record.clone(), token, accepted: true, at_ns: 0, op: None });
            }
            let counter = res.counter(&record).await?;
            history.final_counters.insert(record, counter);
        }
        for history in [&mut tiers.entity, &mut tiers.coord] {
            let rejected: Vec<FenceEntry> = history
                .ops
                .iter()
                .filter(|o| o.outcome == Outcome::Fail)
                .filter_map(|o| match (&o.kind, o.token) {
                    (OpKind::Write { record, .. }, Some(token)) => {
                        Some(FenceEntry { record: record.clone(), token, accepted: false, at_ns: o.invoke_ns, op: None })
                    }
                    _ => None,
                })
                .collect();
            history.fence.extend(rejected);
        }
    }
    Ok(tiers)
}

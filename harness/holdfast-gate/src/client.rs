//! One gate client process (`holdfast-gate client`, started by the gate):
//! takes locks on a few shared keys, increments the key's record at the
//! fenced resource while holding, releases, and now and then vanishes
//! without releasing — its session expires while a "zombie" keeps the token
//! and writes after the expiry. Every operation is appended to a JSON-lines
//! file as a `holdfast_checkers::history::ClientOp`.
//!
//! Timestamps come from CLOCK_MONOTONIC through a raw system call, so they
//! stay comparable across processes even when libfaketime skews this
//! process's clock.

use super::resource::Resource;
use holdfast_checkers::history::{ClientOp, OpKind, Outcome};
use holdfast_client::{Client, ClientConfig, Error, ErrorReason, Session};
use holdfast_model::LockKey;
use holdfast_proto::v1::{AcquireRequest, ReleaseRequest};
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(clap::Args, Clone)]
pub struct ClientArgs {
    /// Comma-separated arbiter endpoints; this client prefers the one at
    /// index `process % n` and fails over to the others.
    #[arg(long)]
    arbiters: String,
    #[arg(long = "client-ca")]
    ca: PathBuf,
    #[arg(long = "client-cert")]
    cert: PathBuf,
    #[arg(long = "client-key")]
    key: PathBuf,
    /// This client's number in the history.
    #[arg(long)]
    process: u64,
    #[arg(long)]
    seed: u64,
    /// Number of shared lock keys (<key-prefix>0 ..).
    #[arg(long, default_value_t = 6)]
    keys: usize,
    /// Lock keys are <key-prefix><n>.
    #[arg(long, default_value = "gate/k")]
    key_prefix: String,
    /// A quarter of the operations lock <coord-key-prefix><n> instead, on a
    /// session of its own opened for that namespace's class (the coord
    /// tier's, in the gate).
    #[arg(long)]
    coord_key_prefix: Option<String>,
    /// Stop when this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Run for this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Session TTL.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    ttl: Duration,
    /// Append operations here (JSON lines).
    #[arg(long)]
    out: PathBuf,
    /// Write "<this process's monotonic ns> <raw monotonic ns>" here every
    /// 200 ms, so the gate can confirm that a clock fault took effect.
    #[arg(long)]
    clock_report: Option<PathBuf>,
    /// Reads `w` while a write is at its pause point, `h` while a key is
    /// held without a resource to write, `-` otherwise.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// The fenced resource (see `holdfast-gate --help`); none: locks only.
    #[arg(long)]
    resource: Option<String>,
    /// Fence mode of the resource (correct, unfenced).
    #[arg(long, default_value = "correct")]
    fence: String,
    /// The rate libfaketime runs this process's clock at (the gate sets
    /// it): recorded deadlines are converted from this process's clock to
    /// the shared raw one with it.
    #[arg(long, default_value_t = 1.0)]
    clock_rate: f64,
    /// Test builds only: switch on this client mutation
    /// (`holdfast_client::mutations`).
    #[arg(long)]
    mutation: Option<String>,
}

/// CLOCK_MONOTONIC without libc's (and so libfaketime's) wrapper.
pub fn raw_monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to the pointer we pass.
    unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_MONOTONIC, &mut ts as *mut libc::timespec) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub struct Log {
    file: Mutex<std::fs::File>,
    process: u64,
    /// The rate this process's clock runs at against the raw one.
    clock_rate: f64,
}

impl Log {
    pub fn create(path: &std::path::Path, process: u64) -> std::io::Result<Self> {
        Self::create_at_rate(path, process, 1.0)
    }

    pub fn create_at_rate(path: &std::path::Path, process: u64, clock_rate: f64) -> std::io::Result<Self> {
        Ok(Log { file: Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?), process, clock_rate })
    }

    pub fn push(&self, kind: OpKind, session: Option<u64>, token: Option<u64>, invoke_ns: u64, outcome: Outcome) {
        // One clock reading: when the answer came, or when the client gave up.
        let end_ns = raw_monotonic_ns();
        let op = ClientOp {
            process: self.process,
            kind,
            session: session.map(|s| s as i64),
            token,
            invoke_ns,
            complete_ns: (outcome != Outcome::Unknown).then_some(end_ns),
            outcome,
            gave_up_ns: (outcome == Outcome::Unknown).then_some(end_ns),
        };
        self.write(&op);
    }

    fn write(&self, op: &ClientOp) {
        let line = serde_json::to_string(op).expect("a ClientOp serialises");
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(f, "{line}");
    }
}

/// Every keepalive the session sends is recorded too.
impl holdfast_client::KeepaliveObserver for Log {
    fn sent(&self, _session: u64) -> u64 {
        raw_monotonic_ns()
    }
    fn answered(&self, session: u64, mark: u64, outcome: holdfast_client::KeepaliveOutcome) {
        let outcome = match outcome {
            holdfast_client::KeepaliveOutcome::Renewed => Outcome::Ok,
            holdfast_client::KeepaliveOutcome::Gone => Outcome::Fail,
            holdfast_client::KeepaliveOutcome::Unknown => Outcome::Unknown,
        };
        self.push(OpKind::Keepalive, Some(session), None, mark, outcome);
    }
    /// The deadline is on this process's clock (tokio's, which libfaketime
    /// fakes); it is recorded on the raw one: the raw time at which this
    /// clock, running at `clock_rate`, will reach it. Clock jumps only move
    /// this clock forward, so a later jump can only bring the real deadline
    /// earlier than recorded.
    fn deadline(&self, session: u64, until: tokio::time::Instant) {
        let now_raw = raw_monotonic_ns();
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let until_ns = now_raw + (left.as_nanos() as f64 / self.clock_rate) as u64;
        self.write(&ClientOp {
            process: self.process,
            kind: OpKind::Deadline { until_ns },
            session: Some(session as i64),
            token: None,
            invoke_ns: now_raw,
            complete_ns: Some(now_raw),
            outcome: Outcome::Ok,
            gave_up_ns: None,
        });
    }
}

/// Refusals that prove the call had no effect are failures; anything else
/// (timeouts, lost connections, a session lost while the call was in
/// flight) leaves the outcome unknown.
pub fn outcome_of(e: &Error) -> Outcome {
    match e.reason() {
        Some(
            ErrorReason::Contention
            | ErrorReason::Leak
            | ErrorReason::Sealed
            | ErrorReason::InvalidArgument
            | ErrorReason::Denied
            | ErrorReason::Unauthenticated
            | ErrorReason::Moving,
        ) => Outcome::Fail,
        _ => Outcome::Unknown,
    }
}

pub async fn run(args: ClientArgs) -> u8 {
    match work(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gate client: {e:#}");
            70
        }
    }
}

async fn work(args: ClientArgs) -> anyhow::Result<()> {
    if let Some(m) = &args.mutation {
        enable_mutation(m)?;
    }
    anyhow::ensure!(args.clock_rate > 0.0, "--clock-rate must be positive, not {}", args.clock_rate);
    let endpoints: Vec<String> = args.arbiters.split(',').map(str::to_string).collect();
    let clients: Vec<Client> = endpoints
        .iter()
        .map(|e| {
            Client::connect_lazy(&ClientConfig { endpoint: e.clone(), ca: args.ca.clone(), cert: args.cert.clone(), key: args.key.clone() })
        })
        .collect::<Result<_, _>>()?;
    let log = Arc::new(Log::create_at_rate(&args.out, args.process, args.clock_rate)?);
    let resource: Option<Arc<dyn Resource>> = match &args.resource {
        Some(r) => Some(super::resource::open(r, &args.fence).await?),
        None => None,
    };
    if let Some(path) = args.clock_report.clone() {
        // A thread, not a task: a backward clock jump stalls tokio's timers.
        // Written aside and renamed, so the gate never reads half a report.
        std::thread::spawn(move || {
            loop {
                let _ = super::faults::write_aside(&path, &format!("{} {}\n", libc_monotonic_ns(), raw_monotonic_ns()));
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let start = raw_monotonic_ns();
    let end = start + args.duration.as_nanos() as u64;
    let mut preferred = args.process as usize % clients.len();
    // One session per tier: [entity, coord].
    let mut sessions: [Option<Session>; 2] = [None, None];
    let coord_namespace = args.coord_key_prefix.as_deref().map(|p| p.split('/').next().unwrap_or(p).to_string());
    let mut next_abandon = start + rng.random_range(3_000_000_000..9_000_000_000u64);
    let mut zombies = Vec::new();
    let mut released: Option<(LockKey, u64, u64)> = None;
    let stop = || args.stop_file.as_ref().is_some_and(|f| f.exists());
    while raw_monotonic_ns() < end && !stop() {
        let tier = usize::from(coord_namespace.is_some() && rng.random_bool(0.25));
        let s = match &sessions[tier] {
            Some(s) if s.can_start() && s.remaining_ttl() > Duration::from_millis(1500) => s,
            _ => {
                sessions[tier] = None;
                let invoke = raw_monotonic_ns();
                let opened = match (tier, &coord_namespace) {
                    (1, Some(ns)) => clients[preferred].open_session_for_observed(ns, args.ttl, log.clone()).await,
                    _ => clients[preferred].open_session_observed(args.ttl, log.clone()).await,
                };
                match opened {
                    Ok(s) => {
                        log.push(OpKind::OpenSession { ttl_ms: args.ttl.as_millis() as u64 }, Some(s.id()), None, invoke, Outcome::Ok);
                        sessions[tier].insert(s)
                    }
                    Err(_) => {
                        preferred = (preferred + 1) % clients.len();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
        };
        let prefix = if tier == 1 { args.coord_key_prefix.as_deref().unwrap_or(&args.key_prefix) } else { &args.key_prefix };
        let key = LockKey::parse(&format!("{prefix}{}", rng.random_range(0..args.keys)))?;
        // Raw RPCs, not Session::acquire: the library releases a grant that
        // arrives after the session was lost, and that release would be
        // missing from the history. Here every release is recorded.
        let sid = s.id();
        let req = AcquireRequest {
            session_id: sid,
            namespace: key.namespace().into(),
            key: key.key().into(),
            wait_millis: rng.random_range(100..1000),
        };
        let invoke = raw_monotonic_ns();
        let token = match clients[preferred].rpc().acquire(req).await.map_err(Error::from) {
            Ok(r) => {
                log.push(OpKind::Acquire { key: key.to_string() }, Some(sid), Some(r.get_ref().token), invoke, Outcome::Ok);
                r.into_inner().token
            }
            Err(e) => {
                log.push(OpKind::Acquire { key: key.to_string() }, Some(sid), None, invoke, outcome_of(&e));
                match e.reason() {
                    // The session is gone (expired, or ended by an epoch
                    // advance): open a new one at once, as a library would.
                    Some(ErrorReason::SessionNotFound) => {
                        sessions[tier] = None;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    // The arbiter (or its way to etcd) failed: the next
                    // acquire goes to the other one. The session stays
                    // while its keepalives say it lives (any arbiter serves
                    // any session), as a library's would: a client that
                    // kept believing in a lease etcd ended is what the
                    // deadline rule (C1) exists to catch.
                    Some(ErrorReason::Unavailable) | None => {
                        preferred = (preferred + 1) % clients.len();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    // Waited out, or refused for a reason retrying at once
                    // would not change (sealed, denied): back off a little.
                    Some(ErrorReason::Contention) => {}
                    Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
                continue;
            }
        };
        let record = super::resource::record_of(&key.to_string());
        if raw_monotonic_ns() >= next_abandon {
            // Vanish: stop renewing, keep the token, write after the expiry.
            next_abandon = raw_monotonic_ns() + rng.random_range(3_000_000_000..9_000_000_000u64);
            drop(sessions[tier].take());
            let late = args.ttl + Duration::from_millis(rng.random_range(300..2500));
            let think = Duration::from_millis(rng.random_range(0..40));
            let (log, resource, record, state) = (log.clone(), resource.clone(), record.clone(), args.state_file.clone());
            zombies.push(tokio::spawn(async move {
                tokio::time::sleep(late).await;
                if let Some(res) = resource {
                    write(&log, &*res, &key, &record, sid, token, think, state.as_deref()).await;
                }
            }));
            continue;
        }
        if let Some(res) = &resource {
            if s.can_start() {
                let think = Duration::from_millis(rng.random_range(5..40));
                write(&log, &**res, &key, &record, sid, token, think, args.state_file.as_deref()).await;
            }
        } else {
            // Holding: the client-pause fault prefers a client in this state.
            set_state(args.state_file.as_deref(), "h");
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
            set_state(args.state_file.as_deref(), "-");
        }
        release(&log, &clients[preferred], &key, sid, token).await;
        // Now and then a release is delivered again later (a retry after a
        // lost answer, a duplicated packet): it must delete nothing.
        if let Some((k, s, t)) = released.take().filter(|_| rng.random_bool(0.05)) {
            release(&log, &clients[preferred], &k, s, t).await;
        }
        released = Some((key, sid, token));
    }
    // Stopped: renew nothing more. A hold whose release failed (etcd or
    // the arbiter was down) ends with its session's lease, within the TTL
    // the liveness check allows for; renewing it while the zombies below
    // sleep out their expiries (up to TTL + 2.5 s) would keep that key
    // from everyone past the check's budget.
    drop(sessions);
    for z in zombies {
        let _ = z.await;
    }
    Ok(())
}

/// Writes `state` to the state file, if there is one (see `--state-file`).
fn set_state(file: Option<&std::path::Path>, state: &str) {
    if let Some(f) = file {
        let _ = std::fs::write(f, state);
    }
}

/// Whether `name` is a client mutation (the gate passes it to its clients,
/// not to the arbiters).
pub fn is_client_mutation(name: &str) -> bool {
    holdfast_client::MUTATION_NAMES.contains(&name)
}

#[cfg(feature = "mutations")]
fn enable_mutation(name: &str) -> anyhow::Result<()> {
    holdfast_client::mutations::enable(name).map_err(anyhow::Error::msg)
}

#[cfg(not(feature = "mutations"))]
fn enable_mutation(name: &str) -> anyhow::Result<()> {
    anyhow::bail!("--mutation {name}: this gate was built without the `mutations` feature (build with --features holdfast-gate/mutations)")
}

/// Refuses a client mutation this build cannot switch on, before anything
/// starts.
pub fn check_client_mutation(name: &str) -> anyhow::Result<()> {
    if cfg!(feature = "mutations") { Ok(()) } else { enable_mutation(name) }
}

pub async fn release(log: &Log, client: &Client, key: &LockKey, sid: u64, token: u64) {
    let invoke = raw_monotonic_ns();
    let req = ReleaseRequest { session_id: sid, namespace: key.namespace().into(), key: key.key().into(), token };
    let outcome = match client.rpc().release(req).await.map_err(Error::from) {
        Ok(r) if r.get_ref().released => Outcome::Ok,
        Ok(_) => Outcome::Fail,
        Err(e) => outcome_of(&e),
    };
    log.push(OpKind::Release { key: key.to_string() }, Some(sid), Some(token), invoke, outcome);
}

#[allow(clippy::too_many_arguments)]
async fn write(
    log: &Log,
    res: &dyn Resource,
    key: &LockKey,
    record: &str,
    sid: u64,
    token: u64,
    think: Duration,
    state: Option<&std::path::Path>,
) {
    let invoke = raw_monotonic_ns();
    let outcome = match res.increment(record, token, think, state).await {
        Ok(true) => Outcome::Ok,
        Ok(false) => Outcome::Fail,
        Err(_) => Outcome::Unknown,
    };
    log.push(OpKind::Write { key: key.to_string(), record: record.to_string() }, Some(sid), Some(token), invoke, outcome);
}

/// CLOCK_MONOTONIC through libc, as std and tokio read it: the clock
/// libfaketime fakes.
fn libc_monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to the pointer we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

use holdfast_approval::Operation;
use holdfast_cli::conn::{self, ConnArgs, CoordArgs, EtcdArgs};
use holdfast_cli::exit;
use holdfast_store::epoch::{self, EpochError};
use holdfast_store::etcd::Etcd;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct EpochArgs {
    #[command(subcommand)]
    action: EpochAction,
}

#[derive(clap::Subcommand)]
enum EpochAction {
    /// Initialise epoch 1 on a new etcd cluster (talks to etcd directly).
    ///
    /// Run once per cluster, before the first arbiter serves. Refuses if the
    /// epoch already exists. Moves a fresh cluster's revision to 1024 first,
    /// so that a later restore from any snapshot is detectable.
    Init(InitArgs),
    /// Show the epoch the arbiter serves, and whether it is sealed.
    Status {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Write a request to advance the epoch of a sealed (restored) cluster,
    /// for two approvers to sign (step 1 of the DR procedure).
    #[command(after_long_help = ADVANCE_REQUEST_HELP)]
    AdvanceRequest(AdvanceRequestArgs),
    /// Carry out a signed epoch advance: verify two approvals, then one
    /// transaction (what `holdfast-epoch-advance@.service` runs).
    #[command(after_long_help = ADVANCE_HELP)]
    Advance(AdvanceArgs),
}

const ADVANCE_REQUEST_HELP: &str = "\
Reads the cluster (it must be sealed, unless --unsealed), asks every arbiter
(--endpoint, comma-separated: all of them) for the highest epoch it ever
served, reads the epoch allocator (/sys/epochs, on the coord cluster when
--coord-endpoint names one, and the entity cluster's own), and writes
STATE_DIR/requests/epoch-advance-<nonce>.toml naming the cluster, the epoch
in force, the highest epoch known, the new epoch above it, the cluster ID
etcd reports now, a random nonce, the requester, the reason and an expiry
(at most 24h). Arbiters keep what they served on their own disks, so after
a restore from a snapshot older than an earlier advance the new epoch is
still above every epoch ever used, from whichever host the request is
written. STATE_DIR/epochs.log (this host's advances) counts too; pass
--new-epoch to go higher still.

Then the requester and a different approver, both dr-operator in
approvers.toml, sign it:
  holdfastctl approve REQUEST --ssh-key KEY        (each of the two)
and the unit carries it out:
  systemctl start holdfast-epoch-advance@epoch-advance-<nonce>.service

Exit status: 0 written; 64 bad arguments (no --endpoint, --valid-for over
24h); 65 the cluster is not sealed, the requester is not a dr-operator, or
the arbiters serve another cluster; 69 etcd or an arbiter unreachable; 78
approvers.toml unreadable.";

const ADVANCE_HELP: &str = "\
Verifies REQUEST against approvers.toml: the requester and a different
approver both signed it (sshsig, namespace holdfast-request) with listed
keys, both hold dr-operator, it has not expired and it is valid for at most
24h. Then asks every arbiter (--endpoint) again for the highest epoch it
served: any at or above the new epoch refuses (a later advance, or a replay
after another restore). Then one etcd transaction compares the epoch, the
allocator (/sys/epochs: nothing at or above the new epoch allocated) and
that the nonce is unused, writes the new epoch bound to the cluster's ID,
log position and a fresh mint, raises the allocator, deletes every hold,
waiter and session record and the seal, and records the nonce; the old
sessions' leases are revoked after. Arbiters unseal by themselves when they
see the new epoch. Anything refused changes nothing.

With a separate coord cluster (--coord-endpoint, HOLDFAST_COORD_ENDPOINT),
the epoch is allocated there and the nonce recorded there first, in one
coord transaction (so a restore of the entity cluster rolls back neither),
then the entity transaction writes the epoch. Should the entity cluster
change in between, the allocated epoch stays unused and the entity cluster
unchanged: write a new request.

Signatures: --signature FILE (twice), or by default every REQUEST.*.sig.

Exit status: 0 advanced; 64 no --endpoint; 65 the cluster is not as the
request says (epoch, cluster ID), the request was already carried out, or
an arbiter or the allocator already knows an epoch at or above the new one;
69 etcd or an arbiter unreachable; 77 the approvals do not hold (one
signature, the same person twice, no role, a key not listed, expired, valid
for more than 24h, changed after signing, another namespace); 78
approvers.toml or the request unreadable.";

#[derive(clap::Args)]
struct AdvanceRequestArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
    /// Your name in approvers.toml (you sign the request too).
    #[arg(long)]
    requester: String,
    /// Why: the incident, the restore, the ticket.
    #[arg(long)]
    reason: String,
    /// The cluster's name (as in arbiter.toml's cluster_name; default: the
    /// one the arbiters serve).
    #[arg(long)]
    cluster: Option<String>,
    /// The lowest new epoch acceptable (default: one above every epoch
    /// this cluster, the allocator, every arbiter and STATE_DIR/epochs.log
    /// know); at most 16 above that highest known epoch.
    #[arg(long)]
    new_epoch: Option<u32>,
    /// How long the request stays valid (at most 24h).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    valid_for: Duration,
    /// Write the request although the cluster is not sealed (an advance
    /// ends every hold).
    #[arg(long)]
    unsealed: bool,
    #[command(flatten)]
    files: crate::approve::Files,
}

#[derive(clap::Args)]
struct AdvanceArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
    /// The request file.
    #[arg(long)]
    request: PathBuf,
    /// An approval (repeat); default: every REQUEST.*.sig.
    #[arg(long)]
    signature: Vec<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    files: crate::approve::Files,
}

/// The highest epoch in STATE_DIR/epochs.log (lines `epoch N cluster ID at UNIX request NONCE`).
fn highest_recorded(state_dir: &Path) -> u32 {
    std::fs::read_to_string(state_dir.join("epochs.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("epoch ")?.split_whitespace().next()?.parse::<u32>().ok())
        .max()
        .unwrap_or(0)
}

/// What the arbiters report of the epochs they served.
struct Served {
    /// The cluster advanced (every arbiter asked grants on it, or refused).
    cluster: String,
    /// The highest epoch any of them served, on any cluster (0: none yet):
    /// epochs are allocated once for every cluster, so a new one goes above
    /// the coord cluster's as well as the entity cluster's.
    highest: u32,
    /// One line per arbiter, for the operator.
    lines: Vec<String>,
}

/// Asks every arbiter in --endpoint for the highest epoch it served. Every
/// one must answer, and all must serve one cluster (`cluster` when given):
/// an arbiter left out could be the one that served the highest epoch.
async fn arbiters_served(conn: &ConnArgs, cluster: Option<&str>) -> Result<Served, u8> {
    if conn.endpoint.as_deref().is_none_or(|e| e.trim().is_empty()) {
        eprintln!(
            "holdfastctl: an epoch advance asks every arbiter for the highest epoch it served: pass --endpoint with all of them, \
             comma-separated (or HOLDFAST_ENDPOINT), and --ca/--cert/--key of any identity they admit"
        );
        return Err(exit::USAGE);
    }
    let base = conn.config()?;
    let mut served = Served { cluster: cluster.unwrap_or_default().to_string(), highest: 0, lines: Vec::new() };
    for endpoint in base.endpoint.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let cfg = holdfast_client::ClientConfig { endpoint: endpoint.to_string(), ..base.clone() };
        let status = match holdfast_client::Client::connect(&cfg).await {
            Ok(client) => client.server_status().await,
            Err(e) => Err(e),
        };
        let status = status.map_err(|e| {
            eprintln!(
                "holdfastctl: arbiter {endpoint} did not say which epochs it served ({e}); every arbiter must answer, \
                 since the one left out could be the one that served the highest epoch. Start it, or leave it out of \
                 --endpoint only if its host is gone for good"
            );
            exit::UNAVAILABLE
        })?;
        if served.cluster.is_empty() {
            served.cluster = status.cluster.clone();
        }
        // The entity cluster (`cluster`), or the coord cluster it also grants on.
        if status.cluster != served.cluster && !status.clusters.iter().any(|c| c.name == served.cluster) {
            let names: Vec<&str> = std::iter::once(status.cluster.as_str())
                .chain(status.clusters.iter().map(|c| c.name.as_str()).filter(|n| *n != status.cluster))
                .collect();
            eprintln!(
                "holdfastctl: arbiter {endpoint} grants on cluster(s) {names:?}, not {:?}; list the arbiters of one cluster in --endpoint (and name it with --cluster)",
                served.cluster
            );
            return Err(exit::INVALID);
        }
        let high = status.served.iter().map(|s| s.epoch).max().unwrap_or(0);
        served.highest = served.highest.max(high);
        served.lines.push(match status.served.iter().max_by_key(|s| s.epoch) {
            None => format!("arbiter {endpoint}: has served no epoch"),
            Some(s) if s.cluster == served.cluster => format!("arbiter {endpoint}: has served up to epoch {high}"),
            Some(s) => format!("arbiter {endpoint}: has served up to epoch {high} (of cluster {})", s.cluster),
        });
    }
    Ok(served)
}

/// The evidence again, at apply time: an arbiter that served the request's
/// new epoch or a later one means a later advance, or this request replayed
/// after another restore (which rolled its nonce record back).
/// Refuses an advance to an epoch some arbiter already served; returns the
/// highest epoch the arbiters report they served.
async fn refuse_served(conn: &ConnArgs, op: &Operation) -> Result<u32, u8> {
    let Operation::EpochAdvance { cluster, new_epoch, .. } = op else { return Ok(0) };
    let arbiters = arbiters_served(conn, Some(cluster)).await?;
    if arbiters.highest >= *new_epoch {
        eprintln!(
            "holdfastctl: refused, nothing was changed: an arbiter already served epoch {} of cluster {cluster}, at or above \
             the requested {new_epoch} (a later advance, or this request replayed after another restore): {}. Write a new request",
            arbiters.highest,
            arbiters.lines.join("; ")
        );
        return Err(exit::INVALID);
    }
    Ok(arbiters.highest)
}

/// etcd with the --etcd-* credentials, or the exit status to return (69).
pub async fn connect(etcd: &EtcdArgs) -> Result<Etcd, u8> {
    Etcd::connect(&etcd.config()).await.map_err(|e| {
        eprintln!("holdfastctl: {e:#}");
        exit::UNAVAILABLE
    })
}

/// The coord cluster named by --coord-endpoint (`None`: the entity cluster
/// serves the coord tier too), or the exit status to return (69).
pub async fn connect_coord(coord: &CoordArgs, etcd: &EtcdArgs) -> Result<Option<Etcd>, u8> {
    let Some(config) = coord.config(etcd) else { return Ok(None) };
    Etcd::connect(&config).await.map(Some).map_err(|e| {
        eprintln!("holdfastctl: the coord cluster (--coord-endpoint): {e:#}");
        exit::UNAVAILABLE
    })
}

async fn advance_request(conn: &ConnArgs, args: AdvanceRequestArgs) -> u8 {
    if args.valid_for > holdfast_approval::request::MAX_VALIDITY {
        eprintln!("holdfastctl: --valid-for {:?} is over the 24h a request may be valid; ask for less", args.valid_for);
        return exit::USAGE;
    }
    let approvers = match crate::approve::load_approvers(&args.files.approvers) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match approvers.approvers.get(&args.requester) {
        None => {
            eprintln!("holdfastctl: {:?} is not an approver in {}", args.requester, args.files.approvers.display());
            return exit::INVALID;
        }
        Some(a) if !a.roles.contains(&holdfast_approval::Role::DrOperator) => {
            eprintln!("holdfastctl: {} is not a dr-operator in {}", a.name, args.files.approvers.display());
            return exit::INVALID;
        }
        Some(_) => {}
    }
    let arbiters = match arbiters_served(conn, args.cluster.as_deref()).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let etcd = match connect(&args.etcd).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let sys = match epoch::read_sys(&etcd).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfastctl: reading /sys/epoch: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let Some((current, _)) = sys.epoch else {
        eprintln!("holdfastctl: the epoch is not initialised; a new cluster needs `holdfastctl epoch init`, not an advance");
        return exit::INVALID;
    };
    if sys.seal.is_none() && !args.unsealed {
        eprintln!(
            "holdfastctl: cluster {} (epoch {}) is not sealed; an advance ends every hold. Pass --unsealed if that is what you want",
            arbiters.cluster, current.epoch
        );
        return exit::INVALID;
    }
    let members = etcd.member_status().await;
    let Some(cluster_id) = members.iter().find_map(|m| m.as_ref().ok().map(|m| m.cluster_id)) else {
        eprintln!("holdfastctl: no etcd member answered Status; every member must be reachable for an advance");
        return exit::UNAVAILABLE;
    };
    let coord = match connect_coord(&args.coord, &args.etcd).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let allocated = match epoch::highest_allocated(&etcd, coord.as_ref()).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("holdfastctl: reading the epoch allocator: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let recorded = highest_recorded(&args.files.state_dir);
    let highest_known = current.epoch.max(allocated).max(arbiters.highest).max(recorded);
    let floor = highest_known.saturating_add(1);
    if floor > holdfast_model::token::MAX_EPOCH {
        eprintln!("holdfastctl: epoch {highest_known} is the last one that fits in a token; this cluster cannot be advanced further");
        return exit::INVALID;
    }
    let new_epoch = args.new_epoch.unwrap_or(floor).max(floor);
    let step = holdfast_approval::request::MAX_EPOCH_STEP;
    if new_epoch - highest_known > step {
        eprintln!(
            "holdfastctl: --new-epoch {new_epoch} is more than {step} above {highest_known}, the highest epoch known; \
             epochs are few (15 bits of a token), so ask for at most {} (without --new-epoch: {floor})",
            highest_known + step
        );
        return exit::USAGE;
    }
    let op =
        Operation::EpochAdvance { cluster: arbiters.cluster.clone(), expected_epoch: current.epoch, new_epoch, cluster_id, highest_known };
    let (request, path) = match crate::approve::new_request(&args.files, &args.requester, &args.reason, op, args.valid_for) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(seal) = &sys.seal {
        println!("sealed    {}", seal.reason);
    }
    println!("epoch {} in force; allocator {allocated}; this host's epochs.log {recorded}", current.epoch);
    for line in &arbiters.lines {
        println!("{line}");
    }
    println!("new epoch {new_epoch}, above {highest_known}, the highest known");
    println!(
        "
wrote {p}

Next: {req} and a different dr-operator each sign it, unchanged:
  holdfastctl approve {p} --ssh-key KEY
then carry it out:
  systemctl start holdfast-epoch-advance@{name}.service
  (or: holdfastctl epoch advance --request {p})",
        p = path.display(),
        req = args.requester,
        name = request.name(),
    );
    exit::OK
}

async fn advance(conn: &ConnArgs, args: AdvanceArgs) -> u8 {
    let approved = match crate::approve::verified(&args.files, &args.request, &args.signature) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let now = crate::approve::now_unix();
    let target = match epoch::approved_target(&approved, now) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("holdfastctl: {}: {e}; nothing was changed", args.request.display());
            return exit::INVALID;
        }
    };
    let (expected_epoch, cluster_id) = (target.expected, target.cluster_id.unwrap_or_default());
    let etcd = match connect(&args.etcd).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let coord = match connect_coord(&args.coord, &args.etcd).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    // A replay etcd still remembers is named as one (the coord cluster keeps
    // nonces across an entity restore); the arbiters' records catch the one
    // it forgot (a restore rolled the nonce record back).
    if let Err(e) = epoch::nonce_unused_via(&etcd, coord.as_ref(), &target).await {
        return refused(e);
    }
    let target = match refuse_served(conn, &approved.request.operation).await {
        Ok(served) => epoch::Target { known: served, ..target },
        Err(code) => return code,
    };
    match epoch::advance_via(&etcd, coord.as_ref(), &target).await {
        Ok(done) => {
            let line =
                format!("epoch {} cluster {} at {now} request {}\n", done.record.epoch, done.record.cluster_id, approved.request.nonce);
            let log = args.files.state_dir.join("epochs.log");
            let recorded = std::fs::create_dir_all(&args.files.state_dir).and_then(|()| {
                use std::io::Write;
                std::fs::OpenOptions::new().create(true).append(true).open(&log)?.write_all(line.as_bytes())
            });
            if let Err(e) = &recorded {
                eprintln!(
                    "holdfastctl: the epoch advanced, but {} could not record it ({e}); add this line by hand: {line}",
                    log.display()
                );
            }
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"epoch": done.record.epoch, "cluster_id": done.record.cluster_id.to_string(),
                        "ended_sessions": done.old_leases.len(), "signers": approved.signers})
                );
            } else {
                println!(
                    "advanced cluster {cluster_id} from epoch {expected_epoch} to {}; {} session(s) ended; approved by {}",
                    done.record.epoch,
                    done.old_leases.len(),
                    approved.signers.join(" and ")
                );
                println!("the arbiters unseal by themselves within their seal.check_interval: `holdfastctl epoch status`");
            }
            exit::OK
        }
        Err(e) => refused(e),
    }
}

/// Prints why an advance did not happen; the exit status (65 the cluster is
/// not as the request says, 69 otherwise).
fn refused(e: EpochError) -> u8 {
    match e {
        EpochError::Mismatch { .. }
        | EpochError::WrongCluster { .. }
        | EpochError::NonceUsed(_)
        | EpochError::NotAbove { .. }
        | EpochError::Allocated { .. }
        | EpochError::TooFar { .. }
        | EpochError::Spent { .. } => {
            eprintln!("holdfastctl: refused: {e}");
            exit::INVALID
        }
        e => {
            eprintln!("holdfastctl: epoch advance failed, nothing was changed: {e}");
            exit::UNAVAILABLE
        }
    }
}

#[derive(clap::Args)]
struct InitArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn run(conn: &ConnArgs, args: EpochArgs) -> u8 {
    match args.action {
        EpochAction::Init(e) => init(e).await,
        EpochAction::Status { json } => status(conn, json).await,
        EpochAction::AdvanceRequest(a) => advance_request(conn, a).await,
        EpochAction::Advance(a) => advance(conn, a).await,
    }
}

async fn init(args: InitArgs) -> u8 {
    let etcd = match connect(&args.etcd).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let coord = match connect_coord(&args.coord, &args.etcd).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let quiet = args.json;
    match epoch::init_via(&etcd, coord.as_ref(), |m| {
        if !quiet {
            eprintln!("holdfastctl: {m}")
        }
    })
    .await
    {
        Ok(r) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"epoch": r.epoch, "cluster_id": format!("{:x}", r.cluster_id), "log_floor": r.log_floor})
                );
            } else {
                println!("initialised epoch {} for etcd cluster {:x}", r.epoch, r.cluster_id);
            }
            exit::OK
        }
        Err(EpochError::AlreadyInitialised(n)) => {
            eprintln!("holdfastctl: the epoch is already initialised (epoch {n}); nothing was changed");
            exit::USAGE
        }
        Err(e) => {
            eprintln!("holdfastctl: epoch init failed: {e}");
            exit::UNAVAILABLE
        }
    }
}

async fn status(conn: &ConnArgs, json: bool) -> u8 {
    let client = match conn.connect().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let s = match client.server_status().await {
        Ok(s) => s,
        Err(e) => return conn::report(&e),
    };
    let served: Vec<String> = s.served.iter().map(|e| format!("{} epoch {} (cluster ID {})", e.cluster, e.epoch, e.cluster_id)).collect();
    // With a coord cluster of its own, its state after the entity cluster's.
    let coord: Vec<String> = s
        .clusters
        .iter()
        .skip(1)
        .map(|c| {
            let state = if c.serving {
                format!("serving epoch {}", c.epoch)
            } else if c.sealed {
                format!("SEALED: {}", c.sealed_reason)
            } else {
                c.sealed_reason.clone()
            };
            format!("{:<12} {state} (cluster {}: the coord tier's keys)", c.tiers, c.name)
        })
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "epoch": s.epoch, "cluster_id": s.cluster_id, "sealed": s.sealed, "serving": s.serving,
                "sealed_reason": s.sealed_reason, "etcd_version": s.etcd_version, "cluster": s.cluster,
                "served": s.served.iter().map(|e| serde_json::json!({"cluster": e.cluster, "epoch": e.epoch, "cluster_id": e.cluster_id})).collect::<Vec<_>>(),
                "clusters": s.clusters.iter().map(|c| serde_json::json!({
                    "name": c.name, "tiers": c.tiers, "epoch": c.epoch, "cluster_id": c.cluster_id,
                    "sealed": c.sealed, "sealed_reason": c.sealed_reason, "serving": c.serving,
                })).collect::<Vec<_>>(),
            })
        );
        return exit::OK;
    }
    if s.sealed {
        println!("state        SEALED: granting nothing");
        println!("reason       {}", s.sealed_reason);
        println!("etcd         {}", s.etcd_version);
        println!("served       {}", if served.is_empty() { "nothing yet".to_string() } else { served.join(", ") });
    } else if !s.serving {
        println!("state        not serving yet");
        println!("reason       {}", s.sealed_reason);
    } else {
        println!("state        serving");
        println!("epoch        {}", s.epoch);
        println!("cluster id   {}", s.cluster_id);
        println!("etcd         {}", s.etcd_version);
        println!("served       {}", served.join(", "));
    }
    for line in &coord {
        println!("{line}");
    }
    exit::OK
}

//! `holdfastctl status`: one screen for an operator, read from etcd.
//!
//! The published class set (`/sys/policy`), the controller's last refused
//! change (`/sys/policy-status`), the epoch and the seal (`/sys/epoch`,
//! `/sys/seal`, read by `holdfast_store::epoch::read_sys`, the same read the
//! arbiter's seal check uses) and the controller leader (its election key).
//! Nothing about holds is read, so nothing printed can rebuild a token.

use crate::etcdconn;
use holdfast_cli::conn::{CoordArgs, EtcdArgs};
use holdfast_cli::exit;
use holdfast_model::layout::{CONTROLLER_ELECTION, EpochRecord, POLICY_KEY, POLICY_STATUS_KEY, SealRecord};
use holdfast_store::epoch::{self, EpochError};
use holdfast_store::etcd::Etcd;
use holdfast_store::policy::{self, PolicyStatus, PublishedPolicy, Refusal, Stored};
use serde_json::{Value, json};
use std::time::{Duration, UNIX_EPOCH};

pub const STATUS_HELP: &str = "\
Reads etcd directly (the same --etcd-* flags and HOLDFAST_ETCD_* variables as
`holdfastctl epoch init`; with a separate coord cluster, --coord-endpoint or
HOLDFAST_COORD_ENDPOINT, the class set, the refused change, the allocator
and the controller are read there); no arbiter is needed. Shows:

  class set   the set at /sys/policy: version, hash, source commit, when it
              was published and by which controller
  refused     the controller's last refused change (/sys/policy-status): when,
              and every problem as FILE:LINE: message [rule]
  epoch       the epoch at /sys/epoch, and whether the cluster is sealed;
              with a separate coord cluster, its own epoch and seal too (the
              keys of coord-tier classes live there)
  tiers       whether one cluster serves both tiers, or which cluster is
              coord (--coord-endpoint, HOLDFAST_COORD_ENDPOINT) and which
              entity (--etcd-endpoint), by etcd cluster ID
  allocator   the highest epoch ever allocated (/sys/epochs, raised by every
              init and advance; on the coord cluster when it is separate)
  controller  the current holdfast-controller leader (HOST pid PID)

Exit status:
  0   everything fine
  1   something needs an operator: no published class set, a refused change
      pending, the cluster sealed (or the epoch not initialised, or a
      malformed document); the last line says which: \"needs attention: ...\"
      (with --json, the \"needs_attention\" list)
  69  etcd unreachable
  78  bad etcd credentials or configuration (unreadable --etcd-ca/--etcd-cert/
      --etcd-key, etcd refused the credentials)";

/// Exit status when something needs an operator (the check found it; etcd
/// answered).
const NEEDS_ATTENTION: u8 = 1;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
    /// The controllers' etcd election name (their `election.name`).
    #[arg(long, value_name = "NAME", default_value = CONTROLLER_ELECTION)]
    election: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The epoch and the seal, or why they could not be read.
enum EpochState {
    Read { epoch: Option<EpochRecord>, seal: Option<SealRecord> },
    Malformed(String),
}

impl EpochState {
    fn seal(&self) -> Option<&SealRecord> {
        match self {
            EpochState::Read { seal, .. } => seal.as_ref(),
            EpochState::Malformed(_) => None,
        }
    }
}

/// Everything `status` shows, read from etcd.
struct Snapshot {
    published: Stored<PublishedPolicy>,
    status: Stored<PolicyStatus>,
    epoch: EpochState,
    /// The coord cluster's own epoch and seal, when it is another cluster.
    coord_epoch: Option<EpochState>,
    /// The epoch allocator's highest (`/sys/epochs`; 0: nothing allocated
    /// through it yet), or why it could not be read.
    allocated: Result<u32, String>,
    /// The etcd cluster IDs of the entity cluster and (when it is another
    /// one) the coord cluster.
    tiers: (u64, Option<u64>),
    leader: Option<String>,
}

fn etcd_failure(what: &str, e: &etcd_client::Error) -> u8 {
    etcdconn::failure(etcdconn::Access::Read(what), e)
}

async fn read(etcd: &Etcd, coord: Option<&Etcd>, election: &str) -> Result<Snapshot, u8> {
    let id = |e: EpochError| match e {
        EpochError::Etcd(e) => etcd_failure("the cluster ID", &e),
        e => {
            eprintln!("holdfastctl: {e}");
            exit::UNAVAILABLE
        }
    };
    let entity_id = epoch::cluster_id(etcd).await.map_err(id)?;
    // A coord cluster with the entity cluster's ID is that same cluster.
    let (coord, coord_id) = match coord {
        Some(c) => match epoch::cluster_id(c).await.map_err(id)? {
            coord_id if coord_id != entity_id => (Some(c), Some(coord_id)),
            _ => (None, None),
        },
        None => (None, None),
    };
    let tiers = (entity_id, coord_id);
    // The class set, the controller's report and its election are on the
    // coord cluster; the epoch and the seal on the entity cluster.
    let at = coord.unwrap_or(etcd);
    let published = policy::read_published(at).await.map_err(|e| etcd_failure(POLICY_KEY, &e))?;
    let status = policy::read_status(at).await.map_err(|e| etcd_failure(POLICY_STATUS_KEY, &e))?;
    let read_epoch = |at: &Etcd| {
        let at = at.clone();
        async move {
            match epoch::read_sys(&at).await {
                Ok(sys) => Ok(EpochState::Read { epoch: sys.epoch.map(|(r, _)| r), seal: sys.seal }),
                Err(EpochError::Etcd(e)) => Err(etcd_failure("/sys/epoch", &e)),
                Err(e) => Ok(EpochState::Malformed(e.to_string())),
            }
        }
    };
    let epoch = read_epoch(etcd).await?;
    let coord_epoch = match coord {
        Some(c) => Some(read_epoch(c).await?),
        None => None,
    };
    let allocated = match epoch::read_allocator(coord.unwrap_or(etcd)).await {
        Ok((a, _)) => Ok(a.highest),
        Err(EpochError::Etcd(e)) => return Err(etcd_failure(holdfast_model::layout::EPOCHS_KEY, &e)),
        Err(e) => Err(e.to_string()),
    };
    let leader = policy::read_controller_leader(at, election).await.map_err(|e| etcd_failure(election, &e))?;
    Ok(Snapshot { published, status, epoch, coord_epoch, allocated, tiers, leader })
}

impl Snapshot {
    fn refusal(&self) -> Option<&Refusal> {
        self.status.doc().and_then(|s| s.last_refusal.as_ref())
    }

    fn sealed(&self) -> Option<&SealRecord> {
        self.epoch.seal()
    }

    /// What needs an operator, most important first; empty when all is well.
    fn attention(&self) -> Vec<String> {
        let mut out = Vec::new();
        match &self.epoch {
            EpochState::Read { epoch: None, .. } => out.push("the epoch is not initialised".to_string()),
            EpochState::Malformed(e) => out.push(format!("the epoch record is malformed ({e})")),
            EpochState::Read { .. } => {}
        }
        if self.sealed().is_some() {
            out.push("the cluster is sealed".into());
        }
        match &self.coord_epoch {
            Some(EpochState::Read { epoch: None, .. }) => {
                out.push("the coord cluster's epoch is not initialised (coord-tier classes grant nothing)".to_string())
            }
            Some(EpochState::Malformed(e)) => out.push(format!("the coord cluster's epoch record is malformed ({e})")),
            Some(EpochState::Read { seal: Some(_), .. }) => out.push("the coord cluster is sealed".into()),
            _ => {}
        }
        match &self.published {
            Stored::Absent => out.push("no published class set".into()),
            Stored::Malformed { .. } => out.push(format!("{POLICY_KEY} is malformed")),
            Stored::Present { .. } => {}
        }
        if let Some(r) = self.refusal() {
            out.push(format!("a refused class change is pending ({} problem(s))", r.problems.len()));
        }
        if let Stored::Malformed { .. } = &self.status {
            out.push(format!("{POLICY_STATUS_KEY} is malformed"));
        }
        out
    }
}

fn when(unix_ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

fn text(s: &Snapshot, attention: &[String]) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<12} {value}\n"));
    match &s.published {
        Stored::Absent => line("class set", "none published".into()),
        Stored::Malformed { error, .. } => line("class set", format!("MALFORMED: {error}")),
        Stored::Present { doc, .. } => {
            line("class set", format!("version {}", doc.version));
            line("  hash", doc.hash.clone());
            line("  commit", doc.source_commit.clone().unwrap_or_else(|| "none (not a Git checkout)".into()));
            let by = if doc.published_by.is_empty() { "unknown" } else { &doc.published_by };
            line("  published", format!("{} by {by}", when(doc.published_unix_ms)));
        }
    }
    match (&s.status, s.refusal()) {
        (Stored::Absent, _) => line("refused", "no controller report yet".into()),
        (Stored::Malformed { error, .. }, _) => line("refused", format!("{POLICY_STATUS_KEY} MALFORMED: {error}")),
        (Stored::Present { .. }, None) => line("refused", "none".into()),
        (Stored::Present { .. }, Some(r)) => {
            line("refused", format!("REFUSED change at {} (directory {}); the last good set stays in force:", when(r.at_unix_ms), r.dir));
            for p in &r.problems {
                out.push_str(&format!("  {p} [{}]\n", p.rule));
            }
        }
    }
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<12} {value}\n"));
    match &s.epoch {
        EpochState::Read { epoch: Some(e), .. } => line("epoch", format!("{} (etcd cluster {:x})", e.epoch, e.cluster_id)),
        EpochState::Read { epoch: None, .. } => line("epoch", "not initialised (`holdfastctl epoch init`)".into()),
        EpochState::Malformed(e) => line("epoch", format!("MALFORMED: {e}")),
    }
    let (at, tiers) = match s.tiers {
        (entity, None) => ("this cluster", format!("one cluster serves both tiers (coord and entity: etcd cluster {entity:x})")),
        (entity, Some(coord)) => ("the coord cluster", format!("coord etcd cluster {coord:x}, entity etcd cluster {entity:x} (separate)")),
    };
    line("tiers", tiers);
    line(
        "allocator",
        match &s.allocated {
            Ok(0) => format!("nothing allocated yet (/sys/epochs on {at})"),
            Ok(n) => format!("highest epoch allocated {n} (/sys/epochs on {at})"),
            Err(e) => format!("MALFORMED: {e}"),
        },
    );
    match s.sealed() {
        None => line("sealed", "no".into()),
        Some(seal) => line("sealed", format!("SEALED since {}: {}", when(seal.sealed_at_unix.saturating_mul(1000)), seal.reason)),
    }
    if let Some(coord) = &s.coord_epoch {
        match coord {
            EpochState::Read { epoch: Some(e), .. } => {
                line("coord epoch", format!("{} (etcd cluster {:x}; the keys of coord-tier classes)", e.epoch, e.cluster_id))
            }
            EpochState::Read { epoch: None, .. } => {
                line("coord epoch", "not initialised (`holdfastctl epoch init` with --etcd-endpoint at the coord cluster)".into())
            }
            EpochState::Malformed(e) => line("coord epoch", format!("MALFORMED: {e}")),
        }
        match coord.seal() {
            None => line("coord sealed", "no".into()),
            Some(seal) => line("coord sealed", format!("SEALED since {}: {}", when(seal.sealed_at_unix.saturating_mul(1000)), seal.reason)),
        }
    }
    line("controller", s.leader.clone().map(|l| format!("{l} (leader)")).unwrap_or_else(|| "no leader".into()));
    if !attention.is_empty() {
        out.push_str(&format!("needs attention: {}\n", attention.join("; ")));
    }
    out
}

fn to_json(s: &Snapshot, election: &str, attention: &[String]) -> Value {
    let published = match &s.published {
        Stored::Absent => Value::Null,
        Stored::Malformed { error, .. } => json!({"malformed": error}),
        Stored::Present { doc, .. } => json!({
            "version": doc.version, "hash": doc.hash, "source_commit": doc.source_commit,
            "published_unix_ms": doc.published_unix_ms, "published_by": doc.published_by,
        }),
    };
    let controller_report = match &s.status {
        Stored::Absent => Value::Null,
        Stored::Malformed { error, .. } => json!({"malformed": error}),
        Stored::Present { doc, .. } => json!({"controller": doc.controller, "updated_unix_ms": doc.updated_unix_ms}),
    };
    let (epoch, seal) = match &s.epoch {
        EpochState::Read { epoch, seal } => (
            epoch.as_ref().map_or(Value::Null, |e| json!({"epoch": e.epoch, "cluster_id": format!("{:x}", e.cluster_id)})),
            seal.as_ref().map_or(Value::Null, |r| json!({"reason": r.reason, "sealed_at_unix": r.sealed_at_unix})),
        ),
        EpochState::Malformed(e) => (json!({"malformed": e}), Value::Null),
    };
    json!({
        "published": published,
        "refused_change": s.refusal(),
        "controller_report": controller_report,
        "epoch": epoch,
        "allocator": match &s.allocated { Ok(n) => json!({"highest": n}), Err(e) => json!({"malformed": e}) },
        "tiers": json!({
            "shared": s.tiers.1.is_none(),
            "entity_cluster_id": format!("{:x}", s.tiers.0),
            "coord_cluster_id": format!("{:x}", s.tiers.1.unwrap_or(s.tiers.0)),
        }),
        "sealed": s.sealed().is_some(),
        "seal": seal,
        "coord": s.coord_epoch.as_ref().map_or(Value::Null, |c| match c {
            EpochState::Read { epoch, seal } => json!({
                "epoch": epoch.as_ref().map_or(Value::Null, |e| json!({"epoch": e.epoch, "cluster_id": format!("{:x}", e.cluster_id)})),
                "sealed": seal.is_some(),
                "seal": seal.as_ref().map_or(Value::Null, |r| json!({"reason": r.reason, "sealed_at_unix": r.sealed_at_unix})),
            }),
            EpochState::Malformed(e) => json!({"epoch": {"malformed": e}, "sealed": false, "seal": Value::Null}),
        }),
        "controller_leader": s.leader,
        "election": election,
        "needs_attention": attention,
    })
}

pub async fn run(args: StatusArgs) -> u8 {
    if let Err(code) = etcdconn::check_files(&args.etcd.config()) {
        return code;
    }
    let etcd = match Etcd::connect(&args.etcd.config()).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfastctl: {e:#}");
            return exit::UNAVAILABLE;
        }
    };
    let coord = match args.coord.config(&args.etcd) {
        None => None,
        Some(config) => match Etcd::connect(&config).await {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("holdfastctl: the coord cluster (--coord-endpoint): {e:#}");
                return exit::UNAVAILABLE;
            }
        },
    };
    let snapshot = match read(&etcd, coord.as_ref(), &args.election).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let attention = snapshot.attention();
    if args.json {
        println!("{}", to_json(&snapshot, &args.election, &attention));
    } else {
        print!("{}", text(&snapshot, &attention));
    }
    if attention.is_empty() { exit::OK } else { NEEDS_ATTENTION }
}

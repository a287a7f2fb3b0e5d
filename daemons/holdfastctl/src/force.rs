//! `holdfastctl force-release request|apply`: ending one hold with two
//! signed approvals (see `holdfast_store::force`).

use crate::approve::{Files, load_approvers, now_unix};
use holdfast_approval::{Operation, Role};
use holdfast_cli::conn::{CoordArgs, EtcdArgs};
use holdfast_cli::exit;
use holdfast_model::LockKey;
use holdfast_store::Etcd;
use holdfast_store::force::{self, ForceError};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ForceArgs {
    #[command(subcommand)]
    action: ForceAction,
}

#[derive(clap::Subcommand)]
enum ForceAction {
    /// Show the hold on NS/KEY, its class and whether it is fenced, and
    /// write a request to end it for two lock-operators to sign.
    #[command(after_long_help = REQUEST_HELP)]
    Request(RequestArgs),
    /// Carry out a signed force-release: verify two approvals, then one
    /// transaction that deletes exactly the named hold.
    #[command(after_long_help = APPLY_HELP)]
    Apply(ApplyArgs),
}

const REQUEST_HELP: &str = "\\
The request names the hold by its holder, session and grant time (never by
anything from which its token could be computed). For an ADVISORY class the
holder is not fenced: after the release it may go on writing while the next
holder writes too. Think twice; prefer asking the holder's owners to stop it.

Then the requester and a different lock-operator each sign it:
  holdfastctl approve REQUEST --ssh-key KEY
and it is carried out with:
  holdfastctl force-release apply REQUEST

The requester's identity in approvers.toml must hold a grant whose
force_release prefixes cover the key (apply checks the approver's too).

Exit status: 0 written; 65 not held, the requester is not a
lock-operator, or their grants do not allow it; 69 etcd unreachable; 78
approvers.toml unreadable.";

const APPLY_HELP: &str = "\\
Verifies REQUEST against approvers.toml (the requester and a different
approver, both lock-operator, signed it unchanged, unexpired), then one etcd
transaction guarded by the hold's create revision and the unused nonce
deletes that hold — never a newer hold of the same key — writes the force
record /sys/force/<nonce> (requester, approver, reason, fenced, the hold) on
a 24 h lease and records the nonce. With the request's revoke_session the
holder's session is ended after. Anything refused changes nothing.

A key of a coord-tier class is held on the coord cluster (--coord-endpoint,
HOLDFAST_COORD_ENDPOINT): the hold is read and released there. With a
separate coord cluster the nonce is recorded there first, so a restore of the entity cluster
cannot make the request run twice; a hold that changed in between is left
alone (65) and the request is spent.

SIGNATURE...: the approvals; default every REQUEST.*.sig.

The request's cluster ID, class and fenced status are derived again first
(the cluster's ID, the published class set): a difference refuses it. Each
signer's identity in approvers.toml (identity = \"spiffe://...\") must hold a
grant in that set whose force_release prefixes cover the key.

Exit status: 0 released; 65 the hold is not the one named (released,
expired, a newer hold), the cluster or the key's class is not what the
request says, or the request was carried out already; 69 etcd
unreachable; 77 the approvals do not hold (a signer's grants do not
allow this key included); 78 a file unreadable.";

#[derive(clap::Args)]
struct RequestArgs {
    /// The key, NAMESPACE/KEY.
    key: String,
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
    /// Your name in approvers.toml (you sign the request too).
    #[arg(long)]
    requester: String,
    /// Why: the incident, the holder's state, the ticket.
    #[arg(long)]
    reason: String,
    /// Also end the holder's session (every hold it has, and its keepalives).
    #[arg(long)]
    revoke_session: bool,
    /// How long the request stays valid.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    valid_for: Duration,
    #[command(flatten)]
    files: Files,
}

#[derive(clap::Args)]
struct ApplyArgs {
    /// The request file.
    request: PathBuf,
    /// The approvals (default: every REQUEST.*.sig).
    signatures: Vec<PathBuf>,
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    files: Files,
}

pub async fn run(args: ForceArgs) -> u8 {
    match args.action {
        ForceAction::Request(a) => request(a).await,
        ForceAction::Apply(a) => apply(a).await,
    }
}

/// The cluster a key's hold lives on: the coord cluster for a key of a
/// coord-tier class (when one is named), the entity cluster otherwise.
fn home<'a>(etcd: &'a Etcd, coord: Option<&'a Etcd>, class: Option<&holdfast_policy::Class>) -> &'a Etcd {
    match (coord, class) {
        (Some(coord), Some(c)) if c.tier == holdfast_policy::Tier::Coord => coord,
        _ => etcd,
    }
}

/// The published class set (on the coord cluster when one is named), or
/// the exit status to return.
async fn published(etcd: &Etcd, coord: Option<&Etcd>) -> Result<Option<holdfast_policy::CompiledSet>, u8> {
    match holdfast_store::policy::read_published(coord.unwrap_or(etcd)).await {
        Ok(holdfast_store::policy::Stored::Present { doc, .. }) => Ok(Some(doc.set)),
        Ok(_) => Ok(None),
        Err(e) => {
            eprintln!("holdfastctl: reading the published class set: {e}");
            Err(exit::UNAVAILABLE)
        }
    }
}

/// The class of `namespace` in the published set, or the exit status to return.
async fn class_of(etcd: &Etcd, coord: Option<&Etcd>, namespace: &str) -> Result<Option<holdfast_policy::Class>, u8> {
    Ok(published(etcd, coord).await?.and_then(|set| set.class_for(namespace).cloned()))
}

async fn request(args: RequestArgs) -> u8 {
    let key = match LockKey::parse(&args.key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("holdfastctl: {}: {} {}", args.key, e.field, e.message);
            return exit::USAGE;
        }
    };
    let approvers = match load_approvers(&args.files.approvers) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if !approvers.approvers.get(&args.requester).is_some_and(|a| a.roles.contains(&Role::LockOperator)) {
        eprintln!("holdfastctl: {:?} is not a lock-operator in {}", args.requester, args.files.approvers.display());
        return exit::INVALID;
    }
    let etcd = match crate::epoch::connect(&args.etcd).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    // The class set is published on the coord cluster (when separate).
    let coord = match crate::epoch::connect_coord(&args.coord, &args.etcd).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let set = match published(&etcd, coord.as_ref()).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The requester's own grants must allow it (apply checks both signers).
    let identity = approvers.approvers.get(&args.requester).and_then(|a| a.identity.clone());
    if let Err(e) = force::check_granted(set.as_ref(), &key, std::slice::from_ref(&args.requester), &[identity]) {
        eprintln!("holdfastctl: refused: {e}");
        return exit::INVALID;
    }
    let class = set.as_ref().and_then(|s| s.class_for(key.namespace()).cloned());
    let home = home(&etcd, coord.as_ref(), class.as_ref());
    let hold = match force::current_hold(home, &key).await {
        Ok(Some(h)) => h,
        Ok(None) => {
            eprintln!("holdfastctl: {key} is not held; nothing to release");
            return exit::INVALID;
        }
        Err(e) => {
            eprintln!("holdfastctl: reading {key}: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let (class_name, fenced) = force::class_facts(class.as_ref());
    let cluster_id = match holdfast_store::epoch::cluster_id(home).await {
        Ok(id) => id,
        Err(e) => {
            eprintln!("holdfastctl: reading the cluster ID of {key}'s cluster: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let op = Operation::ForceRelease {
        cluster_id,
        namespace: key.namespace().to_string(),
        key: key.key().to_string(),
        holder: hold.record.spiffe_id.clone(),
        session: hold.record.session,
        granted_unix_ms: hold.record.granted_unix_ms,
        class: class_name,
        fenced,
        revoke_session: args.revoke_session,
    };
    let (_, path) = match crate::approve::new_request(&args.files, &args.requester, &args.reason, op, args.valid_for) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if !fenced {
        println!(
            "\nWARNING: {key} is not fenced. Releasing it does not stop its holder: a second writer may follow.\n\
             Make sure the holder has stopped (or cannot reach the resource) first."
        );
    }
    println!(
        "\nwrote {p}\n\nNext: {req} and a different lock-operator each sign it, unchanged:\n  holdfastctl approve {p} --ssh-key KEY\nthen:\n  holdfastctl force-release apply {p}",
        p = path.display(),
        req = args.requester,
    );
    exit::OK
}

async fn apply(args: ApplyArgs) -> u8 {
    let approved = match crate::approve::verified(&args.files, &args.request, &args.signatures) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let etcd = match crate::epoch::connect(&args.etcd).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let coord = match crate::epoch::connect_coord(&args.coord, &args.etcd).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    // The hold lives on the cluster of its class's tier.
    let class = match &approved.request.operation {
        Operation::ForceRelease { namespace, .. } => match class_of(&etcd, coord.as_ref(), namespace).await {
            Ok(c) => c,
            Err(code) => return code,
        },
        _ => None,
    };
    let home = home(&etcd, coord.as_ref(), class.as_ref());
    match force::release_via(home, coord.as_ref(), &approved, now_unix()).await {
        Ok(done) => {
            let r = &done.record;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"released": format!("{}/{}", r.namespace, r.key), "holder": r.holder, "fenced": r.fenced,
                        "requester": r.requester, "approver": r.approver, "session_revoked": done.session_revoked,
                        "record": holdfast_model::layout::force_key(&approved.request.nonce)})
                );
            } else {
                println!(
                    "released {}/{} (held by {}); approved by {} and {}; record {}{}",
                    r.namespace,
                    r.key,
                    r.holder,
                    r.requester,
                    r.approver,
                    holdfast_model::layout::force_key(&approved.request.nonce),
                    if done.session_revoked { "; the holder's session ended" } else { "" }
                );
            }
            exit::OK
        }
        Err(
            e @ (ForceError::NotHeld(_)
            | ForceError::OtherHold { .. }
            | ForceError::NonceUsed(_)
            | ForceError::Malformed(_)
            | ForceError::WrongCluster { .. }
            | ForceError::Changed { .. }
            | ForceError::Spent),
        ) => {
            eprintln!("holdfastctl: refused: {e}");
            exit::INVALID
        }
        Err(e @ ForceError::NotGranted { .. }) => {
            eprintln!("holdfastctl: refused: {e}");
            exit::NOPERM
        }
        Err(e) => {
            eprintln!("holdfastctl: force-release failed, nothing was changed: {e}");
            exit::UNAVAILABLE
        }
    }
}

//! The restore fault's first half: a snapshot of the coord cluster and of
//! one member of the entity cluster, taken while the clients keep granting (so grants after it are lost by the restore).
//! The restore itself runs once the episode's workload has stopped
//! (`crate::restore::phase`).

use super::{Effect, FaultCtx};
use rand::Rng;
use rand::rngs::StdRng;
use std::path::PathBuf;

/// A snapshot waiting for the episode's restore phase.
#[derive(Debug, Clone)]
pub struct Pending {
    pub file: PathBuf,
    /// etcd's revision when the snapshot was taken (at most the snapshot's).
    pub revision: i64,
    pub member: usize,
    /// A snapshot of the coord cluster taken just before it, restored with
    /// it: the allocator, the nonces and the coord tier's holds go back too.
    pub coord_file: PathBuf,
    /// The coord cluster's revision when its snapshot was taken.
    pub coord_revision: i64,
}

pub async fn snapshot(ctx: &mut FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    let member = rng.random_range(0..ctx.cluster.spec.members.len());
    let (coord_file, coord_revision) = ctx.cluster.snapshot_coord().await?;
    let (file, revision) = ctx.cluster.snapshot(member).await?;
    let bytes = std::fs::metadata(&file)?.len();
    // The episode restores its oldest snapshot: the hardest case.
    let kept = if ctx.pending_restore.is_none() {
        "the restore follows the workload"
    } else {
        "an older snapshot of this episode is the one restored"
    };
    ctx.pending_restore.get_or_insert(Pending { file: file.clone(), revision, member, coord_file, coord_revision });
    Ok(Effect {
        what: format!(
            "snapshot of the coord cluster at revision {coord_revision}, then of member e{member} at revision {revision} ({bytes} bytes); {kept}"
        ),
        confirmed: format!("{} saved", file.display()),
    })
}

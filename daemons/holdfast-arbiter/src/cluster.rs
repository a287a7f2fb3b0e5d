//! The etcd clusters an arbiter grants on, and which one a key's class
//! picks: keys of classes with `tier = "entity"` live on the entity cluster
//! (`[etcd]`), keys of classes with `tier = "coord"` on the coord cluster
//! (`[coord]`). Each cluster has its own seal check (its own `/sys/epoch`,
//! seal and watermark, and its own record of the epochs served), its own
//! sessions, waiters, keepalive streams and expiry watch. When one cluster
//! serves both tiers, both tiers lead to the same [`Cluster`].
//!
//! A session lives on one cluster. Its ID on the wire is the etcd lease ID
//! with the top bit set for a coord-tier session (etcd never sets that bit
//! in a lease ID), so any arbiter routes a keepalive, a release or a close
//! without a lookup; the session record says the tier too, and the grant
//! transaction compares the record byte for byte.

use crate::Refusal;
use crate::confirm::Confirmer;
use crate::etcd::Etcd;
use crate::expiry::Expiries;
use crate::renewal::Renewer;
use crate::seal::Guard;
use crate::session::Sessions;
use crate::waiting::Waiters;
use holdfast_policy::Tier;
use std::sync::Arc;

/// One etcd cluster and everything the arbiter keeps for it.
pub struct Cluster {
    /// The tiers whose keys live here: "entity", "coord" or "coord,entity".
    pub tiers: &'static str,
    pub etcd: Etcd,
    /// The serve state of this cluster (its epoch, its seal).
    pub guard: Arc<Guard>,
    pub sessions: Arc<Sessions>,
    pub waiters: Arc<Waiters>,
    /// Confirms the leader term of keepalive acknowledgements.
    pub confirmer: Confirmer,
    /// Holds back keepalives while a deposed leader may revoke their lease.
    pub deposed: Arc<crate::deposed::Deposed>,
    /// The shared etcd keepalive streams sessions are renewed through.
    pub renewer: Arc<Renewer>,
    /// Holds this arbiter granted here, for counting the ones that expire.
    pub expiries: Arc<Expiries>,
    /// This cluster's ledger in [`crate::limits::Limits`].
    pub ledger: usize,
}

impl Cluster {
    /// The cluster's name (`cluster_name` or `coord_cluster_name`).
    pub fn name(&self) -> &str {
        self.guard.served.cluster()
    }

    /// Any etcd failure pauses granting on this cluster until it is
    /// re-checked: a reconnect may have reached a restored cluster.
    pub fn seen<T>(&self, r: Result<T, Refusal>) -> Result<T, Refusal> {
        if let Err(e) = &r
            && e.pauses_granting
        {
            self.guard.etcd_failed(&e.message);
        }
        r
    }
}

/// The entity cluster and the coord cluster (the same one when one
/// cluster serves both tiers).
#[derive(Clone)]
pub struct Clusters {
    pub entity: Arc<Cluster>,
    pub coord: Arc<Cluster>,
}

impl Clusters {
    /// The cluster the keys (and sessions) of `tier` live on.
    pub fn of(&self, tier: Tier) -> &Arc<Cluster> {
        match tier {
            Tier::Entity => &self.entity,
            Tier::Coord => &self.coord,
        }
    }

    /// True when one cluster serves both tiers.
    pub fn shared(&self) -> bool {
        Arc::ptr_eq(&self.entity, &self.coord)
    }

    /// Each cluster once: the entity cluster first.
    pub fn all(&self) -> Vec<&Arc<Cluster>> {
        if self.shared() { vec![&self.entity] } else { vec![&self.entity, &self.coord] }
    }
}

/// The bit a coord-tier session's ID carries on the wire.
pub const COORD_SESSION: u64 = 1 << 63;

/// A session ID from the wire: its tier and its etcd lease.
pub fn parse_session(id: u64) -> Result<(Tier, i64), Refusal> {
    let tier = if id & COORD_SESSION != 0 { Tier::Coord } else { Tier::Entity };
    match i64::try_from(id & !COORD_SESSION) {
        Ok(lease) if lease > 0 => Ok((tier, lease)),
        _ => Err(Refusal::invalid("session_id", "is not a session ID; open a session first")),
    }
}

/// The wire ID of the session `lease` on `tier`.
pub fn session_id(tier: Tier, lease: i64) -> u64 {
    match tier {
        Tier::Entity => lease as u64,
        Tier::Coord => lease as u64 | COORD_SESSION,
    }
}

/// The tier's name, as classes and OpenSessionResponse spell it.
pub fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Entity => "entity",
        Tier::Coord => "coord",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_carries_its_tier_and_its_lease() {
        let lease = 0x694d_9a1b_2c3d_4e5f;
        for tier in [Tier::Entity, Tier::Coord] {
            let (t, l) = parse_session(session_id(tier, lease)).expect("parses");
            assert_eq!((t, l), (tier, lease));
        }
        assert_eq!(session_id(Tier::Entity, lease), lease as u64, "entity sessions keep the lease ID as it is");
        for bad in [0, COORD_SESSION] {
            let e = parse_session(bad).expect_err("no lease");
            assert_eq!(e.field, "session_id");
        }
    }
}

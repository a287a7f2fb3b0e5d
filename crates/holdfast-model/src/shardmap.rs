//! The shard map: which entity cluster each lock key lives on (the
//! sharding ADR; ARCHITECTURE.md, "Tiers and clusters"). One versioned
//! document on the coord cluster, [`crate::layout::SHARDMAP_KEY`].
//!
//! - A key's **homing unit** is its namespace and the first N segments of
//!   its path (N per namespace, default 1): `payments/eu/acct-7` is homed as
//!   `payments/eu`, so keys that share a prefix live on one cluster.
//! - The unit is homed by **rendezvous hashing** over the clusters' names
//!   ([`crate::rendezvous::score`], the function the clients choose arbiters
//!   with): adding a cluster moves only the units it now scores highest,
//!   about 1/N of them, and removing one moves only its own.
//! - A namespace can be **assigned** to one cluster (the override for a
//!   large tenant): all its keys live there.
//!
//! The document holds three layouts. `serving` is what arbiters route by.
//! `desired` is what operators edit (`holdfastctl shard add|remove|assign`);
//! editing it moves nothing. A rebalancer turns a `desired` that differs
//! from `serving` into a `target` and one [`Move`] per (source,
//! destination) pair of clusters a unit can move between: each drains
//! (arbiters refuse new grants for its keys with a retryable error), waits
//! for the holds on the source to end, has the destination's epoch advanced
//! above the source's, and flips; when every move has flipped, `target`
//! becomes `serving`. A unit whose home does not change is in no move and is
//! served throughout ([`ShardMap::route`]).
//!
//! Only the types and the routing rule live here (no I/O).

use crate::LockKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Path segments in a homing unit unless the namespace sets its own.
pub const DEFAULT_SEGMENTS: u32 = 1;
/// The most path segments a namespace's homing unit may take.
pub const MAX_SEGMENTS: u32 = 16;

/// One entity cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardCluster {
    /// Its name: the rendezvous input, so renaming a cluster rehomes keys.
    pub name: String,
    /// Its members' client URLs.
    pub endpoints: Vec<String>,
}

/// Where keys live: the clusters, the homing unit per namespace, and the
/// namespaces assigned to one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Layout {
    pub clusters: Vec<ShardCluster>,
    /// Path segments in the homing unit, per namespace (default
    /// [`DEFAULT_SEGMENTS`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub segments: BTreeMap<String, u32>,
    /// Namespaces whose keys all live on one cluster (by name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub assigned: BTreeMap<String, String>,
}

impl Layout {
    /// One cluster, homing everything.
    pub fn single(cluster: ShardCluster) -> Self {
        Layout { clusters: vec![cluster], ..Layout::default() }
    }

    pub fn cluster(&self, name: &str) -> Option<&ShardCluster> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// The path segments of `namespace`'s homing unit.
    pub fn segments_of(&self, namespace: &str) -> u32 {
        self.segments.get(namespace).copied().unwrap_or(DEFAULT_SEGMENTS)
    }

    /// `key`'s homing unit: its namespace and the first N segments of its
    /// path (all of them when it has fewer).
    pub fn unit(&self, key: &LockKey) -> String {
        let n = self.segments_of(key.namespace()) as usize;
        let path: Vec<&str> = key.key().split('/').take(n).collect();
        format!("{}/{}", key.namespace(), path.join("/"))
    }

    /// The cluster `key` lives on.
    pub fn home(&self, key: &LockKey) -> &ShardCluster {
        match self.assigned.get(key.namespace()).and_then(|c| self.cluster(c)) {
            Some(c) => c,
            None => self.home_of_unit(&self.unit(key)),
        }
    }

    /// The cluster a homing unit of an unassigned namespace lives on: the
    /// highest rendezvous score of the unit over the clusters' names.
    pub fn home_of_unit(&self, unit: &str) -> &ShardCluster {
        let names: Vec<&str> = self.clusters.iter().map(|c| c.name.as_str()).collect();
        &self.clusters[crate::rendezvous::ranked(unit, &names)[0]]
    }

    /// Checks the layout; the error says what to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.clusters.is_empty() {
            return Err("no cluster: a layout homes keys on at least one entity cluster".into());
        }
        for (i, c) in self.clusters.iter().enumerate() {
            check_name(&c.name)?;
            if self.clusters[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("cluster {:?} is listed twice", c.name));
            }
            if c.endpoints.is_empty() || c.endpoints.iter().any(|e| e.trim().is_empty()) {
                return Err(format!("cluster {:?} has no endpoints: give its members' client URLs", c.name));
            }
        }
        for (ns, n) in &self.segments {
            crate::key::validate_namespace(ns).map_err(|e| format!("segments: {e}"))?;
            if !(1..=MAX_SEGMENTS).contains(n) {
                return Err(format!("namespace {ns:?}: a homing unit takes 1 to {MAX_SEGMENTS} path segments, not {n}"));
            }
        }
        for (ns, c) in &self.assigned {
            crate::key::validate_namespace(ns).map_err(|e| format!("assigned: {e}"))?;
            if self.cluster(c).is_none() {
                return Err(format!("namespace {ns:?} is assigned to {c:?}, which is not one of the clusters"));
            }
        }
        Ok(())
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(format!("cluster name {name:?}: use 1 to 63 of a-z, 0-9 and '-', not starting or ending with '-'")) }
}

/// Where a move stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveStep {
    /// Arbiters refuse new grants of the range; the rebalancer waits for the
    /// holds on the source to end (at most the class TTL after the last
    /// grant).
    Draining,
    /// The source holds none of the range; the destination's epoch is being
    /// advanced above the source's (allocated on coord).
    Advancing,
    /// The range lives on the destination now.
    Flipped,
}

impl fmt::Display for MoveStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MoveStep::Draining => "draining",
            MoveStep::Advancing => "advancing",
            MoveStep::Flipped => "flipped",
        })
    }
}

/// The units moving from one cluster to another: every unit whose home is
/// `from` in `serving` and `to` in `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub from: String,
    pub to: String,
    pub step: MoveStep,
    /// When the step began (ms since the Unix epoch).
    pub since_unix_ms: u64,
    /// Draining: the time by which every hold of the range has ended even if
    /// none is released (the last grant plus the class TTL); 0 until known.
    #[serde(default)]
    pub wait_until_unix_ms: u64,
    /// Draining: the holds of the range the source still had at the last
    /// look.
    #[serde(default)]
    pub holds_left: u64,
    /// Advancing and after: the destination's new epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_epoch: Option<u16>,
}

/// The shard map document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    /// Raised by one on every write.
    pub version: u64,
    /// What arbiters route by.
    pub serving: Layout,
    /// What operators asked for.
    pub desired: Layout,
    /// What the moves in flight lead to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Layout>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<Move>,
}

/// Where an arbiter sends a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    /// Grant and release it on this cluster.
    Serve(&'a ShardCluster),
    /// Its unit is moving and has not flipped: refuse new grants with a
    /// retryable error.
    Moving { from: &'a str, to: &'a str, step: MoveStep },
}

impl ShardMap {
    /// The first map: one cluster serving every key (what an appliance with
    /// one entity cluster does without a map).
    pub fn new(first: ShardCluster) -> Self {
        let layout = Layout::single(first);
        ShardMap { version: 1, serving: layout.clone(), desired: layout, target: None, moves: Vec::new() }
    }

    /// Where `key` is served now.
    pub fn route(&self, key: &LockKey) -> Route<'_> {
        let here = self.serving.home(key);
        let Some(target) = &self.target else { return Route::Serve(here) };
        let there = target.home(key);
        if here.name == there.name {
            return Route::Serve(here);
        }
        match self.moves.iter().find(|m| m.from == here.name && m.to == there.name) {
            Some(m) if m.step == MoveStep::Flipped => Route::Serve(there),
            Some(m) => Route::Moving { from: &here.name, to: &there.name, step: m.step },
            // Not planned (a corrupt map): refuse rather than guess.
            None => Route::Moving { from: &here.name, to: &there.name, step: MoveStep::Draining },
        }
    }

    /// Whether operators asked for a layout no move has started toward.
    pub fn pending(&self) -> bool {
        self.target.is_none() && self.desired != self.serving
    }

    /// The (source, destination) pairs a unit can move between on the way
    /// from `serving` to `target`. When only clusters were added or removed,
    /// a unit moves only to an added cluster or off a removed one
    /// (rendezvous); any other change (assignments, segments) can move a
    /// unit between any two.
    pub fn planned_pairs(serving: &Layout, target: &Layout) -> Vec<(String, String)> {
        let same_rules = serving.segments == target.segments && serving.assigned == target.assigned;
        let mut pairs = Vec::new();
        for a in &serving.clusters {
            for b in &target.clusters {
                let kept = target.cluster(&a.name).is_some() && serving.cluster(&b.name).is_some();
                if a.name != b.name && (!same_rules || !kept) {
                    pairs.push((a.name.clone(), b.name.clone()));
                }
            }
        }
        pairs
    }

    /// The rebalancer starts moving toward `desired`: `target` is set and
    /// every planned pair starts draining.
    pub fn begin(&mut self, now_unix_ms: u64) -> Result<(), String> {
        if self.target.is_some() {
            return Err("a move is already in flight: finish it first".into());
        }
        if !self.pending() {
            return Err("the desired layout is the one serving: nothing to move".into());
        }
        self.desired.validate().map_err(|e| format!("the desired layout: {e}"))?;
        let target = self.desired.clone();
        self.moves = Self::planned_pairs(&self.serving, &target)
            .into_iter()
            .map(|(from, to)| Move {
                from,
                to,
                step: MoveStep::Draining,
                since_unix_ms: now_unix_ms,
                wait_until_unix_ms: 0,
                holds_left: 0,
                destination_epoch: None,
            })
            .collect();
        self.target = Some(target);
        Ok(())
    }

    /// When every move has flipped: `target` becomes `serving`.
    pub fn finish(&mut self) -> Result<(), String> {
        let Some(target) = &self.target else { return Err("no move in flight".into()) };
        if let Some(m) = self.moves.iter().find(|m| m.step != MoveStep::Flipped) {
            return Err(format!("the move {} → {} is still {}", m.from, m.to, m.step));
        }
        self.serving = target.clone();
        self.target = None;
        self.moves.clear();
        Ok(())
    }

    /// Adds an entity cluster to the desired layout.
    pub fn add(&mut self, cluster: ShardCluster) -> Result<(), String> {
        if self.desired.cluster(&cluster.name).is_some() {
            return Err(format!("cluster {:?} is already in the desired layout", cluster.name));
        }
        let mut next = self.desired.clone();
        next.clusters.push(cluster);
        next.validate()?;
        self.desired = next;
        Ok(())
    }

    /// Removes an entity cluster from the desired layout.
    pub fn remove(&mut self, name: &str) -> Result<(), String> {
        if self.desired.cluster(name).is_none() {
            return Err(format!("cluster {name:?} is not in the desired layout"));
        }
        let pinned: Vec<&String> = self.desired.assigned.iter().filter(|(_, c)| *c == name).map(|(ns, _)| ns).collect();
        if !pinned.is_empty() {
            return Err(format!("namespaces {pinned:?} are assigned to {name:?}: assign them elsewhere first"));
        }
        if self.desired.clusters.len() == 1 {
            return Err(format!("{name:?} is the last cluster: add another before removing it"));
        }
        self.desired.clusters.retain(|c| c.name != name);
        Ok(())
    }

    /// Assigns `namespace` to `cluster` in the desired layout, or (None)
    /// homes it by rendezvous again.
    pub fn assign(&mut self, namespace: &str, cluster: Option<&str>) -> Result<(), String> {
        crate::key::validate_namespace(namespace).map_err(|e| e.to_string())?;
        let mut next = self.desired.clone();
        match cluster {
            Some(c) => next.assigned.insert(namespace.to_string(), c.to_string()),
            None => next.assigned.remove(namespace),
        };
        next.validate()?;
        self.desired = next;
        Ok(())
    }

    /// Sets the path segments of `namespace`'s homing unit in the desired
    /// layout.
    pub fn set_segments(&mut self, namespace: &str, segments: u32) -> Result<(), String> {
        let mut next = self.desired.clone();
        if segments == DEFAULT_SEGMENTS {
            next.segments.remove(namespace);
        } else {
            next.segments.insert(namespace.to_string(), segments);
        }
        next.validate()?;
        self.desired = next;
        Ok(())
    }

    /// Checks the whole document; the error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.version == 0 {
            return Err("version 0: a map starts at version 1".into());
        }
        self.serving.validate().map_err(|e| format!("serving: {e}"))?;
        self.desired.validate().map_err(|e| format!("desired: {e}"))?;
        match &self.target {
            None if !self.moves.is_empty() => Err("moves without a target layout".into()),
            None => Ok(()),
            Some(target) => {
                target.validate().map_err(|e| format!("target: {e}"))?;
                let mut want = Self::planned_pairs(&self.serving, target);
                let mut have: Vec<(String, String)> = self.moves.iter().map(|m| (m.from.clone(), m.to.clone())).collect();
                want.sort();
                have.sort();
                if want != have {
                    return Err(format!("the moves {have:?} are not the planned pairs {want:?}"));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> ShardCluster {
        ShardCluster { name: name.into(), endpoints: vec![format!("https://{name}.example:2379")] }
    }

    fn key(text: &str) -> LockKey {
        LockKey::parse(text).unwrap()
    }

    fn two() -> ShardMap {
        let mut m = ShardMap::new(cluster("entity-a"));
        m.add(cluster("entity-b")).unwrap();
        m.begin(0).unwrap();
        for mv in &mut m.moves {
            mv.step = MoveStep::Flipped;
        }
        m.finish().unwrap();
        m
    }

    /// 10,000 sampled homing units (the sample), of 100 namespaces.
    fn units() -> Vec<LockKey> {
        (0..10_000).map(|i| key(&format!("ns{}/unit-{i}/k", i % 100))).collect()
    }

    #[test]
    fn adding_a_third_shard_moves_about_a_third_of_the_units_and_only_to_it() {
        let mut m = two();
        let before: Vec<String> = units().iter().map(|k| m.serving.home(k).name.clone()).collect();
        m.add(cluster("entity-c")).unwrap();
        m.begin(0).unwrap();
        let target = m.target.clone().unwrap();
        let mut moved = 0;
        for (k, b) in units().iter().zip(&before) {
            let after = &target.home(k).name;
            if after != b {
                assert_eq!(after, "entity-c", "{k} moved between two old clusters");
                moved += 1;
            }
        }
        let share = moved as f64 / 10_000.0;
        eprintln!("adding a third shard moves {moved} of 10,000 homing units ({:.1} %, ideal 33.3 %)", share * 100.0);
        assert!((0.25..=0.42).contains(&share), "{moved} of 10,000 moved");
        // Only the moves to the new cluster are planned.
        let pairs: Vec<(String, String)> = m.moves.iter().map(|mv| (mv.from.clone(), mv.to.clone())).collect();
        assert_eq!(pairs, vec![("entity-a".into(), "entity-c".into()), ("entity-b".into(), "entity-c".into())]);
    }

    #[test]
    fn a_unit_that_stays_home_is_served_at_every_step_of_a_move() {
        let mut m = two();
        m.add(cluster("entity-c")).unwrap();
        m.begin(0).unwrap();
        let target = m.target.clone().unwrap();
        let keys = units();
        let check = |m: &ShardMap, flipped: &[&str]| {
            for k in &keys {
                let (here, there) = (m.serving.home(k).name.clone(), target.home(k).name.clone());
                match m.route(k) {
                    Route::Serve(c) if here == there => assert_eq!(c.name, here, "{k}"),
                    Route::Serve(c) => {
                        assert!(flipped.contains(&here.as_str()), "{k} served on {} before its move flipped", c.name);
                        assert_eq!(c.name, there, "{k}");
                    }
                    Route::Moving { from, to, .. } => {
                        assert_ne!(here, there, "{k} stays home but is refused");
                        assert!(!flipped.contains(&from), "{k}: flipped but refused");
                        assert_eq!((from, to), (here.as_str(), there.as_str()));
                    }
                }
            }
        };
        check(&m, &[]);
        m.moves[0].step = MoveStep::Advancing;
        check(&m, &[]);
        m.moves[0].step = MoveStep::Flipped;
        let first = m.moves[0].from.clone();
        check(&m, &[first.as_str()]);
        m.moves[1].step = MoveStep::Flipped;
        let second = m.moves[1].from.clone();
        check(&m, &[first.as_str(), second.as_str()]);
        m.finish().unwrap();
        assert_eq!(m.serving, target);
        for k in &keys {
            assert_eq!(m.route(k), Route::Serve(target.home(k)));
        }
    }

    #[test]
    fn removing_a_shard_moves_only_its_units() {
        let mut m = two();
        m.add(cluster("entity-c")).unwrap();
        m.begin(0).unwrap();
        m.moves.iter_mut().for_each(|mv| mv.step = MoveStep::Flipped);
        m.finish().unwrap();
        let before: Vec<String> = units().iter().map(|k| m.serving.home(k).name.clone()).collect();
        m.remove("entity-b").unwrap();
        m.begin(0).unwrap();
        let target = m.target.clone().unwrap();
        for (k, b) in units().iter().zip(&before) {
            if b != "entity-b" {
                assert_eq!(&target.home(k).name, b, "{k} moved although its cluster stays");
            }
        }
        let mut pairs: Vec<String> = m.moves.iter().map(|mv| format!("{}>{}", mv.from, mv.to)).collect();
        pairs.sort();
        assert_eq!(pairs, ["entity-b>entity-a", "entity-b>entity-c"]);
    }

    #[test]
    fn keys_of_a_unit_live_together_and_an_assigned_namespace_on_its_cluster() {
        let mut m = two();
        let l = &m.serving;
        assert_eq!(l.unit(&key("payments/eu/acct-7")), "payments/eu");
        assert_eq!(l.unit(&key("payments/solo")), "payments/solo");
        for i in 0..50 {
            assert_eq!(l.home(&key(&format!("orders/shop-{i}/a"))), l.home(&key(&format!("orders/shop-{i}/b/c"))));
        }
        m.set_segments("orders", 2).unwrap();
        assert_eq!(m.desired.unit(&key("orders/shop-1/b/c")), "orders/shop-1/b");
        m.assign("orders", Some("entity-b")).unwrap();
        assert!((0..100).all(|i| m.desired.home(&key(&format!("orders/k{i}"))).name == "entity-b"));
        // A change of rules can move a unit between any two clusters.
        m.begin(0).unwrap();
        assert_eq!(m.moves.len(), 2);
        assert!(m.validate().is_ok());
    }

    #[test]
    fn edits_that_make_no_sense_are_refused_and_change_nothing() {
        let mut m = two();
        let before = m.clone();
        let bad: Vec<(Result<(), String>, &str)> = vec![
            (m.clone().add(cluster("entity-a")), "already"),
            (m.clone().add(ShardCluster { name: "Bad_Name".into(), endpoints: vec!["x".into()] }), "a-z"),
            (m.clone().add(ShardCluster { name: "entity-z".into(), endpoints: vec![] }), "no endpoints"),
            (m.clone().remove("entity-q"), "not in the desired"),
            (m.clone().assign("orders", Some("entity-q")), "not one of the clusters"),
            (m.clone().set_segments("orders", 0), "1 to 16"),
            (m.clone().begin(0), "nothing to move"),
            (m.clone().finish(), "no move in flight"),
        ];
        for (got, want) in bad {
            let e = got.unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        m.assign("orders", Some("entity-a")).unwrap();
        assert!(m.remove("entity-a").unwrap_err().contains("assign them elsewhere"));
        let mut one = ShardMap::new(cluster("entity-a"));
        assert!(one.remove("entity-a").unwrap_err().contains("last cluster"));
        assert_eq!(before.serving, m.serving);
        let mut moving = two();
        moving.add(cluster("entity-c")).unwrap();
        moving.begin(0).unwrap();
        assert!(moving.finish().unwrap_err().contains("still draining"));
        assert!(moving.begin(0).unwrap_err().contains("already in flight"));
        let mut broken = moving.clone();
        broken.moves.pop();
        assert!(broken.validate().unwrap_err().contains("planned pairs"));
    }

    #[test]
    fn the_document_round_trips_as_json() {
        let mut m = two();
        m.add(cluster("entity-c")).unwrap();
        m.assign("big-tenant", Some("entity-c")).unwrap();
        m.begin(1_800_000_000_000).unwrap();
        m.moves[0].destination_epoch = Some(7);
        let bytes = crate::layout::encode(&m);
        let back: ShardMap = crate::layout::decode(crate::layout::SHARDMAP_KEY, &bytes).unwrap();
        assert_eq!(back, m);
        assert!(back.validate().is_ok());
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("\"step\":\"draining\""), "{text}");
    }
}

//! Hall-aware placement of etcd members.
//!
//! Rules (ADR "Where do the etcd members physically run?"):
//! - entity clusters: three members, one per hall;
//! - the coord cluster: five members split 2-2-1;
//! - no hall ever holds a majority of a cluster's members (so losing one hall
//!   never loses quorum), and every cluster spans at least `required_halls`
//!   halls (default three);
//! - nodes are dedicated: one etcd member per host.
//!
//! Placement is a flow problem (clusters -> halls with at most `cap` members
//! each -> hosts per hall), solved exactly, so every inventory that admits a
//! valid plan gets one. Output is deterministic: halls and hosts are taken in
//! name order, clusters in inventory order, and cluster tokens are derived
//! from `--token-seed` when one is given.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Tier;
use crate::error::{ProvisionError, Result};

/// An inventory of hosts and halls, and the clusters to place.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// Minimum number of distinct halls every cluster must span: 2 or 3 (default 3, the design's three halls).
    #[serde(default = "default_required_halls")]
    pub required_halls: usize,
    /// etcd peer port on every host.
    #[serde(default = "default_peer_port")]
    pub peer_port: u16,
    /// etcd client port on every host.
    #[serde(default = "default_client_port")]
    pub client_port: u16,
    /// Dedicated etcd hosts.
    pub hosts: Vec<Host>,
    /// Clusters to create.
    pub clusters: Vec<ClusterSpec>,
}

fn default_required_halls() -> usize {
    3
}
fn default_peer_port() -> u16 {
    2380
}
fn default_client_port() -> u16 {
    2379
}

/// A dedicated host.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Host name; also the etcd member name.
    pub name: String,
    /// Hall the host stands in.
    pub hall: String,
    /// Address etcd listens on and advertises (IP or DNS name).
    pub address: String,
}

/// A cluster to place.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Cluster name, e.g. `entity-1`, `coord`.
    pub name: String,
    /// Tier: `entity` (3 members, one per hall) or `coord` (5 members, 2-2-1).
    pub tier: Tier,
    /// Optional pinned members (host names). A pinned placement is checked against the same rules and refused if it breaks them.
    #[serde(default)]
    pub members: Option<Vec<String>>,
}

impl Tier {
    /// Members of a cluster of this tier.
    pub fn size(self) -> usize {
        match self {
            Tier::Entity => 3,
            Tier::Coord => 5,
        }
    }
    /// Most members one hall may hold: fewer than a majority.
    pub fn cap_per_hall(self) -> usize {
        (self.size() - 1) / 2
    }
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Entity => "entity",
            Tier::Coord => "coord",
        }
    }
}

/// One member's etcd configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Member {
    /// etcd `--name` (the host name).
    pub name: String,
    /// Host it runs on.
    pub host: String,
    /// Hall of that host.
    pub hall: String,
    /// `--initial-advertise-peer-urls`.
    pub initial_advertise_peer_urls: String,
    /// `--listen-peer-urls`.
    pub listen_peer_urls: String,
    /// `--advertise-client-urls`.
    pub advertise_client_urls: String,
    /// `--listen-client-urls`.
    pub listen_client_urls: String,
}

/// A placed cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterPlan {
    /// Cluster name.
    pub name: String,
    /// Tier.
    pub tier: Tier,
    /// `--initial-cluster-token`: fresh for every cluster creation.
    pub initial_cluster_token: String,
    /// `--initial-cluster`.
    pub initial_cluster: String,
    /// `--initial-cluster-state`.
    pub initial_cluster_state: String,
    /// Members per hall.
    pub split: BTreeMap<String, usize>,
    /// Members, in name order.
    pub members: Vec<Member>,
}

/// The whole plan.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Plan {
    /// Clusters, in inventory order.
    pub clusters: Vec<ClusterPlan>,
    /// Hosts left without a member.
    pub spare_hosts: Vec<String>,
}

/// Where cluster tokens come from.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// Derived from a seed: reproducible. Use a new seed for every cluster creation.
    Seed(String),
    /// Random from the OS: fresh every run.
    Random,
}

impl TokenSource {
    fn token(&self, cluster: &str) -> String {
        let bytes: Vec<u8> = match self {
            TokenSource::Seed(seed) => {
                let mut h = Sha256::new();
                h.update(b"holdfast-cluster-token\0");
                h.update(seed.as_bytes());
                h.update(b"\0");
                h.update(cluster.as_bytes());
                h.finalize()[..8].to_vec()
            }
            TokenSource::Random => {
                use rand::RngCore;
                let mut b = [0u8; 8];
                rand::rng().fill_bytes(&mut b);
                b.to_vec()
            }
        };
        format!("{cluster}-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }
}

impl Inventory {
    /// Reads and validates an inventory file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProvisionError::Inventory { path: path.to_owned(), problems: vec![format!("cannot read it: {e}")] })?;
        Self::parse(&text, path)
    }

    /// Parses and validates inventory text.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let inv: Inventory =
            toml::from_str(text).map_err(|e| ProvisionError::Inventory { path: path.to_owned(), problems: vec![e.to_string()] })?;
        let problems = inv.problems();
        if problems.is_empty() { Ok(inv) } else { Err(ProvisionError::Inventory { path: path.to_owned(), problems }) }
    }

    /// Structural problems (duplicates, unknown pinned hosts, ...).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let mut names = BTreeSet::new();
        for h in &self.hosts {
            if h.name.is_empty() || h.hall.is_empty() || h.address.is_empty() {
                p.push(format!("hosts: {:?} needs a name, a hall and an address", h.name));
            }
            if !names.insert(h.name.as_str()) {
                p.push(format!("hosts: {:?} is listed twice", h.name));
            }
        }
        let mut cl = BTreeSet::new();
        for c in &self.clusters {
            if !cl.insert(c.name.as_str()) {
                p.push(format!("clusters: {:?} is listed twice", c.name));
            }
            for m in c.members.iter().flatten() {
                if !names.contains(m.as_str()) {
                    p.push(format!("clusters.{}.members: {m:?} is not in hosts", c.name));
                }
            }
        }
        if !(2..=3).contains(&self.required_halls) {
            p.push(format!(
                "required_halls: {} is not possible with these tiers: below 2 no hall loss is survivable, above 3 an entity cluster (3 members) cannot comply; use 3",
                self.required_halls
            ));
        }
        p
    }
}

/// Checks a plan against the rules; returns every violation.
pub fn violations(inv: &Inventory, clusters: &[(String, Tier, Vec<String>)]) -> Vec<String> {
    let hall_of: BTreeMap<&str, &str> = inv.hosts.iter().map(|h| (h.name.as_str(), h.hall.as_str())).collect();
    let mut used: BTreeMap<&str, &str> = BTreeMap::new();
    let mut v = Vec::new();
    for (name, tier, members) in clusters {
        if members.len() != tier.size() {
            v.push(format!("cluster {name}: {} members pinned, the {} tier has {}", members.len(), tier.name(), tier.size()));
        }
        let mut split: BTreeMap<&str, usize> = BTreeMap::new();
        for m in members {
            match hall_of.get(m.as_str()) {
                Some(h) => *split.entry(h).or_default() += 1,
                None => v.push(format!("cluster {name}: member {m:?} is not an inventory host")),
            }
            if let Some(other) = used.insert(m.as_str(), name.as_str()) {
                v.push(format!("host {m} would run members of both {other} and {name}; etcd nodes are dedicated, one member per host"));
            }
        }
        for (hall, n) in &split {
            if 2 * n > members.len() {
                v.push(format!(
                    "cluster {name}: hall {hall} would hold {n} of {} members, a majority; losing that hall would lose quorum",
                    members.len()
                ));
            }
        }
        if split.len() < inv.required_halls {
            v.push(format!(
                "cluster {name}: members span {} hall(s) ({}), fewer than the {} required",
                split.len(),
                split.keys().copied().collect::<Vec<_>>().join(", "),
                inv.required_halls
            ));
        }
    }
    v
}

/// Max-flow placement: clusters -> halls (cap per hall) -> free hosts per hall.
/// Returns per-cluster hall counts, or `None` if not every member fits.
fn assign_counts(caps: &[(usize, usize)], hall_free: &[usize]) -> Option<Vec<Vec<usize>>> {
    let (nc, nh) = (caps.len(), hall_free.len());
    // flow[c][h] = members of cluster c in hall h.
    let mut flow = vec![vec![0usize; nh]; nc];
    let mut hall_used = vec![0usize; nh];
    for c in 0..nc {
        let (size, _) = caps[c];
        for _ in 0..size {
            // BFS for an augmenting path from cluster c to a hall with free hosts,
            // through the residual graph (cluster -> hall forward, hall -> cluster backward).
            // Node ids: clusters 0..nc, halls nc..nc+nh.
            let mut prev: Vec<Option<usize>> = vec![None; nc + nh];
            let mut seen = vec![false; nc + nh];
            seen[c] = true;
            let mut q = VecDeque::from([c]);
            let mut end = None;
            while let Some(u) = q.pop_front() {
                if u < nc {
                    // Halls with the most free hosts first, then by name order.
                    let mut order: Vec<usize> = (0..nh).collect();
                    order.sort_by_key(|&h| (std::cmp::Reverse(hall_free[h] - hall_used[h]), h));
                    for h in order {
                        if !seen[nc + h] && flow[u][h] < caps[u].1 {
                            seen[nc + h] = true;
                            prev[nc + h] = Some(u);
                            if hall_used[h] < hall_free[h] {
                                end = Some(h);
                                break;
                            }
                            q.push_back(nc + h);
                        }
                    }
                    if end.is_some() {
                        break;
                    }
                } else {
                    let h = u - nc;
                    for c2 in 0..nc {
                        if !seen[c2] && flow[c2][h] > 0 {
                            seen[c2] = true;
                            prev[c2] = Some(u);
                            q.push_back(c2);
                        }
                    }
                }
            }
            let h_end = end?;
            hall_used[h_end] += 1;
            // Walk back: hall <- cluster (+1), cluster <- hall (-1), ...
            let mut node = nc + h_end;
            while let Some(p) = prev[node] {
                if node >= nc {
                    flow[p][node - nc] += 1;
                } else {
                    flow[node][p - nc] -= 1;
                }
                node = p;
            }
        }
    }
    Some(flow)
}

/// Computes the plan, or refuses with the reasons.
pub fn plan(inv: &Inventory, tokens: &TokenSource) -> Result<Plan> {
    let mut reasons = Vec::new();
    let mut hosts_by_hall: BTreeMap<&str, Vec<&Host>> = BTreeMap::new();
    for h in &inv.hosts {
        hosts_by_hall.entry(h.hall.as_str()).or_default().push(h);
    }
    for hs in hosts_by_hall.values_mut() {
        hs.sort_by(|a, b| a.name.cmp(&b.name));
    }
    // Pinned clusters first: checked, and their hosts taken out of the pool.
    let pinned: Vec<(String, Tier, Vec<String>)> =
        inv.clusters.iter().filter_map(|c| c.members.clone().map(|m| (c.name.clone(), c.tier, m))).collect();
    reasons.extend(violations(inv, &pinned));
    let taken: BTreeSet<&str> = pinned.iter().flat_map(|(_, _, m)| m.iter().map(String::as_str)).collect();
    let halls: Vec<&str> = hosts_by_hall.keys().copied().collect();
    let free: Vec<Vec<&Host>> =
        halls.iter().map(|h| hosts_by_hall[h].iter().copied().filter(|x| !taken.contains(x.name.as_str())).collect()).collect();
    let free_n: Vec<usize> = free.iter().map(Vec::len).collect();
    let open: Vec<&ClusterSpec> = inv.clusters.iter().filter(|c| c.members.is_none()).collect();
    // A per-hall cap below a majority also forces the span: 3 members with at
    // most 1 per hall, or 5 with at most 2, always cover at least three halls
    // (and `required_halls` is at most 3, see `Inventory::problems`).
    let caps: Vec<(usize, usize)> = open.iter().map(|c| (c.tier.size(), c.tier.cap_per_hall())).collect();
    let counts = assign_counts(&caps, &free_n);
    if counts.is_none() {
        reasons.extend(explain(inv, &open, &halls, &free_n));
    }
    if !reasons.is_empty() {
        return Err(ProvisionError::Placement { reasons });
    }
    let counts = counts.unwrap_or_default();
    // Hosts within a hall go to clusters in inventory order, hosts in name order.
    let mut next: Vec<usize> = vec![0; halls.len()];
    let mut placed: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (ci, c) in open.iter().enumerate() {
        let mut members = Vec::new();
        for (hi, n) in counts[ci].iter().enumerate() {
            for _ in 0..*n {
                members.push(free[hi][next[hi]].name.clone());
                next[hi] += 1;
            }
        }
        placed.insert(c.name.as_str(), members);
    }
    for (name, _, m) in &pinned {
        placed.insert(name.as_str(), m.clone());
    }
    let all: Vec<(String, Tier, Vec<String>)> =
        inv.clusters.iter().map(|c| (c.name.clone(), c.tier, placed.get(c.name.as_str()).cloned().unwrap_or_default())).collect();
    let v = violations(inv, &all);
    if !v.is_empty() {
        return Err(ProvisionError::Placement { reasons: v });
    }
    let by_name: BTreeMap<&str, &Host> = inv.hosts.iter().map(|h| (h.name.as_str(), h)).collect();
    let mut clusters = Vec::new();
    for (name, tier, mut names) in all {
        names.sort();
        let mut members = Vec::new();
        let mut split = BTreeMap::new();
        for n in &names {
            let Some(h) = by_name.get(n.as_str()) else {
                continue;
            };
            *split.entry(h.hall.clone()).or_insert(0) += 1;
            let peer = format!("https://{}:{}", h.address, inv.peer_port);
            let client = format!("https://{}:{}", h.address, inv.client_port);
            members.push(Member {
                name: h.name.clone(),
                host: h.name.clone(),
                hall: h.hall.clone(),
                initial_advertise_peer_urls: peer.clone(),
                listen_peer_urls: peer,
                advertise_client_urls: client.clone(),
                listen_client_urls: client,
            });
        }
        let initial_cluster = members.iter().map(|m| format!("{}={}", m.name, m.initial_advertise_peer_urls)).collect::<Vec<_>>().join(",");
        clusters.push(ClusterPlan {
            initial_cluster_token: tokens.token(&name),
            name,
            tier,
            initial_cluster,
            initial_cluster_state: "new".into(),
            split,
            members,
        });
    }
    let used: BTreeSet<&str> = placed.values().flatten().map(String::as_str).collect();
    let mut spare_hosts: Vec<String> = inv.hosts.iter().map(|h| h.name.clone()).filter(|n| !used.contains(n.as_str())).collect();
    spare_hosts.sort();
    Ok(Plan { clusters, spare_hosts })
}

fn explain(inv: &Inventory, open: &[&ClusterSpec], halls: &[&str], free: &[usize]) -> Vec<String> {
    let mut r = Vec::new();
    let offer = halls.iter().zip(free).map(|(h, n)| format!("{h}: {n}")).collect::<Vec<_>>().join(", ");
    let with_hosts = free.iter().filter(|&&n| n > 0).count();
    if with_hosts < inv.required_halls {
        r.push(format!(
            "free hosts stand in only {with_hosts} hall(s) ({offer}); every cluster must span at least {} halls so that no hall holds a majority. Add hosts in other halls",
            inv.required_halls
        ));
    }
    let need: usize = open.iter().map(|c| c.tier.size()).sum();
    let have: usize = free.iter().sum();
    if need > have {
        r.push(format!("the clusters need {need} dedicated hosts, the inventory has {have} free ({offer}). Add hosts or remove clusters"));
    }
    for c in open {
        let cap = c.tier.cap_per_hall();
        let fits: usize = free.iter().map(|&n| n.min(cap)).sum();
        if fits < c.tier.size() {
            r.push(format!(
                "cluster {} ({} tier) needs {} members with at most {cap} per hall; the halls can hold only {fits} ({offer})",
                c.name,
                c.tier.name(),
                c.tier.size()
            ));
        }
    }
    if r.is_empty() {
        r.push(format!(
            "the clusters cannot share the halls' hosts without one hall holding a majority of some cluster (free hosts per hall: {offer}). Add hosts to the smallest halls, or remove a cluster"
        ));
    }
    r
}

/// Human-readable plan.
pub fn render_text(p: &Plan) -> String {
    let mut s = String::new();
    for c in &p.clusters {
        let split = c.split.iter().map(|(h, n)| format!("{h}={n}")).collect::<Vec<_>>().join(" ");
        s.push_str(&format!("cluster {} ({}, {} members; {split})\n", c.name, c.tier.name(), c.members.len()));
        s.push_str(&format!("  initial-cluster-token: {}\n", c.initial_cluster_token));
        s.push_str(&format!("  initial-cluster: {}\n", c.initial_cluster));
        for m in &c.members {
            s.push_str(&format!("  member {} in {}: peer {} client {}\n", m.name, m.hall, m.listen_peer_urls, m.listen_client_urls));
        }
    }
    if !p.spare_hosts.is_empty() {
        s.push_str(&format!("spare hosts: {}\n", p.spare_hosts.join(", ")));
    }
    s
}

/// Where a member's TLS material lives on its host: one certificate for
/// clients and peers (`/etc/holdfast/tls/<member>.pem` and its key, e.g. `etcd-a1.pem`),
/// and the etcd CA that signs members and every tool's client certificate.
pub const ETCD_TLS_DIR: &str = "/etc/holdfast/tls";

/// The CN every member certificate carries (its SANs name the host). The
/// tools' client certificates come from the same etcd CA, so a member
/// admits as a Raft peer only this CN (`ETCD_PEER_CERT_ALLOWED_CN`): the
/// arbiter's or the observer's certificate cannot join the peer port.
pub const MEMBER_CN: &str = "holdfast etcd member";

/// A member's etcd settings as a systemd `EnvironmentFile=` (etcd reads
/// `ETCD_*`): client and peer TLS, both requiring a certificate from the
/// etcd CA (`--client-cert-auth`: a tool's etcd user is its certificate's
/// CN). Authentication itself is turned on once the cluster is up, by
/// `holdfastctl etcd roles`, which also makes every tool's role. Peers
/// must present a certificate with CN [`MEMBER_CN`].
pub fn render_env(c: &ClusterPlan, m: &Member) -> String {
    let (dir, name) = (ETCD_TLS_DIR, &m.name);
    let tls = format!(
        "ETCD_CERT_FILE={dir}/{name}.pem\n\
         ETCD_KEY_FILE={dir}/{name}-key.pem\n\
         ETCD_TRUSTED_CA_FILE={dir}/etcd-ca.pem\n\
         ETCD_CLIENT_CERT_AUTH=true\n\
         ETCD_PEER_CERT_FILE={dir}/{name}.pem\n\
         ETCD_PEER_KEY_FILE={dir}/{name}-key.pem\n\
         ETCD_PEER_TRUSTED_CA_FILE={dir}/etcd-ca.pem\n\
         ETCD_PEER_CLIENT_CERT_AUTH=true\n\
         ETCD_PEER_CERT_ALLOWED_CN={MEMBER_CN}\n"
    );
    let urls = format!(
        "# holdfast-provision plan: member {} of cluster {} ({}). Generated; do not edit.\n\
         ETCD_NAME={}\n\
         ETCD_INITIAL_CLUSTER={}\n\
         ETCD_INITIAL_CLUSTER_TOKEN={}\n\
         ETCD_INITIAL_CLUSTER_STATE={}\n\
         ETCD_INITIAL_ADVERTISE_PEER_URLS={}\n\
         ETCD_LISTEN_PEER_URLS={}\n\
         ETCD_ADVERTISE_CLIENT_URLS={}\n\
         ETCD_LISTEN_CLIENT_URLS={}\n",
        m.name,
        c.name,
        c.tier.name(),
        m.name,
        c.initial_cluster,
        c.initial_cluster_token,
        c.initial_cluster_state,
        m.initial_advertise_peer_urls,
        m.listen_peer_urls,
        m.advertise_client_urls,
        m.listen_client_urls
    );
    urls + &tls
}

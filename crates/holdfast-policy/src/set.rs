//! The compiled set: every valid class (by namespace) and grant (by name),
//! with a content hash. The controller publishes it to `/sys/policy`;
//! arbiters enforce it.

use crate::date::Date;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Duration;

/// Why a class exists: what two holders acting at once would cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    /// Two holders at once would corrupt data.
    Correctness,
    /// Two holders at once only waste work.
    Efficiency,
}

/// What the service promises for a class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Enforcement {
    /// The guarded resource refuses stale tokens: a passing pause test
    /// recorded for this class, this resource and this schema version proved
    /// it, and has not expired.
    Fenced {
        /// The resource as `holdfast-pausetest` names it (no credentials).
        resource: String,
        /// The resource's schema version the class declares.
        schema_version: u32,
    },
    /// Grants are ordered and expire, but nothing stops a paused holder from
    /// writing after its lease ends. Allowed only with a named owner of that
    /// risk and a date by which the waiver is reviewed.
    Advisory { risk_owner: String, waiver_expires: Date },
    /// Declared fenced, but no pause-test result counts for its resource and
    /// schema version (none, failed, expired or for another version): the
    /// controller publishes it as advisory, with the reason, until one
    /// does. No one accepted this risk: the risk register lists it and an
    /// alert fires.
    Demoted { resource: String, schema_version: u32, reason: String },
}

impl Enforcement {
    /// Whether the class is fenced in force (not merely declared so).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Enforcement::Fenced { .. })
    }

    /// Whether the class is declared fenced but published as advisory.
    pub fn is_demoted(&self) -> bool {
        matches!(self, Enforcement::Demoted { .. })
    }

    /// The word `--json` outputs and tables print: fenced, advisory or demoted.
    pub fn mode(&self) -> &'static str {
        match self {
            Enforcement::Fenced { .. } => "fenced",
            Enforcement::Advisory { .. } => "advisory",
            Enforcement::Demoted { .. } => "demoted",
        }
    }
}

/// Which etcd clusters hold the class's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// The coord cluster: few, long-lived coordination locks (leader
    /// election, singletons); tuned for availability.
    Coord,
    /// The sharded entity clusters: many per-entity locks; tuned for write
    /// throughput.
    Entity,
}

/// What an arbiter does when it cannot reach a majority of etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnQuorumLoss {
    /// Grant and renew nothing; holders self-fence as their deadlines pass.
    Closed,
    /// Grant from local memory with token 0 (efficiency, advisory classes only).
    Open,
}

/// How waiters for a held key are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fairness {
    /// In arbiter memory; lost on arbiter restart or rebalance.
    BestEffort,
    /// Waiters stored under `/q/`, at two consensus writes per waiter.
    Durable,
}

/// One lock class: the rules for every key in its namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    /// The name in `[class.<name>]`.
    pub name: String,
    /// The first segment of every key the class governs (`<namespace>/<key>`).
    pub namespace: String,
    pub purpose: Purpose,
    pub enforcement: Enforcement,
    /// The session TTL: callers cannot choose another.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    pub tier: Tier,
    pub on_quorum_loss: OnQuorumLoss,
    pub fairness: Fairness,
    /// The region the namespace is homed to; arbiters elsewhere refuse its
    /// keys with a typed error naming it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_region: Option<String>,
}

/// One grant: what an identity, or every identity under a prefix, may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The name in `[grant.<name>]`.
    pub name: String,
    /// An exact SPIFFE ID, or a prefix of SPIFFE IDs ending in `/` (matches
    /// every ID under it; see [`Grant::matches`]).
    pub identity: String,
    /// Key prefixes (`ns/` or `ns/key-prefix`) the identity may lock.
    pub lock: Vec<String>,
    /// Key prefixes whose holder the identity may inspect.
    pub inspect: Vec<String>,
    /// Key prefixes the identity may force-release (still with two-person
    /// approval).
    pub force_release: Vec<String>,
}

impl Grant {
    /// Whether the identity is a prefix (ends in `/`) rather than one ID.
    pub fn identity_is_prefix(&self) -> bool {
        self.identity.ends_with('/')
    }

    /// Whether the grant applies to a caller's SPIFFE ID.
    pub fn matches(&self, spiffe_id: &str) -> bool {
        if self.identity_is_prefix() { spiffe_id.starts_with(&self.identity) } else { spiffe_id == self.identity }
    }
}

/// The compiled class and grant set: what the controller publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompiledSet {
    /// Every class, by its namespace (a namespace has exactly one class).
    pub classes: BTreeMap<String, Class>,
    /// Every grant, by its name.
    pub grants: BTreeMap<String, Grant>,
    /// `sha256:<64 hex digits>` of the canonical JSON of `classes` and
    /// `grants` (see [`content_hash`]): equal sets have equal hashes, however
    /// the files were split, ordered or commented.
    pub hash: String,
}

impl CompiledSet {
    pub fn new(classes: BTreeMap<String, Class>, grants: BTreeMap<String, Grant>) -> Self {
        let hash = content_hash(&classes, &grants);
        CompiledSet { classes, grants, hash }
    }

    /// Whether `hash` matches the content (a reader's check of a published set).
    pub fn hash_is_valid(&self) -> bool {
        self.hash == content_hash(&self.classes, &self.grants)
    }

    /// The class governing a namespace.
    pub fn class_for(&self, namespace: &str) -> Option<&Class> {
        self.classes.get(namespace)
    }
}

/// `sha256:` and the lowercase hex SHA-256 of `{"classes":…,"grants":…}` as
/// serde_json writes it: maps in key order, struct fields in declaration
/// order, no whitespace. Serialising these plain structs cannot fail; if it
/// ever did, the hash of the empty input would not match any real set.
pub fn content_hash(classes: &BTreeMap<String, Class>, grants: &BTreeMap<String, Grant>) -> String {
    #[derive(Serialize)]
    struct Content<'a> {
        classes: &'a BTreeMap<String, Class>,
        grants: &'a BTreeMap<String, Grant>,
    }
    let bytes = serde_json::to_vec(&Content { classes, grants }).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

//! The published policy: the documents at `/sys/policy` and
//! `/sys/policy-status`, the pause-test results the controller validates
//! against, and the leader-guarded transactions that write them.
//!
//! Only the active holdfast-controller writes here, and every write compares
//! the create revision of its election leader key: a controller whose lease
//! ended (deposed, paused, cut off) cannot publish, whatever it believes.
//! The publish also compares `/sys/policy`'s mod revision with the one the
//! controller read, so two controllers can never lose each other's update.

use crate::etcd::Etcd;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use holdfast_model::layout::{self, PAUSETEST_PREFIX, POLICY_KEY, POLICY_STATUS_KEY, PauseTestRecord};
use holdfast_policy::CompiledSet;
use serde::{Deserialize, Serialize};

/// The document at [`POLICY_KEY`]: the compiled class and grant set every
/// arbiter enforces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedPolicy {
    /// 1 for the first set published on a cluster, +1 on every publish.
    pub version: u64,
    /// The set's content hash (`sha256:<hex>`, equal to `set.hash`).
    pub hash: String,
    /// The HEAD commit of the Git checkout the policy directory is in, if
    /// it is in one.
    #[serde(default)]
    pub source_commit: Option<String>,
    /// When the controller published it (milliseconds since the Unix epoch).
    pub published_unix_ms: u64,
    /// Which controller published it (`host pid N`).
    #[serde(default)]
    pub published_by: String,
    pub set: CompiledSet,
}

/// The document at [`POLICY_STATUS_KEY`]: what the active controller last
/// concluded, for `holdfastctl status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyStatus {
    /// The version at `/sys/policy` (0: nothing published yet).
    pub version: u64,
    /// Its hash (`None`: nothing published yet).
    pub hash: Option<String>,
    /// The refusal of the files currently in the policy directory, or
    /// `None` when they are valid (published, or equal to the published set).
    pub last_refusal: Option<Refusal>,
    /// The controller that wrote this (`host pid N`).
    pub controller: String,
    /// When it was written (milliseconds since the Unix epoch).
    pub updated_unix_ms: u64,
}

/// A change the controller refused to publish, and every reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub at_unix_ms: u64,
    /// The policy directory that was read.
    pub dir: String,
    pub problems: Vec<RefusedProblem>,
}

/// One problem of a refused change (as `holdfastctl class check` prints it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusedProblem {
    pub file: String,
    /// 1-based; 0 when the problem is about the directory, not a line.
    pub line: usize,
    /// The stable rule code (`ttl-out-of-range`, …; `unreadable` for a
    /// directory that could not be read, `not-checked` for a rule that could
    /// not be checked).
    pub rule: String,
    pub message: String,
}

impl std::fmt::Display for RefusedProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}

impl From<&holdfast_policy::Problem> for RefusedProblem {
    fn from(p: &holdfast_policy::Problem) -> Self {
        RefusedProblem { file: p.file.clone(), line: p.line, rule: p.rule.code(), message: p.message.clone() }
    }
}

/// The election key that makes a controller the leader: its key and create
/// revision (etcd's `LeaderKey`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub key: Vec<u8>,
    pub create_revision: i64,
}

impl Leadership {
    fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.create_revision)
    }
}

/// A document read from etcd with its mod revision; `Malformed` keeps the
/// revision (a write must still compare it) and the etcd version count.
#[derive(Debug, Clone)]
pub enum Stored<T> {
    Absent,
    Present { doc: T, mod_revision: i64 },
    Malformed { error: String, mod_revision: i64, writes: i64 },
}

impl<T> Stored<T> {
    pub fn mod_revision(&self) -> i64 {
        match self {
            Stored::Absent => 0,
            Stored::Present { mod_revision, .. } | Stored::Malformed { mod_revision, .. } => *mod_revision,
        }
    }

    pub fn doc(&self) -> Option<&T> {
        match self {
            Stored::Present { doc, .. } => Some(doc),
            _ => None,
        }
    }
}

fn stored<T: for<'de> Deserialize<'de>>(key: &str, kv: Option<&KeyValue>) -> Stored<T> {
    match kv {
        None => Stored::Absent,
        Some(kv) => match layout::decode::<T>(key, kv.value()) {
            Ok(doc) => Stored::Present { doc, mod_revision: kv.mod_revision() },
            Err(error) => Stored::Malformed { error, mod_revision: kv.mod_revision(), writes: kv.version() },
        },
    }
}

impl Stored<PublishedPolicy> {
    /// The version the next publish gets: one more than the stored one (for
    /// a malformed document, one more than the number of writes to the key,
    /// so versions still only grow).
    pub fn next_version(&self) -> u64 {
        match self {
            Stored::Absent => 1,
            Stored::Present { doc, .. } => doc.version + 1,
            Stored::Malformed { writes, .. } => (*writes).max(0) as u64 + 1,
        }
    }
}

/// Decodes the records under [`PAUSETEST_PREFIX`]; records that do not
/// decode are returned as messages (and do not count).
pub fn decode_pause_tests(kvs: &[KeyValue]) -> (Vec<PauseTestRecord>, Vec<String>) {
    let mut records = Vec::new();
    let mut bad = Vec::new();
    for kv in kvs {
        let key = String::from_utf8_lossy(kv.key());
        match layout::decode::<PauseTestRecord>(&key, kv.value()) {
            Ok(r) => records.push(r),
            Err(e) => bad.push(e),
        }
    }
    (records, bad)
}

/// Every pause-test result under `/sys/pausetest/` (what `holdfastctl class
/// check --etcd-endpoint` reads), and the records that did not decode.
pub async fn read_pause_tests(etcd: &Etcd) -> Result<(Vec<PauseTestRecord>, Vec<String>), etcd_client::Error> {
    let resp = etcd.get(PAUSETEST_PREFIX, Some(GetOptions::new().with_prefix())).await?;
    Ok(decode_pause_tests(resp.kvs()))
}

/// The published policy, for readers (standby controllers, arbiters, status).
pub async fn read_published(etcd: &Etcd) -> Result<Stored<PublishedPolicy>, etcd_client::Error> {
    let resp = etcd.get(POLICY_KEY, None).await?;
    Ok(stored(POLICY_KEY, resp.kvs().first()))
}

/// The published policy and the epoch of the cluster it is on (0: none
/// initialised), read in one transaction: an arbiter orders the sets it
/// enforces by (epoch, version), so that a restore, which rolls the version
/// back and is followed by an epoch advance, never leaves running arbiters
/// ignoring the controller's next publications (docs/policy.md).
pub async fn read_published_at_epoch(etcd: &Etcd) -> Result<(Stored<PublishedPolicy>, u32), etcd_client::Error> {
    let txn = Txn::new().and_then([TxnOp::get(POLICY_KEY, None), TxnOp::get(layout::EPOCH_KEY, None)]);
    let resp = etcd.txn(txn).await?;
    let mut gets = resp.op_responses().into_iter().map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    });
    let policy = stored(POLICY_KEY, gets.next().flatten().as_ref());
    Ok((policy, epoch_of(gets.next().flatten().as_ref())))
}

/// The epoch in an [`layout::EPOCH_KEY`] value (0: absent or malformed).
pub fn epoch_of(kv: Option<&KeyValue>) -> u32 {
    kv.and_then(|kv| layout::decode::<layout::EpochRecord>(layout::EPOCH_KEY, kv.value()).ok()).map_or(0, |r| r.epoch)
}

/// The published policy from a key-value pair read or watched at
/// [`POLICY_KEY`] (`None`: the key is absent or was deleted).
pub fn decode_published(kv: Option<&KeyValue>) -> Stored<PublishedPolicy> {
    stored(POLICY_KEY, kv)
}

/// The status document.
pub async fn read_status(etcd: &Etcd) -> Result<Stored<PolicyStatus>, etcd_client::Error> {
    let resp = etcd.get(POLICY_STATUS_KEY, None).await?;
    Ok(stored(POLICY_STATUS_KEY, resp.kvs().first()))
}

/// The current leader's value under the election `name` (a controller
/// writes `HOST pid PID`), or `None` when no candidate holds it.
pub async fn read_controller_leader(etcd: &Etcd, name: &str) -> Result<Option<String>, etcd_client::Error> {
    match etcd.client.election_client().leader(name).await {
        Ok(r) => Ok(r.kv().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())),
        Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("no leader") => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the leader reads at the start of a round, in one transaction.
#[derive(Debug, Clone)]
pub struct LeaderView {
    pub published: Stored<PublishedPolicy>,
    pub status: Stored<PolicyStatus>,
    pub pause_tests: Vec<PauseTestRecord>,
    /// Pause-test records that did not decode.
    pub bad_pause_tests: Vec<String>,
}

/// Reads `/sys/policy`, `/sys/policy-status` and `/sys/pausetest/` in one
/// transaction that also proves the leadership: `Ok(None)` when the leader
/// key is gone (or belongs to another campaign).
pub async fn read_as_leader(etcd: &Etcd, leader: &Leadership) -> Result<Option<LeaderView>, etcd_client::Error> {
    let txn = Txn::new().when([leader.compare()]).and_then([
        TxnOp::get(POLICY_KEY, None),
        TxnOp::get(POLICY_STATUS_KEY, None),
        TxnOp::get(PAUSETEST_PREFIX, Some(GetOptions::new().with_prefix())),
    ]);
    let resp = etcd.txn(txn).await?;
    if !resp.succeeded() {
        return Ok(None);
    }
    let mut gets = resp.op_responses().into_iter().map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().to_vec(),
        _ => Vec::new(),
    });
    let policy = gets.next().unwrap_or_default();
    let status = gets.next().unwrap_or_default();
    let (pause_tests, bad_pause_tests) = decode_pause_tests(&gets.next().unwrap_or_default());
    Ok(Some(LeaderView {
        published: stored(POLICY_KEY, policy.first()),
        status: stored(POLICY_STATUS_KEY, status.first()),
        pause_tests,
        bad_pause_tests,
    }))
}

/// How a leader-guarded write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written at this revision.
    Written(i64),
    /// The leader key is gone: this controller is no longer the leader and
    /// wrote nothing.
    NotLeader,
    /// `/sys/policy` changed since it was read (another writer); nothing was
    /// written: read again.
    Raced,
}

/// Publishes `policy` (and `status`) if the leadership still holds and
/// `/sys/policy` is still at `seen_mod_revision` (0: absent).
pub async fn publish(
    etcd: &Etcd,
    leader: &Leadership,
    seen_mod_revision: i64,
    policy: &PublishedPolicy,
    status: &PolicyStatus,
) -> Result<WriteOutcome, etcd_client::Error> {
    let txn = Txn::new()
        .when([leader.compare(), Compare::mod_revision(POLICY_KEY, CompareOp::Equal, seen_mod_revision)])
        .and_then([TxnOp::put(POLICY_KEY, layout::encode(policy), None), TxnOp::put(POLICY_STATUS_KEY, layout::encode(status), None)])
        .or_else([TxnOp::get(leader.key.clone(), None)]);
    outcome(etcd, txn, leader).await
}

/// Writes the status document if the leadership still holds.
pub async fn write_status(etcd: &Etcd, leader: &Leadership, status: &PolicyStatus) -> Result<WriteOutcome, etcd_client::Error> {
    let txn = Txn::new()
        .when([leader.compare()])
        .and_then([TxnOp::put(POLICY_STATUS_KEY, layout::encode(status), None)])
        .or_else([TxnOp::get(leader.key.clone(), None)]);
    outcome(etcd, txn, leader).await
}

async fn outcome(etcd: &Etcd, txn: Txn, leader: &Leadership) -> Result<WriteOutcome, etcd_client::Error> {
    let resp = etcd.txn(txn).await?;
    if resp.succeeded() {
        return Ok(WriteOutcome::Written(resp.header().map(|h| h.revision()).unwrap_or(0)));
    }
    let still_leader = resp.op_responses().into_iter().any(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().is_some_and(|kv| kv.create_revision() == leader.create_revision),
        _ => false,
    });
    Ok(if still_leader { WriteOutcome::Raced } else { WriteOutcome::NotLeader })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn documents_round_trip_and_versions_only_grow() {
        let set = CompiledSet::new(BTreeMap::new(), BTreeMap::new());
        let p = PublishedPolicy {
            version: 3,
            hash: set.hash.clone(),
            source_commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
            published_unix_ms: 1,
            published_by: "h pid 1".into(),
            set,
        };
        let bytes = layout::encode(&p);
        assert_eq!(layout::decode::<PublishedPolicy>(POLICY_KEY, &bytes).unwrap(), p);
        let s = Stored::Present { doc: p, mod_revision: 9 };
        assert_eq!(s.next_version(), 4);
        assert_eq!(Stored::<PublishedPolicy>::Absent.next_version(), 1);
        let m = Stored::<PublishedPolicy>::Malformed { error: "x".into(), mod_revision: 5, writes: 7 };
        assert_eq!((m.next_version(), m.mod_revision()), (8, 5));

        let status = PolicyStatus {
            version: 0,
            hash: None,
            last_refusal: Some(Refusal {
                at_unix_ms: 2,
                dir: "/etc/holdfast".into(),
                problems: vec![RefusedProblem { file: "f.toml".into(), line: 3, rule: "ttl-out-of-range".into(), message: "m".into() }],
            }),
            controller: "h pid 1".into(),
            updated_unix_ms: 2,
        };
        let json = String::from_utf8(layout::encode(&status)).unwrap();
        assert!(json.contains("\"last_refusal\":{\"at_unix_ms\":2"), "{json}");
        assert_eq!(layout::decode::<PolicyStatus>(POLICY_STATUS_KEY, json.as_bytes()).unwrap(), status);
        assert_eq!(status.last_refusal.unwrap().problems[0].to_string(), "f.toml:3: m");
    }
}

//! The etcd key layout (ARCHITECTURE.md, "etcd layout") and the JSON records
//! stored there. Every component builds keys through these functions.

use serde::{Deserialize, Serialize};

/// `{epoch, cluster_id, log_floor}` — compared in every grant.
pub const EPOCH_KEY: &str = "/sys/epoch";
/// Present while a rewind has been detected and not yet cleared by an epoch
/// advance. Makes the seal durable across arbiter restarts.
pub const SEAL_KEY: &str = "/sys/seal";
/// A raised log-offset floor, refreshed by arbiters (see [`crate::seal`]).
pub const WATERMARK_KEY: &str = "/sys/watermark";
/// Scratch key used by `epoch init` to move a new cluster's revision forward.
pub const INIT_PAD_KEY: &str = "/sys/init-pad";
/// The epoch allocator ([`EpochsRecord`]): the highest epoch ever minted,
/// only ever raised, in the same transaction as the mint. It lives on the
/// coord cluster; while one cluster serves both tiers it is that cluster's
/// (and a restore of it rolls the allocator back too: the arbiters' own
/// record of what they served is what covers that case).
pub const EPOCHS_KEY: &str = "/sys/epochs";

/// Pause-test results: `/sys/pausetest/<class>/<resource>` (see
/// [`pausetest_key`]). Nothing else lives under this prefix; an epoch
/// advance leaves it alone (results are about resources, not grants).
pub const PAUSETEST_PREFIX: &str = "/sys/pausetest/";
/// How long a pause-test result counts.
pub const PAUSETEST_VALIDITY: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// Withdrawal markers: `/sys/withdrawn/<ns>/<key>` (see [`withdrawn_key`]),
/// written by the same transaction that withdraws a grant the arbiter cannot
/// vouch for, on the withdrawn hold's session lease. They make a withdrawal
/// visible in etcd's log: the only hold deletes that are neither a release
/// nor the end of a session.
pub const WITHDRAWN_PREFIX: &str = "/sys/withdrawn/";

/// Shipped fail-open spool records: `/sys/unprotected/<spool>/<seq>` (see
/// [`unprotected_key`]), each one [`crate::spool::Entry`] as JSON, put by
/// the arbiter that spooled it once etcd is back, compared absent so a
/// record shipped twice (a crash between shipping and emptying the spool)
/// is stored once. The tailer turns each into an audit event with
/// `unprotected = true`.
pub const UNPROTECTED_PREFIX: &str = "/sys/unprotected/";

/// The key of record `seq` of spool `spool` (its ID, 16 hex digits).
pub fn unprotected_key(spool: &str, seq: u64) -> String {
    format!("{UNPROTECTED_PREFIX}{spool}/{seq:020}")
}

/// Used approval nonces (`/sys/nonce/<nonce>`): written by the transaction
/// that performs a two-person operation, compared absent by it, so a
/// request runs at most once.
pub const NONCE_PREFIX: &str = "/sys/nonce/";

pub fn nonce_key(nonce: &str) -> String {
    format!("{NONCE_PREFIX}{nonce}")
}

/// Force-release records (`/sys/force/<nonce>`), on a 24 h lease.
pub const FORCE_PREFIX: &str = "/sys/force/";

pub fn force_key(nonce: &str) -> String {
    format!("{FORCE_PREFIX}{nonce}")
}

/// How long a force-release record stays in etcd (the audit tailer archives
/// it before then).
pub const FORCE_RECORD_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The record at [`force_key`]: who ended which hold, approved by whom, and
/// whether the class is fenced. The hold is named by its holder, session and
/// grant time — never its create revision, which with the epoch is the
/// holder's token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForceRecord {
    pub namespace: String,
    pub key: String,
    pub holder: String,
    pub session: i64,
    pub granted_unix_ms: u64,
    pub class: String,
    pub fenced: bool,
    pub requester: String,
    pub approver: String,
    pub reason: String,
    pub revoked_session: bool,
    pub at_unix: u64,
}

/// The record at [`nonce_key`]: which two-person operation used the nonce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NonceRecord {
    pub kind: String,
    pub requester: String,
    pub signers: Vec<String>,
    pub reason: String,
    pub at_unix: u64,
}

/// The compiled class and grant set, published by the active
/// holdfast-controller as one JSON document (`holdfast_store::policy::
/// PublishedPolicy`) and watched by every arbiter. Replaced on each good
/// change; never written with an invalid set.
pub const POLICY_KEY: &str = "/sys/policy";
/// The shard map (`crate::shardmap::ShardMap`), on the coord cluster: which
/// entity cluster each key lives on, what operators asked for, and the
/// moves in flight.
pub const SHARDMAP_KEY: &str = "/sys/shardmap";
/// The controller's report on the published set and on the last refused
/// change (`holdfast_store::policy::PolicyStatus`), for `holdfastctl status`.
pub const POLICY_STATUS_KEY: &str = "/sys/policy-status";
/// The default etcd election name of holdfast-controller: candidates put
/// `<name>/<lease hex>` on their lease; the oldest such key is the leader.
pub const CONTROLLER_ELECTION: &str = "/sys/election/controller";

/// The default etcd election name of holdfast-tailer (one active tailer
/// per cluster; the same scheme as [`CONTROLLER_ELECTION`]).
pub const TAILER_ELECTION: &str = "/sys/election/tailer";

/// Close markers: `/sys/closed/<lease as 16 hex digits>` (see
/// [`closed_key`]), written on the session's lease by the transaction that
/// deletes a session record to close it. They make a close visible in
/// etcd's log: a record deleted with a marker was closed; one deleted
/// without a marker lapsed (or ended with an epoch advance). The lease
/// revoke that follows deletes the marker with the session's holds.
pub const CLOSED_PREFIX: &str = "/sys/closed/";

pub fn closed_key(lease: i64) -> String {
    format!("{CLOSED_PREFIX}{:016x}", lease as u64)
}

/// The lease a close marker names.
pub fn lease_of_closed(marker_key: &str) -> Option<i64> {
    parse_lease(marker_key.strip_prefix(CLOSED_PREFIX)?)
}

/// The lease of a session record key (`/s/<lease>`).
pub fn lease_of_session(session_key: &str) -> Option<i64> {
    parse_lease(session_key.strip_prefix(SESSION_PREFIX)?)
}

fn parse_lease(hex: &str) -> Option<i64> {
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok().map(|v| v as i64)).flatten()
}

pub const SESSION_PREFIX: &str = "/s/";
pub const HOLD_PREFIX: &str = "/l/";
pub const WAITER_PREFIX: &str = "/q/";

/// `/s/<lease as 16 hex digits>`
pub fn session_key(lease: i64) -> String {
    format!("{SESSION_PREFIX}{:016x}", lease as u64)
}

/// `/l/<ns>/<key>`; the key must already be validated.
pub fn hold_key(key: &crate::LockKey) -> String {
    format!("{HOLD_PREFIX}{}/{}", key.namespace(), key.key())
}

/// Drain markers, on an entity cluster: `/sys/drain/<unit>` (see
/// [`drain_key`]). The rebalancer writes one on a move's source before it
/// marks the range draining in the shard map, and every grant transaction
/// compares the markers of its key absent ([`drain_keys`]), so no grant
/// lands on the source after the rebalancer's wait for its holds began,
/// whatever map an arbiter's watch has delivered (docs/protocol.md, the
/// drain fence). A marker stays after its range has moved away, and is
/// removed from a cluster before a range moves back to it.
pub const DRAIN_PREFIX: &str = "/sys/drain/";

/// The marker of one homing unit (`<ns>/<segments>`,
/// [`crate::shardmap::Layout::unit`]), or of a whole namespace (`<ns>`: an
/// assigned namespace moves as one).
pub fn drain_key(unit: &str) -> String {
    format!("{DRAIN_PREFIX}{unit}")
}

/// Every marker that drains `key`: its namespace's, and its unit's at each
/// number of path segments a namespace may home by (1 to
/// [`crate::shardmap::MAX_SEGMENTS`], no more than the key has). Comparing
/// all of them makes a grant's fence independent of the segment count in
/// the arbiter's copy of the map; a key of one segment has two markers.
pub fn drain_keys(key: &crate::LockKey) -> Vec<String> {
    let mut keys = vec![drain_key(key.namespace())];
    let mut unit = key.namespace().to_string();
    for segment in key.key().split('/').take(crate::shardmap::MAX_SEGMENTS as usize) {
        unit.push('/');
        unit.push_str(segment);
        keys.push(drain_key(&unit));
    }
    keys
}

/// The record at a drain marker: when the drain began and when the
/// rebalancer expects the range to serve again (its wait's bound), from
/// which an arbiter tells a refused client how long to wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    pub since_unix_ms: u64,
    pub until_unix_ms: u64,
}

/// `/sys/withdrawn/<ns>/<key>` for the hold at `hold_key` (`/l/<ns>/<key>`).
pub fn withdrawn_key(hold_key: &str) -> String {
    format!("{WITHDRAWN_PREFIX}{}", hold_key.strip_prefix(HOLD_PREFIX).unwrap_or(hold_key))
}

/// The hold key a withdrawal marker names (the inverse of [`withdrawn_key`]).
pub fn hold_key_of_withdrawn(marker_key: &str) -> Option<String> {
    marker_key.strip_prefix(WITHDRAWN_PREFIX).map(|rest| format!("{HOLD_PREFIX}{rest}"))
}

/// `/sys/pausetest/<class>/<resource>`: the class is validated (see
/// [`validate_class`]); the resource description is percent-encoded into one
/// segment, so `/` in it cannot make two results collide.
pub fn pausetest_key(class: &str, resource: &str) -> String {
    let mut key = format!("{PAUSETEST_PREFIX}{class}/");
    for b in resource.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            key.push(b as char);
        } else {
            key.push_str(&format!("%{b:02X}"));
        }
    }
    key
}

/// Class names, as in `[class.<name>]`: 1..=63 of `a-z 0-9 -`, not starting
/// or ending with `-`.
pub fn validate_class(class: &str) -> Result<(), crate::key::FieldError> {
    let ok = !class.is_empty()
        && class.len() <= 63
        && class.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !class.starts_with('-')
        && !class.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(crate::key::FieldError::new(
            "class",
            format!("{class:?} is not a class name; use 1..=63 of a-z, 0-9 and '-', not starting or ending with '-'"),
        ))
    }
}

/// The record at [`EPOCH_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochRecord {
    pub epoch: u32,
    /// The etcd cluster ID this epoch was minted for.
    pub cluster_id: u64,
    /// Log-offset floor (raft index − revision) measured when the epoch was
    /// minted. See [`crate::seal`].
    pub log_floor: i64,
    /// 32 random hex digits drawn when the epoch was minted (init or
    /// advance): no two mints share one, so an epoch minted again after a
    /// restore never looks like the one an arbiter served, even where the
    /// cluster ID and the log floor happen to match. Empty in records
    /// written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mint: String,
}

/// The record at [`EPOCHS_KEY`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochsRecord {
    /// The highest epoch minted by any init or advance that went through
    /// this allocator; a new mint must be above it.
    pub highest: u32,
}

/// The record at [`SEAL_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealRecord {
    pub reason: String,
    /// Seconds since the Unix epoch when an arbiter wrote this record.
    pub sealed_at_unix: u64,
}

/// The record at [`WATERMARK_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkRecord {
    pub log_floor: i64,
}

/// The record at `/s/<lease>`: who owns the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    pub spiffe_id: String,
    pub ttl_secs: u64,
    /// A session on the coord tier (for keys of coord-tier classes); left
    /// out of the record for the entity tier, so entity records read as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coord: bool,
}

/// The record at `/l/<ns>/<key>`: the hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRecord {
    pub spiffe_id: String,
    pub session: i64,
    pub epoch: u32,
    /// Wall-clock time of the grant (for hold-duration metrics and inspect;
    /// never used for correctness).
    #[serde(default)]
    pub granted_unix_ms: u64,
}

/// The record at [`withdrawn_key`]: which hold was withdrawn, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WithdrawnRecord {
    /// The withdrawn hold's create revision (its grant's revision).
    pub create_revision: i64,
    /// The withdrawn hold's session lease.
    pub session: i64,
    /// Why the arbiter could not vouch for the grant.
    pub reason: String,
}

/// Whether the fence held in a pause test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseTestOutcome {
    /// The frozen holder's writes were rejected after its lock passed on.
    Pass,
    /// A stale write was accepted (or a valid one refused).
    Fail,
}

/// The record at [`pausetest_key`]: one run of `holdfast-pausetest`. It is
/// also put on an etcd lease of [`PAUSETEST_VALIDITY`], but etcd restarts a
/// lease's TTL after a leader change, so readers decide expiry from
/// `expires_unix_ms` ([`PauseTestRecord::invalid_because`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseTestRecord {
    /// The lock class the result is for.
    pub class: String,
    /// The resource, without credentials (e.g. `postgresql://db:5432/app?table=t`).
    pub resource: String,
    /// The resource's schema version when the test ran.
    pub schema_version: u32,
    /// When the test ran (milliseconds since the Unix epoch).
    pub time_unix_ms: u64,
    /// When the result stops counting.
    pub expires_unix_ms: u64,
    /// The etcd server version the lock service ran on.
    pub etcd_version: String,
    pub outcome: PauseTestOutcome,
    /// Why, in words: which write was accepted or rejected.
    pub reason: String,
    /// The fence implementation exercised (`correct`, or a deliberately
    /// wrong one shown failing).
    pub fence_mode: String,
}

impl PauseTestRecord {
    /// `None` if the result still counts; otherwise why it is treated as
    /// absent (expired, or the resource's schema changed since).
    pub fn invalid_because(&self, now_unix_ms: u64, current_schema_version: u32) -> Option<String> {
        if now_unix_ms >= self.expires_unix_ms {
            return Some(format!(
                "the result expired (it was recorded at {} ms, valid until {} ms)",
                self.time_unix_ms, self.expires_unix_ms
            ));
        }
        if self.schema_version != current_schema_version {
            return Some(format!(
                "the result is for schema version {}, and the resource is now at schema version {current_schema_version}",
                self.schema_version
            ));
        }
        None
    }
}

/// Serialises a record. Records are plain structs of strings and integers,
/// for which serde_json cannot fail.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).unwrap_or_default()
}

pub fn decode<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("{key} holds a malformed record ({e}); it was not written by holdfast"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_records_round_trip() {
        let k = crate::LockKey::new("payments", "ledger/7").unwrap();
        assert_eq!(hold_key(&k), "/l/payments/ledger/7");
        assert_eq!(session_key(0x1234), "/s/0000000000001234");
        assert_eq!(lease_of_session(&session_key(-5)), Some(-5));
        assert_eq!(lease_of_closed(&closed_key(0x7abc)), Some(0x7abc));
        assert_eq!(lease_of_session("/s/12"), None);
        let r = EpochRecord { epoch: 2, cluster_id: u64::MAX, log_floor: -3, mint: "0f".repeat(16) };
        assert_eq!(decode::<EpochRecord>(EPOCH_KEY, &encode(&r)).unwrap(), r);
        let old = decode::<EpochRecord>(EPOCH_KEY, b"{\"epoch\":1,\"cluster_id\":7,\"log_floor\":0}").unwrap();
        assert_eq!(old.mint, "", "a record from before the mint reads back");
        assert!(!encode(&EpochRecord { mint: String::new(), ..old.clone() }).windows(4).any(|w| w == b"mint"));
        assert!(decode::<EpochRecord>(EPOCH_KEY, b"{\"epoch\":1}").is_err());
    }

    #[test]
    fn a_keys_drain_markers_are_its_namespace_and_each_unit_it_can_be_homed_by() {
        let k = crate::LockKey::new("payments", "eu/acct-7/ledger").unwrap();
        assert_eq!(
            drain_keys(&k),
            ["/sys/drain/payments", "/sys/drain/payments/eu", "/sys/drain/payments/eu/acct-7", "/sys/drain/payments/eu/acct-7/ledger"]
        );
        // Whatever the map's segment count, the key's unit is among them.
        let mut layout = crate::shardmap::Layout::default();
        for n in 1..=crate::shardmap::MAX_SEGMENTS {
            layout.segments.insert("payments".into(), n);
            assert!(drain_keys(&k).contains(&drain_key(&layout.unit(&k))), "{n} segments");
        }
        let deep = crate::LockKey::new("ns", &vec!["s"; 20].join("/")).unwrap();
        assert_eq!(drain_keys(&deep).len(), 1 + crate::shardmap::MAX_SEGMENTS as usize);
        assert!(drain_keys(&k).iter().all(|m| m.starts_with(DRAIN_PREFIX)));
    }

    #[test]
    fn pausetest_keys_are_one_segment_per_resource() {
        assert_eq!(
            pausetest_key("ledger", "s3://b/p?endpoint=http://h:1"),
            "/sys/pausetest/ledger/s3%3A%2F%2Fb%2Fp%3Fendpoint%3Dhttp%3A%2F%2Fh%3A1"
        );
        assert_ne!(pausetest_key("a", "x/y"), pausetest_key("a/x", "y"));
        assert!(pausetest_key("c", "r").starts_with(PAUSETEST_PREFIX));
        assert!(validate_class("payments-ledger").is_ok());
        for bad in ["", "-a", "a-", "A", "a/b", "a b"] {
            assert_eq!(validate_class(bad).unwrap_err().field, "class", "{bad:?}");
        }
    }

    #[test]
    fn pausetest_results_lapse_by_time_and_by_schema_version() {
        let r = PauseTestRecord {
            class: "c".into(),
            resource: "r".into(),
            schema_version: 1,
            time_unix_ms: 1_000,
            expires_unix_ms: 1_000 + PAUSETEST_VALIDITY.as_millis() as u64,
            etcd_version: "3.6.16".into(),
            outcome: PauseTestOutcome::Pass,
            reason: "ok".into(),
            fence_mode: "correct".into(),
        };
        assert_eq!(r.invalid_because(2_000, 1), None);
        assert!(r.invalid_because(r.expires_unix_ms, 1).unwrap().contains("expired"));
        assert!(r.invalid_because(2_000, 2).unwrap().contains("schema version 2"));
        let json = String::from_utf8(encode(&r)).unwrap();
        assert!(json.contains("\"outcome\":\"pass\""), "{json}");
        assert_eq!(decode::<PauseTestRecord>("k", json.as_bytes()).unwrap(), r);
    }
}

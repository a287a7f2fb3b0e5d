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
        let r = EpochRecord { epoch: 2, cluster_id: u64::MAX, log_floor: -3 };
        assert_eq!(decode::<EpochRecord>(EPOCH_KEY, &encode(&r)).unwrap(), r);
        assert!(decode::<EpochRecord>(EPOCH_KEY, b"{\"epoch\":1}").is_err());
    }
}

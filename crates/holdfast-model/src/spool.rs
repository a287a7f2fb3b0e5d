//! The record format of the fail-open spool: what an arbiter writes to
//! `<state_dir>/unprotected.spool` for each grant and end of a hold made
//! from memory while etcd was out of reach, and what is shipped from it to
//! the audit store with `unprotected = true`.
//!
//! A spool is a sequence of records, each `length (u32 LE) | CRC-32C of
//! the payload (u32 LE) | payload` where the payload is one [`Entry`] as
//! JSON. [`read_records`] reads them back: a bad last record is a torn
//! append (left out), a bad record with anything after it is damage.

use serde::{Deserialize, Serialize};

const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
/// Bytes before each record's payload.
pub const HEADER: u64 = 8;
/// The largest payload a record may have (a key is at most a few hundred
/// bytes; anything near this is damage).
pub const MAX_PAYLOAD: u32 = 64 << 10;

/// What happened to an unprotected hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// Granted from memory, token 0.
    Grant,
    /// Released by its holder (or its session was closed).
    Release,
    /// Ended without a release: its session expired, or etcd came back
    /// and the arbiter ended every unprotected session.
    End,
}

/// One spooled record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The spool's ID (hex), the same in every record of one spool.
    pub spool: String,
    /// 1 for the spool's first record, then one more per record.
    pub seq: u64,
    pub event: Event,
    /// Wall-clock time of the event, Unix milliseconds.
    pub at_unix_ms: u64,
    /// The cluster the class's keys live on (`cluster_name`).
    pub cluster: String,
    pub namespace: String,
    pub key: String,
    pub class: String,
    /// The holder's SPIFFE ID.
    pub identity: String,
    /// The unprotected session (its wire ID).
    pub session: u64,
    /// Why a hold ended, for `End`: "expired" or "quorum_back".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

/// `entry` as one record: header and JSON payload.
pub fn encode_record(entry: &Entry) -> Vec<u8> {
    let payload = serde_json::to_vec(entry).unwrap_or_default();
    let mut record = Vec::with_capacity(payload.len() + HEADER as usize);
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&CRC.checksum(&payload).to_le_bytes());
    record.extend_from_slice(&payload);
    record
}

/// Reads a spool's bytes: its records and the length of the whole ones.
/// A bad last record is a torn append (left out); a bad record followed by
/// anything is damage (an error naming its offset).
pub fn read_records(bytes: &[u8]) -> Result<(Vec<Entry>, u64), String> {
    let mut entries = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let damage = |why: String| -> Result<(Vec<Entry>, u64), String> { Err(format!("record at byte {at}: {why}")) };
        if rest.len() < HEADER as usize {
            break;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_PAYLOAD {
            // A torn append is at most one record long; more after it is damage.
            if rest.len() > (HEADER + u64::from(MAX_PAYLOAD)) as usize {
                return damage(format!("length {len} is over {MAX_PAYLOAD}"));
            }
            break;
        }
        let end = HEADER as usize + len as usize;
        if rest.len() < end {
            break;
        }
        let payload = &rest[HEADER as usize..end];
        let last = end == rest.len();
        if CRC.checksum(payload) != crc {
            if last {
                break;
            }
            return damage("checksum mismatch, with records after it".into());
        }
        match serde_json::from_slice::<Entry>(payload) {
            Ok(e) => entries.push(e),
            Err(e) if last => {
                let _ = e;
                break;
            }
            Err(e) => return damage(format!("does not parse: {e}")),
        }
        at += end;
    }
    Ok((entries, at as u64))
}

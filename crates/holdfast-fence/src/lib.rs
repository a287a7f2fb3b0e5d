//! Reference fences: how a resource rejects a write from a holder whose lock
//! has moved on.
//!
//! A lock service cannot stop a holder that was paused past its lease from
//! writing afterwards. Exclusion holds only where the write lands: the
//! resource keeps, per record, the highest fencing token it has accepted and
//! refuses any write whose token is not strictly greater — **in the same
//! atomic step as the write**. The two correct implementations here are meant
//! to be copied:
//!
//! - [`postgres::PgFence`]: `UPDATE … SET …, fence = $token WHERE id = $id AND
//!   fence < $token` — one statement, so PostgreSQL's row lock makes the
//!   comparison and the write one step.
//! - [`s3::S3Fence`]: read the object and its ETag, compare the fence stored in
//!   the object, then `PUT` with `If-Match: <that ETag>` — the store applies
//!   the write only to the exact version whose fence was compared.
//!
//! The other [`FenceMode`]s are the mistakes owners really make, kept here so
//! that the pause-test kit (`holdfast-pausetest`) and the correctness gate can
//! show that they fail: `fence <= $token`, and a check and a write in two
//! statements. `Unfenced` has no check at all.
//!
//! Every record here is a counter: [`Fence::increment`] adds one. Each record
//! also keeps the list of tokens it accepted, in the resource's own serial
//! order ([`Fence::accepted_log`]) — the correctness gate's C2 checker reads
//! it. A real resource would keep only the `fence` column.
//!
//! Tokens are capabilities: nothing in this crate puts a token into an error,
//! a log line or a `Debug` output.

pub mod postgres;
pub mod s3;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use holdfast_model::Token;
pub use postgres::PgFence;
pub use s3::{S3Config, S3Fence};

/// Which fence a resource runs. Only [`FenceMode::Correct`] is a fence; the
/// others are deliberately wrong and exist to be caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceMode {
    /// The stored fence is compared with `<` in the same atomic step as the
    /// write.
    Correct,
    /// Wrong: compares with `<=`, so a token the record already accepted is
    /// accepted again — also after the lock has passed to a new holder that
    /// has not written yet.
    LessOrEqual,
    /// Wrong: reads the fence, compares in the client, then writes without a
    /// condition. A holder paused between the two statements overwrites a
    /// newer holder's write.
    TwoStatements,
    /// No token check at all: read, modify, write. Loses updates.
    Unfenced,
}

impl FenceMode {
    pub const ALL: [FenceMode; 4] = [FenceMode::Correct, FenceMode::LessOrEqual, FenceMode::TwoStatements, FenceMode::Unfenced];

    /// The name used on command lines and in records.
    pub fn name(self) -> &'static str {
        match self {
            FenceMode::Correct => "correct",
            FenceMode::LessOrEqual => "less-or-equal",
            FenceMode::TwoStatements => "two-statements",
            FenceMode::Unfenced => "unfenced",
        }
    }
}

impl fmt::Display for FenceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FenceMode {
    type Err = FenceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FenceMode::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            FenceError::Config(format!("fence mode {s:?} is unknown; use one of {}", FenceMode::ALL.map(FenceMode::name).join(", ")))
        })
    }
}

/// What the resource decided about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The write took effect; `value` is the record's counter after it.
    Accepted { value: u64 },
    /// The resource refused the write: a token at least as new had already
    /// written this record. Nothing changed.
    Rejected,
}

impl Written {
    pub fn is_accepted(self) -> bool {
        matches!(self, Written::Accepted { .. })
    }
}

/// Why a fence operation failed. An error from [`Fence::increment`] means
/// the outcome is unknown: the write may or may not have taken effect.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A bad resource description, record name or setting. Nothing was sent.
    #[error("{0}")]
    Config(String),
    /// The resource could not be reached or failed the request.
    #[error("{resource}: {message}")]
    Resource { resource: String, message: String },
    /// A record exists but is not in this fence's format.
    #[error("{resource}: record {record:?} is malformed ({message}); it was not written by holdfast-fence")]
    Malformed { resource: String, record: String, message: String },
    /// The resource has not been set up (no schema version recorded).
    #[error("{resource}: not set up for fencing; run setup first (holdfast-pausetest runs it for you)")]
    NotSetUp { resource: String },
    /// Conditional writes kept losing to concurrent writers.
    #[error("{resource}: record {record:?} changed under {attempts} consecutive conditional writes; giving up (outcome: not written)")]
    Contended { resource: String, record: String, attempts: u32 },
}

/// A fenced resource of counters.
///
/// Object-safe and shareable: hold it as [`SharedFence`] and clone the `Arc`
/// into as many tasks as needed.
#[async_trait::async_trait]
pub trait Fence: Send + Sync {
    /// Creates what the fence needs (table, schema record) if absent.
    /// Idempotent and safe to run concurrently.
    async fn setup(&self) -> Result<(), FenceError>;

    /// The record's counter; 0 if the record does not exist yet.
    async fn read(&self, record: &str) -> Result<u64, FenceError>;

    /// Adds one to the record's counter if `token` passes the fence.
    ///
    /// `between` is the pause point: it is called at most once, after the
    /// write has started and before the statement (or request) that decides
    /// it is sent. Correct fences call it before their single conditional
    /// statement; [`FenceMode::TwoStatements`] calls it between its check and
    /// its write. A fence that already knows the write is stale before that
    /// point (the S3 fence after its `GET`, the two-statement check) returns
    /// [`Written::Rejected`] without calling it. The pause-test kit stops the
    /// process there with SIGSTOP. Pass `&mut || {}` when there is nothing
    /// to do.
    async fn increment(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError>;

    /// Every token the record accepted, in the order the resource accepted
    /// them (empty if the record does not exist).
    async fn accepted_log(&self, record: &str) -> Result<Vec<u64>, FenceError>;

    /// The schema version recorded in the resource by [`Fence::setup`]. A
    /// pause-test result is valid only for the schema version it ran against.
    async fn schema_version(&self) -> Result<u32, FenceError>;

    /// The resource, without credentials: a stable identifier suitable for
    /// records and messages (`postgresql://host:port/db?table=t`,
    /// `s3://bucket/prefix?endpoint=…`).
    fn describe(&self) -> String;

    /// The resource class: `postgresql` or `s3`.
    fn kind(&self) -> &'static str;

    fn mode(&self) -> FenceMode;
}

/// A fence shared between tasks.
pub type SharedFence = Arc<dyn Fence>;

/// The schema version this build creates. Bump it when the table or object
/// layout changes; recorded pause-test results then stop counting.
pub const SCHEMA_VERSION: u32 = 1;

/// Longest record name.
pub const MAX_RECORD_LEN: usize = 200;

/// Record names are safe in an S3 key and a SQL text column alike:
/// 1..=200 of `A-Z a-z 0-9 . _ -`, not starting with `.`.
pub fn validate_record(record: &str) -> Result<(), FenceError> {
    let bad = |why: &str| Err(FenceError::Config(format!("record name {record:?} {why}")));
    if record.is_empty() {
        return bad("is empty");
    }
    if record.len() > MAX_RECORD_LEN {
        return bad(&format!("is {} bytes; the limit is {MAX_RECORD_LEN}", record.len()));
    }
    if record.starts_with('.') {
        return bad("may not start with '.'");
    }
    if let Some(c) = record.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return bad(&format!("contains {c:?}; use only A-Z, a-z, 0-9, '.', '_' and '-'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_by_name() {
        for m in FenceMode::ALL {
            assert_eq!(m.name().parse::<FenceMode>().unwrap(), m);
        }
        let err = "lte".parse::<FenceMode>().unwrap_err().to_string();
        assert!(err.contains("\"lte\"") && err.contains("less-or-equal"), "{err}");
    }

    #[test]
    fn record_names_are_checked() {
        assert!(validate_record("ledger-7.a_b").is_ok());
        for (bad, needle) in [("", "empty"), (".x", "'.'"), ("a/b", "'/'"), ("a b", "' '"), ("é", "'é'")] {
            let e = validate_record(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
        assert!(validate_record(&"x".repeat(MAX_RECORD_LEN + 1)).is_err());
    }
}

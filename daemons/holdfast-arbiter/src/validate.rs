//! `ValidateToken`: whether a presented token is the current holder's, for
//! resources that cannot store a fence mark.
//!
//! - **The read** is one read-only etcd transaction: it compares `/sys/epoch`
//!   with the record this arbiter serves and gets the hold key. Without a
//!   `serializable` option etcd answers it linearizably (through the
//!   leader's read index), so it sees every grant and release that committed
//!   before the call. The answer is checked like a grant's: the cluster ID
//!   must be the epoch's, the revision may not be below one already seen, and
//!   the arbiter must still be serving afterwards. A sealed or unverified
//!   arbiter vouches for nothing.
//! - **The comparison**: the hold's token is `hold epoch << 48 | create
//!   revision` (what its grant minted), and only a hold of the epoch being
//!   served counts. It is compared with the presented value in constant time
//!   ([`subtle`]), whether or not a hold exists; the presented value is never
//!   logged, traced or returned.
//! - **The rate limit**: a token bucket per caller identity for this call
//!   alone ([`RATE_PER_SECOND`], [`BURST`], kept in [`crate::limits`]), so
//!   guessing is slow and one caller's flood leaves every other resource
//!   its answers; grants are not affected.
//! - **Counting**: `holdfast_arbiter_validate_token_{valid,invalid,refused}_total`
//!   by the key's class (`namespace`, `class`, `tier`, `cluster`); calls
//!   refused by the class set before that are not counted here.

use crate::Refusal;
use crate::seal::{Guard, Serve};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use holdfast_model::layout::{self, HoldRecord};
use holdfast_model::{LockKey, Token};
use holdfast_store::etcd::Etcd;
use subtle::{Choice, ConstantTimeEq};
use tonic::Code;

/// ValidateToken calls one arbiter admits per second from one identity,
/// sustained.
pub const RATE_PER_SECOND: u32 = 2000;
/// ValidateToken calls one arbiter admits at once from one identity after
/// a quiet period.
pub const BURST: u32 = 200;

/// The refusal past `who`'s bucket. Not an etcd failure: it must not
/// pause granting.
pub fn rate_limited(who: &str) -> Refusal {
    Refusal::new(
        Code::ResourceExhausted,
        holdfast_proto::ErrorReason::Unavailable,
        format!(
            "ValidateToken is rate-limited for {who} on this arbiter ({RATE_PER_SECOND}/s, burst {BURST}, per identity); retry after a short backoff"
        ),
    )
}

/// Counts one answered or refused call under its key's class.
pub fn count(class: &holdfast_policy::Class, outcome: &Result<bool, Refusal>) {
    let m = &*crate::metrics::METRICS;
    let family = match outcome {
        Ok(true) => &m.validate_valid,
        Ok(false) => &m.validate_invalid,
        Err(_) => &m.validate_refused,
    };
    family.get_or_create(&m.class_labels(class)).inc();
}

/// Whether `presented` is the token of the hold on `key` now.
pub async fn check(etcd: &Etcd, guard: &Guard, key: &LockKey, presented: u64) -> Result<bool, Refusal> {
    let current = match guard.state() {
        Serve::Serving(c) => c,
        Serve::Sealed { reason, .. } => return Err(Refusal::sealed(&reason)),
        Serve::Unverified(why) => return Err(Refusal::not_serving(&why)),
    };
    let epoch = current.record.epoch;
    let hold_key = layout::hold_key(key);
    let highest_before = guard.highest_before(epoch);
    // Read-only, no serializable option: a linearizable read.
    let txn = Txn::new()
        .when([Compare::value(layout::EPOCH_KEY, CompareOp::Equal, current.bytes.clone())])
        .and_then([TxnOp::get(hold_key.as_str(), None)]);
    let resp = etcd.txn(txn).await.map_err(|e| Refusal::unavailable(&e.to_string()))?;
    let header = resp.header().ok_or_else(|| Refusal::unavailable("etcd answered without a header"))?;
    if header.cluster_id() != current.record.cluster_id {
        guard.etcd_failed("etcd answered a token validation with another cluster ID");
        return Err(Refusal::unavailable("etcd answered with another cluster ID; this arbiter is re-checking the cluster"));
    }
    if header.revision() < highest_before {
        // A linearizable read never answers below a revision already seen,
        // unless the cluster was rewound. (No numbers: they are token halves.)
        guard.etcd_failed("etcd answered a token validation below a revision already seen");
        return Err(Refusal::unavailable("etcd answered from an older revision; this arbiter is re-checking the cluster"));
    }
    if !resp.succeeded() {
        guard.etcd_failed("the epoch record changed");
        return Err(Refusal::unavailable("the epoch record changed; retry after the arbiter has re-read it"));
    }
    guard.observe(epoch, header.revision());
    if !guard.still_serving(epoch) {
        return Err(match guard.state() {
            Serve::Sealed { reason, .. } => Refusal::sealed(&reason),
            other => Refusal::unavailable(&other.describe()),
        });
    }
    let hold = resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    });
    let expected = hold.and_then(|kv| {
        let record: HoldRecord = layout::decode(&hold_key, kv.value()).ok()?;
        // The token the grant minted carries the hold's epoch; a hold of any
        // epoch but the one served names no token that is still valid.
        if record.epoch != epoch {
            return None;
        }
        Token::new(record.epoch, u64::try_from(kv.create_revision()).ok()?).ok()
    });
    Ok(same(expected, presented))
}

/// `expected == Some(presented)`, in time that depends on neither value nor
/// on where they differ: both are compared as 8 bytes with `subtle`, and the
/// comparison is made (against 0) when there is no expected token.
pub fn same(expected: Option<Token>, presented: u64) -> bool {
    let present = Choice::from(u8::from(expected.is_some()));
    let expected = expected.map(Token::expose).unwrap_or(0).to_be_bytes();
    let eq = expected[..].ct_eq(&presented.to_be_bytes()[..]);
    (eq & present).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_of_a_present_hold_is_the_same() {
        let t = Token::new(3, 301).unwrap();
        assert!(same(Some(t), t.expose()));
        assert!(!same(Some(t), t.expose() ^ 1), "the last bit");
        assert!(!same(Some(t), t.expose() ^ (1 << 63)), "the first bit");
        assert!(!same(Some(t), Token::new(4, 301).unwrap().expose()), "another epoch");
        assert!(!same(None, 0), "a free key, even against 0");
        assert!(!same(None, t.expose()));
    }

    #[test]
    fn the_rate_limit_refusal_is_not_an_etcd_failure_code() {
        let r = rate_limited("spiffe://example.org/db");
        assert_eq!(r.code, Code::ResourceExhausted);
        assert!(r.message.contains("rate-limited for spiffe://example.org/db"), "{}", r.message);
    }
}

//! The request document: what two people approve.
//!
//! A request is written once, by the requester's tool, and never edited:
//! the signatures cover its bytes exactly as written ([`Request::render`]),
//! and [`Request::parse`] reads it back only after they verify. It carries
//! a random nonce (single-use: the operation's transaction records it), an
//! expiry (one hour unless asked otherwise), the requester, the reason, and
//! the exact operation with everything the operation will compare.

use crate::approvers::Role;
use serde::Deserialize;
use std::fmt::Write as _;
use std::time::Duration;

/// The format this crate writes and reads.
pub const VERSION: u32 = 1;

/// How long a request stays valid unless the requester says otherwise.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(3600);

/// The longest a request may be valid: [`Request::new`] refuses more, and
/// [`crate::verify`] refuses a request whose expiry is further than this
/// from its creation or from now.
pub const MAX_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// The most an epoch advance may ask above the highest epoch known: an
/// advance needs only one; a few more leave room for epochs allocated
/// between the request and its signing. A token has 15 bits of epoch, so a
/// request for a far epoch (up to 32767, the last) would spend every
/// advance to come. Refused when the request is read, and again when it is
/// carried out against the epochs known then.
pub const MAX_EPOCH_STEP: u32 = 16;

/// The operation a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// After a restore: advance `/sys/epoch` of `cluster` from
    /// `expected_epoch` to `new_epoch`, bound to `cluster_id` (what the
    /// restored cluster reports), ending every hold, waiter and session.
    /// `highest_known` is the highest epoch known when the request was
    /// written (the cluster's record, the allocator, every arbiter's report
    /// of what it served); `new_epoch` is above it.
    EpochAdvance { cluster: String, expected_epoch: u32, new_epoch: u32, cluster_id: u64, highest_known: u32 },
    /// End the hold on `namespace/key` that `holder` has through `session`
    /// since `granted_unix_ms` — that hold and no later one of the same key.
    /// `fenced` is the class's enforcement when the request was written (an
    /// advisory class means a second writer may follow); `revoke_session`
    /// also ends the holder's session. `class`, `fenced` and `cluster_id`
    /// (the cluster the hold is on) are derived again when the request is
    /// carried out, and any difference refuses it.
    ForceRelease {
        cluster_id: u64,
        namespace: String,
        key: String,
        holder: String,
        session: i64,
        granted_unix_ms: u64,
        class: String,
        fenced: bool,
        revoke_session: bool,
    },
}

impl Operation {
    pub fn kind(&self) -> &'static str {
        match self {
            Operation::EpochAdvance { .. } => "epoch-advance",
            Operation::ForceRelease { .. } => "force-release",
        }
    }

    /// The role both signers must hold.
    pub fn role(&self) -> Role {
        match self {
            Operation::EpochAdvance { .. } => Role::DrOperator,
            Operation::ForceRelease { .. } => Role::LockOperator,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// 32 hex digits from the OS's random source.
    pub nonce: String,
    /// The approver name of who asked (they sign it too).
    pub requester: String,
    pub reason: String,
    pub created_unix: u64,
    pub expires_unix: u64,
    pub operation: Operation,
}

fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

impl Request {
    /// A new request with a fresh nonce from the OS, valid for `valid_for`
    /// from `now_unix`.
    pub fn new(requester: &str, reason: &str, operation: Operation, now_unix: u64, valid_for: Duration) -> Result<Self, String> {
        if valid_for > MAX_VALIDITY {
            return Err(format!(
                "a request may be valid for at most {}h, not {}s; ask for less (the default is {}h)",
                MAX_VALIDITY.as_secs() / 3600,
                valid_for.as_secs(),
                DEFAULT_VALIDITY.as_secs() / 3600
            ));
        }
        if valid_for.as_secs() == 0 {
            return Err("a request must be valid for at least one second".into());
        }
        let mut nonce = [0u8; 16];
        getrandom::getrandom(&mut nonce).map_err(|e| format!("no random nonce from the OS: {e}"))?;
        Ok(Request {
            nonce: nonce.iter().map(|b| format!("{b:02x}")).collect(),
            requester: requester.to_string(),
            reason: reason.to_string(),
            created_unix: now_unix,
            expires_unix: now_unix + valid_for.as_secs(),
            operation,
        })
    }

    /// The file name stem: the kind and the nonce's first 12 digits.
    pub fn name(&self) -> String {
        format!("{}-{}", self.operation.kind(), &self.nonce[..self.nonce.len().min(12)])
    }

    /// The document's bytes, as signed.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "# holdfast two-person request ({kind}). Sign exactly this file; any change\n\
             # to it voids every signature:\n\
             #   holdfastctl approve FILE --ssh-key KEY\n\
             #   ssh-keygen -Y sign -n {ns} -f KEY FILE       (the same, by hand)\n\
             version = {VERSION}\n\
             kind = {}\n\
             nonce = {}\n\
             requester = {}\n\
             reason = {}\n\
             created_unix = {}\n\
             expires_unix = {}\n",
            quoted(self.operation.kind()),
            quoted(&self.nonce),
            quoted(&self.requester),
            quoted(&self.reason),
            self.created_unix,
            self.expires_unix,
            kind = self.operation.kind(),
            ns = crate::NAMESPACE,
        );
        match &self.operation {
            Operation::EpochAdvance { cluster, expected_epoch, new_epoch, cluster_id, highest_known } => {
                let _ = write!(
                    s,
                    "\n[epoch_advance]\ncluster = {}\nexpected_epoch = {expected_epoch}\nnew_epoch = {new_epoch}\n\
                     # The cluster ID the restored cluster reports (decimal).\ncluster_id = {}\n\
                     # The highest epoch known when this was written: the cluster's record, the\n\
                     # allocator, and every arbiter's report of the epochs it served.\n\
                     highest_known = {highest_known}\n",
                    quoted(cluster),
                    quoted(&cluster_id.to_string()),
                );
            }
            Operation::ForceRelease { cluster_id, namespace, key, holder, session, granted_unix_ms, class, fenced, revoke_session } => {
                let _ = write!(
                    s,
                    "\n[force_release]\n# The cluster ID the hold's cluster reports (decimal).\ncluster_id = {}\nnamespace = {}\nkey = {}\n# The hold: its holder, session and grant time (never its token).\n\
                     holder = {}\nsession = {session}\ngranted_unix_ms = {granted_unix_ms}\nclass = {}\nfenced = {fenced}\n\
                     revoke_session = {revoke_session}\n",
                    quoted(&cluster_id.to_string()),
                    quoted(namespace),
                    quoted(key),
                    quoted(holder),
                    quoted(class),
                );
            }
        }
        s
    }

    /// Reads a document back; every field must be there and nothing else.
    pub fn parse(text: &str) -> Result<Request, String> {
        let doc: Doc = toml::from_str(text).map_err(|e| format!("not a holdfast request: {}", e.to_string().trim()))?;
        if doc.version != VERSION {
            return Err(format!("request version {} is not {VERSION}; write it again with this holdfastctl", doc.version));
        }
        if doc.nonce.len() != 32 || !doc.nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("nonce: not 32 hex digits".into());
        }
        if doc.expires_unix <= doc.created_unix {
            return Err("expires_unix is not after created_unix".into());
        }
        let operation = match (doc.kind.as_str(), doc.epoch_advance) {
            ("force-release", None) => {
                let f = doc.force_release.ok_or("kind = \"force-release\" without a [force_release] table")?;
                let cluster_id =
                    f.cluster_id.parse::<u64>().map_err(|_| format!("force_release.cluster_id {:?}: not a number", f.cluster_id))?;
                Operation::ForceRelease {
                    cluster_id,
                    namespace: f.namespace,
                    key: f.key,
                    holder: f.holder,
                    session: f.session,
                    granted_unix_ms: f.granted_unix_ms,
                    class: f.class,
                    fenced: f.fenced,
                    revoke_session: f.revoke_session,
                }
            }
            ("epoch-advance", Some(e)) => {
                let cluster_id =
                    e.cluster_id.parse::<u64>().map_err(|_| format!("epoch_advance.cluster_id {:?}: not a number", e.cluster_id))?;
                if e.new_epoch <= e.expected_epoch {
                    return Err(format!("epoch_advance.new_epoch {} is not above expected_epoch {}", e.new_epoch, e.expected_epoch));
                }
                if e.new_epoch <= e.highest_known {
                    return Err(format!("epoch_advance.new_epoch {} is not above highest_known {}", e.new_epoch, e.highest_known));
                }
                if e.new_epoch - e.highest_known > MAX_EPOCH_STEP {
                    return Err(format!(
                        "epoch_advance.new_epoch {} is more than {MAX_EPOCH_STEP} above highest_known {}: epochs are few (a token has 15 bits for them); ask for at most {}",
                        e.new_epoch,
                        e.highest_known,
                        e.highest_known + MAX_EPOCH_STEP
                    ));
                }
                Operation::EpochAdvance {
                    cluster: e.cluster,
                    expected_epoch: e.expected_epoch,
                    new_epoch: e.new_epoch,
                    cluster_id,
                    highest_known: e.highest_known,
                }
            }
            ("epoch-advance", None) => return Err("kind = \"epoch-advance\" without an [epoch_advance] table".into()),
            (other, _) => return Err(format!("kind {other:?}: not an operation this holdfastctl performs")),
        };
        Ok(Request {
            nonce: doc.nonce,
            requester: doc.requester,
            reason: doc.reason,
            created_unix: doc.created_unix,
            expires_unix: doc.expires_unix,
            operation,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    version: u32,
    kind: String,
    nonce: String,
    requester: String,
    reason: String,
    created_unix: u64,
    expires_unix: u64,
    epoch_advance: Option<EpochAdvanceDoc>,
    force_release: Option<ForceReleaseDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceReleaseDoc {
    cluster_id: String,
    namespace: String,
    key: String,
    holder: String,
    session: i64,
    granted_unix_ms: u64,
    class: String,
    fenced: bool,
    revoke_session: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EpochAdvanceDoc {
    cluster: String,
    expected_epoch: u32,
    new_epoch: u32,
    cluster_id: String,
    highest_known: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Request {
        let op = Operation::EpochAdvance {
            cluster: "entity-1".into(),
            expected_epoch: 3,
            new_epoch: 4,
            cluster_id: u64::MAX - 7,
            highest_known: 3,
        };
        Request::new("alice", "restore after \"disk\" loss\nline two", op, 1_700_000_000, DEFAULT_VALIDITY).unwrap()
    }

    #[test]
    fn a_rendered_request_reads_back_the_same() {
        let r = sample();
        assert_eq!(Request::parse(&r.render()).unwrap(), r);
        assert_eq!(r.expires_unix - r.created_unix, 3600);
        assert_eq!(r.nonce.len(), 32);
        assert_ne!(sample().nonce, r.nonce, "a fresh nonce each time");
        assert!(r.name().starts_with("epoch-advance-"));
    }

    #[test]
    fn validity_is_capped_at_a_day() {
        let op = sample().operation;
        assert!(Request::new("alice", "r", op.clone(), 1, MAX_VALIDITY).is_ok());
        let e = Request::new("alice", "r", op.clone(), 1, MAX_VALIDITY + Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("at most 24h"), "{e}");
        assert!(Request::new("alice", "r", op, 1, Duration::ZERO).is_err());
    }

    #[test]
    fn a_force_release_request_reads_back_the_same() {
        let op = Operation::ForceRelease {
            cluster_id: u64::MAX - 3,
            namespace: "payments".into(),
            key: "ledger-7".into(),
            holder: "spiffe://example.org/ledger".into(),
            session: 0x5d30_a234_a0f5_e74a,
            granted_unix_ms: 1_700_000_000_123,
            class: "payments-ledger".into(),
            fenced: false,
            revoke_session: true,
        };
        let r = Request::new("carol", "a leaked hold", op, 1_700_000_000, DEFAULT_VALIDITY).unwrap();
        assert_eq!(Request::parse(&r.render()).unwrap(), r);
        assert_eq!(r.operation.role(), Role::LockOperator);
        assert!(r.name().starts_with("force-release-"));
    }

    #[test]
    fn bad_documents_are_refused_with_the_field() {
        let text = sample().render();
        let cases = [
            (text.replace("version = 1", "version = 2"), "request version 2"),
            (text.replace("new_epoch = 4", "new_epoch = 3"), "new_epoch 3 is not above expected_epoch 3"),
            (text.replace("highest_known = 3", "highest_known = 4"), "new_epoch 4 is not above highest_known 4"),
            (text.replace("new_epoch = 4", "new_epoch = 20"), "new_epoch 20 is more than 16 above highest_known 3: epochs are few"),
            (text.replace("kind = \"epoch-advance\"", "kind = \"format-disk\""), "kind \"format-disk\""),
            (format!("{text}extra = 1\n"), "unknown field"),
            (text.replace("expires_unix", "expires_unix_x"), "not a holdfast request"),
        ];
        for (bad, message) in cases {
            let e = Request::parse(&bad).unwrap_err();
            assert!(e.contains(message), "{e}");
        }
    }
}

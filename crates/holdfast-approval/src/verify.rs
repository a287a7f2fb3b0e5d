//! Checking a request's approvals.
//!
//! [`verify`] takes the request's bytes exactly as signed and the armored
//! `sshsig` signatures, and approves only when:
//!
//! 1. the bytes parse as a request, it has not expired, and its expiry is
//!    at most a day after its creation and after now (`MAX_VALIDITY`);
//! 2. every signature is an `sshsig` under [`crate::NAMESPACE`] by a key
//!    listed in `approvers.toml`, and verifies over these exact bytes; a
//!    FIDO2 (`sk-`) key's signature must carry the user-presence flag (a
//!    touch), as OpenSSH requires by default;
//! 3. the signers are at least two **different** approvers, one of them the
//!    requester;
//! 4. every signer holds the operation's role.
//!
//! Any failure refuses the whole request with one [`Refusal`] that says
//! which rule and what to do; nothing is partially approved.

use crate::approvers::{Approvers, Role};
use crate::request::Request;
use ssh_key::SshSig;

/// A request that two approvers signed.
#[derive(Debug, Clone)]
pub struct Approved {
    pub request: Request,
    /// The approvers who signed, the requester first.
    pub signers: Vec<String>,
    /// Each signer's SPIFFE ID from approvers.toml, in the order of
    /// `signers` (`None`: none listed).
    pub identities: Vec<Option<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the request does not parse: {0}")]
    Unreadable(String),
    #[error("the request expired at {expires_unix} (now {now_unix}); write a new request and sign it again")]
    Expired { expires_unix: u64, now_unix: u64 },
    #[error(
        "the request is valid until {expires_unix}, more than {max_hours}h after it was written ({created_unix}) or after now ({now_unix}); write a new request valid for at most {max_hours}h and sign it again"
    )]
    BeyondCap { created_unix: u64, expires_unix: u64, now_unix: u64, max_hours: u64 },
    #[error("signature {index}: not an OpenSSH signature ({why}); make it with `holdfastctl approve` or `ssh-keygen -Y sign`")]
    Malformed { index: usize, why: String },
    #[error("signature {index}: made under the namespace {namespace:?}, not {expected:?}; sign with `-n {expected}`")]
    WrongNamespace { index: usize, namespace: String, expected: &'static str },
    #[error("signature {index}: key {fingerprint} is not listed in approvers.toml")]
    UnknownKey { index: usize, fingerprint: String },
    #[error(
        "signature {index} ({approver}): does not verify over this request; the file was changed after signing, or the signature is for another file"
    )]
    BadSignature { index: usize, approver: String },
    #[error(
        "signature {index} ({approver}): made by a FIDO2 key without the user's touch (its user-presence flag is not set); sign again and touch the key when it asks (keys made with -O no-touch-required cannot approve)"
    )]
    NoUserPresence { index: usize, approver: String },
    #[error("the requester {0:?} is not an approver in approvers.toml")]
    UnknownRequester(String),
    #[error("the requester {0} has not signed; the requester signs first, then a different approver")]
    RequesterMissing(String),
    #[error("only {0} signed (each signature counted once per person); a second, different approver must sign too")]
    OnePerson(String),
    #[error("{approver} does not hold the role {role} this operation needs")]
    MissingRole { approver: String, role: Role },
}

/// Checks `signatures` (armored `-----BEGIN SSH SIGNATURE-----` texts) over
/// `request` (the file's bytes) at `now_unix`.
pub fn verify(request: &[u8], signatures: &[String], approvers: &Approvers, now_unix: u64) -> Result<Approved, Refusal> {
    let text = std::str::from_utf8(request).map_err(|_| Refusal::Unreadable("not UTF-8".into()))?;
    let parsed = Request::parse(text).map_err(Refusal::Unreadable)?;
    if now_unix >= parsed.expires_unix {
        return Err(Refusal::Expired { expires_unix: parsed.expires_unix, now_unix });
    }
    let cap = crate::request::MAX_VALIDITY.as_secs();
    if parsed.expires_unix - parsed.created_unix > cap || parsed.expires_unix > now_unix.saturating_add(cap) {
        return Err(Refusal::BeyondCap {
            created_unix: parsed.created_unix,
            expires_unix: parsed.expires_unix,
            now_unix,
            max_hours: cap / 3600,
        });
    }
    let requester = approvers.approvers.get(&parsed.requester).ok_or_else(|| Refusal::UnknownRequester(parsed.requester.clone()))?;
    let role = parsed.operation.role();
    let mut signers: Vec<String> = Vec::new();
    for (i, armored) in signatures.iter().enumerate() {
        let index = i + 1;
        let sig = SshSig::from_pem(armored.trim()).map_err(|e| Refusal::Malformed { index, why: e.to_string() })?;
        if sig.namespace() != crate::NAMESPACE {
            return Err(Refusal::WrongNamespace { index, namespace: sig.namespace().to_string(), expected: crate::NAMESPACE });
        }
        let key = sig.public_key();
        let approver = approvers.owner(key).ok_or_else(|| Refusal::UnknownKey {
            index,
            fingerprint: ssh_key::PublicKey::from(key.clone()).fingerprint(Default::default()).to_string(),
        })?;
        ssh_key::PublicKey::from(key.clone())
            .verify(crate::NAMESPACE, request, &sig)
            .map_err(|_| Refusal::BadSignature { index, approver: approver.name.clone() })?;
        if !user_present(&sig) {
            return Err(Refusal::NoUserPresence { index, approver: approver.name.clone() });
        }
        if !approver.roles.contains(&role) {
            return Err(Refusal::MissingRole { approver: approver.name.clone(), role });
        }
        if !signers.contains(&approver.name) {
            signers.push(approver.name.clone());
        }
    }
    if !signers.contains(&requester.name) {
        return Err(Refusal::RequesterMissing(requester.name.clone()));
    }
    if signers.len() < 2 {
        return Err(Refusal::OnePerson(requester.name.clone()));
    }
    signers.sort_by_key(|s| *s != requester.name);
    let identities = signers.iter().map(|s| approvers.approvers.get(s).and_then(|a| a.identity.clone())).collect();
    Ok(Approved { request: parsed, signers, identities })
}

/// The FIDO user-presence flag in a security-key signature's flags byte.
const SK_USER_PRESENT: u8 = 0x01;

/// Whether `sig` was made with the user present: always for a key that is
/// not a security key; for an `sk-` key, when the flags byte the key signed
/// (the fifth byte from the end: flags, then a 4-byte counter) has the
/// user-presence bit. The flags are covered by the signature, so they
/// cannot be set after the fact.
fn user_present(sig: &SshSig) -> bool {
    let signature = sig.signature();
    match signature.algorithm() {
        ssh_key::Algorithm::SkEd25519 | ssh_key::Algorithm::SkEcdsaSha2NistP256 => {
            let bytes = signature.as_bytes();
            bytes.len() >= 5 && bytes[bytes.len() - 5] & SK_USER_PRESENT != 0
        }
        _ => true,
    }
}

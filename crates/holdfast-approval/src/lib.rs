//! Two-person operations (epoch advance, force-release): who may approve,
//! what is approved, and checking the approvals.
//!
//! - [`approvers`]: `/etc/holdfast/approvers.toml` — each approver's name,
//!   roles and OpenSSH public keys (FIDO2 `sk-ssh-ed25519@openssh.com` keys
//!   recommended: a touch per signature).
//! - [`request`]: a request is a small TOML document with a random nonce,
//!   an expiry, the requester, the reason and the exact operation. Its
//!   bytes, exactly as written, are what is signed: any edit voids every
//!   signature.
//! - [`verify`]: an approval is an OpenSSH `sshsig` signature over those
//!   bytes under the namespace [`NAMESPACE`] (`ssh-keygen -Y sign -n
//!   holdfast-request -f KEY FILE`, or `holdfastctl approve`). A request is
//!   approved when the requester **and a different approver** both signed
//!   it with listed keys, both hold the operation's role, and it has not
//!   expired. Signatures are checked by the `ssh-key` crate, never by
//!   hand-written crypto.
//!
//! The nonce is single-use: the operation's own etcd transaction records it
//! (`/sys/nonce/<nonce>`, compared absent), so a replayed request changes
//! nothing. That part lives with the transactions in `holdfast-store`.

pub mod approvers;
pub mod request;
pub mod verify;

pub use approvers::{Approver, Approvers, Role};
pub use request::{Operation, Request};
pub use verify::{Approved, Refusal, verify};

/// The sshsig namespace of every holdfast approval: a signature made for
/// anything else (`git`, `file`, another tool) does not verify here.
pub const NAMESPACE: &str = "holdfast-request";

//! Exit statuses. Scripts branch on these; they are part of the contract.

pub const OK: u8 = 0;
/// A precise error in what was asked (bad key, bad TTL...).
pub const USAGE: u8 = 64;
/// The input is wrong: `class check` found problems in the class or grant
/// files (each printed as FILE:LINE: message). EX_DATAERR.
pub const INVALID: u8 = 65;
/// The arbiter or etcd is unreachable, or the arbiter is sealed.
pub const UNAVAILABLE: u8 = 69;
/// An internal error.
pub const SOFTWARE: u8 = 70;
/// The lock was not acquired before --wait passed (another session holds it).
pub const CONTENTION: u8 = 75;
/// The credentials were refused, or the identity may not lock the key.
pub const NOPERM: u8 = 77;
/// The key is held by this identity under another session (a leaked hold).
pub const LEAK: u8 = 76;
/// The lock was lost while the command ran; the command was terminated.
pub const LOCK_LOST: u8 = 79;
/// Configuration files or credentials are unreadable.
pub const CONFIG: u8 = 78;

//! Shared types for every holdfast component. No I/O lives here.

pub mod key;
pub mod layout;
pub mod rendezvous;
pub mod seal;
pub mod shardmap;
pub mod spool;
pub mod token;
pub mod ttl;

pub use key::{FieldError, LockKey};
pub use token::Token;

/// An error and its sources, each once: "transport error: tcp connect
/// error: Connection refused (os error 111)". A source whose text the
/// message already holds is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

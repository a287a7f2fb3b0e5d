//! Shared types for every holdfast component. No I/O lives here.

pub mod key;
pub mod layout;
pub mod seal;
pub mod spool;
pub mod token;
pub mod ttl;

pub use key::{FieldError, LockKey};
pub use token::Token;

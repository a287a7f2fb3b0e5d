//! The holdfast client library.
//!
//! ```no_run
//! # async fn demo() -> Result<(), holdfast_client::Error> {
//! use holdfast_client::{Client, ClientConfig};
//! use holdfast_model::LockKey;
//! use std::time::Duration;
//! let client = Client::connect(&ClientConfig::from_env()?).await?;
//! let session = client.open_session(Duration::from_secs(15)).await?;
//! let hold = session.acquire(&LockKey::parse("payments/ledger-7").unwrap(), Duration::from_secs(30)).await?;
//! let fence = hold.token().expose(); // hand this to the resource, never to a log
//! # let _ = fence;
//! hold.release().await?;
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! Workloads normally use a [`Locker`]: one session per TTL shared by every
//! hold, re-entrant holds, drain-then-fence with a required `on_fence`
//! callback, and key-affine arbiter choice with failover. [`Client`] and
//! [`Session`] are the lower-level pieces it is built from.

pub mod affinity;
mod connect;
mod error;
mod locker;
#[cfg(feature = "mutations")]
pub mod mutations;

/// The names of the client library's deliberate bugs (switched on with
/// `mutations::enable` in a build with the `mutations` feature). Listed in
/// every build, so a tool can tell a client mutation from an arbiter one.
pub const MUTATION_NAMES: &[&str] = &["fence_from_receive_time"];
mod session;

pub use connect::{Client, ClientConfig};
pub use error::Error;
pub use holdfast_proto::ErrorReason;
pub use locker::{AcquireOptions, Fenced, LockGuard, Locker, LockerConfig};
pub use session::{FENCE_MARGIN, Health, Hold, KeepaliveObserver, KeepaliveOutcome, Session, fence_deadline, keepalive_period};

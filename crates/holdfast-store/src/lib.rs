//! The etcd store layer: everything the arbiter and the tools both need to
//! talk to the lock key space (whose layout is `holdfast_model::layout`).
//!
//! - [`etcd`]: the connection (one balanced client, one per member).
//! - [`txn`]: the grant and release transactions.
//! - [`epoch`]: the epoch record, `epoch init`, the advance transaction, the
//!   durable seal and the log-offset watermark.
//! - [`policy`]: the published class and grant set (`/sys/policy`), the
//!   controller's status document, the pause-test results, and the
//!   leader-guarded transactions that write them.
//! - [`force`]: the two-person force-release of one hold.
//! - [`shardmap`]: the shard map on the coord cluster, edited by
//!   compare-and-swap.
//! - [`roles`]: the etcd role of each tool and its key ranges, and making a
//!   cluster match them (`holdfastctl etcd roles`).
//! - `mutation` (feature `mutations`, test builds only): deliberate bugs for
//!   the correctness gate.

pub mod epoch;
pub mod etcd;
pub mod force;
#[cfg(feature = "mutations")]
pub mod mutation;
pub mod policy;
pub mod roles;
pub mod shardmap;
pub mod txn;

pub use etcd::Etcd;

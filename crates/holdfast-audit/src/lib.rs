//! The audit trail of a holdfast cluster.
//!
//! holdfast-tailer reads etcd's revision stream and turns every committed
//! change of a key into one [`Event`], keyed by `(cluster_id, revision,
//! index within the revision)`. Nothing here ever holds a token: an event
//! of a grant carries its revision (which with the epoch *is* the token),
//! and every output withholds that revision while the hold is live
//! ([`query::withhold_live_grant_revisions`]).
//!
//! - [`event`]: the event model (kinds, fields, JSON form).
//! - [`classify`]: how a change becomes an event; how a release is told
//!   from an expiry and a session close from a lapse, by construction.
//! - [`store`]: the embedded append-only store (segments, fsync,
//!   checkpoint, single writer, replay without duplicates).
//! - [`query`]: filters and the client-health reports.
//! - [`sink`]: the interface every destination implements.

pub mod classify;
pub mod event;
pub mod query;
pub mod sink;
pub mod store;

pub use event::{Event, Kind};

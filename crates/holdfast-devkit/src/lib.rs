//! Building blocks for running holdfast locally, shipped with `holdfastctl
//! dev` and used by the test harness and the gate (never by a production
//! daemon): a throwaway CA, etcd process control, the one daemon launcher
//! (`daemon.rs`; `arbiter.rs`, `controller.rs` and `tailer.rs` name it for each), free ports, a systemd notify listener.

pub mod arbiter;
pub mod controller;
pub mod daemon;
pub mod etcd;
pub mod notify;
pub mod pki;
pub mod ports;
pub mod process;
pub mod tailer;

/// rcgen, for tests that build certificate parameters of their own
/// ([`pki::DevCa::issue_with`]).
pub use rcgen;

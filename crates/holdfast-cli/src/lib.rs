//! The pieces of holdfast's command-line tools that more than one binary
//! needs: connection flags for arbiters and etcd, error reports, and exit
//! statuses. `holdfastctl` and `holdfast-pausetest` both use them.

pub mod conn;
pub mod exit;

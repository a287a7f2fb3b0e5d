//! The pieces of holdfast's command-line tools that more than one binary
//! needs: connection flags for arbiters and etcd, error reports, and exit
//! statuses. `holdfastctl` and `holdfast-pausetest` both use them; every
//! shipped binary uses `docs` for its man pages and shell completions.

pub mod conn;
pub mod docs;
pub mod exit;

//! Building blocks for running holdfast locally: used by `holdfastctl dev`
//! and by the test harness, never by a production daemon.

pub mod etcd;
pub mod etcdlog;
pub mod notify;
pub mod pki;
pub mod ports;
pub mod postgres;
pub mod s3;

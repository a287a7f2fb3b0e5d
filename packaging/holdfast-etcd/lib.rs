//! No code: this crate only carries the holdfast-etcd package metadata
//! (see Cargo.toml and docs/packaging.md).

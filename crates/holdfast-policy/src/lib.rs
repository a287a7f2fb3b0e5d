//! Lock classes and prefix grants (ARCHITECTURE.md, "Class file").
//!
//! A policy directory (`/etc/holdfast/` on a host) holds `classes.d/*.toml`
//! (one `[class.NAME]` table per lock class: namespace, enforcement, TTL,
//! tier…) and `grants.d/*.toml` (one `[grant.NAME]` table per SPIFFE ID or
//! ID prefix: the key prefixes it may lock, inspect or force-release).
//!
//! [`validate`] is the one validation function: `holdfastctl class check`,
//! the controller before it publishes and every arbiter when it loads a set
//! call it. It reports every problem in one pass, each with its file, line,
//! a stable [`Rule`] code and the fix, and compiles a valid set into a
//! [`CompiledSet`] (classes by namespace, grants, a content hash). No I/O
//! happens here besides reading the directory ([`Sources::read`]): the
//! pause-test results come in as [`PauseTests`], read by the caller.
//!
//! The rules and their messages are listed in `docs/policy.md`. [`cost`]
//! and [`risk`] hold the arithmetic of `holdfastctl class cost` and
//! `holdfastctl risk-register`.

pub mod access;
pub mod cost;
pub mod date;
pub mod problem;
pub mod risk;
pub mod set;
pub mod source;
pub mod validate;

pub use access::{Access, Action};
pub use date::Date;
pub use problem::{Problem, Rule};
pub use risk::{WaiverStatus, advisory_classes, waiver_status};
pub use set::{Class, CompiledSet, Enforcement, Fairness, Grant, OnQuorumLoss, Purpose, Tier};
pub use source::{LoadError, SourceFile, Sources};
pub use validate::{Checks, PauseTests, Report, validate};

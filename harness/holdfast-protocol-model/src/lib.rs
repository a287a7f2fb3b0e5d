//! A Stateright model of holdfast's lock protocol, checked exhaustively to a
//! bound: grants and releases (the transactions of `holdfast_store::txn`,
//! compare for compare; lost grant answers and their retries), sessions,
//! keepalives and send-time deadlines, lease expiry, the arbiter's seal and
//! its record of served epochs, snapshots and restores of any earlier
//! snapshot, the two-person epoch advance with its allocator on coord, key
//! moves between entity clusters, and a fenced resource; etcd leader
//! changes, with a deposed leader that still answers keepalives (the
//! arbiter's Raft-term confirmation). Eleven deliberate bugs ([`Mutation`])
//! each produce a counterexample. See docs/protocol.md.
//!
//! Lab only (`harness/`), never packaged.

pub mod model;
pub mod state;

pub use model::{
    Action, Config, FENCE_HOLDS, Mutation, NO_GRANT_WHILE_SEALED, NO_REISSUE_AFTER_RESTORE, NO_TOKEN_TWICE, NO_TWO_LIVE_HOLDERS,
    ProtocolModel, Scenario, TOKENS_INCREASE, WAITER_GRANTED,
};
pub use state::State;

use stateright::{Checker, HasDiscoveries, Model};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

impl Mutation {
    pub const ALL: [Mutation; 11] = [
        Mutation::NoEpochCompare,
        Mutation::TokenFromCounter,
        Mutation::NoSealCheck,
        Mutation::AdvanceByOne,
        Mutation::ForgetServedEpochs,
        Mutation::MoveWithoutAdvance,
        Mutation::MoveWithoutDrain,
        Mutation::DrainByMapOnly,
        Mutation::DeadlineFromReceiveTime,
        Mutation::ReleaseUnguarded,
        Mutation::NoKeepaliveConfirmation,
    ];

    /// The scenario whose bound exposes it.
    pub fn scenario(self) -> Scenario {
        match self {
            Mutation::MoveWithoutAdvance | Mutation::MoveWithoutDrain | Mutation::DrainByMapOnly => Scenario::Move,
            Mutation::DeadlineFromReceiveTime | Mutation::ReleaseUnguarded => Scenario::Time,
            Mutation::NoKeepaliveConfirmation => Scenario::Leader,
            _ => Scenario::Restore,
        }
    }

    /// The property its counterexample violates.
    pub fn violates(self) -> &'static str {
        match self {
            Mutation::NoEpochCompare => TOKENS_INCREASE,
            Mutation::TokenFromCounter => NO_TOKEN_TWICE,
            Mutation::NoSealCheck => NO_GRANT_WHILE_SEALED,
            Mutation::AdvanceByOne => NO_REISSUE_AFTER_RESTORE,
            Mutation::ForgetServedEpochs => NO_REISSUE_AFTER_RESTORE,
            Mutation::MoveWithoutAdvance => TOKENS_INCREASE,
            Mutation::MoveWithoutDrain => NO_TWO_LIVE_HOLDERS,
            Mutation::DrainByMapOnly => NO_TWO_LIVE_HOLDERS,
            Mutation::DeadlineFromReceiveTime => NO_TWO_LIVE_HOLDERS,
            Mutation::ReleaseUnguarded => NO_TWO_LIVE_HOLDERS,
            Mutation::NoKeepaliveConfirmation => NO_TWO_LIVE_HOLDERS,
        }
    }
}

/// What one run of the checker found.
#[derive(Debug)]
pub struct Outcome {
    pub unique_states: usize,
    pub states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Property name → readable trace of the counterexample.
    pub traces: BTreeMap<&'static str, String>,
    /// Property name → number of steps of the counterexample.
    pub lengths: BTreeMap<&'static str, usize>,
}

impl Outcome {
    pub fn summary(&self) -> String {
        format!("{} unique states ({} generated), depth {}, {:.1?}", self.unique_states, self.states, self.max_depth, self.elapsed)
    }
}

/// Explores the whole space of `cfg` breadth first with `threads` workers;
/// with `stop_at`, only until that property has a counterexample, and then
/// the shortest one (see [`shortest`]).
pub fn check(cfg: Config, threads: usize, stop_at: Option<&'static str>) -> Outcome {
    match stop_at {
        Some(p) => shortest(cfg, p),
        None => run(cfg, threads, None, None),
    }
}

/// The shortest counterexample of `property`: breadth first to depth 2, 3,
/// ... until one exists. (Within one bounded run Stateright keeps the last
/// path it found for a property, not the first, so iterative deepening is
/// what makes the trace a shortest one.) The outcome's counts are those of
/// the last, successful run.
pub fn shortest(cfg: Config, property: &'static str) -> Outcome {
    let start = Instant::now();
    let mut last = None;
    for depth in 2..=64 {
        let o = run(cfg.clone(), 1, Some(property), Some(depth));
        let found = o.traces.contains_key(property);
        let exhausted = o.max_depth < depth;
        last = Some(o);
        if found || exhausted {
            break;
        }
    }
    let mut o = last.unwrap_or_else(|| run(cfg, 1, Some(property), None));
    o.elapsed = start.elapsed();
    o
}

fn run(cfg: Config, threads: usize, stop_at: Option<&'static str>, depth: Option<usize>) -> Outcome {
    let model = ProtocolModel::new(cfg);
    let start = Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if let Some(p) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf([p].into_iter().collect()));
    }
    if let Some(d) = depth {
        builder = builder.target_max_depth(d);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = start.elapsed();
    let mut traces = BTreeMap::new();
    let mut lengths = BTreeMap::new();
    for (name, path) in checker.discoveries() {
        let steps = path.into_vec();
        lengths.insert(name, steps.len().saturating_sub(1));
        traces.insert(name, render(&model, steps, name));
    }
    Outcome {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        traces,
        lengths,
    }
}

/// A counterexample as numbered steps with what each changed.
pub fn render(model: &ProtocolModel, steps: Vec<(State, Option<Action>)>, property: &str) -> String {
    let mut out = String::new();
    let mut n = 0;
    for w in steps.windows(2) {
        let (prev, action) = (&w[0].0, &w[0].1);
        let next = &w[1].0;
        let Some(action) = action else { continue };
        n += 1;
        let _ = writeln!(out, "{n:>2}. {}{}", model.describe(action), effect(prev, next, action));
    }
    let _ = writeln!(out, "    ✗ violates: {property}");
    out
}

fn effect(prev: &State, next: &State, action: &Action) -> String {
    use state::{Serve, show_token};
    match *action {
        Action::Acquire { client, key, answer_lost, .. } => {
            let c = usize::from(client);
            let ki = usize::from(key);
            let cluster = |h: u8| (b'X' + h) as char;
            match next.clients[c].held[ki] {
                // No transaction committed: the retry found its own hold.
                Some(h) if prev.budget.grants == next.budget.grants => {
                    format!(" → its own hold (the session's): granted {} on {}", show_token(h.token), cluster(h.cluster))
                }
                Some(h) => format!(" → granted {} on {}", show_token(h.token), cluster(h.cluster)),
                None if answer_lost => {
                    let ci = usize::from(next.coord.map[ki]);
                    match next.clusters[ci].store.holds[ki] {
                        Some(h) => format!(
                            " → committed {} on {}, never received",
                            show_token(state::token(h.epoch, u64::from(h.create_revision))),
                            cluster(ci as u8)
                        ),
                        None => " → committed, never received".into(),
                    }
                }
                None => " → committed, but the token is withheld and the arbiter seals".into(),
            }
        }
        Action::Check { arbiter, cluster } => match &next.arbiters[usize::from(arbiter)].serve[usize::from(cluster)] {
            Serve::Serving(r) => format!(" → serving epoch {} (mint {})", r.epoch, r.mint),
            Serve::Sealed(e) => format!(" → sealed in epoch {e}"),
            Serve::Unverified => " → unverified".into(),
        },
        Action::Advance { cluster } | Action::MoveAdvance { key: cluster } => {
            let ci = match *action {
                Action::MoveAdvance { key } => prev.coord.moving[usize::from(key)].map(|m| usize::from(m.to)).unwrap_or(0),
                _ => usize::from(cluster),
            };
            let r = &next.clusters[ci].store.epoch;
            format!(" → {} at epoch {} (mint {}), every hold and session there ended", (b'X' + ci as u8) as char, r.epoch, r.mint)
        }
        Action::Write { key, .. } => {
            let (before, after) = (prev.resource[usize::from(key)], next.resource[usize::from(key)]);
            match after {
                Some(m) if before != after => format!(" → accepted, mark {}", show_token(m.token)),
                _ => " → rejected".into(),
            }
        }
        Action::Restore { cluster, .. } => {
            let cl = &next.clusters[usize::from(cluster)];
            format!(" → revision {}, epoch {} (mint {})", cl.store.revision, cl.store.epoch.epoch, cl.store.epoch.mint)
        }
        Action::DeliverRelease { msg, .. } => {
            let ki = usize::from(msg.key);
            let ci = usize::from(msg.cluster);
            if prev.clusters[ci].store.holds[ki].is_some() && next.clusters[ci].store.holds[ki].is_none() {
                " → a hold is deleted".into()
            } else {
                " → nothing deleted".into()
            }
        }
        Action::KeepaliveAnswer { client, cluster } => {
            let ci = usize::from(cluster);
            let answer = prev.clients[usize::from(client)].sessions[ci].and_then(|s| s.keepalive).and_then(|k| k.answer);
            match (answer, next.clients[usize::from(client)].sessions[ci]) {
                (Some(state::Renewal::Renewed { confirmed: false }), Some(s)) => {
                    format!(" → renewed, but in an unconfirmed term: not counted (local deadline stays {})", s.deadline)
                }
                (_, Some(s)) => format!(" → local deadline {}", s.deadline),
                (_, None) => String::new(),
            }
        }
        Action::KeepaliveAtLeader { client, cluster } => {
            let ci = usize::from(cluster);
            let lease = prev.clients[usize::from(client)].sessions[ci].map(|s| s.lease).unwrap_or(0);
            match next.clusters[ci].store.lease(lease) {
                Some(l) => format!(" (t={}) → lease expires at {}", next.now, l.expiry),
                None => " → lease gone".into(),
            }
        }
        Action::KeepaliveAtDeposed { client, cluster } => {
            let ci = usize::from(cluster);
            let lease = prev.clients[usize::from(client)].sessions[ci].map(|s| s.lease).unwrap_or(0);
            let answer = next.clients[usize::from(client)].sessions[ci].and_then(|s| s.keepalive).and_then(|k| k.answer);
            let real = next.clusters[ci].store.lease(lease).map(|l| l.expiry);
            let term = prev.clusters[ci].deposed.as_ref().map(|d| d.term).unwrap_or(0);
            match (answer, real) {
                (Some(state::Renewal::Renewed { .. }), Some(e)) => {
                    format!(" (t={}) → answers TTL in term {term}; the real lease still expires at {e}", next.now)
                }
                (Some(state::Renewal::Renewed { .. }), None) => {
                    format!(" (t={}) → answers TTL in term {term}; the real lease is gone", next.now)
                }
                _ => " → lease not found".into(),
            }
        }
        Action::LeaderChange { cluster } => {
            let cl = &next.clusters[usize::from(cluster)];
            let leases: Vec<String> = cl.store.leases.iter().map(|l| format!("{} until {}", l.id, l.expiry)).collect();
            format!(" (t={}) → term {}, leases {}", next.now, cl.term, leases.join(", "))
        }
        Action::Tick => format!(" → t={}", next.now),
        _ => String::new(),
    }
}

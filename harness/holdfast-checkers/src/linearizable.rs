//! C3 (`linearizable`): per-key linearizability of the lock operations.
//!
//! Wing–Gong–Lowe search with Porcupine's memoization, one key at a time,
//! against a sequential **fenced mutex with expiry**:
//!
//! - state: the holder `(session, token)` or free, and the highest token
//!   granted so far;
//! - `acquire(session) → token` (ok): legal only when free, and the token is
//!   greater than every token granted before; the holder becomes
//!   `(session, token)`. A retried acquire by the holder that returns the
//!   holder's own token is also legal and changes nothing (the arbiter
//!   answers a session's repeated acquire with its existing hold);
//! - `release(session, token)` (ok): legal only when the holder is exactly
//!   `(session, token)`; the lock becomes free;
//! - `expire(lease, create_revision)`: legal only when the holder's session is
//!   `lease` and its token's revision is `create_revision`; the lock becomes
//!   free.
//!
//! Which operations take part:
//!
//! - ok acquires and releases must be linearized, inside their real-time
//!   interval `[invoke, complete]`;
//! - failed operations had no effect and are left out;
//! - operations with an unknown outcome (a timeout counts as unknown) stay
//!   pending to the end: they may be linearized at any point after their
//!   invocation, or not at all. When etcd's log proves one took effect (an
//!   unclaimed put creating the key on the session's lease, or a non-expiry
//!   delete of the hold a release presented), it gets that revision and must
//!   be linearized;
//! - expiries come from etcd's log (deletes marked as lease expiry, and
//!   deletes of unknown cause that no release explains). An explicit
//!   (non-expiry) delete that no ok or unknown release explains is reported
//!   as [`Rule::UnexplainedDelete`] and then treated like an expiry — unless
//!   etcd's log proves it a *withdrawal*: the arbiter withdraws a grant whose
//!   token it will not hand out, and the withdrawing transaction writes a
//!   marker naming that exact hold (key, create revision, lease) at the
//!   delete's revision ([`crate::history::Withdrawal`]). A withdrawal frees
//!   the lock like an expiry; a withdrawal of a grant whose client got its
//!   token is still reported. Expiries and withdrawals have no
//!   real-time interval but a fixed place: every operation that carries an
//!   etcd revision (ok grants: their token's revision; releases and expiries:
//!   their delete's revision) is linearized in revision order.
//!
//! A key whose search exceeds [`Config::max_steps_per_key`], or that has more
//! than [`Config::max_ops_per_key`] operations, is reported inconclusive
//! ("unknown / too large"); the gate must count that as a failure.
//!
//! Not checked here: tokens against etcd (C1), the fence (C2), sessions and
//! keepalives (a session's expiry is taken from etcd, not from its TTL).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{EtcdEventKind, History, OpKind, Outcome, lock_key_of, make_token, token_revision};
use crate::report::{Checker, Inconclusive, OpRef, Report, Rule, client_ref, etcd_ref};

/// Search bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Most model steps tried for one key before giving up as inconclusive.
    pub max_steps_per_key: u64,
    /// Keys with more operations than this are inconclusive without search.
    pub max_ops_per_key: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config { max_steps_per_key: 2_000_000, max_ops_per_key: 100_000 }
    }
}

/// A model operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// `token` is `None` for an unknown-outcome acquire that etcd does not
    /// show (so its token was never observed).
    Acquire {
        session: i64,
        token: Option<u64>,
    },
    Release {
        session: i64,
        token: u64,
    },
    /// `unclaimed`: no grant (ok, or unknown matched to etcd) of this key
    /// has `create_revision`; only such an expiry may end a hold whose token
    /// was never observed.
    Expire {
        lease: i64,
        create_revision: u64,
        unclaimed: bool,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    action: Action,
    invoke: u64,
    /// `u64::MAX` for operations that stay pending to the end.
    complete: u64,
    /// Fixed place in etcd's revision order, if known.
    revision: Option<u64>,
    required: bool,
    source: OpRef,
}

/// The sequential model's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct State {
    holder: Option<(i64, Option<u64>)>,
    highest: u64,
}

impl State {
    /// Applies `action`; `None` if it is illegal in this state.
    fn step(self, action: Action) -> Option<State> {
        match action {
            Action::Acquire { session, token } => {
                if let Some(held) = self.holder {
                    // A retried acquire by the holder returns the same hold
                    // (the arbiter is re-entrant per session); anything else
                    // must wait for the lock to be free.
                    let same = token.is_some() && held == (session, token);
                    return same.then_some(self);
                }
                match token {
                    Some(t) if t <= self.highest => None,
                    Some(t) => Some(State { holder: Some((session, Some(t))), highest: t }),
                    None => Some(State { holder: Some((session, None)), highest: self.highest }),
                }
            }
            Action::Release { session, token } => {
                (self.holder == Some((session, Some(token)))).then_some(State { holder: None, highest: self.highest })
            }
            Action::Expire { lease, create_revision, unclaimed } => match self.holder {
                Some((s, t)) if s == lease => {
                    let same = match t {
                        Some(t) => create_revision == 0 || token_revision(t) == create_revision,
                        None => unclaimed,
                    };
                    same.then_some(State { holder: None, highest: self.highest })
                }
                _ => None,
            },
        }
    }

    fn describe(self) -> String {
        match self.holder {
            None => format!("free (highest token {})", self.highest),
            Some((s, Some(t))) => format!("held by session {s} with token {t}"),
            Some((s, None)) => format!("held by session {s} with an unobserved token"),
        }
    }
}

/// Runs C3 over `history`.
pub fn check(history: &History, config: &Config) -> Report {
    let mut report = Report::new(Checker::C3);
    let keys = partition(history, &mut report);
    report.checked = keys.len();
    for (key, mut entries) in keys {
        if entries.len() > config.max_ops_per_key {
            report.inconclusive.push(Inconclusive {
                key: key.to_string(),
                reason: format!("{} operations exceed the limit of {}", entries.len(), config.max_ops_per_key),
            });
            continue;
        }
        entries.sort_by_key(|e| e.invoke);
        match search(&entries, config.max_steps_per_key) {
            Outcome3::Linearizable => {}
            Outcome3::TooLarge(steps) => report
                .inconclusive
                .push(Inconclusive { key: key.to_string(), reason: format!("search gave up after {steps} steps (unknown / too large)") }),
            Outcome3::Not { linearized, state, stuck } => {
                let required = entries.iter().filter(|e| e.required).count();
                // The operations that could have come next at the deepest
                // point, or else every required operation.
                let stuck = if stuck.is_empty() {
                    (0..entries.len()).filter(|&i| entries.get(i).is_some_and(|e| e.required)).collect()
                } else {
                    stuck
                };
                let ops: Vec<OpRef> = stuck.iter().filter_map(|&i| entries.get(i)).map(|e| e.source.clone()).take(6).collect();
                report.push(
                    Rule::NotLinearizable,
                    key,
                    ops,
                    format!(
                        "no linearization: at best {linearized} of {required} required operations fit, leaving the lock {}; the listed operations could not continue from there",
                        state.describe()
                    ),
                );
            }
        }
    }
    report
}

/// A delete in etcd's log: (create revision, revision, lease, expired, event index).
type Delete = (u64, u64, i64, Option<bool>, usize);

/// Splits the history into per-key model operations.
fn partition<'a>(history: &'a History, report: &mut Report) -> BTreeMap<&'a str, Vec<Entry>> {
    let mut keys: BTreeMap<&str, Vec<Entry>> = BTreeMap::new();

    // etcd facts per key: creation puts (revision → lease, event) and
    // deletes (create revision → delete revision, lease, expired, event).
    let mut puts: HashMap<&str, BTreeMap<u64, (i64, usize)>> = HashMap::new();
    let mut deletes: HashMap<&str, Vec<Delete>> = HashMap::new();
    for (i, ev) in history.etcd.events.iter().enumerate() {
        let Some(key) = lock_key_of(&ev.key) else {
            continue;
        };
        keys.entry(key).or_default();
        match ev.kind {
            EtcdEventKind::Put if ev.create_revision == ev.revision => {
                puts.entry(key).or_default().insert(ev.revision, (ev.lease, i));
            }
            EtcdEventKind::Put => {}
            EtcdEventKind::Delete => deletes.entry(key).or_default().push((ev.create_revision, ev.revision, ev.lease, ev.expired, i)),
        }
    }

    // Revisions claimed by ok grants, so unknown acquires match only the rest.
    let mut claimed: HashSet<(&str, u64)> = HashSet::new();
    for op in &history.ops {
        if let (OpKind::Acquire { key }, Outcome::Ok, Some(t)) = (&op.kind, op.outcome, op.token) {
            claimed.insert((key, token_revision(t)));
        }
    }
    // Grants delivered to their client: the arbiter never withdraws those.
    let delivered = claimed.clone();
    // Withdrawals etcd's log proves: the arbiter withdraws a grant whose
    // token it will not hand out (it sealed or lost track of etcd while the
    // grant was in flight), deleting the hold and writing a marker naming
    // that exact hold in one transaction. (key, create revision, lease,
    // delete revision).
    let withdrawn: HashSet<(&str, u64, i64, u64)> =
        history.etcd.withdrawals.iter().filter_map(|w| Some((lock_key_of(&w.key)?, w.create_revision, w.lease, w.revision))).collect();
    let mut explained: HashSet<usize> = HashSet::new();

    // Ok operations first, so that when an ok and an unknown release present
    // the same token (a retry after a timeout), the ok one — which the server
    // says deleted the hold — is matched to etcd's delete, and the unknown
    // one stays optional. Entries are sorted by invocation per key below.
    let mut order: Vec<usize> = (0..history.ops.len()).collect();
    order.sort_by_key(|&i| history.ops[i].outcome != Outcome::Ok);
    for index in order {
        let op = &history.ops[index];
        let (key, is_acquire) = match &op.kind {
            OpKind::Acquire { key } => (key.as_str(), true),
            OpKind::Release { key } => (key.as_str(), false),
            _ => continue,
        };
        if op.outcome == Outcome::Fail {
            continue;
        }
        let source = client_ref(history, index);
        let Some(session) = op.session else {
            report.push(Rule::Malformed, key, vec![source], "lock operation without a session".to_string());
            continue;
        };
        let known = op.outcome == Outcome::Ok;
        let complete = match (known, op.complete_ns) {
            (true, Some(c)) => c,
            (true, None) => {
                report.push(Rule::Malformed, key, vec![source], "ok operation without completion time".to_string());
                continue;
            }
            (false, _) => u64::MAX,
        };
        let entry = if is_acquire {
            match (known, op.token) {
                (true, Some(t)) => Entry {
                    action: Action::Acquire { session, token: Some(t) },
                    invoke: op.invoke_ns,
                    complete,
                    revision: Some(token_revision(t)),
                    required: true,
                    source,
                },
                (true, None) => {
                    report.push(Rule::Malformed, key, vec![source], "ok acquire without a token".to_string());
                    continue;
                }
                (false, _) => {
                    // Did etcd record it? The first unclaimed creation on
                    // this session's lease.
                    let found = puts.get(key).and_then(|m| {
                        m.iter().find(|&(&rev, &(lease, _))| lease == session && !claimed.contains(&(key, rev))).map(|(&rev, _)| rev)
                    });
                    match found {
                        Some(rev) => {
                            claimed.insert((key, rev));
                            Entry {
                                action: Action::Acquire { session, token: Some(make_token(history.etcd.epoch_at(rev), rev)) },
                                invoke: op.invoke_ns,
                                complete,
                                revision: Some(rev),
                                required: true,
                                source,
                            }
                        }
                        None => Entry {
                            action: Action::Acquire { session, token: None },
                            invoke: op.invoke_ns,
                            complete,
                            revision: None,
                            required: false,
                            source,
                        },
                    }
                }
            }
        } else {
            let Some(token) = op.token else {
                report.push(Rule::Malformed, key, vec![source], "release without a token".to_string());
                continue;
            };
            // The non-expiry delete of the hold this release presented.
            let found = deletes.get(key).and_then(|d| {
                d.iter().find(|&&(create, _, _, expired, ev)| {
                    create == token_revision(token) && expired != Some(true) && !explained.contains(&ev)
                })
            });
            let revision = found.map(|&(_, rev, _, _, ev)| {
                explained.insert(ev);
                rev
            });
            Entry {
                action: Action::Release { session, token },
                invoke: op.invoke_ns,
                complete,
                revision,
                required: known || revision.is_some(),
                source,
            }
        };
        keys.entry(key).or_default().push(entry);
    }

    // Deletes no release explains are expiries (or unattributed deletes,
    // which free the lock the same way).
    for (key, list) in &deletes {
        for &(create, rev, lease, expired, ev) in list {
            if explained.contains(&ev) {
                continue;
            }
            let proven_withdrawal = withdrawn.contains(&(*key, create, lease, rev));
            if expired == Some(false) && !proven_withdrawal {
                report.push(
                    Rule::UnexplainedDelete,
                    key,
                    vec![etcd_ref(history, ev)],
                    format!(
                        "hold created at revision {create} was deleted at revision {rev} but no release presented its token \
                         and no withdrawal marker names it"
                    ),
                );
            } else if proven_withdrawal && delivered.contains(&(*key, create)) {
                report.push(
                    Rule::UnexplainedDelete,
                    key,
                    vec![etcd_ref(history, ev)],
                    format!("hold created at revision {create} was withdrawn at revision {rev} although its grant reached the client"),
                );
            }
            keys.entry(key).or_default().push(Entry {
                action: Action::Expire { lease, create_revision: create, unclaimed: create == 0 || !claimed.contains(&(*key, create)) },
                invoke: 0,
                complete: u64::MAX,
                revision: Some(rev),
                required: true,
                source: etcd_ref(history, ev),
            });
        }
    }

    // An unknown acquire that etcd does not show can only matter by being
    // ended by an unclaimed expiry of its session's lease; without one it
    // could only block others, so leave it out rather than let it multiply
    // the search.
    for entries in keys.values_mut() {
        let freeing: HashSet<i64> = entries
            .iter()
            .filter_map(|e| match e.action {
                Action::Expire { lease, unclaimed: true, .. } => Some(lease),
                _ => None,
            })
            .collect();
        entries.retain(|e| match e.action {
            Action::Acquire { session, token: None } => freeing.contains(&session),
            _ => true,
        });
    }
    keys
}

enum Outcome3 {
    Linearizable,
    TooLarge(u64),
    Not { linearized: usize, state: State, stuck: Vec<usize> },
}

/// A search node: the state before, the candidates, and the next to try.
struct Frame {
    state: State,
    candidates: Vec<usize>,
    next: usize,
    /// The entry whose linearization led here.
    via: Option<usize>,
}

/// Entries (sorted by invocation) that may be linearized next: every
/// entry that must precede them in real time or in revision order is done.
fn candidates(entries: &[Entry], done: &[u64]) -> Vec<usize> {
    let is_done = |i: usize| done.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0);
    let mut min_complete = u64::MAX;
    let mut min_revision = u64::MAX;
    for (i, e) in entries.iter().enumerate() {
        if is_done(i) || !e.required {
            continue;
        }
        min_complete = min_complete.min(e.complete);
        if let Some(r) = e.revision {
            min_revision = min_revision.min(r);
        }
    }
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.invoke > min_complete {
            break;
        }
        if is_done(i) {
            continue;
        }
        if e.revision.is_some_and(|r| r > min_revision) {
            continue;
        }
        out.push(i);
    }
    out
}

/// Depth-first Wing–Gong–Lowe search with a memo of (done set, state).
fn search(entries: &[Entry], max_steps: u64) -> Outcome3 {
    let required = entries.iter().filter(|e| e.required).count();
    if required == 0 {
        return Outcome3::Linearizable;
    }
    let words = entries.len().div_ceil(64);
    let mut done = vec![0u64; words];
    let mut done_required = 0usize;
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let start = State { holder: None, highest: 0 };
    let mut stack = vec![Frame { state: start, candidates: candidates(entries, &done), next: 0, via: None }];
    let mut steps = 0u64;
    let mut best: (usize, State, Vec<usize>) = (0, start, Vec::new());

    while let Some(frame) = stack.last_mut() {
        let Some(&c) = frame.candidates.get(frame.next) else {
            // Exhausted: backtrack.
            if done_required > best.0 || best.2.is_empty() {
                best = (done_required, frame.state, frame.candidates.clone());
            }
            let via = frame.via;
            stack.pop();
            if let Some(v) = via {
                if let Some(w) = done.get_mut(v / 64) {
                    *w &= !(1 << (v % 64));
                }
                if entries.get(v).is_some_and(|e| e.required) {
                    done_required -= 1;
                }
            }
            continue;
        };
        frame.next += 1;
        steps += 1;
        if steps > max_steps {
            return Outcome3::TooLarge(max_steps);
        }
        let Some(entry) = entries.get(c) else {
            continue;
        };
        let Some(next) = frame.state.step(entry.action) else {
            continue;
        };
        if let Some(w) = done.get_mut(c / 64) {
            *w |= 1 << (c % 64);
        }
        let counted = usize::from(entry.required);
        if done_required + counted == required {
            return Outcome3::Linearizable;
        }
        if !seen.insert((done.clone(), next)) {
            if let Some(w) = done.get_mut(c / 64) {
                *w &= !(1 << (c % 64));
            }
            continue;
        }
        done_required += counted;
        let cands = candidates(entries, &done);
        stack.push(Frame { state: next, candidates: cands, next: 0, via: Some(c) });
    }
    let (linearized, state, stuck) = best;
    Outcome3::Not { linearized, state, stuck }
}

#[cfg(test)]
mod tests {
    //! The search against a plain depth-first search without the memo: the
    //! memo may only make the search faster, never change its answer.

    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn entry(action: Action, invoke: u64, complete: u64, required: bool) -> Entry {
        let source = OpRef::Client { index: 0, invoke_ns: invoke, complete_ns: Some(complete) };
        Entry { action, invoke, complete, revision: None, required, source }
    }

    fn acquire(session: i64, token: u64) -> Action {
        Action::Acquire { session, token: Some(token) }
    }

    fn release(session: i64, token: u64) -> Action {
        Action::Release { session, token }
    }

    /// Every order, no memo: is there one that linearizes every required entry?
    fn exhaustive(entries: &[Entry], done: &mut Vec<u64>, state: State, left: usize) -> bool {
        if left == 0 {
            return true;
        }
        for c in candidates(entries, done) {
            let Some(next) = state.step(entries[c].action) else { continue };
            done[c / 64] |= 1 << (c % 64);
            if exhaustive(entries, done, next, left - usize::from(entries[c].required)) {
                return true;
            }
            done[c / 64] &= !(1 << (c % 64));
        }
        false
    }

    fn reference(entries: &[Entry]) -> bool {
        let required = entries.iter().filter(|e| e.required).count();
        exhaustive(entries, &mut vec![0; entries.len().div_ceil(64)], State { holder: None, highest: 0 }, required)
    }

    fn linearizable(entries: &[Entry]) -> bool {
        match search(entries, u64::MAX) {
            Outcome3::Linearizable => true,
            Outcome3::Not { .. } => false,
            Outcome3::TooLarge(_) => unreachable!("no step limit"),
        }
    }

    /// A memo hit on a required entry must leave it free for the paths tried
    /// after it. The required four overlap; the only orders that work put session 2's
    /// acquire and release (token 5) before session 1's acquire and its retry
    /// (token 10). The search first tries session 1's acquire then its retry,
    /// fails, then the retry then the acquire — the same (done set, state),
    /// a memo hit on the acquire — and must still find the order that starts
    /// with session 2. (The optional first entry, a release nobody can
    /// make, puts the memo hit at index 1, where a wrong word or bit index
    /// differs from the right one.)
    #[test]
    fn a_memo_hit_does_not_lose_the_entry_for_later_paths() {
        let entries = [
            entry(release(3, 1), 0, 100, false),
            entry(acquire(1, 10), 1, 100, true),
            entry(acquire(1, 10), 2, 100, true),
            entry(acquire(2, 5), 3, 100, true),
            entry(release(2, 5), 4, 100, true),
        ];
        assert!(reference(&entries));
        assert!(linearizable(&entries));
    }

    /// Small random histories (two sessions, three tokens, overlapping
    /// intervals, some entries optional): the search with its memo answers
    /// exactly as the exhaustive search does, both ways.
    #[test]
    fn the_search_agrees_with_an_exhaustive_search_on_small_histories() {
        let mut rng = StdRng::seed_from_u64(12);
        let (mut yes, mut no) = (0, 0);
        for _ in 0..4000 {
            let n = rng.random_range(2..=6);
            let mut entries: Vec<Entry> = (0..n)
                .map(|_| {
                    let session = rng.random_range(1..=2);
                    let token = [5, 10, 15][rng.random_range(0..3)];
                    let action = if rng.random_bool(0.7) { acquire(session, token) } else { release(session, token) };
                    let invoke = rng.random_range(0..40);
                    entry(action, invoke, invoke + rng.random_range(1..60), rng.random_bool(0.7))
                })
                .collect();
            entries.sort_by_key(|e| e.invoke);
            let expected = reference(&entries);
            assert_eq!(linearizable(&entries), expected, "search and exhaustive search disagree on {:?}", actions(&entries));
            if expected { yes += 1 } else { no += 1 }
        }
        eprintln!("{yes} linearizable, {no} not");
        assert!(yes > 500 && no > 500, "both answers are exercised: {yes} linearizable, {no} not");
    }

    fn actions(entries: &[Entry]) -> Vec<String> {
        entries.iter().map(|e| format!("{:?} [{}, {}] required={}", e.action, e.invoke, e.complete, e.required)).collect()
    }
}

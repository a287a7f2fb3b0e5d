//! C1 (`etcd_log`): client-visible grants against etcd's event log (ground truth).
//!
//! Rules, each reported under its own [`Rule`]:
//!
//! - **Log order** ([`Rule::EtcdLogOutOfOrder`]): etcd's events are in
//!   non-decreasing revision order (events of one Txn share a revision).
//!   Everything below relies on it.
//! - **Holder intervals never overlap** ([`Rule::HolderIntervalOverlap`]):
//!   per key, a put that creates the hold (create revision = revision) may
//!   only happen when no hold exists, i.e. every hold's interval
//!   create → delete revision is disjoint from the next. A put that updates
//!   a hold must update the one that is current.
//! - **Tokens strictly increase per key** ([`Rule::TokenNotIncreasing`]):
//!   the ok grants of a key, in the order of their etcd events, carry
//!   strictly increasing tokens.
//! - **Every ok grant is in etcd** ([`Rule::GrantWithoutEtcdEvent`],
//!   [`Rule::GrantEventMismatch`], [`Rule::GrantWrongEpoch`]): its token's
//!   revision (`token & (2^48-1)`) is the revision of a put creating its
//!   key, on its session's lease; its epoch (`token >> 48`) is the epoch
//!   in force at that revision (epoch advances are in etcd's log).
//! - **Holds only on live sessions** ([`Rule::GrantOnEndedSession`]): no
//!   put in etcd's log creates a hold on a lease whose session record
//!   `/s/<lease>` was deleted at an earlier revision (expired, closed, or
//!   ended by an epoch advance). etcd itself refuses a put on a revoked
//!   lease; between a record's delete and its lease's revoke only the
//!   grant's compare on the session record stands in the way.
//! - **No hold while its range drains** ([`Rule::GrantWhileDraining`]): no
//!   put in etcd's log creates a hold of a key while a drain marker
//!   (`/sys/drain/<unit>`) covering it exists: the unit is the key, or a
//!   prefix of it ending at a `/`. The grant transaction compares the
//!   markers absent; a move's wait for the range's holds relies on it.
//! - **No token is reused** ([`Rule::TokenReused`]): no two ok grants carry
//!   the same token — except (a) a session's retried acquire of a key it
//!   holds, which returns the same hold (same key, session, token) and is
//!   exempt from this and the ordering rules, and (b) grants of *different*
//!   keys committed together by group commit: both keys really were created
//!   at that one revision in etcd's log. Tokens are unique per key always,
//!   and across keys unless etcd shows one multi-key commit.
//! - **Real-time order** ([`Rule::RealTimeOrder`]): on one key, a grant that
//!   completed before another was invoked has the smaller token.
//! - **No client believes past its lease** ([`Rule::DeadlinePastSessionEnd`]):
//!   a client's recorded local deadline ([`OpKind::Deadline`]) for a session
//!   whose record etcd deleted by lease expiry (not by an epoch advance)
//!   falls no later than that end. etcd's log has revisions, not times, so
//!   the end is placed in real time from above: an ok acquire whose token
//!   revision is at or after the end revision completed after the end, so
//!   a deadline later than that acquire's completion is proven late. This
//!   is what keepalive confirmation and send-time deadlines protect: a
//!   renewal that etcd did not make, or a deadline counted from a late
//!   answer, lets a client act after its hold may have passed to another.
//!
//! Not checked here: grants with unknown outcome (C3 places them), releases
//! and expiries against clients (C3), the fence (C2), session operations.

use std::collections::{BTreeMap, HashMap};

use crate::EtcdEventKind;
use crate::history::{History, OpKind, Outcome, lock_key_of, token_epoch, token_revision};
use crate::report::{Checker, Report, Rule, client_ref, etcd_ref};

/// An ok grant as C1 sees it.
#[derive(Clone, Copy)]
struct Grant<'a> {
    index: usize,
    key: &'a str,
    session: Option<i64>,
    token: u64,
    invoke_ns: u64,
    complete_ns: u64,
}

/// Runs C1 over `history`.
/// Across an etcd restore: `before` is the history up to the moment etcd
/// was stopped and restored from a snapshot, `after` the history of the
/// restored cluster (each checked on its own by [`check`]). A restored log
/// reuses revisions, so a token minted after the restore in the old epoch
/// could equal or undercut one already handed out; the seal and the epoch
/// advance exist to prevent that. Rule ([`Rule::TokenNotAboveRestore`]):
/// every ok grant after the restore carries a token greater than every ok
/// grant's token before it, whatever the keys.
pub fn check_restore(before: &History, after: &History) -> Report {
    let mut report = Report::new(Checker::C1);
    let ok = |h: &History| -> Vec<(usize, u64)> {
        h.ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op.kind, OpKind::Acquire { .. }) && op.outcome == Outcome::Ok)
            .filter_map(|(i, op)| Some((i, op.token?)))
            .collect()
    };
    let (first, then) = (ok(before), ok(after));
    report.checked = then.len();
    let Some(&(top_index, top)) = first.iter().max_by_key(|(_, t)| *t) else {
        return report;
    };
    for (i, token) in then {
        if token <= top {
            let key = match &after.ops[i].kind {
                OpKind::Acquire { key } => key.clone(),
                _ => String::new(),
            };
            report.push(
                Rule::TokenNotAboveRestore,
                &key,
                vec![client_ref(after, i), client_ref(before, top_index)],
                format!(
                    "granted after the restore with epoch {} at revision {}, not above epoch {} revision {} granted before it",
                    token_epoch(token),
                    token_revision(token),
                    token_epoch(top),
                    token_revision(top)
                ),
            );
        }
    }
    report
}

pub fn check(history: &History) -> Report {
    let mut report = Report::new(Checker::C1);
    let creations = check_log(history, &mut report);
    let grants = ok_grants(history, &mut report);

    let mut keys: BTreeMap<&str, Vec<&Grant<'_>>> = BTreeMap::new();
    for g in &grants {
        keys.entry(g.key).or_default().push(g);
    }
    for (key, _) in creations.keys() {
        keys.entry(key).or_default();
    }
    report.checked = keys.len();

    check_grants_in_log(history, &grants, &creations, &mut report);
    check_reuse(history, &grants, &mut report);
    for (key, key_grants) in &keys {
        check_increasing(history, key, key_grants, &creations, &mut report);
        check_real_time(history, key, key_grants, &mut report);
    }
    check_deadlines(history, &grants, &mut report);
    report
}

/// [`Rule::DeadlinePastSessionEnd`]: every recorded local deadline against
/// its session's end by lease expiry, placed in real time by the earliest
/// completion of an ok grant at or after the end's revision.
fn check_deadlines(history: &History, grants: &[Grant<'_>], report: &mut Report) {
    // Sessions ended by expiry (or a close): the first revision the record
    // was deleted at. A session an epoch advance ended is left out: the
    // advance ends it without regard to its lease, which no client can see
    // coming.
    let mut ends: HashMap<i64, u64> = HashMap::new();
    let mut advanced: Vec<i64> = Vec::new();
    for e in &history.etcd.session_ends {
        if history.etcd.is_advance(e.revision) {
            advanced.push(e.lease);
        }
        let r = ends.entry(e.lease).or_insert(e.revision);
        *r = (*r).min(e.revision);
    }
    for lease in advanced {
        ends.remove(&lease);
    }
    if ends.is_empty() {
        return;
    }
    // Ok grants by token revision, with the earliest completion at or after
    // each (a suffix minimum; of grants completing at the same moment, the
    // one at the lowest revision is the evidence cited).
    let mut by_revision: Vec<(u64, u64, usize)> = grants.iter().map(|g| (token_revision(g.token), g.complete_ns, g.index)).collect();
    by_revision.sort_unstable();
    let mut earliest: Vec<(u64, usize)> = vec![(u64::MAX, usize::MAX); by_revision.len()];
    let mut best = (u64::MAX, usize::MAX);
    for (i, &(_, complete, index)) in by_revision.iter().enumerate().rev() {
        if complete <= best.0 {
            best = (complete, index);
        }
        earliest[i] = best;
    }
    for (index, op) in history.ops.iter().enumerate() {
        let (OpKind::Deadline { until_ns }, Some(lease)) = (&op.kind, op.session) else {
            continue;
        };
        let Some(&end) = ends.get(&lease) else { continue };
        let first = by_revision.partition_point(|(r, _, _)| *r < end);
        let Some(&(seen_ns, grant)) = earliest.get(first) else { continue };
        if *until_ns > seen_ns {
            report.push(
                Rule::DeadlinePastSessionEnd,
                &format!("session {lease:x}"),
                vec![client_ref(history, index), client_ref(history, grant)],
                format!(
                    "process {} treated session {lease:x} as alive until {until_ns} ns, but etcd deleted its record at \
                     revision {end} (lease expiry), which a grant completed at {seen_ns} ns had already observed: \
                     {} ms too late",
                    op.process,
                    (*until_ns - seen_ns) / 1_000_000
                ),
            );
        }
    }
}

/// Creation puts by (lock key, revision) → (event index, lease).
type Creations<'a> = HashMap<(&'a str, u64), (usize, i64)>;

/// Checks log order and interval overlap; returns the creation puts.
fn check_log<'a>(history: &'a History, report: &mut Report) -> Creations<'a> {
    let mut creations = Creations::new();
    // The first revision at which each session record was deleted.
    let mut ended: HashMap<i64, u64> = HashMap::new();
    for e in &history.etcd.session_ends {
        let r = ended.entry(e.lease).or_insert(e.revision);
        *r = (*r).min(e.revision);
    }
    // Per drain unit: the revisions it was written and deleted at.
    let mut drains: HashMap<&str, Vec<(u64, bool)>> = HashMap::new();
    for d in &history.etcd.drains {
        drains.entry(d.unit.as_str()).or_default().push((d.revision, d.present));
    }
    // Per key: the current hold (create revision, event index), if any.
    let mut open: HashMap<&str, (u64, usize)> = HashMap::new();
    let mut last: Option<(usize, u64)> = None;
    for (i, ev) in history.etcd.events.iter().enumerate() {
        let Some(key) = lock_key_of(&ev.key) else {
            continue;
        };
        if let Some((j, rev)) = last
            && ev.revision < rev
        {
            report.push(
                Rule::EtcdLogOutOfOrder,
                key,
                vec![etcd_ref(history, j), etcd_ref(history, i)],
                format!("etcd event at revision {} follows one at revision {rev}", ev.revision),
            );
        }
        last = Some((i, ev.revision));
        match ev.kind {
            EtcdEventKind::Put if ev.create_revision == ev.revision => {
                if let Some(&(held, j)) = open.get(key) {
                    report.push(
                        Rule::HolderIntervalOverlap,
                        key,
                        vec![etcd_ref(history, j), etcd_ref(history, i)],
                        format!("hold created at revision {} while the hold created at {held} was never deleted", ev.revision),
                    );
                }
                if let Some(&end) = ended.get(&ev.lease)
                    && ev.lease != 0
                    && end < ev.revision
                {
                    report.push(
                        Rule::GrantOnEndedSession,
                        key,
                        vec![etcd_ref(history, i)],
                        format!(
                            "hold created at revision {} on lease {:x}, whose session record was deleted at revision {end}",
                            ev.revision, ev.lease
                        ),
                    );
                }
                if let Some(unit) = draining_at(&drains, key, ev.revision) {
                    report.push(
                        Rule::GrantWhileDraining,
                        key,
                        vec![etcd_ref(history, i)],
                        format!("hold created at revision {} while the drain marker of {unit} existed", ev.revision),
                    );
                }
                open.insert(key, (ev.revision, i));
                creations.insert((key, ev.revision), (i, ev.lease));
            }
            EtcdEventKind::Put => match open.get(key) {
                Some(&(held, _)) if held == ev.create_revision => {}
                other => {
                    let mut ops = vec![etcd_ref(history, i)];
                    if let Some(&(_, j)) = other {
                        ops.insert(0, etcd_ref(history, j));
                    }
                    report.push(
                        Rule::HolderIntervalOverlap,
                        key,
                        ops,
                        format!(
                            "put at revision {} updates a hold created at {} that is not the current hold",
                            ev.revision, ev.create_revision
                        ),
                    );
                }
            },
            EtcdEventKind::Delete => {
                // A delete ends the current hold; etcd emits no event for
                // deleting a missing key, so a delete always ends one.
                open.remove(key);
            }
        }
    }
    creations
}

/// The drain unit covering `key` whose marker existed just before
/// `revision` (what a transaction at `revision` compares), if any.
fn draining_at<'a>(drains: &HashMap<&'a str, Vec<(u64, bool)>>, key: &str, revision: u64) -> Option<&'a str> {
    drains.iter().find_map(|(unit, changes)| {
        let covers = key == *unit || key.strip_prefix(*unit).is_some_and(|rest| rest.starts_with('/'));
        let present = changes.iter().rfind(|(r, _)| *r < revision).is_some_and(|(_, p)| *p);
        (covers && present).then_some(*unit)
    })
}

impl Grant<'_> {
    /// Whether `other` is the same hold returned again: the arbiter answers
    /// a session's repeated acquire of a key it holds with the existing hold
    /// (same key, session and token). Such a pair is not a reuse.
    fn same_hold(&self, other: &Grant<'_>) -> bool {
        self.key == other.key && self.token == other.token && self.session.is_some() && self.session == other.session
    }
}

/// Collects ok grants; reports ok acquires without token or completion.
fn ok_grants<'a>(history: &'a History, report: &mut Report) -> Vec<Grant<'a>> {
    let mut grants = Vec::new();
    for (index, op) in history.ops.iter().enumerate() {
        let OpKind::Acquire { key } = &op.kind else {
            continue;
        };
        if op.outcome != Outcome::Ok {
            continue;
        }
        match (op.token, op.complete_ns) {
            (Some(token), Some(complete_ns)) => {
                grants.push(Grant { index, key, session: op.session, token, invoke_ns: op.invoke_ns, complete_ns })
            }
            _ => report.push(
                Rule::Malformed,
                key,
                vec![client_ref(history, index)],
                "ok acquire without a token or a completion time".to_string(),
            ),
        }
    }
    grants
}

/// Every ok grant has its creating put, on its lease, in the current epoch.
fn check_grants_in_log(history: &History, grants: &[Grant<'_>], creations: &Creations<'_>, report: &mut Report) {
    for g in grants {
        let epoch = token_epoch(g.token);
        let revision = token_revision(g.token);
        let current = history.etcd.epoch_at(revision);
        if epoch != current {
            report.push(
                Rule::GrantWrongEpoch,
                g.key,
                vec![client_ref(history, g.index)],
                format!("grant token {} has epoch {epoch}; the epoch at its revision {revision} is {current}", g.token),
            );
        }
        match creations.get(&(g.key, revision)) {
            None => report.push(
                Rule::GrantWithoutEtcdEvent,
                g.key,
                vec![client_ref(history, g.index)],
                format!("grant token {} has no etcd put creating the key at revision {revision}", g.token),
            ),
            Some(&(ev, lease)) => {
                if let Some(session) = g.session
                    && session != lease
                {
                    report.push(
                        Rule::GrantEventMismatch,
                        g.key,
                        vec![client_ref(history, g.index), etcd_ref(history, ev)],
                        format!("grant to session {session} but the put at revision {revision} is on lease {lease}"),
                    );
                }
            }
        }
    }
}

/// True if etcd's log shows `lock_key` created at exactly `revision`.
fn created_at(history: &History, lock_key: &str, revision: u64) -> bool {
    let key = crate::history::etcd_key_of(lock_key);
    history.etcd.events.iter().any(|e| {
        matches!(e.kind, crate::history::EtcdEventKind::Put) && e.key == key && e.revision == revision && e.create_revision == revision
    })
}

/// No two ok grants share a token (see the module docs for the two
/// exemptions).
fn check_reuse(history: &History, grants: &[Grant<'_>], report: &mut Report) {
    let mut seen: HashMap<u64, &Grant<'_>> = HashMap::new();
    for g in grants {
        if let Some(first) = seen.get(&g.token)
            && !first.same_hold(g)
            && !(first.key != g.key
                && created_at(history, first.key, crate::history::token_revision(g.token))
                && created_at(history, g.key, crate::history::token_revision(g.token)))
        {
            report.push(
                Rule::TokenReused,
                g.key,
                vec![client_ref(history, first.index), client_ref(history, g.index)],
                format!("token {} granted twice (keys {} and {})", g.token, first.key, g.key),
            );
        } else {
            seen.insert(g.token, g);
        }
    }
}

/// In the order of their etcd creation events, a key's grants' tokens
/// strictly increase. Grants without an event are left to
/// [`check_grants_in_log`].
fn check_increasing(history: &History, key: &str, grants: &[&Grant<'_>], creations: &Creations<'_>, report: &mut Report) {
    let mut placed: Vec<(usize, &Grant<'_>)> =
        grants.iter().filter_map(|g| creations.get(&(key, token_revision(g.token))).map(|&(ev, _)| (ev, *g))).collect();
    placed.sort_by_key(|&(ev, g)| (ev, g.index));
    for pair in placed.windows(2) {
        let [(_, a), (_, b)] = pair else { continue };
        if b.token <= a.token && !a.same_hold(b) {
            report.push(
                Rule::TokenNotIncreasing,
                key,
                vec![client_ref(history, a.index), client_ref(history, b.index)],
                format!("token {} follows token {} in etcd order", b.token, a.token),
            );
        }
    }
}

/// A grant completed before another was invoked has the smaller token.
/// Sweep: grants by invocation; fold in every grant that completed before.
fn check_real_time(history: &History, key: &str, grants: &[&Grant<'_>], report: &mut Report) {
    let mut by_complete: Vec<&Grant<'_>> = grants.to_vec();
    by_complete.sort_by_key(|g| (g.complete_ns, g.index));
    let mut by_invoke: Vec<&Grant<'_>> = grants.to_vec();
    by_invoke.sort_by_key(|g| (g.invoke_ns, g.index));
    let mut done = 0;
    let mut max: Option<&Grant<'_>> = None;
    for b in by_invoke {
        while let Some(a) = by_complete.get(done) {
            if a.complete_ns >= b.invoke_ns {
                break;
            }
            if max.is_none_or(|m| a.token > m.token) {
                max = Some(a);
            }
            done += 1;
        }
        if let Some(a) = max
            && a.token >= b.token
            && !a.same_hold(b)
        {
            report.push(
                Rule::RealTimeOrder,
                key,
                vec![client_ref(history, a.index), client_ref(history, b.index)],
                format!("grant with token {} completed before a grant with token {} was invoked", a.token, b.token),
            );
        }
    }
}

//! Keepalives are not counted while a deposed etcd leader may still revoke
//! the session's lease.
//!
//! **The mechanism** (docs/gate.md, "A deposed leader's revokes"). etcd's
//! lessor keeps each lease's expiry in the leader's memory only. A leader
//! that stops (SIGSTOP, a paused VM, a stalled disk) while the others elect
//! a new one wakes up with the expiries it had: every lease the new leader
//! renewed meanwhile looks expired to it. Its lessor proposes their revokes
//! before its server loop learns it was deposed (`revokeExpiredLeases` in
//! `server/lease/lessor.go`; the guard `ensureLeadership` in
//! `server/etcdserver/server.go`, etcd #15247, asks nobody while the Raft
//! loop has ticked within three ticks, which it has just after waking); a
//! proposal made once its Raft state is follower is forwarded to the new
//! leader, which commits it. Measured on etcd 3.6.17 and 3.4.23: a leader
//! stopped longer than the TTL minus the renewal period ends sessions whose
//! confirmed renewals promised them seconds more.
//!
//! **What the arbiter does.** It counts a keepalive answered in Raft term
//! `T` only once it has seen every member of the cluster either answer a
//! Status call in term `T` or later, or refuse the connection (a stopped
//! process has no lessor; a restarted member's lessor is not primary), and
//! still do so [`GRACE`] later: a revoke the woken leader proposed before
//! it stepped down is committed or dropped by then. Until then, a member
//! that times out (stopped, stalled, cut off) may be a deposed leader with
//! stale expiries. The exception is a session whose lease was granted in
//! term `T` or later through this arbiter: no leader of an earlier term
//! ever knew it, and a member that led a later term answers with it.
//!
//! **The cost.** While a member does not answer, sessions granted before
//! the current term are not renewed by the client's count: they end at
//! their deadline, once, and the clients open new ones, which count at
//! once. A leader whose host is lost for good therefore ends the older
//! sessions one TTL after the election — until it answers again or is
//! removed from `etcd.endpoints`. Nothing can tell such a host from a
//! paused one that will come back and revoke.

use crate::etcd::Etcd;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::{Notify, watch};
use tokio::time::{Duration, Instant};

/// How long every member must keep answering in the new term before its
/// keepalives count: longer than one round of etcd's lessor revoke loop
/// (500 ms), so that a revoke a woken leader proposed before it learned it
/// was deposed has been committed or dropped.
pub const GRACE: Duration = Duration::from_millis(600);
/// Between two Status rounds while a term is waiting to be cleared.
pub const ROUND_EVERY: Duration = Duration::from_millis(100);
/// How long one member's Status answer is waited for.
pub const STATUS_WITHIN: Duration = Duration::from_secs(1);

/// One member's part in a Status round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It answered, in this Raft term.
    Term(u64),
    /// Nothing listens on its client port: the process is not running.
    Refused,
    /// No answer (timed out, or an error other than a refused connection).
    Silent(String),
}

/// What one Status round says about `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Every member answered in `target` or later, or refused. (A member
    /// in a later term is no leader of an earlier one; only terms keepalives
    /// were answered in are cleared: a member cut off from its peers
    /// without pre-vote, as on etcd 3.4, campaigns into terms nobody leads.)
    Clear,
    /// These members (endpoint and why) may still lead an earlier term.
    Waiting(Vec<String>),
}

/// Judges one Status round (endpoints in the order of `answers`).
pub fn judge(target: u64, answers: &[(String, Answer)]) -> Round {
    let waiting: Vec<String> = answers
        .iter()
        .filter_map(|(e, a)| match a {
            Answer::Term(t) if *t < target => Some(format!("{e} (answers in term {t})")),
            Answer::Silent(why) => Some(format!("{e} ({why})")),
            _ => None,
        })
        .collect();
    if waiting.is_empty() { Round::Clear } else { Round::Waiting(waiting) }
}

/// Whether a keepalive answered in term `acked` counts for a lease granted
/// in term `granted` (None: not granted through this arbiter, or before it
/// started), when every term up to `cleared` is cleared.
pub fn counts(acked: u64, granted: Option<u64>, cleared: u64) -> bool {
    acked <= cleared || granted.is_some_and(|g| g >= acked)
}

/// Whether a Status error says nothing listens on the member's port.
pub fn refused(error: &str) -> bool {
    error.contains("Connection refused") || error.contains("os error 111")
}

/// The terms this arbiter has cleared on one cluster, and the grant term of
/// the leases it granted there.
pub struct Deposed {
    cleared: watch::Sender<u64>,
    wanted: Mutex<u64>,
    wake: Notify,
    granted: Mutex<HashMap<i64, u64>>,
}

/// Leases whose grant term is remembered, at most; past it the map starts
/// again (a forgotten lease only waits like one granted elsewhere).
const MAX_REMEMBERED: usize = 200_000;

impl Deposed {
    /// Starts the Status rounds of `etcd`'s members.
    pub fn start(etcd: Etcd) -> std::sync::Arc<Self> {
        let d = std::sync::Arc::new(Deposed {
            cleared: watch::channel(0).0,
            wanted: Mutex::new(0),
            wake: Notify::new(),
            granted: Mutex::new(HashMap::new()),
        });
        tokio::spawn(run(etcd, d.clone()));
        d
    }

    /// Records that `lease` was granted in Raft term `term`.
    pub fn granted(&self, lease: i64, term: u64) {
        let mut g = self.granted.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= MAX_REMEMBERED {
            g.clear();
        }
        g.insert(lease, term);
    }

    pub fn forget(&self, lease: i64) {
        self.granted.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease);
    }

    /// The highest term cleared so far.
    pub fn cleared(&self) -> u64 {
        *self.cleared.borrow()
    }

    /// Whether a keepalive of `lease` answered in term `acked` counts,
    /// waiting at most `within` for the term to be cleared.
    pub async fn count(&self, lease: i64, acked: u64, within: Duration) -> bool {
        let granted = self.granted.lock().unwrap_or_else(|e| e.into_inner()).get(&lease).copied();
        if counts(acked, granted, self.cleared()) {
            return true;
        }
        {
            let mut w = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
            *w = (*w).max(acked);
        }
        self.wake.notify_one();
        let mut rx = self.cleared.subscribe();
        matches!(tokio::time::timeout(within, rx.wait_for(|c| *c >= acked)).await, Ok(Ok(_)))
    }
}

async fn run(etcd: Etcd, d: std::sync::Arc<Deposed>) {
    // The term every member was first seen answering in, and since when.
    let mut clear_since: Option<(u64, Instant)> = None;
    let mut warned: Option<u64> = None;
    let mut asked_since: Option<Instant> = None;
    loop {
        let wanted = *d.wanted.lock().unwrap_or_else(|e| e.into_inner());
        if wanted <= d.cleared() {
            asked_since = None;
            d.wake.notified().await;
            continue;
        }
        let asked = *asked_since.get_or_insert_with(Instant::now);
        let answers: Vec<(String, Answer)> = etcd
            .member_status_within(STATUS_WITHIN)
            .await
            .into_iter()
            .zip(etcd.members.iter().map(|(e, _)| e.clone()))
            .map(|(a, e)| {
                let answer = match a {
                    Ok(s) => Answer::Term(s.raft_term),
                    Err(why) if refused(&why) => Answer::Refused,
                    Err(why) => Answer::Silent(why),
                };
                (e, answer)
            })
            .collect();
        let target = wanted;
        match judge(target, &answers) {
            Round::Clear => match clear_since {
                // Still clear GRACE after the first clear round: cleared.
                Some((t, since)) if t == target && since.elapsed() >= GRACE => {
                    d.cleared.send_if_modified(|c| std::mem::replace(c, (*c).max(target)) < target);
                    if warned.take().is_some() {
                        tracing::info!(term = target, "every etcd member answers in the current Raft term again; keepalives count again");
                    }
                    clear_since = None;
                }
                Some((t, _)) if t == target => {}
                _ => clear_since = Some((target, Instant::now())),
            },
            Round::Waiting(who) => {
                clear_since = None;
                // Said once per term, after a second: a leader change with
                // every member up clears well within that.
                if warned != Some(target) && asked.elapsed() >= Duration::from_secs(1) {
                    warned = Some(target);
                    crate::metrics::inc(|m| &m.deposed_leader_waits);
                    tracing::warn!(
                        term = target,
                        members = %who.join(", "),
                        "etcd elected a new leader and these members do not answer in its term: one may be a deposed \
                         leader that will revoke leases when it wakes, so keepalives of sessions granted before this \
                         term do not count until they answer (or are removed from etcd.endpoints); those sessions \
                         end at their deadline and clients open new ones"
                    );
                }
            }
        }
        tokio::time::sleep(ROUND_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(t: u64) -> Answer {
        Answer::Term(t)
    }

    fn round(answers: &[Answer]) -> Vec<(String, Answer)> {
        answers.iter().enumerate().map(|(i, a)| (format!("e{i}"), a.clone())).collect()
    }

    #[test]
    fn a_term_is_clear_once_every_member_answers_in_it_or_later_or_is_not_running() {
        assert_eq!(judge(7, &round(&[a(7), a(7), a(7)])), Round::Clear);
        assert_eq!(judge(7, &round(&[a(7), Answer::Refused, a(7)])), Round::Clear, "a stopped process has no lessor");
        assert_eq!(judge(7, &round(&[a(7), a(9), a(7)])), Round::Clear, "a member in a later term leads no earlier one");
    }

    #[test]
    fn a_member_that_is_silent_or_behind_may_be_a_deposed_leader() {
        let r = judge(7, &round(&[a(7), Answer::Silent("no answer within 1s".into()), a(7)]));
        assert_eq!(r, Round::Waiting(vec!["e1 (no answer within 1s)".into()]));
        // A woken leader answers in its old term before it learns the new one.
        let r = judge(7, &round(&[a(6), a(7), a(7)]));
        assert_eq!(r, Round::Waiting(vec!["e0 (answers in term 6)".into()]));
    }

    #[test]
    fn a_keepalive_counts_in_a_cleared_term_or_for_a_lease_no_earlier_leader_knew() {
        assert!(counts(5, None, 5));
        assert!(counts(4, None, 5));
        assert!(!counts(6, None, 5), "a new term, not cleared: waits");
        assert!(!counts(6, Some(5), 5), "granted before the new term: an earlier leader knew it");
        assert!(counts(6, Some(6), 5), "granted in the new term");
        assert!(counts(6, Some(7), 5));
    }

    #[test]
    fn a_refused_connection_is_told_from_a_silent_member() {
        assert!(refused(
            "https://127.0.0.1:2379: grpc request error: status: Unavailable, message: \"tcp connect error: Connection refused (os error 111)\""
        ));
        assert!(!refused("https://127.0.0.1:2379: no answer within 1s"));
    }
}

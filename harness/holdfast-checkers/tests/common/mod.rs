//! A small builder for hand-made histories.
#![allow(dead_code, clippy::too_many_arguments)]

use holdfast_checkers::history::make_token;
use holdfast_checkers::{ClientOp, EtcdEvent, EtcdEventKind, FenceEntry, History, OpKind, Outcome};

pub const EPOCH: u64 = 1;

pub fn tok(rev: u64) -> u64 {
    make_token(EPOCH, rev)
}

#[derive(Default)]
pub struct B {
    pub h: History,
}

impl B {
    pub fn new() -> Self {
        let mut b = B::default();
        b.h.etcd.epoch = EPOCH;
        b
    }

    /// An op that ended at `end`: its completion, or for an unknown outcome
    /// its give-up time (none recorded if `end` is before `inv`: many tests
    /// pass 0 there when the time does not matter).
    fn op(&mut self, process: u64, kind: OpKind, session: i64, token: Option<u64>, inv: u64, end: u64, outcome: Outcome) -> usize {
        let unknown = outcome == Outcome::Unknown;
        self.h.ops.push(ClientOp {
            process,
            kind,
            session: Some(session),
            token,
            invoke_ns: inv,
            complete_ns: (!unknown).then_some(end),
            outcome,
            gave_up_ns: (unknown && end >= inv).then_some(end),
        });
        self.h.ops.len() - 1
    }

    /// Acquire of `key` by session `s`; `rev` is the granted token's revision when known.
    /// For an unknown outcome `comp` is when the client gave up.
    pub fn acq(&mut self, key: &str, s: i64, inv: u64, comp: u64, outcome: Outcome, rev: Option<u64>) -> usize {
        self.op(s as u64, OpKind::Acquire { key: key.into() }, s, rev.map(tok), inv, comp, outcome)
    }

    pub fn ok_acq(&mut self, key: &str, s: i64, inv: u64, comp: u64, rev: u64) -> usize {
        self.acq(key, s, inv, comp, Outcome::Ok, Some(rev))
    }

    /// Release of `key`; for an unknown outcome `comp` is when the client gave up.
    pub fn rel(&mut self, key: &str, s: i64, inv: u64, comp: u64, outcome: Outcome, rev: u64) -> usize {
        self.op(s as u64, OpKind::Release { key: key.into() }, s, Some(tok(rev)), inv, comp, outcome)
    }

    /// A write of `record` with token revision `rev`; `fence` = Some(accepted) logs it at the fence.
    /// It ends (completes, or for an unknown outcome is given up) at `at + 5`.
    pub fn write(&mut self, key: &str, record: &str, s: i64, rev: u64, at: u64, outcome: Outcome, fence: Option<bool>) -> usize {
        let i = self.op(s as u64, OpKind::Write { key: key.into(), record: record.into() }, s, Some(tok(rev)), at, at + 5, outcome);
        if let Some(accepted) = fence {
            self.h.fence.push(FenceEntry { record: record.into(), token: tok(rev), accepted, at_ns: at + 2, op: Some(i) });
        }
        i
    }

    /// Session `s` (process `s`) recorded at `at` that it treats itself as
    /// alive until `until`.
    pub fn deadline(&mut self, s: i64, at: u64, until: u64) -> usize {
        self.op(s as u64, OpKind::Deadline { until_ns: until }, s, None, at, at, Outcome::Ok)
    }

    pub fn counter(&mut self, record: &str, value: u64) {
        self.h.final_counters.insert(record.into(), value);
    }

    pub fn put(&mut self, key: &str, rev: u64, lease: i64) {
        self.h.etcd.events.push(EtcdEvent {
            kind: EtcdEventKind::Put,
            key: format!("/l/{key}"),
            revision: rev,
            create_revision: rev,
            lease,
            expired: None,
        });
    }

    pub fn del(&mut self, key: &str, rev: u64, create: u64, lease: i64, expired: bool) {
        self.h.etcd.events.push(EtcdEvent {
            kind: EtcdEventKind::Delete,
            key: format!("/l/{key}"),
            revision: rev,
            create_revision: create,
            lease,
            expired: Some(expired),
        });
    }

    /// The withdrawal marker the arbiter writes with the delete at `rev` of
    /// the hold of `key` created at `create` on `lease`.
    pub fn withdrawn(&mut self, key: &str, rev: u64, create: u64, lease: i64) {
        self.h.etcd.withdrawals.push(holdfast_checkers::Withdrawal {
            key: format!("/l/{key}"),
            create_revision: create,
            lease,
            revision: rev,
        });
    }

    /// A clean acquire → release of `key` by `s` at revisions `rev` / `rev + 1`, in `[t, t+30]`.
    pub fn hold(&mut self, key: &str, s: i64, t: u64, rev: u64) {
        self.ok_acq(key, s, t, t + 10, rev);
        self.put(key, rev, s);
        self.rel(key, s, t + 20, t + 30, Outcome::Ok, rev);
        self.del(key, rev + 1, rev, s, false);
    }
}

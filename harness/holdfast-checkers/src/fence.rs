//! C2 (`fence`): the fenced resource's accept/reject log and final counters.
//!
//! The fence log ([`History::fence`]) is in the resource's own serial order.
//! Per record:
//!
//! - **Accepted tokens never decrease** ([`Rule::FenceTokenDecreased`]): a
//!   write is accepted only with a token at least the highest accepted so
//!   far (equal: the same holder writing again).
//! - **One contiguous block per holder** ([`Rule::FenceInterleaving`]): once
//!   another token has been accepted after token A, A is never accepted
//!   again (no A,B,A). A holder is identified by its grant's token.
//! - **No lost or phantom updates** ([`Rule::LostUpdate`],
//!   [`Rule::PhantomUpdate`]): with `ok` and `unknown` the numbers of
//!   acknowledged and unknown-outcome `Write`s on the record, the final
//!   counter lies in `ok ..= ok + unknown` (so equals `ok` when nothing is
//!   unknown).
//! - **Counter matches the log** ([`Rule::CounterMismatch`]): the final
//!   counter equals the number of accepted entries in the fence log.
//! - **Acknowledged means accepted** ([`Rule::AckedButRejected`]): a fence
//!   entry linked to an ok `Write` was accepted.
//!
//! Not checked: whether rejections were justified (a fence that rejects too
//! much is a liveness problem, not a safety one), or whether an accepted
//! token belonged to the current holder (that is exclusion at etcd: C1/C3).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::history::{History, OpKind, Outcome};
use crate::report::{Checker, OpRef, Report, Rule, client_ref, fence_ref};

#[derive(Default)]
struct Counts {
    ok: u64,
    unknown: u64,
    accepted: u64,
    /// Index of the last ok write, for reports.
    last_ok: Option<usize>,
}

/// Runs C2 over `history`.
pub fn check(history: &History) -> Report {
    let mut report = Report::new(Checker::C2);
    let mut records: BTreeMap<&str, Counts> = BTreeMap::new();
    for (index, op) in history.ops.iter().enumerate() {
        let OpKind::Write { record, .. } = &op.kind else {
            continue;
        };
        let c = records.entry(record).or_default();
        match op.outcome {
            Outcome::Ok => {
                c.ok += 1;
                c.last_ok = Some(index);
            }
            Outcome::Unknown => c.unknown += 1,
            Outcome::Fail => {}
        }
    }
    for record in history.final_counters.keys() {
        records.entry(record).or_default();
    }

    // Order rules, per record, in the resource's serial order.
    let mut last: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
    let mut closed: BTreeMap<&str, HashSet<u64>> = BTreeMap::new();
    for (i, entry) in history.fence.iter().enumerate() {
        let record = entry.record.as_str();
        if let Some(op) = entry.op {
            let acked = history.ops.get(op).is_some_and(|o| o.outcome == Outcome::Ok);
            if acked && !entry.accepted {
                report.push(
                    Rule::AckedButRejected,
                    record,
                    vec![client_ref(history, op), fence_ref(history, i)],
                    format!("write with token {} acknowledged to the client but rejected at the fence", entry.token),
                );
            }
        }
        if !entry.accepted {
            continue;
        }
        records.entry(record).or_default().accepted += 1;
        if let Some(&(prev, j)) = last.get(record) {
            if entry.token < prev {
                report.push(
                    Rule::FenceTokenDecreased,
                    record,
                    vec![fence_ref(history, j), fence_ref(history, i)],
                    format!("fence accepted token {} after token {prev}", entry.token),
                );
            }
            if entry.token != prev {
                let set = closed.entry(record).or_default();
                set.insert(prev);
                if set.contains(&entry.token) {
                    report.push(
                        Rule::FenceInterleaving,
                        record,
                        vec![fence_ref(history, j), fence_ref(history, i)],
                        format!("holder with token {} wrote again after holder with token {prev} had written", entry.token),
                    );
                }
            }
        }
        last.insert(record, (entry.token, i));
    }

    report.checked = records.len();
    let seen: BTreeSet<&str> = records.keys().copied().collect();
    for record in seen {
        let Some(c) = records.get(record) else {
            continue;
        };
        let ops: Vec<OpRef> = c.last_ok.map(|i| client_ref(history, i)).into_iter().collect();
        let Some(&fin) = history.final_counters.get(record) else {
            report.push(Rule::Malformed, record, ops, "record was written but its final counter was not recorded".to_string());
            continue;
        };
        if fin < c.ok {
            report.push(
                Rule::LostUpdate,
                record,
                ops.clone(),
                format!("final counter {fin} is below the {} acknowledged increments", c.ok),
            );
        }
        if fin > c.ok + c.unknown {
            report.push(
                Rule::PhantomUpdate,
                record,
                ops.clone(),
                format!("final counter {fin} exceeds {} acknowledged plus {} unknown increments", c.ok, c.unknown),
            );
        }
        let logged = !history.fence.is_empty();
        if logged && fin != c.accepted {
            report.push(
                Rule::CounterMismatch,
                record,
                ops,
                format!("final counter {fin} but the fence log accepted {} writes", c.accepted),
            );
        }
    }
    report
}

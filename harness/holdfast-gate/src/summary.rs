//! What the gate reports: the [`Summary`] of a run (printed as a table, and
//! with `--json` as one JSON object on the last line), and the timeline of
//! a key a checker found a violation on.

use holdfast_checkers::history::{History, Stats};
use holdfast_checkers::report::Report;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Serialize, Default)]
pub struct Summary {
    pub profile: String,
    pub seed: u64,
    pub etcd_version: String,
    pub episodes: u32,
    pub duration_s: f64,
    pub ops: usize,
    pub lock_ops: usize,
    pub ok_grants: usize,
    /// Of `ok_grants`, those of coord-tier keys (granted on the coord
    /// cluster, under its own epoch).
    pub coord_grants: usize,
    pub unknown_ops: usize,
    pub expiries: usize,
    pub stale_rejected: usize,
    pub accepted_writes: usize,
    pub leader_changes: u64,
    pub faults: BTreeMap<String, usize>,
    pub faults_unconfirmed: Vec<String>,
    /// `--leader-pause-max`, in seconds, when set (a measuring run: not the
    /// default bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_pause_max_s: Option<f64>,
    /// Local deadlines the clients recorded, each checked against its
    /// lease's end (C1 `DeadlinePastSessionEnd`).
    pub deadlines: usize,
    pub violations: usize,
    /// Violations counted by checker/rule, e.g. "C2/LostUpdate".
    pub violations_by_rule: BTreeMap<String, usize>,
    /// The first 20 violations, with their keys.
    pub violation_rules: Vec<String>,
    /// Violations a fault's own checks found (`quorum-loss`: what
    /// fail-open promises), each counted in `violations` as `fault/<kind>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fault_violations: Vec<String>,
    pub inconclusive: usize,
    pub liveness_max_ms: u64,
    /// Clock rates set with libfaketime, by process ("client0", "arbiter1").
    pub clock_rates_set: BTreeMap<String, f64>,
    /// The rates the clients' clocks were seen running at (their own
    /// CLOCK_MONOTONIC against the raw one, jumps taken out), last episode.
    pub clock_rates_measured: BTreeMap<String, f64>,
    /// Arbiters that sealed themselves (nothing is restored in the gate).
    pub false_seals: usize,
    /// Grants the arbiters withdrew (withdrawal markers in etcd's log).
    pub withdrawals: usize,
    pub liveness_failures: usize,
    pub resource: String,
    pub fence: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutation: Option<String>,
    pub group_commit: bool,
    /// With `--audit`: the audit store against etcd's log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<holdfast_checkers::audit::AuditReport>,
    pub dir: String,
}

impl Summary {
    /// Adds an episode's history counts.
    pub fn count_history(&mut self, stats: &Stats) {
        self.ops += stats.ops;
        self.deadlines += stats.deadlines;
        self.lock_ops += stats.lock_ops;
        self.ok_grants += stats.ok_grants;
        self.unknown_ops += stats.unknown_ops;
        self.expiries += stats.expiries;
        self.stale_rejected += stats.stale_rejected;
        self.accepted_writes += stats.accepted_writes;
    }

    /// Adds the violations a fault's own checks found.
    pub fn count_fault_violations(&mut self, kind: &str, found: Vec<String>) {
        for v in found {
            self.violations += 1;
            *self.violations_by_rule.entry(format!("fault/{kind}")).or_default() += 1;
            if self.violation_rules.len() < 20 {
                self.violation_rules.push(format!("fault/{kind}: {v}"));
            }
            self.fault_violations.push(format!("{kind}: {v}"));
        }
    }

    /// Adds the checkers' verdicts on an episode: violations by rule, the
    /// first 20 with their keys, and inconclusive keys.
    pub fn count_reports(&mut self, reports: &[Report]) {
        for r in reports {
            self.inconclusive += r.inconclusive.len();
            for v in &r.violations {
                self.violations += 1;
                *self.violations_by_rule.entry(format!("{:?}/{:?}", v.checker, v.rule)).or_default() += 1;
                if self.violation_rules.len() < 20 {
                    self.violation_rules.push(format!("{:?}/{:?} on {}", v.checker, v.rule, v.key));
                }
            }
        }
    }
}

pub fn print_table(s: &Summary) {
    println!("holdfast gate — profile {}, seed {}, etcd {}", s.profile, s.seed, s.etcd_version);
    println!("  episodes            {:>8}   ({:.0} s)", s.episodes, s.duration_s);
    println!(
        "  operations          {:>8}   (lock ops {}, grants {} of which {} on the coord tier, unknown {})",
        s.ops, s.lock_ops, s.ok_grants, s.coord_grants, s.unknown_ops
    );
    println!("  expiries            {:>8}", s.expiries);
    println!(
        "  stale writes reject {:>8}   (accepted {}; resource {}, fence {})",
        s.stale_rejected, s.accepted_writes, s.resource, s.fence
    );
    println!("  leader changes      {:>8}", s.leader_changes);
    for (k, n) in &s.faults {
        println!("  fault {:<22} {:>3}", k, n);
    }
    for u in &s.faults_unconfirmed {
        println!("  fault NOT CONFIRMED: {u}");
    }
    if let Some(max) = s.leader_pause_max_s {
        println!("  leader-pause up to  {max:>8.2} s (--leader-pause-max; default 2 × TTL)");
    }
    println!("  client deadlines    {:>8}   (each checked against its lease's end in etcd's log)", s.deadlines);
    println!("  liveness            worst {} ms after healing, {} keys late", s.liveness_max_ms, s.liveness_failures);
    let rates: Vec<String> = s
        .clock_rates_set
        .iter()
        .map(|(p, set)| match s.clock_rates_measured.get(p) {
            Some(m) => format!("{p} x{set:.2} (seen x{m:.3})"),
            None => format!("{p} x{set:.2}"),
        })
        .collect();
    println!("  clock rates         {}", rates.join(", "));
    println!("  violations          {:>8}   {}", s.violations, s.violation_rules.join("; "));
    println!("  false seals         {:>8}", s.false_seals);
    println!("  withdrawn grants    {:>8}", s.withdrawals);
    println!("  inconclusive keys   {:>8}   (any fails the gate)", s.inconclusive);
}

/// The operations and etcd events of one key, in order: what a reader needs
/// to see a violation.
pub fn timeline(history: &History, key: &str) -> String {
    let mut out = String::new();
    let etcd_key = holdfast_checkers::history::etcd_key_of(key);
    out.push_str(&format!("  timeline of {key} (client ops by invoke time; tokens shown as epoch/revision):\n"));
    for o in history.ops.iter().filter(|o| o.key() == Some(key)).take(60) {
        let tok = o
            .token
            .map(|t| format!("{}/{}", holdfast_checkers::history::token_epoch(t), holdfast_checkers::history::token_revision(t)))
            .unwrap_or_else(|| "-".into());
        // An unknown outcome stays pending to the end; when the client gave up is shown after it.
        let gave_up = o.gave_up_ns.map(|g| format!(" (client gave up at {g})")).unwrap_or_default();
        out.push_str(&format!(
            "    {:>14} .. {:>14}  p{:<3} {:<40} {:?} {}{}\n",
            o.invoke_ns,
            o.complete_ns.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
            o.process,
            format!("{:?}", o.kind),
            o.outcome,
            tok,
            gave_up
        ));
    }
    for e in history.etcd.events.iter().filter(|e| e.key == etcd_key).take(60) {
        out.push_str(&format!(
            "    etcd rev {:>8} {:?} create {} lease {:x} expired {:?}\n",
            e.revision, e.kind, e.create_revision, e.lease, e.expired
        ));
    }
    out
}

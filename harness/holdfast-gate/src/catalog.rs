//! The fault kinds and the mutations, as the documentation lists them.
//!
//! `holdfast-gate --list-faults` and `--list-mutations` print these two
//! tables in Markdown; the README carries them verbatim between markers
//! (`tests/catalog.rs` fails when the two differ), and each mutation's test
//! in `tests/tests/gate_faults.rs` runs it under exactly the faults listed
//! here and requires one of the rules listed here. So the tables cannot say
//! something the tests do not do.

use crate::faults::FaultKind;

/// How a mutation is exercised.
#[derive(Debug, Clone, Copy)]
pub enum Plan {
    /// The gate, with these `--faults` (in order; a name repeated is struck
    /// again).
    Gate(&'static [&'static str]),
    /// Another test; the text says which and how.
    Elsewhere(&'static str),
}

/// One deliberate bug and what catches it.
#[derive(Debug, Clone, Copy)]
pub struct Mutation {
    /// The name `--mutation` (or `[mutation]` in an arbiter's config) takes.
    pub name: &'static str,
    /// What is broken.
    pub breaks: &'static str,
    /// How its test exercises it.
    pub plan: Plan,
    /// The checker rules (`C1/GrantWrongEpoch`, ...) its test requires at
    /// least one of; empty when something other than a rule catches it.
    pub rules: &'static [&'static str],
    /// What else the "caught by" column says (conditions, other evidence).
    pub note: &'static str,
}

impl Mutation {
    /// The `--faults` argument of its gate test (empty for [`Plan::Elsewhere`]).
    pub fn faults_arg(&self) -> String {
        match self.plan {
            Plan::Gate(faults) => faults.join(","),
            Plan::Elsewhere(_) => String::new(),
        }
    }
}

/// Every mutation: the arbiter's (`[mutation]`, holdfast-config), the client
/// library's (`holdfast_client::MUTATION_NAMES`) and the gate's own
/// procedure's ([`crate::GATE_MUTATIONS`]).
pub const MUTATIONS: &[Mutation] = &[
    Mutation {
        name: "release_unguarded",
        breaks: "release not guarded by create revision and lease",
        plan: Plan::Gate(&["client-pause"]),
        rules: &["C3/NotLinearizable", "C3/UnexplainedDelete"],
        note: "",
    },
    Mutation {
        name: "token_from_counter",
        breaks: "token from a local counter",
        plan: Plan::Gate(&["arbiter-kill"]),
        rules: &["C1/GrantWithoutEtcdEvent"],
        note: "",
    },
    Mutation {
        name: "no_epoch_compare",
        breaks: "the grant does not compare `/sys/epoch`",
        plan: Plan::Gate(&["epoch-advance", "epoch-advance", "epoch-advance"]),
        rules: &["C1/GrantWrongEpoch"],
        note: "",
    },
    Mutation {
        name: "no_session_compare",
        breaks: "the grant does not compare the session record",
        plan: Plan::Gate(&["epoch-advance", "epoch-advance", "epoch-advance", "epoch-advance"]),
        rules: &["C1/GrantOnEndedSession"],
        note: "",
    },
    Mutation {
        name: "no_seal_check",
        breaks: "restore detection off",
        plan: Plan::Gate(&["restore"]),
        rules: &["C1/TokenNotAboveRestore"],
        note: "",
    },
    Mutation {
        name: "forget_served_epochs",
        breaks: "the arbiter ignores its record of the epochs it served",
        plan: Plan::Gate(&["restore", "epoch-advance"]),
        rules: &["C1/TokenNotAboveRestore"],
        note: "the restore is from a snapshot older than the advance, arbiters restarted across it",
    },
    Mutation {
        name: "advance_from_restored_record",
        breaks: "the gate's own procedure: the advance after a restore takes the restored epoch record plus one",
        plan: Plan::Gate(&["restore", "epoch-advance"]),
        rules: &[],
        note: "the arbiters refuse the entity epoch they served under another mint and stay sealed (the coord \
               cluster's own advance by one is refused by its allocator): the restore is never confirmed and the \
               keys are never grantable again (liveness); no token is reissued",
    },
    Mutation {
        name: "no_withdrawal_marker",
        breaks: "withdrawal without its marker",
        plan: Plan::Elsewhere("etcd restored under a running arbiter (`tests/tests/withdrawal.rs`)"),
        rules: &["C3/UnexplainedDelete"],
        note: "",
    },
    Mutation {
        name: "no_keepalive_confirmation",
        breaks: "a keepalive counts without the quorum read of the Raft term",
        plan: Plan::Gate(&["leader-disk-stall"; 8]),
        rules: &["C1/DeadlinePastSessionEnd"],
        note: "etcd before 3.6 (3.6 answers no keepalive from a stalled leader: the gate passes, and the test \
               asserts that)",
    },
    Mutation {
        name: "no_deposed_leader_check",
        breaks: "a keepalive answered in a new Raft term counts before every etcd member answers in it",
        plan: Plan::Gate(&["leader-pause"; 12]),
        rules: &["C1/DeadlinePastSessionEnd"],
        note: "leader stops up to 2 × TTL: the woken leader revokes leases whose renewals through the new leader counted",
    },
    Mutation {
        name: "fail_open_any_class",
        breaks: "fail-open grants every class from memory with token 0, not only `on_quorum_loss = \"open\"` ones",
        plan: Plan::Gate(&["quorum-loss"]),
        rules: &[],
        note: "the quorum-loss fault's check: a session of the correctness class opened without a majority",
    },
    Mutation {
        name: "no_drain_compare",
        breaks: "the grant does not compare the key's drain markers",
        plan: Plan::Gate(&["drain", "drain", "drain"]),
        rules: &["C1/GrantWhileDraining"],
        note: "",
    },
    Mutation {
        name: "fence_from_receive_time",
        breaks: "client library: the session's deadline counts from the keepalive's answer, not its send",
        plan: Plan::Gate(&["client-link", "client-link", "client-link", "client-link", "client-link"]),
        rules: &["C1/DeadlinePastSessionEnd"],
        note: "",
    },
];

/// The mutation named `name`.
pub fn mutation(name: &str) -> Option<&'static Mutation> {
    MUTATIONS.iter().find(|m| m.name == name)
}

impl FaultKind {
    /// How the fault strikes, as the README's table says.
    pub fn how(self) -> &'static str {
        match self {
            FaultKind::LeaderPause => {
                "SIGSTOP the etcd leader for up to 2 × TTL (10 s at TTL 5 s; election timeout 500 ms; \
                 `--leader-pause-max` to change): past about TTL − TTL/3 the woken leader revokes leases the new leader \
                 renewed, on 3.6.17 as on 3.4.23, and the arbiter counts no keepalive while it may, docs/gate.md"
            }
            FaultKind::MemberKill => "kill -9 the leader, restart it",
            FaultKind::ClientPause => "SIGSTOP a client for 2–3× its TTL, in the middle of a write when one is, else while it holds a key",
            FaultKind::ArbiterPause => "SIGSTOP an arbiter past the TTL",
            FaultKind::ArbiterKill => "kill -9 arbiter 1 while the proxy holds etcd's answers (its Txns applied, unanswered), restart",
            FaultKind::LeaderIsolation => "iptables DROP between the leader and its peers",
            FaultKind::MinorityPartition => "one follower cut off",
            FaultKind::MajorityPartition => "the arbiters reach only a member cut off from the quorum",
            FaultKind::AsymmetricArbiterEtcd => "an arbiter's requests reach etcd, the answers are dropped",
            FaultKind::PacketLoss => "5–25 % random loss in every namespace",
            FaultKind::ProxyDelay => "arbiter 1 reaches etcd through a userspace TCP proxy that delays each chunk",
            FaultKind::ProxyStall => "arbiter 1 reaches etcd through a userspace TCP proxy that holds all traffic",
            FaultKind::ClientLink => {
                "client 0 reaches the arbiters through userspace proxies: answers ~1.3 s late (under its keepalive \
                 timeout), then its requests held past its TTL"
            }
            FaultKind::FsyncDelay => "`strace -e inject=fdatasync,fsync:delay_enter=…` on the leader",
            FaultKind::LeaderDiskStall => {
                "the same, each sync held TTL + 4 s: the leader's Raft loop stops while its gRPC serves (etcd #15247). \
                 The deposed leader revokes leases the new one renewed once its disk is back; the arbiter counts no \
                 keepalive until it answers in the new term (docs/gate.md)"
            }
            FaultKind::ClockJump => {
                "libfaketime on arbiter 1 and two clients: both clocks jumped forward 5–30 s, cumulatively (as after \
                 a VM suspend; CLOCK_MONOTONIC never goes back on Linux)"
            }
            FaultKind::EpochAdvance => {
                "the epoch advanced under load; the old sessions' leases revoked 1–3 s after the advance \
                 transaction (their records are gone at once). Alternately, the clients race the arbiters' switch \
                 to the new epoch, or are frozen until both arbiters serve it"
            }
            FaultKind::Restore => {
                "the coord cluster and a member snapshotted mid-run while clients keep granting; after the workload \
                 every member (and coord) is stopped and restored from its snapshot with the same cluster token and \
                 peer URLs, both arbiters restarted, clients start on fresh keys of both tiers, each cluster's epoch \
                 is advanced with the advance transaction (entity, then coord's own). In a plan with `epoch-advance` the snapshot comes first, so the restore is \
                 older than an advance"
            }
            FaultKind::QuorumLoss => {
                "SIGSTOP a majority of the entity cluster past the arbiters' `fail_open.after` (2 s) under load; an \
                 open efficiency class (`gateopen`, TTL 30 s) is locked on both arbiters meanwhile, kill -9 arbiter 0 \
                 mid-outage, restart it once the members resume"
            }
            FaultKind::Drain => {
                "drain markers (`/sys/drain/<unit>`) written on the entity cluster under load, as a move's source has                  them: for a third of the keys, or one time in four the whole namespace; deleted after 2–4 s"
            }
        }
    }

    /// What confirms that the fault took effect.
    pub fn confirmed_by(self) -> &'static str {
        match self {
            FaultKind::LeaderPause => "the others elect a new leader",
            FaultKind::MemberKill => "it answers again",
            FaultKind::ClientPause | FaultKind::ArbiterPause => "process state T",
            FaultKind::ArbiterKill => "answers held at the kill; READY=1 again",
            FaultKind::LeaderIsolation => "a new leader",
            FaultKind::MinorityPartition | FaultKind::MajorityPartition => "its applied index stalls while the majority's moves",
            FaultKind::AsymmetricArbiterEtcd | FaultKind::PacketLoss => "DROP counters",
            FaultKind::ProxyDelay | FaultKind::ProxyStall => "chunks held",
            FaultKind::ClientLink => "chunks delayed and held",
            FaultKind::FsyncDelay => "strace's DELAYED lines",
            FaultKind::LeaderDiskStall => "the syncs held; another member leads meanwhile",
            FaultKind::ClockJump => "the clients report the jump",
            FaultKind::EpochAdvance => "both arbiters log that they serve the new epoch",
            FaultKind::Restore => {
                "both arbiters answer ServerStatus sealed on both clusters, then both serve both new epochs; C1 \
                 (`TokenNotAboveRestore`) proves every token after the restore above every token of its tier before it"
            }
            FaultKind::QuorumLoss => {
                "both arbiters grant the open class with token 0 and refuse the correctness class; every unprotected \
                 grant is in `/sys/unprotected/` once with one end (`--audit`: in the audit store once); a protected \
                 grant (token > 0) before and after"
            }
            FaultKind::Drain => {
                "the markers read back from etcd; C1 (`GrantWhileDraining`) proves no hold of a drained key was                  created while its marker existed"
            }
        }
    }
}

/// `holdfast-gate --list-faults`: every fault kind, how it strikes and
/// what confirms it, as a Markdown table.
pub fn faults_table() -> String {
    let mut out = String::from("| fault | how | confirmed by |\n|---|---|---|\n");
    for kind in FaultKind::all() {
        out.push_str(&format!("| `{}` | {} | {} |\n", kind.name(), kind.how(), kind.confirmed_by()));
    }
    out
}

/// `holdfast-gate --list-mutations`: every mutation, the faults its test
/// runs and what catches it, as a Markdown table.
pub fn mutations_table() -> String {
    let mut out = String::from("| mutation | what it breaks | faults | caught by |\n|---|---|---|---|\n");
    for m in MUTATIONS {
        let faults = match m.plan {
            Plan::Gate(faults) => plan_text(faults),
            Plan::Elsewhere(text) => text.to_string(),
        };
        out.push_str(&format!("| `{}` | {} | {} | {} |\n", m.name, m.breaks, faults, caught_text(m)));
    }
    out
}

/// `a, a, a, b` as "`a` ×3, `b`".
fn plan_text(faults: &[&str]) -> String {
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for &f in faults {
        match runs.last_mut() {
            Some((name, n)) if *name == f => *n += 1,
            _ => runs.push((f, 1)),
        }
    }
    runs.iter().map(|(name, n)| if *n == 1 { format!("`{name}`") } else { format!("`{name}` ×{n}") }).collect::<Vec<_>>().join(", ")
}

/// `C3/A, C3/B, C1/C` as "C3 (`A`, `B`), C1 (`C`)", then the note.
fn caught_text(m: &Mutation) -> String {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for &rule in m.rules {
        let (checker, name) = rule.split_once('/').unwrap_or((rule, ""));
        match groups.iter_mut().find(|(c, _)| *c == checker) {
            Some((_, names)) => names.push(name),
            None => groups.push((checker, vec![name])),
        }
    }
    let mut parts: Vec<String> = groups
        .iter()
        .map(|(checker, names)| {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("{checker} ({})", names.join(", "))
        })
        .collect();
    if !m.note.is_empty() {
        parts.push(m.note.to_string());
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_mutation_that_exists_is_listed_once() {
        let listed: BTreeSet<&str> = MUTATIONS.iter().map(|m| m.name).collect();
        assert_eq!(listed.len(), MUTATIONS.len(), "a mutation is listed twice");
        let exist: BTreeSet<&str> = holdfast_config::arbiter::MUTATION_NAMES
            .iter()
            .chain(holdfast_client::MUTATION_NAMES)
            .chain(crate::GATE_MUTATIONS.iter())
            .copied()
            .collect();
        assert_eq!(listed, exist);
    }

    #[test]
    fn every_planned_fault_is_a_fault_kind_and_every_rule_names_a_checker() {
        let kinds: BTreeSet<String> = FaultKind::all().into_iter().map(FaultKind::name).collect();
        for m in MUTATIONS {
            if let Plan::Gate(faults) = m.plan {
                assert!(!faults.is_empty(), "{}: a gate plan with no fault", m.name);
                for f in faults {
                    assert!(kinds.contains(*f), "{}: no fault kind {f}", m.name);
                }
            }
            for rule in m.rules {
                assert!(["C1/", "C2/", "C3/"].iter().any(|c| rule.starts_with(*c)), "{}: {rule}", m.name);
            }
            assert!(!m.rules.is_empty() || !m.note.is_empty(), "{}: nothing says what catches it", m.name);
        }
    }

    #[test]
    fn repeated_faults_and_rules_of_one_checker_are_grouped() {
        assert_eq!(plan_text(&["a", "a", "a", "b"]), "`a` ×3, `b`");
        assert_eq!(plan_text(&["restore", "epoch-advance"]), "`restore`, `epoch-advance`");
        let m = mutation("release_unguarded").unwrap();
        assert_eq!(caught_text(m), "C3 (`NotLinearizable`, `UnexplainedDelete`)");
        let m = mutation("no_keepalive_confirmation").unwrap();
        assert!(caught_text(m).starts_with("C1 (`DeadlinePastSessionEnd`); etcd before 3.6"));
    }
}

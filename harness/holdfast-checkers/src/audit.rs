//! The audit checker: the tailer's store against etcd's own log.
//!
//! Two questions, both from data alone:
//! 1. **Complete, once**: the set of `(revision, index)` positions the
//!    store holds equals the set etcd's log has, up to the last revision
//!    compared (a gap event's lost revisions excepted: they are reported,
//!    not excused, by the caller).
//!    Revisions the tailer withholds (a hold granted in them is live) count
//!    as recorded, from its private `withheld.jsonl`.
//! 2. **No live token**: no revision that created a hold live after the
//!    store was read is in the store (with the epoch, it is the token).
//! 3. **Classified as etcd's log says**: every hold the store says ended
//!    with its session (expiry, close, advance) is a delete the gate's own
//!    recorder marks `expired`, and every release, withdrawal or
//!    force-release one it marks an explicit delete. The two are decided
//!    independently (`holdfast_audit::classify` and the recorder's
//!    session-record rule).

use std::collections::{BTreeMap, BTreeSet};

/// How a stored event says a hold ended, at a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEnd {
    pub revision: u64,
    /// The etcd key (`/l/<ns>/<key>`).
    pub key: String,
    /// `true` for an expiry, close or advance; `false` for a release,
    /// withdrawal or force-release.
    pub with_session: bool,
    /// The audit kind, for messages.
    pub kind: String,
}

/// What the comparison found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditReport {
    /// Positions compared.
    pub compared: usize,
    /// In etcd's log, not in the store (first 20).
    pub missing: Vec<(i64, u32)>,
    /// In the store, not in etcd's log (first 20).
    pub extra: Vec<(i64, u32)>,
    /// Hold ends whose kind disagrees with the recorder (first 20).
    pub misclassified: Vec<String>,
    /// Hold ends compared with the recorder.
    pub ends_compared: usize,
    /// Positions withheld (not in the store) because a hold granted in
    /// their revision was live.
    pub withheld: usize,
    /// Revisions of holds live after the store was read that the store
    /// holds anyway: a live token readable by the audit group (first 20).
    pub live_stored: Vec<i64>,
    /// Stored records of grants made without etcd (`/sys/unprotected/`),
    /// each `unprotected = true` (one that is not is misclassified).
    pub unprotected: usize,
}

impl AuditReport {
    pub fn passed(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.misclassified.is_empty() && self.live_stored.is_empty()
    }
}

/// What the tailer recorded: its store's positions, those it withholds
/// (read before the store), and the create revisions of the holds live in
/// etcd (read after the store).
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub stored: BTreeSet<(i64, u32)>,
    pub withheld: BTreeSet<(i64, u32)>,
    pub live: BTreeSet<i64>,
}

/// Compares the store's positions (with the withheld ones) with etcd's,
/// up to the last revision of `etcd` (the store may already hold later
/// ones), checks no live hold's revision is stored, and compares the
/// store's hold ends with the recorder's `expired` flags (`(revision, key)
/// → expired`).
pub fn compare(
    recorded_by_tailer: &Recorded,
    etcd: &BTreeSet<(i64, u32)>,
    ends: &[StoredEnd],
    recorded: &BTreeMap<(u64, String), Option<bool>>,
) -> AuditReport {
    let through = etcd.last().map_or(0, |p| p.0);
    let Recorded { stored, withheld, live } = recorded_by_tailer;
    let all: BTreeSet<_> = stored.union(withheld).filter(|p| p.0 <= through).copied().collect();
    let stored_revisions: BTreeSet<i64> = stored.iter().map(|p| p.0).collect();
    let mut report = AuditReport {
        compared: etcd.len(),
        missing: etcd.difference(&all).take(20).copied().collect(),
        extra: all.difference(etcd).take(20).copied().collect(),
        withheld: withheld.iter().filter(|p| p.0 <= through && !stored.contains(p)).count(),
        live_stored: live.intersection(&stored_revisions).take(20).copied().collect(),
        ..AuditReport::default()
    };
    for end in ends {
        let Some(expired) = recorded.get(&(end.revision, end.key.clone())) else { continue };
        report.ends_compared += 1;
        if let Some(expired) = expired
            && *expired != end.with_session
            && report.misclassified.len() < 20
        {
            report.misclassified.push(format!(
                "{} at revision {}: the store says {}, etcd's log says {}",
                end.key,
                end.revision,
                end.kind,
                if *expired { "it ended with its session" } else { "an explicit delete" }
            ));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_and_misclassifications_are_named() {
        let etcd: BTreeSet<_> = [(1, 0), (2, 0), (2, 1), (3, 0)].into();
        let stored: BTreeSet<_> = [(1, 0), (2, 0), (3, 0), (4, 0)].into();
        let ends = vec![
            StoredEnd { revision: 3, key: "/l/a".into(), with_session: false, kind: "release".into() },
            StoredEnd { revision: 2, key: "/l/b".into(), with_session: true, kind: "expiry".into() },
        ];
        let recorded: BTreeMap<_, _> = [((3, "/l/a".to_string()), Some(true)), ((2, "/l/b".to_string()), Some(true))].into();
        let r = compare(&Recorded { stored, ..Recorded::default() }, &etcd, &ends, &recorded);
        assert_eq!((r.missing.clone(), r.extra.clone()), (vec![(2, 1)], vec![]), "(4, 0) is after the compared range");
        assert_eq!(r.ends_compared, 2);
        assert_eq!(r.misclassified.len(), 1, "{:?}", r.misclassified);
        assert!(r.misclassified[0].contains("/l/a") && r.misclassified[0].contains("release"));
        assert!(!r.passed());
        let same = compare(&Recorded { stored: etcd.clone(), ..Recorded::default() }, &etcd, &[], &BTreeMap::new());
        assert!(same.passed() && same.compared == 4);
        // Revision 2 withheld: complete; then stored while its hold lives.
        let split = Recorded { stored: [(1, 0), (3, 0)].into(), withheld: [(2, 0), (2, 1)].into(), live: [2].into() };
        let r = compare(&split, &etcd, &[], &BTreeMap::new());
        assert!(r.passed() && r.withheld == 2, "{r:?}");
        let leaked = Recorded { stored: etcd.clone(), live: [2].into(), ..Recorded::default() };
        let r = compare(&leaked, &etcd, &[], &BTreeMap::new());
        assert_eq!(r.live_stored, [2]);
        assert!(!r.passed());
    }

    #[test]
    fn a_stored_position_etcd_never_had_is_extra_and_fails() {
        let etcd: BTreeSet<_> = [(1, 0), (3, 0)].into();
        let stored: BTreeSet<_> = [(1, 0), (2, 0), (3, 0)].into();
        let r = compare(&Recorded { stored, ..Recorded::default() }, &etcd, &[], &BTreeMap::new());
        assert_eq!(r.extra, [(2, 0)]);
        assert!(r.missing.is_empty() && !r.passed(), "{r:?}");
    }

    #[test]
    fn withheld_counts_only_positions_within_the_range_and_not_stored_too() {
        let etcd: BTreeSet<_> = [(1, 0), (2, 0), (3, 0)].into();
        // (2, 0) withheld and not stored: counted. (3, 0) withheld and since
        // stored (its hold ended): not counted. (5, 0) past the compared
        // range: not counted.
        let r = Recorded { stored: [(1, 0), (3, 0)].into(), withheld: [(2, 0), (3, 0), (5, 0)].into(), live: BTreeSet::new() };
        let report = compare(&r, &etcd, &[], &BTreeMap::new());
        assert_eq!(report.withheld, 1, "{report:?}");
        assert!(report.passed(), "{report:?}");
    }

    #[test]
    fn at_most_twenty_misclassified_ends_are_named_but_all_are_compared() {
        let etcd: BTreeSet<_> = [(1, 0)].into();
        let ends: Vec<StoredEnd> = (0..25)
            .map(|i| StoredEnd { revision: 100 + i, key: format!("/l/k{i}"), with_session: false, kind: "release".into() })
            .collect();
        let recorded: BTreeMap<_, _> = ends.iter().map(|e| ((e.revision, e.key.clone()), Some(true))).collect();
        let r = compare(&Recorded { stored: etcd.clone(), ..Recorded::default() }, &etcd, &ends, &recorded);
        assert_eq!((r.misclassified.len(), r.ends_compared), (20, 25));
        assert!(!r.passed());
    }
}

//! The audit checker: the tailer's store against etcd's own log.
//!
//! Two questions, both from data alone:
//! 1. **Complete, once**: the set of `(revision, index)` positions the
//!    store holds equals the set etcd's log has, up to the last revision
//!    compared (a gap event's lost revisions excepted: they are reported,
//!    not excused, by the caller).
//! 2. **Classified as etcd's log says**: every hold the store says ended
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
}

impl AuditReport {
    pub fn passed(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.misclassified.is_empty()
    }
}

/// Compares the store's positions with etcd's, up to the last revision of
/// `etcd` (the store may already hold later ones), and the store's hold
/// ends with the recorder's `expired` flags (`(revision, key) → expired`).
pub fn compare(
    stored: &BTreeSet<(i64, u32)>,
    etcd: &BTreeSet<(i64, u32)>,
    ends: &[StoredEnd],
    recorded: &BTreeMap<(u64, String), Option<bool>>,
) -> AuditReport {
    let through = etcd.last().map_or(0, |p| p.0);
    let stored: BTreeSet<_> = stored.iter().filter(|p| p.0 <= through).copied().collect();
    let mut report = AuditReport {
        compared: etcd.len(),
        missing: etcd.difference(&stored).take(20).copied().collect(),
        extra: stored.difference(etcd).take(20).copied().collect(),
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
        let r = compare(&stored, &etcd, &ends, &recorded);
        assert_eq!((r.missing.clone(), r.extra.clone()), (vec![(2, 1)], vec![]), "(4, 0) is after the compared range");
        assert_eq!(r.ends_compared, 2);
        assert_eq!(r.misclassified.len(), 1, "{:?}", r.misclassified);
        assert!(r.misclassified[0].contains("/l/a") && r.misclassified[0].contains("release"));
        assert!(!r.passed());
        let same = compare(&etcd, &etcd, &[], &BTreeMap::new());
        assert!(same.passed() && same.compared == 4);
    }
}

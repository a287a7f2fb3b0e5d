//! Detecting that the etcd cluster was rewound by a snapshot restore.
//!
//! The cluster ID alone does not detect a restore: etcd 3.4 restored with the
//! same `--initial-cluster-token` and peer URLs comes back with the same
//! cluster ID, member IDs and even Raft term. What a restore always changes
//! is the Raft log: `snapshot restore` writes a fresh log whose index starts
//! near zero, while the MVCC revision of the snapshot is kept.
//!
//! **The rule.** For a member, let the *log offset* be
//! `applied_index − revision` (both from the Status RPC). Every committed Raft
//! entry raises the index by exactly one and the revision by at most one, so
//! on a cluster that was never rewound the offset never decreases. A restore
//! drops the index to about the member count and keeps the revision, so the
//! offset falls by roughly the snapshot's Raft index.
//!
//! The epoch record stores the offset measured when the epoch was minted, and
//! arbiters raise a watermark (`/sys/watermark`) as they observe the offset
//! grow. An arbiter judges the cluster *rewound* when a majority of members
//! answer and every answer is more than [`SLACK`] below the floor. `epoch
//! init` first moves a new cluster's revision to at least
//! [`INIT_MIN_REVISION`], so any snapshot of an initialised cluster is far
//! enough from the floor to be detected: restoring it puts the offset at
//! about `members − revision ≤ members − 1024`, while the floor is ≥ −1.
//!
//! The rule can be defeated only by a restored cluster that commits more
//! non-writing entries (lease grants, failed transactions, elections) than
//! the offset fell by before any arbiter checks it; arbiters check before
//! serving and every second after, and the first detection is written to
//! `/sys/seal`, which only an epoch advance removes.

/// Tolerance for the two Status fields being read some entries apart (etcd
/// 3.6 reads the revision before the applied index, so a reading can run
/// ahead of the true offset; floors are raised only to lower bounds, see the
/// arbiter's `offset_lower_bounds`, and this covers a reading that lags). A
/// restore drops the offset by about the snapshot's revision, at least
/// [`INIT_MIN_REVISION`], far more than this.
pub const SLACK: i64 = 128;

/// `epoch init` moves a fresh cluster's revision to at least this.
pub const INIT_MIN_REVISION: i64 = 1024;

/// One member's answer to the Status RPC: its applied Raft index and the
/// MVCC revision of its response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPosition {
    pub applied_index: u64,
    pub revision: i64,
}

impl LogPosition {
    pub fn offset(&self) -> i64 {
        i64::try_from(self.applied_index).unwrap_or(i64::MAX).saturating_sub(self.revision)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// At least one answering member is at or above the floor.
    Intact { lowest_offset: i64 },
    /// A majority answered and all of them are below the floor.
    Rewound { highest_offset: i64, floor: i64 },
    /// Too few members answered to judge.
    Unknown { answered: usize, members: usize },
}

/// Judges a set of Status answers from a cluster of `members` members
/// against the floor.
pub fn judge(answers: &[LogPosition], floor: i64, members: usize) -> Verdict {
    let members = members.max(answers.len()).max(1);
    if answers.len() <= members / 2 {
        return Verdict::Unknown { answered: answers.len(), members };
    }
    let highest = answers.iter().map(LogPosition::offset).max().unwrap_or(i64::MIN);
    if highest < floor - SLACK {
        Verdict::Rewound { highest_offset: highest, floor }
    } else {
        let lowest = answers.iter().map(LogPosition::offset).min().unwrap_or(highest);
        Verdict::Intact { lowest_offset: lowest }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(applied_index: u64, revision: i64) -> LogPosition {
        LogPosition { applied_index, revision }
    }

    #[test]
    fn growing_log_is_intact() {
        assert!(matches!(judge(&[at(309, 301)], 5, 1), Verdict::Intact { lowest_offset: 8 }));
        // A follower a few entries behind is still intact.
        assert!(matches!(judge(&[at(500, 480), at(490, 475)], 20, 3), Verdict::Intact { .. }));
    }

    #[test]
    fn restored_log_is_rewound() {
        // Figures from a real restore: index 309 -> 4, revision 301 kept.
        let floor = at(309, 301).offset();
        assert_eq!(judge(&[at(4, 301)], floor, 1), Verdict::Rewound { highest_offset: -297, floor });
        assert!(matches!(judge(&[at(6, 1100), at(6, 1100)], -1, 3), Verdict::Rewound { .. }));
    }

    #[test]
    fn minority_cannot_decide() {
        assert!(matches!(judge(&[at(4, 301)], 8, 3), Verdict::Unknown { answered: 1, members: 3 }));
        assert!(matches!(judge(&[], 8, 1), Verdict::Unknown { .. }));
    }

    #[test]
    fn one_current_member_keeps_it_intact() {
        assert!(matches!(judge(&[at(4, 301), at(400, 301)], 8, 3), Verdict::Intact { .. }));
    }

    #[test]
    fn offset_is_applied_index_minus_revision() {
        assert_eq!(at(309, 301).offset(), 8);
        assert_eq!(at(4, 301).offset(), -297);
        assert_eq!(at(u64::MAX, -1).offset(), i64::MAX);
    }

    #[test]
    fn intact_reports_the_lowest_offset() {
        assert_eq!(judge(&[at(500, 480), at(490, 475), at(520, 490)], 20, 3), Verdict::Intact { lowest_offset: 15 });
    }

    #[test]
    fn a_strict_majority_must_answer() {
        let rewound = at(4, 2000);
        // 2 of 4 and 2 of 5 are not a majority; 3 of 4 and 3 of 5 are.
        assert_eq!(judge(&[rewound; 2], 8, 4), Verdict::Unknown { answered: 2, members: 4 });
        assert_eq!(judge(&[rewound; 2], 8, 5), Verdict::Unknown { answered: 2, members: 5 });
        assert_eq!(judge(&[rewound; 1], 8, 5), Verdict::Unknown { answered: 1, members: 5 });
        assert!(matches!(judge(&[rewound; 3], 8, 4), Verdict::Rewound { .. }));
        assert!(matches!(judge(&[rewound; 3], 8, 5), Verdict::Rewound { .. }));
        // More answers than the configured members counts them as members.
        assert!(matches!(judge(&[rewound; 2], 8, 1), Verdict::Rewound { .. }));
    }

    #[test]
    fn slack_absorbs_field_skew() {
        assert!(matches!(judge(&[at(100, 100 + SLACK)], 0, 1), Verdict::Intact { .. }));
        assert!(matches!(judge(&[at(100, 101 + SLACK)], 0, 1), Verdict::Rewound { .. }));
    }
}

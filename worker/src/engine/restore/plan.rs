//! Restore decisions for one store of one task. Pure: the caller reads the facts
//! (checkpoint from the store's metadata column family, the changelog's offsets, the
//! committed source offset) and carries out the plan.
//!
//! Local state is always a committed prefix of the changelog, so a restart restores only
//! the tail past the checkpoint; a full rebuild happens only when there is no usable
//! checkpoint, and it says why.

/// Facts about one store's changelog partition and its local copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreFacts {
    /// Next changelog offset the local store has not applied (None: no checkpoint).
    pub checkpoint: Option<i64>,
    /// First offset still in the changelog partition.
    pub log_start: i64,
    /// Offset after the last readable record (the last stable offset under exactly-once).
    pub log_end: i64,
    /// The local store holds no data (a new or wiped volume).
    pub local_empty: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestorePlan {
    /// The local store already holds everything the changelog has.
    UpToDate,
    /// Read `[from, to)` and apply it on top of the local store.
    Tail { from: i64, to: i64 },
    /// Rebuild from `[from, to)`. `bulk_load`: the store is empty, so build SST files and
    /// ingest them instead of single puts. `wipe`: the local store must be cleared first.
    Full {
        from: i64,
        to: i64,
        bulk_load: bool,
        wipe: bool,
        reason: FullRestoreReason,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullRestoreReason {
    /// No checkpoint: a new volume, or state deleted by hand.
    NoCheckpoint,
    /// The checkpoint is past the changelog's end: the topic was recreated or truncated,
    /// so local state is not a prefix of it any more and cannot be trusted.
    CheckpointBeyondLog,
    /// The checkpoint is before the log start: records in between were deleted.
    CheckpointBeforeLogStart,
}

pub fn plan(f: RestoreFacts) -> RestorePlan {
    let full = |reason, wipe| RestorePlan::Full {
        from: f.log_start,
        to: f.log_end,
        bulk_load: f.local_empty || wipe,
        wipe: wipe && !f.local_empty,
        reason,
    };
    match f.checkpoint {
        None => full(FullRestoreReason::NoCheckpoint, !f.local_empty),
        Some(c) if c > f.log_end => full(FullRestoreReason::CheckpointBeyondLog, true),
        Some(c) if c < f.log_start => full(FullRestoreReason::CheckpointBeforeLogStart, true),
        Some(c) if c == f.log_end => RestorePlan::UpToDate,
        Some(c) => RestorePlan::Tail {
            from: c,
            to: f.log_end,
        },
    }
}

/// Whether a changelog record is applied during restore. Each record carries the source
/// offset that produced it; under at-least-once a crash between producing the changelog
/// and committing the source offset leaves records whose source offset will be
/// processed again, and applying them would double-count.
pub fn apply_changelog_record(produced_by: Option<i64>, committed_source: Option<i64>) -> bool {
    match (produced_by, committed_source) {
        (Some(p), Some(c)) => p < c,
        // Nothing committed yet: every produced record will be reprocessed.
        (Some(_), None) => false,
        // Records without the header (written by other tools) are trusted.
        (None, _) => true,
    }
}

/// Where an exactly-once task resumes a source topic that has no committed offset in
/// Kafka (the group's offsets expired while the app was stopped, or were deleted): past
/// both the position kept with the local state and the last source offset the restored
/// changelog names, so nothing already in the state is applied twice. `None` when
/// neither is known: nothing of that topic is in the state, and it is read from the
/// start.
pub fn resume_without_group_offset(
    kept: Option<i64>,
    last_in_changelog: Option<i64>,
) -> Option<i64> {
    match (kept, last_in_changelog.map(|o| o + 1)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_group_offsets_a_task_resumes_past_everything_its_state_holds() {
        assert_eq!(resume_without_group_offset(Some(100), Some(149)), Some(150));
        assert_eq!(resume_without_group_offset(Some(200), Some(149)), Some(200));
        assert_eq!(resume_without_group_offset(None, Some(149)), Some(150));
        assert_eq!(resume_without_group_offset(Some(7), None), Some(7));
        assert_eq!(resume_without_group_offset(None, None), None);
    }

    fn facts(checkpoint: Option<i64>, start: i64, end: i64, empty: bool) -> RestoreFacts {
        RestoreFacts {
            checkpoint,
            log_start: start,
            log_end: end,
            local_empty: empty,
        }
    }

    #[test]
    fn a_restart_with_the_state_dir_kept_restores_only_the_tail() {
        assert_eq!(
            plan(facts(Some(900), 0, 1000, false)),
            RestorePlan::Tail {
                from: 900,
                to: 1000
            }
        );
        assert_eq!(
            plan(facts(Some(1000), 0, 1000, false)),
            RestorePlan::UpToDate
        );
    }

    #[test]
    fn a_deleted_state_dir_is_rebuilt_in_bulk_from_the_start() {
        assert_eq!(
            plan(facts(None, 0, 1000, true)),
            RestorePlan::Full {
                from: 0,
                to: 1000,
                bulk_load: true,
                wipe: false,
                reason: FullRestoreReason::NoCheckpoint
            }
        );
    }

    #[test]
    fn a_recreated_changelog_wipes_local_state_instead_of_trusting_it() {
        let p = plan(facts(Some(5000), 0, 10, false));
        assert_eq!(
            p,
            RestorePlan::Full {
                from: 0,
                to: 10,
                bulk_load: true,
                wipe: true,
                reason: FullRestoreReason::CheckpointBeyondLog
            }
        );
        assert!(matches!(
            plan(facts(Some(5), 100, 200, false)),
            RestorePlan::Full {
                reason: FullRestoreReason::CheckpointBeforeLogStart,
                wipe: true,
                ..
            }
        ));
    }

    #[test]
    fn restore_skips_records_produced_at_or_beyond_the_committed_source_offset() {
        assert!(apply_changelog_record(Some(41), Some(42)));
        assert!(!apply_changelog_record(Some(42), Some(42)));
        assert!(!apply_changelog_record(Some(50), Some(42)));
        assert!(!apply_changelog_record(Some(0), None));
        assert!(apply_changelog_record(None, Some(42)));
    }
}

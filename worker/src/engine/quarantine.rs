//! Local state that cannot be used: a task directory RocksDB cannot open (a corrupted
//! file, a failed checksum), or one that belongs to another app, task or partitioning
//! (a reused volume, a directory copied or swapped by hand). Such a directory is moved
//! aside, never deleted, and the task restores from its changelog, which is the truth;
//! a warning event, a metric and a log line say so. A crash loop on a bad directory,
//! or another task's state served as this one's, is what this prevents.
//!
//! [`judge`] is the pure decision; [`move_aside`] the one filesystem change. What a
//! restore reads is not decided here (the empty directory plans a full restore).

use std::path::{Path, PathBuf};

use crate::store::Identity;

/// Why a directory was moved aside; the metric label (the variant's name) and the
/// event's wording.
#[derive(Debug, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Unusable {
    /// RocksDB refused to open it (corruption, checksum, missing files).
    Unreadable(rocksdb::Error),
    /// RocksDB opened it but later found it corrupted (`store::CORRUPTION_MARK`).
    Corrupted(String),
    /// Its identity names another app, task or partition count.
    Foreign { found: Identity },
    /// Its identity record is there but is not one: why it does not decode.
    BadIdentity(serde_json::Error),
    /// A store's data was written under another layout: the store was reset
    /// (`oxbow.dev/reset`), its changelog started over, and this copy is the old data.
    LayoutChanged { store: String, was: String },
}

impl Unusable {
    pub fn label(&self) -> &'static str {
        self.into()
    }

    pub fn describe(&self, expected: &Identity) -> String {
        match self {
            Self::Unreadable(e) => format!("RocksDB cannot open it: {e}"),
            Self::Corrupted(e) => format!("RocksDB found it corrupted while the task ran: {e}"),
            Self::Foreign { found } => format!(
                "it holds the state of application {:?} task {} with {} partitions, not {:?} task {} with {}",
                found.application_id,
                found.task,
                found.partitions,
                expected.application_id,
                expected.task,
                expected.partitions
            ),
            Self::BadIdentity(e) => format!("its identity record is unreadable: {e}"),
            Self::LayoutChanged { store, was } => format!(
                "store {store:?} holds data laid out as \"{was}\" but the app now needs \"{}\" (the store was reset)",
                expected.layouts.get(store).map_or("", String::as_str)
            ),
        }
    }
}

/// What to do with a directory that opened.
#[derive(Debug)]
pub enum Verdict {
    /// Its identity is this task's.
    Use,
    /// No identity yet (new, or written before identities), or this task's with stores
    /// added, dropped or not yet recorded: record this task's.
    Stamp,
    /// Not this task's state.
    MoveAside(Unusable),
}

/// The decision for a directory that opened, from the identity it holds.
pub fn judge(found: Option<Result<Identity, serde_json::Error>>, expected: &Identity) -> Verdict {
    match found {
        None => Verdict::Stamp,
        Some(Err(e)) => Verdict::MoveAside(Unusable::BadIdentity(e)),
        Some(Ok(found)) if &found == expected => Verdict::Use,
        Some(Ok(found))
            if found.application_id != expected.application_id
                || found.task != expected.task
                || found.partitions != expected.partitions =>
        {
            Verdict::MoveAside(Unusable::Foreign { found })
        }
        Some(Ok(found)) => {
            // A store kept under its name with another layout; a store new or gone, or
            // a directory from before layouts, is only re-stamped.
            let changed = found
                .layouts
                .iter()
                .find(|(store, was)| expected.layouts.get(*store).is_some_and(|now| now != *was));
            match changed {
                Some((store, was)) => Verdict::MoveAside(Unusable::LayoutChanged {
                    store: store.clone(),
                    was: was.clone(),
                }),
                None => Verdict::Stamp,
            }
        }
    }
}

/// Whether an open error is only another handle still holding the directory's lock
/// (a query finishing, a store closed a moment ago): wait, do not move it aside.
pub fn is_lock_held(error: &str) -> bool {
    let e = error.to_ascii_lowercase();
    e.contains("lock") && (e.contains("hold") || e.contains("temporarily unavailable"))
}

/// Moves `dir` to `<app dir>/quarantine/<task>-<millis>` and returns where it went.
pub fn move_aside(dir: &Path, now_ms: i64) -> std::io::Result<PathBuf> {
    let parent = dir.parent().unwrap_or(dir);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "task".into());
    let target_dir = parent.join("quarantine");
    std::fs::create_dir_all(&target_dir)?;
    let target = target_dir.join(format!("{name}-{now_ms}"));
    std::fs::rename(dir, &target)?;
    Ok(target)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_metric_labels_are_the_variants_names_in_snake_case() {
        let unopenable = rocksdb::DB::open_default("/dev/null/state").expect_err("not a dir");
        let labels = [
            Unusable::Unreadable(unopenable).label(),
            Unusable::Corrupted("c".into()).label(),
            Unusable::Foreign { found: me() }.label(),
            Unusable::BadIdentity(eof()).label(),
            Unusable::LayoutChanged {
                store: "s".into(),
                was: "w".into(),
            }
            .label(),
        ];
        assert_eq!(
            labels,
            [
                "unreadable",
                "corrupted",
                "foreign",
                "bad_identity",
                "layout_changed"
            ]
        );
    }
    use super::*;

    /// What serde says of a truncated record.
    fn eof() -> serde_json::Error {
        serde_json::from_slice::<Identity>(b"{").expect_err("a truncated record")
    }

    fn me() -> Identity {
        Identity {
            application_id: "ns.orders".into(),
            task: "0_3".into(),
            partitions: 4,
            layouts: [(
                "totals".to_string(),
                "aggregate window=none fields=n:count".to_string(),
            )]
            .into(),
        }
    }

    #[test]
    fn a_directory_without_identity_is_stamped_and_its_own_is_used() {
        assert!(matches!(judge(None, &me()), Verdict::Stamp));
        assert!(matches!(judge(Some(Ok(me())), &me()), Verdict::Use));
    }

    #[test]
    fn another_apps_task_or_partitioning_is_moved_aside() {
        for found in [
            Identity {
                application_id: "other.orders".into(),
                ..me()
            },
            Identity {
                task: "0_2".into(),
                ..me()
            },
            Identity {
                partitions: 8,
                ..me()
            },
        ] {
            let v = judge(Some(Ok(found.clone())), &me());
            assert!(
                matches!(&v, Verdict::MoveAside(Unusable::Foreign { found: f }) if *f == found),
                "{v:?}"
            );
        }
        assert!(matches!(
            judge(Some(Err(eof())), &me()),
            Verdict::MoveAside(Unusable::BadIdentity(_))
        ));
    }

    #[test]
    fn a_store_reset_under_another_layout_is_moved_aside_and_a_new_store_is_stamped() {
        let old = Identity {
            layouts: [(
                "totals".to_string(),
                "aggregate window=none fields=n:count,s:sum".to_string(),
            )]
            .into(),
            ..me()
        };
        let v = judge(Some(Ok(old)), &me());
        assert!(
            matches!(&v, Verdict::MoveAside(Unusable::LayoutChanged { store, was })
                if store == "totals" && was == "aggregate window=none fields=n:count,s:sum"),
            "{v:?}"
        );
        let before_layouts = Identity {
            layouts: Default::default(),
            ..me()
        };
        assert!(matches!(
            judge(Some(Ok(before_layouts)), &me()),
            Verdict::Stamp
        ));
        let other_store = Identity {
            layouts: [("seen".to_string(), "dedupe".to_string())].into(),
            ..me()
        };
        assert!(matches!(
            judge(Some(Ok(other_store)), &me()),
            Verdict::Stamp
        ));
    }

    #[test]
    fn only_a_held_lock_is_waited_for() {
        assert!(is_lock_held(
            "IO error: While lock file: /s/0_1/LOCK: Resource temporarily unavailable"
        ));
        assert!(!is_lock_held(
            "Corruption: CURRENT file does not end with newline"
        ));
    }

    #[test]
    fn the_foreign_description_names_both_owners() {
        let found = Identity {
            application_id: "b.orders".into(),
            ..me()
        };
        let d = Unusable::Foreign { found }.describe(&me());
        assert!(
            d.contains("\"b.orders\"") && d.contains("\"ns.orders\""),
            "{d}"
        );
    }

    #[test]
    fn a_moved_directory_keeps_its_files_under_quarantine() {
        let root = std::env::temp_dir().join(format!("oxbow-quarantine-{}", std::process::id()));
        let dir = root.join("app").join("0_1");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("CURRENT"), "garbage").expect("write");
        let moved = move_aside(&dir, 42).expect("moved");
        assert_eq!(moved, root.join("app").join("quarantine").join("0_1-42"));
        assert!(!dir.exists());
        assert_eq!(
            std::fs::read_to_string(moved.join("CURRENT")).expect("kept"),
            "garbage"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}

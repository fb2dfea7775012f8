//! Routing: who answers for a task. The pure decision of whether a query is answered
//! here, forwarded to the active, read from a stale copy, or refused with a reason.
//!
//! Owns: [`LocalCopy`], [`Facts`], [`Decision`], [`decide`], [`retry_after`] and
//! [`stale_candidates`]. Must not touch: I/O (`serve.rs` gathers the facts and acts on
//! the decision) or the stores.

use std::collections::BTreeMap;

use oxbow_crds::TaskId;
use oxbow_crds::assignment::TaskPlacement;

use crate::status::{RestoreProgress, Role, TaskState};

/// Retry-After bounds: a client should come back soon enough to see the restore end,
/// and not hammer a pod whose restore rate is not measured yet.
const RETRY_AFTER_MAX: u64 = 300;
const RETRY_AFTER_UNKNOWN: u64 = 5;

/// This worker's copy of a task, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalCopy {
    pub role: Role,
    pub state: TaskState,
    /// Changelog records the local state is behind (standbys, restoring actives).
    pub state_lag: Option<i64>,
    pub restore: Option<RestoreProgress>,
    pub last_error: Option<String>,
    /// Its store is open for reads.
    pub open: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Facts<'a> {
    pub me: &'a str,
    pub task: TaskId,
    pub local: Option<LocalCopy>,
    pub placement: Option<&'a TaskPlacement>,
    pub addresses: &'a BTreeMap<String, String>,
    /// The request came from another pod: answer from here or not at all.
    pub forwarded: bool,
    pub allow_stale: bool,
    pub max_staleness: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// This pod holds the task actively and it is running.
    Local,
    /// Another pod is the active: ask it.
    Forward {
        pod: String,
        addr: String,
    },
    /// `allowStale`: a local copy within the staleness bound.
    StaleLocal {
        lag: i64,
    },
    /// `allowStale`: the active cannot answer; ask a standby (it checks its own lag).
    StaleForward {
        pod: String,
        addr: String,
    },
    /// The owner is this pod and it is restoring or starting.
    Restoring {
        retry_after: u64,
        progress: Option<RestoreProgress>,
    },
    Unavailable(String),
}

/// Seconds until a restore should be done, for `Retry-After`.
pub fn retry_after(progress: Option<&RestoreProgress>) -> u64 {
    match progress {
        Some(p) if p.records_per_second > 0.0 => {
            let secs = (p.remaining as f64 / p.records_per_second).ceil();
            (secs as u64).clamp(1, RETRY_AFTER_MAX)
        }
        _ => RETRY_AFTER_UNKNOWN,
    }
}

/// Standbys of the task on other pods with a known address, in assignment order.
pub fn stale_candidates(f: &Facts<'_>) -> Vec<(String, String)> {
    f.placement
        .map(|p| {
            p.standbys
                .iter()
                .filter(|s| s.as_str() != f.me)
                .filter_map(|s| f.addresses.get(s).map(|a| (s.clone(), a.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// Who answers for `f.task`, from what this pod knows of it.
pub fn decide(f: &Facts<'_>) -> Decision {
    let t = f.task;
    if let Some(l) = &f.local {
        if l.role == Role::Active && l.state == TaskState::Running && l.open {
            return Decision::Local;
        }
        // A local copy that is close enough, when the caller accepts that.
        if f.allow_stale
            && l.open
            && matches!(l.state, TaskState::Running | TaskState::Restoring)
            && let Some(lag) = l.state_lag
            && lag <= f.max_staleness
        {
            return Decision::StaleLocal { lag: lag.max(0) };
        }
        if l.role == Role::Active {
            if l.state == TaskState::Failed {
                return Decision::Unavailable(format!(
                    "task {t} failed on {}: {}",
                    f.me,
                    l.last_error.as_deref().unwrap_or("no reason recorded")
                ));
            }
            if f.allow_stale
                && !f.forwarded
                && let Some((pod, addr)) = stale_candidates(f).into_iter().next()
            {
                return Decision::StaleForward { pod, addr };
            }
            return Decision::Restoring {
                retry_after: retry_after(l.restore.as_ref()),
                progress: l.restore.clone(),
            };
        }
    }
    if f.forwarded {
        return Decision::Unavailable(format!(
            "{} was asked for task {t} but does not hold it actively{} (the assignment may be moving); retry",
            f.me,
            if f.allow_stale {
                " nor within the staleness bound"
            } else {
                ""
            }
        ));
    }
    let stale_fallback = |why: String| {
        if f.allow_stale
            && let Some((pod, addr)) = stale_candidates(f).into_iter().next()
        {
            return Decision::StaleForward { pod, addr };
        }
        Decision::Unavailable(why)
    };
    match f.placement {
        Some(p) if p.active == f.me => Decision::Restoring {
            // Assigned here, not started yet: the engine picks it up within a second.
            retry_after: 1,
            progress: None,
        },
        Some(p) => match f.addresses.get(&p.active) {
            Some(addr) => Decision::Forward {
                pod: p.active.clone(),
                addr: addr.clone(),
            },
            None => stale_fallback(format!(
                "the owner of task {t}, {}, has no known address (standalone workers need --peers)",
                p.active
            )),
        },
        None => stale_fallback(format!("no owner of task {t} is known yet")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::DEFAULT_MAX_STALENESS;

    fn placement(active: &str, standbys: &[&str]) -> TaskPlacement {
        TaskPlacement {
            active: active.into(),
            standbys: standbys.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn copy(role: Role, state: TaskState, lag: Option<i64>) -> LocalCopy {
        LocalCopy {
            role,
            state,
            state_lag: lag,
            restore: None,
            last_error: None,
            open: true,
        }
    }

    fn facts<'a>(
        local: Option<LocalCopy>,
        p: Option<&'a TaskPlacement>,
        addrs: &'a BTreeMap<String, String>,
    ) -> Facts<'a> {
        Facts {
            me: "a",
            task: TaskId::new(0, 3),
            local,
            placement: p,
            addresses: addrs,
            forwarded: false,
            allow_stale: false,
            max_staleness: DEFAULT_MAX_STALENESS,
        }
    }

    fn addrs() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("a".into(), "10.0.0.1:8080".into()),
            ("b".into(), "10.0.0.2:8080".into()),
            ("c".into(), "10.0.0.3:8080".into()),
        ])
    }

    #[test]
    fn a_running_local_active_answers_here() {
        let a = addrs();
        let p = placement("a", &["b"]);
        let f = facts(
            Some(copy(Role::Active, TaskState::Running, None)),
            Some(&p),
            &a,
        );
        assert_eq!(decide(&f), Decision::Local);
    }

    #[test]
    fn another_active_gets_the_request_forwarded_once() {
        let a = addrs();
        let p = placement("b", &["a"]);
        let mut f = facts(
            Some(copy(Role::Standby, TaskState::Running, Some(3))),
            Some(&p),
            &a,
        );
        assert_eq!(
            decide(&f),
            Decision::Forward {
                pod: "b".into(),
                addr: "10.0.0.2:8080".into()
            }
        );
        f.forwarded = true;
        assert!(
            matches!(decide(&f), Decision::Unavailable(m) if m.contains("does not hold it actively")),
            "a forwarded request is never forwarded again"
        );
    }

    #[test]
    fn allow_stale_reads_a_local_standby_within_the_bound_only() {
        let a = addrs();
        let p = placement("b", &["a"]);
        let mut f = facts(
            Some(copy(Role::Standby, TaskState::Running, Some(40))),
            Some(&p),
            &a,
        );
        f.allow_stale = true;
        assert_eq!(decide(&f), Decision::StaleLocal { lag: 40 });
        f.max_staleness = 39;
        assert!(matches!(decide(&f), Decision::Forward { .. }));
        f.local = Some(copy(Role::Standby, TaskState::Running, None));
        f.max_staleness = DEFAULT_MAX_STALENESS;
        assert!(
            matches!(decide(&f), Decision::Forward { .. }),
            "an unknown lag is not within any bound"
        );
    }

    #[test]
    fn a_restoring_local_active_answers_503_with_retry_after_from_the_rate() {
        let a = addrs();
        let p = placement("a", &["b"]);
        let mut l = copy(Role::Active, TaskState::Restoring, Some(50_000));
        let progress = RestoreProgress {
            remaining: 25_000,
            records_per_second: 10_000.0,
            ..Default::default()
        };
        l.restore = Some(progress.clone());
        let mut f = facts(Some(l), Some(&p), &a);
        assert_eq!(
            decide(&f),
            Decision::Restoring {
                retry_after: 3,
                progress: Some(progress)
            }
        );
        f.allow_stale = true;
        assert_eq!(
            decide(&f),
            Decision::StaleForward {
                pod: "b".into(),
                addr: "10.0.0.2:8080".into()
            },
            "with allowStale a standby elsewhere is asked instead"
        );
    }

    #[test]
    fn retry_after_is_at_least_one_second_and_bounded() {
        let p = |remaining, rate| RestoreProgress {
            remaining,
            records_per_second: rate,
            ..Default::default()
        };
        assert_eq!(retry_after(Some(&p(1, 1e9))), 1);
        assert_eq!(retry_after(Some(&p(0, 5.0))), 1);
        assert_eq!(retry_after(Some(&p(u64::MAX, 1.0))), RETRY_AFTER_MAX);
        assert_eq!(retry_after(Some(&p(10, 0.0))), RETRY_AFTER_UNKNOWN);
        assert_eq!(retry_after(None), RETRY_AFTER_UNKNOWN);
    }

    #[test]
    fn an_owner_without_address_or_no_owner_is_unavailable_with_a_reason() {
        let none = BTreeMap::new();
        let p = placement("b", &[]);
        let f = facts(None, Some(&p), &none);
        assert!(matches!(decide(&f), Decision::Unavailable(m) if m.contains("--peers")));
        let f = facts(None, None, &none);
        assert!(matches!(decide(&f), Decision::Unavailable(m) if m.contains("no owner")));
    }

    #[test]
    fn a_failed_local_active_says_why() {
        let a = addrs();
        let p = placement("a", &[]);
        let mut l = copy(Role::Active, TaskState::Failed, None);
        l.last_error = Some("boom".into());
        let f = facts(Some(l), Some(&p), &a);
        assert!(matches!(decide(&f), Decision::Unavailable(m) if m.contains("boom")));
    }

    #[test]
    fn a_task_assigned_here_but_not_started_asks_to_retry_shortly() {
        let a = addrs();
        let p = placement("a", &[]);
        let f = facts(None, Some(&p), &a);
        assert_eq!(
            decide(&f),
            Decision::Restoring {
                retry_after: 1,
                progress: None
            }
        );
    }
}

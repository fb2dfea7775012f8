//! Phase 1 of [`next`](super::next): each task's active, sticky, with failover.
//!
//! A task stays on its active pod while that pod is a target. A task whose pod is gone,
//! not eligible, or back on an empty volume while another pod holds a warm copy moves
//! at once to the freshest copy, else the least loaded pod. A draining pod keeps its
//! actives here; the drain phase moves them. Must not place standbys.

use super::view::{Plan, View};
use crate::names::TaskId;

/// The actives after failover, with the target pods' load and the tasks left on
/// draining pods.
pub(super) fn actives(v: &View<'_>) -> Plan {
    let mut plan = Plan {
        load: v.targets.iter().map(|f| (f.pod.clone(), 0)).collect(),
        ..Plan::default()
    };
    let mut orphans = Vec::new();
    for t in v.tasks() {
        match v.prev_of(t).map(|tp| tp.active.clone()) {
            Some(pod) if v.is_target(&pod) && !cold_with_warm_alternative(v, &pod, t) => {
                *plan.load.entry(pod.clone()).or_default() += 1;
                plan.active.insert(t, pod);
            }
            Some(pod) if v.is_eligible(&pod) && !v.is_target(&pod) => {
                plan.active.insert(t, pod);
                plan.draining.push(t);
            }
            _ => orphans.push(t),
        }
    }
    for t in orphans {
        // Freshest state first, then the least loaded, then the name (determinism).
        let best = v
            .targets
            .iter()
            .min_by_key(|f| {
                (
                    f.state_lag.get(&t).copied().unwrap_or(i64::MAX),
                    plan.load.get(&f.pod).copied().unwrap_or(0),
                    f.pod.clone(),
                )
            })
            .map(|f| f.pod.clone())
            .unwrap_or_default();
        *plan.load.entry(best.clone()).or_default() += 1;
        plan.active.insert(t, best);
    }
    plan
}

/// An active without a warm copy (restarted on an empty volume, or not reporting yet)
/// gives way to a pod whose copy is warm: processing resumes there at once instead of
/// waiting for a restore. It is the failover of a lost volume.
fn cold_with_warm_alternative(v: &View<'_>, pod: &str, t: TaskId) -> bool {
    let acked = v
        .eligible
        .iter()
        .find(|f| f.pod == pod)
        .and_then(|f| f.acknowledged)
        .is_some_and(|g| g >= v.generation);
    // Cold: its copy is reported far behind (a restore from an empty volume announces
    // what it will read), or it runs the current generation and has no copy at all. A
    // pod that has not caught up with the assignment yet is unknown: moving its tasks on
    // a guess would shuffle every start.
    let cold = match v.lag_on(pod, t) {
        Some(l) => l > v.p.warmup_max_lag,
        None => acked,
    };
    cold && v.targets.iter().any(|f| {
        f.pod != pod
            && f.state_lag
                .get(&t)
                .is_some_and(|l| *l <= v.p.warmup_max_lag)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assignment, facts, params};
    use super::*;

    #[test]
    fn a_task_stays_on_its_active_while_that_pod_is_a_target() {
        let prev = assignment(1, &[("a", &[]), ("b", &[])]);
        let pods = [facts("a", &[(0, 0)]), facts("b", &[(1, 0)])];
        let plan = actives(&View::new(Some(&prev), &pods, params(2)).expect("an eligible pod"));
        assert_eq!(plan.active[&TaskId::new(0, 0)], "a");
        assert_eq!(plan.active[&TaskId::new(0, 1)], "b");
        assert_eq!(plan.load, [("a".into(), 1), ("b".into(), 1)].into());
    }

    #[test]
    fn a_lost_pods_task_goes_to_the_freshest_copy_not_the_least_loaded_pod() {
        // Task 0 ran on "gone"; "b" runs task 1 but holds a fresher copy of task 0 than "c".
        let prev = assignment(1, &[("gone", &[]), ("b", &[])]);
        let mut c = facts("c", &[(0, 400)]);
        c.acknowledged = Some(1);
        let pods = [facts("b", &[(1, 0), (0, 10)]), c];
        let plan = actives(&View::new(Some(&prev), &pods, params(2)).expect("an eligible pod"));
        assert_eq!(plan.active[&TaskId::new(0, 0)], "b");
    }

    #[test]
    fn a_draining_pod_keeps_its_active_for_the_drain_phase() {
        let prev = assignment(1, &[("a", &[]), ("b", &[])]);
        let mut b = facts("b", &[(1, 0)]);
        b.draining = true;
        let pods = [facts("a", &[(0, 0)]), b];
        let plan = actives(&View::new(Some(&prev), &pods, params(2)).expect("an eligible pod"));
        assert_eq!(plan.active[&TaskId::new(0, 1)], "b");
        assert_eq!(plan.draining, vec![TaskId::new(0, 1)]);
        assert!(
            !plan.load.contains_key("b"),
            "a draining pod is no target: {:?}",
            plan.load
        );
    }

    #[test]
    fn an_active_back_on_an_empty_volume_gives_way_only_once_it_runs_the_generation() {
        let prev = assignment(3, &[("a", &[]), ("b", &[])]);
        let warm_b = facts("b", &[(1, 0), (0, 5)]);
        // "a" reports no copy of task 0 but has not acknowledged generation 3: unknown.
        let unknown = [facts("a", &[]), warm_b.clone()];
        let plan = actives(&View::new(Some(&prev), &unknown, params(2)).expect("an eligible pod"));
        assert_eq!(plan.active[&TaskId::new(0, 0)], "a");
        // Once it runs generation 3 with no copy, it is cold: the warm copy takes over.
        let mut a = facts("a", &[]);
        a.acknowledged = Some(3);
        let cold = [a, warm_b];
        let plan = actives(&View::new(Some(&prev), &cold, params(2)).expect("an eligible pod"));
        assert_eq!(plan.active[&TaskId::new(0, 0)], "b");
    }
}

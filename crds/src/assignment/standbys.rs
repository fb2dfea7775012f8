//! Phase 4 of [`next`](super::next): each task's standbys, on staying pods only.
//!
//! `standby_replicas` per task on distinct target pods other than the active: a pod
//! warming up to take the task over first, then the standbys kept from the previous
//! assignment, then a previous active that lost the task (its copy is warm), then the
//! pods with the freshest copy, then the least loaded. No pod holds more than its fair
//! share while another has room. Must not move an active.

use std::collections::BTreeMap;

use super::TaskPlacement;
use super::view::{Plan, View};
use crate::names::TaskId;

/// Every task's placement: its active from `plan`, and its standbys. The previous
/// actives are filled in later, with the generation.
pub(super) fn place(v: &View<'_>, plan: &Plan) -> BTreeMap<TaskId, TaskPlacement> {
    let mut standby_load: BTreeMap<String, usize> =
        v.targets.iter().map(|f| (f.pod.clone(), 0)).collect();
    let cap = fair_share(v);
    let mut tasks = BTreeMap::new();
    for t in v.tasks() {
        let act = plan.active.get(&t).cloned().unwrap_or_default();
        let standbys = standbys_of(v, plan, t, &act, &standby_load, cap);
        for s in &standbys {
            *standby_load.entry(s.clone()).or_default() += 1;
        }
        tasks.insert(
            t,
            TaskPlacement {
                active: act,
                standbys,
                previous: vec![],
            },
        );
    }
    tasks
}

/// A pod's fair share of standbys: kept copies and fresh state count only up to it, so
/// a pod that gave many actives away (each leaves a warm standby behind) does not end
/// up holding most of the standbys.
fn fair_share(v: &View<'_>) -> usize {
    let per_task = (v.p.standby_replicas as usize).min(v.targets.len().saturating_sub(1));
    (v.p.tasks as usize * per_task)
        .div_ceil(v.targets.len().max(1))
        .max(1)
}

/// Task `t`'s standbys, given the standbys placed so far (`standby_load`).
fn standbys_of(
    v: &View<'_>,
    plan: &Plan,
    t: TaskId,
    act: &str,
    standby_load: &BTreeMap<String, usize>,
    cap: usize,
) -> Vec<String> {
    let room = v.targets.len() - usize::from(v.is_target(act));
    let mut standbys: Vec<String> = Vec::new();
    if let Some(w) = plan.warming.get(&t)
        && w != act
    {
        standbys.push(w.clone());
    }
    let want = (v.p.standby_replicas as usize)
        .min(room)
        .max(standbys.len());
    let keep = |s: &String, standbys: &Vec<String>| {
        standbys.len() < want
            && s != act
            && v.is_target(s)
            && !standbys.contains(s)
            && standby_load.get(s).copied().unwrap_or(0) < cap
    };
    let prev = v.prev_of(t);
    for s in prev.map(|tp| tp.standbys.clone()).unwrap_or_default() {
        if keep(&s, &standbys) {
            standbys.push(s);
        }
    }
    // A previous active that lost the task keeps its state warm as a standby.
    if let Some(old) = prev.map(|tp| tp.active.clone())
        && keep(&old, &standbys)
    {
        standbys.push(old);
    }
    while standbys.len() < want {
        let pick = v
            .targets
            .iter()
            .filter(|f| f.pod != act && !standbys.contains(&f.pod))
            .min_by_key(|f| {
                let load = standby_load.get(&f.pod).copied().unwrap_or(0);
                (
                    load >= cap,
                    f.state_lag.get(&t).copied().unwrap_or(i64::MAX),
                    load,
                    f.pod.clone(),
                )
            })
            .map(|f| f.pod.clone());
        match pick {
            Some(pod) => standbys.push(pod),
            None => break,
        }
    }
    standbys
}

#[cfg(test)]
mod tests {
    use super::super::failover::actives;
    use super::super::testing::{assignment, facts, params};
    use super::*;

    fn placed(
        prev: &super::super::Assignment,
        pods: &[super::super::PodFacts],
        tasks: u32,
    ) -> BTreeMap<TaskId, TaskPlacement> {
        let v = View::new(Some(prev), pods, params(tasks)).expect("an eligible pod");
        place(&v, &actives(&v))
    }

    #[test]
    fn a_standby_is_never_the_active_and_stays_where_it_was() {
        let prev = assignment(1, &[("a", &["c"]), ("b", &["a"])]);
        let pods = [facts("a", &[]), facts("b", &[]), facts("c", &[])];
        let tasks = placed(&prev, &pods, 2);
        assert_eq!(tasks[&TaskId::new(0, 0)].standbys, vec!["c".to_string()]);
        assert_eq!(tasks[&TaskId::new(0, 1)].standbys, vec!["a".to_string()]);
    }

    #[test]
    fn a_new_standby_goes_to_the_freshest_copy_then_the_least_loaded() {
        let prev = assignment(1, &[("a", &[]), ("a", &[])]);
        let pods = [facts("a", &[]), facts("b", &[]), facts("c", &[(1, 30)])];
        let tasks = placed(&prev, &pods, 2);
        assert_eq!(tasks[&TaskId::new(0, 0)].standbys, vec!["b".to_string()]);
        assert_eq!(tasks[&TaskId::new(0, 1)].standbys, vec!["c".to_string()]);
    }

    #[test]
    fn a_pod_with_many_kept_copies_holds_no_more_than_its_fair_share() {
        // "c" was every task's standby; with three pods and one standby per task, each
        // holds at most two of the four.
        let prev = assignment(
            1,
            &[("a", &["c"]), ("a", &["c"]), ("b", &["c"]), ("b", &["c"])],
        );
        let pods = [facts("a", &[]), facts("b", &[]), facts("c", &[])];
        let tasks = placed(&prev, &pods, 4);
        let on_c = tasks
            .values()
            .filter(|p| p.standbys.contains(&"c".to_string()))
            .count();
        assert_eq!(on_c, 2, "{tasks:?}");
        assert!(tasks.values().all(|p| p.standbys.len() == 1));
    }

    #[test]
    fn with_one_pod_there_is_no_room_for_a_standby() {
        let prev = assignment(1, &[("a", &[])]);
        let tasks = placed(&prev, &[facts("a", &[])], 1);
        assert!(tasks[&TaskId::new(0, 0)].standbys.is_empty());
    }
}

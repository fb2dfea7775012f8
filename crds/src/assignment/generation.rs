//! Phase 5 of [`next`](super::next): whether the placement is a new generation, and
//! each task's previous actives in it.
//!
//! A placement equal to the previous one (actives, standbys and the listed pods) keeps
//! its generation, so feeding unchanged facts back settles. A new generation names,
//! per task, the pods that ran it before and may not have let go yet: the new active
//! waits for exactly these. Must not change a placement.

use std::collections::BTreeMap;

use super::{Assignment, PodFacts, PreviousActive, TaskPlacement};
use crate::names::TaskId;

/// The assignment to publish for `tasks`: the previous one when nothing changed,
/// else the next generation with its previous actives.
pub(super) fn publish(
    prev: Option<&Assignment>,
    mut tasks: BTreeMap<TaskId, TaskPlacement>,
    pods: &[PodFacts],
) -> Assignment {
    let pod_names: Vec<String> = pods.iter().map(|f| f.pod.clone()).collect();
    let changed = prev.is_none_or(|a| {
        !a.tracks_previous || !same_placements(&a.tasks, &tasks) || a.pods != pod_names
    });
    match prev {
        Some(a) if !changed => a.clone(),
        _ => {
            let generation = prev.map_or(0, |a| a.generation) + 1;
            hand_over(prev, &mut tasks, pods, &pod_names, generation);
            Assignment {
                generation,
                tasks,
                pods: pod_names,
                tracks_previous: true,
            }
        }
    }
}

/// Actives and standbys alike (the previous actives follow from them).
fn same_placements(
    a: &BTreeMap<TaskId, TaskPlacement>,
    b: &BTreeMap<TaskId, TaskPlacement>,
) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((ta, pa), (tb, pb))| {
            ta == tb && pa.active == pb.active && pa.standbys == pb.standbys
        })
}

/// Fills in each task's previous actives for generation `generation`: the last
/// generation's active when the task moved, and earlier ones that have not acknowledged
/// the generation that moved it away, while their pods exist.
///
/// A previous assignment that did not track them (from an older operator, or the floor
/// placement starts over from) says nothing about where tasks ran: then every listed pod
/// that has not acknowledged its generation may still be starting any task from an
/// older one, and is a previous active of every task it does not get.
fn hand_over(
    prev: Option<&Assignment>,
    tasks: &mut BTreeMap<TaskId, TaskPlacement>,
    pods: &[PodFacts],
    listed: &[String],
    generation: i64,
) {
    let Some(prev) = prev else {
        return;
    };
    let acked = |pod: &str| {
        pods.iter()
            .find(|f| f.pod == pod)
            .and_then(|f| f.acknowledged)
            .unwrap_or(0)
    };
    let unknown: Vec<PreviousActive> = if prev.tracks_previous {
        Vec::new()
    } else {
        listed
            .iter()
            .filter(|pod| acked(pod) < prev.generation)
            .map(|pod| PreviousActive {
                pod: pod.clone(),
                until: prev.generation,
            })
            .collect()
    };
    for (t, placement) in tasks.iter_mut() {
        placement.previous = previous_actives(
            prev.tasks.get(t),
            &placement.active,
            &unknown,
            listed,
            &acked,
            generation,
        );
    }
}

/// One task's previous actives in generation `generation`, where `active` runs it:
/// those of `old` (its placement one generation earlier) still listed and short of
/// acknowledging the move, `old`'s active if the task moved away from it, and `unknown`
/// (see [`hand_over`]). Never the new active itself; each pod at most once.
fn previous_actives(
    old: Option<&TaskPlacement>,
    active: &str,
    unknown: &[PreviousActive],
    listed: &[String],
    acked: &dyn Fn(&str) -> i64,
    generation: i64,
) -> Vec<PreviousActive> {
    let mut previous: Vec<PreviousActive> = Vec::new();
    let mut add = |p: PreviousActive| {
        if p.pod != active
            && listed.contains(&p.pod)
            && acked(&p.pod) < p.until
            && !previous.iter().any(|q| q.pod == p.pod)
        {
            previous.push(p);
        }
    };
    if let Some(old) = old {
        if old.active != active {
            add(PreviousActive {
                pod: old.active.clone(),
                until: generation,
            });
        }
        for p in old.previous.iter().filter(|p| p.pod != old.active) {
            add(p.clone());
        }
    }
    for p in unknown {
        add(p.clone());
    }
    previous
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assignment, facts};
    use super::*;

    fn acked(pod: &str, generation: i64) -> PodFacts {
        PodFacts {
            acknowledged: Some(generation),
            ..facts(pod, &[])
        }
    }

    #[test]
    fn an_unchanged_placement_keeps_its_generation_so_unchanged_facts_settle() {
        let prev = assignment(7, &[("a", &["b"]), ("b", &["a"])]);
        let pods = [acked("a", 7), acked("b", 7)];
        let next = publish(Some(&prev), prev.tasks.clone(), &pods);
        assert_eq!(next, prev);
    }

    #[test]
    fn a_moved_task_names_its_old_active_until_that_pod_acknowledges_the_move() {
        let prev = assignment(3, &[("a", &[]), ("a", &[])]);
        let mut tasks = prev.tasks.clone();
        tasks.get_mut(&TaskId::new(0, 1)).expect("task 1").active = "b".into();
        let next = publish(Some(&prev), tasks.clone(), &[acked("a", 3), acked("b", 3)]);
        assert_eq!(next.generation, 4);
        assert_eq!(
            next.tasks[&TaskId::new(0, 1)].previous,
            [PreviousActive {
                pod: "a".into(),
                until: 4
            }],
            "b waits for a to let go of task 1"
        );
        assert!(
            next.tasks[&TaskId::new(0, 0)].previous.is_empty(),
            "task 0 stayed"
        );

        // "a" acknowledged generation 4: it has let go, and nobody waits for it.
        let mut later = tasks;
        later.get_mut(&TaskId::new(0, 0)).expect("task 0").standbys = vec!["b".into()];
        let after = publish(Some(&next), later, &[acked("a", 4), acked("b", 4)]);
        assert_eq!(after.generation, 5);
        assert!(after.tasks.values().all(|t| t.previous.is_empty()));
    }

    #[test]
    fn a_pod_that_is_gone_is_no_previous_active() {
        let prev = assignment(2, &[("a", &[])]);
        let mut tasks = prev.tasks.clone();
        tasks.get_mut(&TaskId::new(0, 0)).expect("task 0").active = "b".into();
        let next = publish(Some(&prev), tasks, &[acked("b", 2)]);
        assert_eq!(next.pods, ["b"]);
        assert!(next.tasks[&TaskId::new(0, 0)].previous.is_empty());
    }

    #[test]
    fn after_an_assignment_without_previous_actives_every_unacknowledged_pod_is_waited_for() {
        let mut prev = assignment(5, &[("a", &[]), ("b", &[])]);
        prev.tracks_previous = false;
        let pods = [acked("a", 5), acked("b", 4), facts("c", &[])];
        let next = publish(Some(&prev), prev.tasks.clone(), &pods);
        assert_eq!(next.generation, 6, "now tracked: a new generation");
        assert!(next.tracks_previous);
        let waits = |t: u32| -> Vec<&str> {
            next.tasks[&TaskId::new(0, t)]
                .previous
                .iter()
                .map(|p| p.pod.as_str())
                .collect()
        };
        assert_eq!(
            waits(0),
            ["b", "c"],
            "a acknowledged 5; b and c may run anything"
        );
        assert_eq!(waits(1), ["c"], "b runs task 1 itself");
    }
}

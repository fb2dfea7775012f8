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

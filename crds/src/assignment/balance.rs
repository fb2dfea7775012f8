//! Phase 3 of [`next`](super::next): even out the actives, with warm-up.
//!
//! The most loaded pod hands a task to the least loaded one while they differ by more
//! than one, but the task moves only once the receiver is warm (until then the
//! receiver holds it as a warming standby).
//!
//! A task the drain is handing to the most loaded pod goes to the least loaded one
//! instead, from its draining giver: the drain's receivers follow the freshest copies,
//! which can pile up on one pod, and evening that out with a task that stays on a
//! staying pod would move that task for nothing. Only without such a task does a
//! staying task move (a scale-out, or a failed pod come back). Must not place standbys.

use super::view::{Plan, View};
use crate::names::TaskId;

pub(super) fn balance(v: &View<'_>, m: &mut Plan) {
    while let Some((over, over_load)) = m
        .load
        .iter()
        .max_by_key(|(pod, l)| (**l, std::cmp::Reverse((*pod).clone())))
        .map(|(pod, l)| (pod.clone(), *l))
    {
        let Some((under, under_load)) = m
            .load
            .iter()
            .min_by_key(|(pod, l)| (**l, (*pod).clone()))
            .map(|(pod, l)| (pod.clone(), *l))
        else {
            break;
        };
        if over_load <= under_load + 1 {
            break;
        }
        let fresh_on_under = |t: &TaskId| (v.lag_on(&under, *t).unwrap_or(i64::MAX), *t);
        // The drain's receiver of a task: its warming pod, else its (new) active.
        let receiver = |t: &TaskId| m.warming.get(t).or_else(|| m.active.get(t)).cloned();
        let drained = m
            .drained
            .keys()
            .filter(|t| receiver(t).is_some_and(|r| r == over))
            .min_by_key(|t| fresh_on_under(t))
            .copied();
        if let Some(t) = drained {
            let giver = m.drained.get(&t).cloned().unwrap_or_default();
            if v.warm(&giver, &under, t) {
                m.active.insert(t, under.clone());
                m.warming.remove(&t);
            } else {
                m.active.insert(t, giver);
                m.warming.insert(t, under.clone());
            }
        } else {
            // The over pod's task that the under pod holds the freshest copy of.
            let Some(t) = m
                .active
                .iter()
                .filter(|(t, pod)| **pod == over && !m.warming.contains_key(t))
                .map(|(t, _)| *t)
                .min_by_key(fresh_on_under)
            else {
                break;
            };
            if v.warm(&over, &under, t) {
                m.active.insert(t, under.clone());
            } else {
                m.warming.insert(t, under.clone());
            }
        }
        // A warming move counts as done for balancing, so the loop ends.
        *m.load.entry(over).or_default() -= 1;
        *m.load.entry(under).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::failover::actives;
    use super::super::testing::{assignment, facts, params};
    use super::*;

    /// Four tasks on "a"; "b" joins with copies of tasks 2 (warm) and 3 (cold).
    fn scale_out(b_lags: &[(u32, i64)]) -> Plan {
        let prev = assignment(1, &[("a", &[]), ("a", &[]), ("a", &[]), ("a", &[])]);
        let pods = [
            facts("a", &[(0, 0), (1, 0), (2, 0), (3, 0)]),
            facts("b", b_lags),
        ];
        let v = View::new(Some(&prev), &pods, params(4)).expect("an eligible pod");
        let mut plan = actives(&v);
        balance(&v, &mut plan);
        plan
    }

    #[test]
    fn a_new_pod_takes_its_share_of_the_tasks_it_holds_warm_copies_of() {
        let plan = scale_out(&[(2, 0), (3, 10)]);
        assert_eq!(plan.active[&TaskId::new(0, 2)], "b");
        assert_eq!(plan.active[&TaskId::new(0, 3)], "b");
        assert!(plan.warming.is_empty());
        assert_eq!(plan.load, [("a".into(), 2), ("b".into(), 2)].into());
    }

    #[test]
    fn a_new_pod_without_warm_copies_warms_up_while_the_old_pod_keeps_running() {
        let plan = scale_out(&[(2, 0), (3, 5_000)]);
        assert_eq!(plan.active[&TaskId::new(0, 2)], "b", "warm: moves");
        assert_eq!(plan.active[&TaskId::new(0, 3)], "a", "cold: stays for now");
        assert_eq!(plan.warming[&TaskId::new(0, 3)], "b");
    }

    #[test]
    fn pods_within_one_task_of_each_other_are_left_alone() {
        let prev = assignment(1, &[("a", &[]), ("a", &[]), ("b", &[])]);
        let pods = [facts("a", &[(0, 0), (1, 0)]), facts("b", &[(0, 0), (2, 0)])];
        let v = View::new(Some(&prev), &pods, params(3)).expect("an eligible pod");
        let mut plan = actives(&v);
        let before = (plan.active.clone(), plan.load.clone());
        balance(&v, &mut plan);
        assert_eq!((plan.active, plan.load), before);
    }
}

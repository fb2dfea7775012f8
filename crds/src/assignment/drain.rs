//! Phase 2 of [`next`](super::next): the tasks of draining pods find their receivers.
//!
//! Each task left on a draining pod goes to the staying pod with the freshest copy (its
//! standbys first among equals, then the least loaded). It moves once that copy is
//! warm; until then the receiver holds it as a warming standby and the draining pod
//! keeps running it, so nothing restores cold. Must not move a task of a staying pod.

use super::view::{Plan, View};

pub(super) fn hand_off(v: &View<'_>, plan: &mut Plan) {
    for t in std::mem::take(&mut plan.draining) {
        let giver = plan.active.get(&t).cloned().unwrap_or_default();
        let standbys = v
            .prev_of(t)
            .map(|tp| tp.standbys.clone())
            .unwrap_or_default();
        let Some(receiver) = v
            .targets
            .iter()
            .min_by_key(|f| {
                (
                    f.state_lag.get(&t).copied().unwrap_or(i64::MAX),
                    !standbys.contains(&f.pod),
                    plan.load.get(&f.pod).copied().unwrap_or(0),
                    f.pod.clone(),
                )
            })
            .map(|f| f.pod.clone())
        else {
            continue;
        };
        // The receiver's load counts the task from now on, warm or not, so balancing
        // sees the picture after the drain.
        *plan.load.entry(receiver.clone()).or_default() += 1;
        plan.drained.insert(t, giver.clone());
        if v.warm(&giver, &receiver, t) {
            plan.active.insert(t, receiver);
        } else {
            plan.warming.insert(t, receiver);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::failover::actives;
    use super::super::testing::{assignment, facts, params};
    use super::*;
    use crate::names::TaskId;

    fn drained(pods: &[crate::assignment::PodFacts], prev_standby: &str) -> Plan {
        let prev = assignment(1, &[("a", &[]), ("b", &[prev_standby])]);
        let v = View::new(Some(&prev), pods, params(2)).expect("an eligible pod");
        let mut plan = actives(&v);
        hand_off(&v, &mut plan);
        plan
    }

    #[test]
    fn a_draining_pods_task_moves_at_once_to_a_warm_copy() {
        let mut b = facts("b", &[(1, 0)]);
        b.draining = true;
        let pods = [facts("a", &[(0, 0)]), b, facts("c", &[(1, 20)])];
        let plan = drained(&pods, "c");
        let t1 = TaskId::new(0, 1);
        assert_eq!(plan.active[&t1], "c");
        assert_eq!(plan.drained[&t1], "b");
        assert!(plan.warming.is_empty());
        assert!(plan.draining.is_empty(), "every draining task was handled");
    }

    #[test]
    fn a_draining_pods_task_waits_on_the_giver_while_the_receiver_warms_up() {
        let mut b = facts("b", &[(1, 0)]);
        b.draining = true;
        let pods = [facts("a", &[(0, 0)]), b, facts("c", &[(1, 5_000)])];
        let plan = drained(&pods, "c");
        let t1 = TaskId::new(0, 1);
        assert_eq!(plan.active[&t1], "b", "the draining pod keeps running it");
        assert_eq!(plan.warming[&t1], "c");
        assert_eq!(plan.load["c"], 1, "the receiver's load counts the task");
    }

    #[test]
    fn among_equally_fresh_receivers_the_tasks_standby_wins() {
        let mut b = facts("b", &[(1, 0)]);
        b.draining = true;
        // "a" and "c" hold no copy; "c" is the standby, "a" would win on load and name.
        let pods = [facts("a", &[]), b, facts("c", &[])];
        let prev = assignment(1, &[("c", &[]), ("b", &["c"])]);
        let v = View::new(Some(&prev), &pods, params(2)).expect("an eligible pod");
        let mut plan = actives(&v);
        hand_off(&v, &mut plan);
        assert_eq!(plan.warming[&TaskId::new(0, 1)], "c");
    }
}

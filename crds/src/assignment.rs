//! Which worker runs which task. Pure.
//!
//! Standalone mode (no operator-published assignment): instance `n` of `m` runs the
//! tasks `t` with `t % m == n`. Every task has exactly one owner as long as every
//! instance is started with the same `m`; the operator's sticky assignment with standbys
//! replaces this when it publishes one.

use std::collections::BTreeMap;

use crate::names::TaskId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    #[error("instance {instance} is out of range: instances are numbered 0..{instances}")]
    InstanceOutOfRange { instance: u32, instances: u32 },
    #[error("instances must be at least 1")]
    NoInstances,
}

/// The tasks instance `instance` of `instances` runs in standalone mode.
pub fn standalone(
    tasks: u32,
    instance: u32,
    instances: u32,
) -> Result<Vec<TaskId>, AssignmentError> {
    if instances == 0 {
        return Err(AssignmentError::NoInstances);
    }
    if instance >= instances {
        return Err(AssignmentError::InstanceOutOfRange {
            instance,
            instances,
        });
    }
    Ok((0..tasks)
        .filter(|t| t % instances == instance)
        .map(TaskId)
        .collect())
}

/// What the operator knows about one worker pod when it computes an assignment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    pub pod: String,
    /// Ready, or not ready for less than the failover timeout: it keeps its tasks.
    pub eligible: bool,
    /// Tasks whose state this pod holds (active or standby), with how far its copy is
    /// behind the changelog end (0 = caught up).
    pub state_lag: BTreeMap<TaskId, i64>,
}

/// One task's placement.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TaskPlacement {
    pub active: String,
    /// Standby pods, fed from the changelog; a pod warming up to take the active over is
    /// one of them.
    pub standbys: Vec<String>,
}

/// The key of the assignment ConfigMap (`<name>-assignment`) holding the JSON of
/// [`Assignment`].
pub const CONFIG_MAP_KEY: &str = "assignment.json";

/// The published assignment.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    /// Grows by one with every change; workers acknowledge the generation they run.
    pub generation: i64,
    pub tasks: BTreeMap<TaskId, TaskPlacement>,
    /// The worker pods that exist, as the operator saw them when it published. A new
    /// active starts a task only when no *listed* pod still reports it as active: a pod
    /// that is gone cannot release what it held, and is not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub tasks: u32,
    pub standby_replicas: u32,
    /// A warming standby takes the active over once its lag is at most this.
    pub warmup_max_lag: i64,
}

/// The next assignment from the previous one and the pods' facts. Pure and
/// deterministic; fed back with unchanged facts it settles within a few rounds and then
/// returns itself with the same generation (no flapping).
///
/// - **Failover**: a task whose active pod is not eligible moves at once to the eligible
///   pod with the freshest copy of its state (lowest lag), else the least loaded.
/// - **Sticky**: otherwise a task stays on its active pod.
/// - **Balance with warm-up**: a pod with more than its share of actives gives tasks to
///   pods with less, but a task moves only once the receiving pod's copy is within
///   `warmup_max_lag`; until then the receiver holds it as a (warming) standby.
/// - **Standbys**: `standby_replicas` per task on distinct eligible pods other than the
///   active, kept where they are when possible, otherwise on the least loaded pods.
pub fn next(prev: Option<&Assignment>, pods: &[PodFacts], p: Params) -> Assignment {
    let eligible: Vec<&PodFacts> = pods.iter().filter(|f| f.eligible).collect();
    let generation = prev.map_or(0, |a| a.generation);
    if eligible.is_empty() {
        // Nobody can run anything: keep the last word rather than publish an empty one.
        return prev.cloned().unwrap_or_default();
    }
    let is_eligible = |pod: &str| eligible.iter().any(|f| f.pod == pod);
    let lag_on = |pod: &str, t: TaskId| {
        eligible
            .iter()
            .find(|f| f.pod == pod)
            .and_then(|f| f.state_lag.get(&t).copied())
    };
    let n = eligible.len();

    // 1. Actives: sticky, with failover.
    let mut active: BTreeMap<TaskId, String> = BTreeMap::new();
    let mut load: BTreeMap<String, usize> = eligible.iter().map(|f| (f.pod.clone(), 0)).collect();
    let mut orphans = Vec::new();
    for t in (0..p.tasks).map(TaskId) {
        match prev
            .and_then(|a| a.tasks.get(&t))
            .map(|tp| tp.active.clone())
        {
            Some(pod) if is_eligible(&pod) => {
                *load.entry(pod.clone()).or_default() += 1;
                active.insert(t, pod);
            }
            _ => orphans.push(t),
        }
    }
    for t in orphans {
        // Freshest state first, then the least loaded, then the name (determinism).
        let best = eligible
            .iter()
            .min_by_key(|f| {
                (
                    f.state_lag.get(&t).copied().unwrap_or(i64::MAX),
                    load.get(&f.pod).copied().unwrap_or(0),
                    f.pod.clone(),
                )
            })
            .map(|f| f.pod.clone())
            .unwrap_or_default();
        *load.entry(best.clone()).or_default() += 1;
        active.insert(t, best);
    }

    // 2. Balance: the most loaded pod hands a task to the least loaded one while they
    //    differ by more than one, but the task moves only once the receiver is warm.
    let mut warming: BTreeMap<TaskId, String> = BTreeMap::new();
    while let Some((over, over_load)) = load
        .iter()
        .max_by_key(|(pod, l)| (**l, std::cmp::Reverse((*pod).clone())))
        .map(|(pod, l)| (pod.clone(), *l))
    {
        let Some((under, under_load)) = load
            .iter()
            .min_by_key(|(pod, l)| (**l, (*pod).clone()))
            .map(|(pod, l)| (pod.clone(), *l))
        else {
            break;
        };
        if over_load <= under_load + 1 {
            break;
        }
        // The over pod's task that the under pod holds the freshest copy of.
        let candidate = active
            .iter()
            .filter(|(t, pod)| **pod == over && !warming.contains_key(t))
            .min_by_key(|(t, _)| (lag_on(&under, **t).unwrap_or(i64::MAX), **t))
            .map(|(t, _)| *t);
        let Some(t) = candidate else { break };
        if lag_on(&under, t).is_some_and(|l| l <= p.warmup_max_lag) {
            active.insert(t, under.clone());
        } else {
            warming.insert(t, under.clone());
        }
        // A warming move counts as done for balancing, so the loop ends.
        *load.entry(over).or_default() -= 1;
        *load.entry(under).or_default() += 1;
    }
    // 3. Standbys.
    let mut standby_load: BTreeMap<String, usize> =
        eligible.iter().map(|f| (f.pod.clone(), 0)).collect();
    let mut tasks = BTreeMap::new();
    for t in (0..p.tasks).map(TaskId) {
        let act = active.get(&t).cloned().unwrap_or_default();
        let mut standbys: Vec<String> = Vec::new();
        if let Some(w) = warming.get(&t)
            && *w != act
        {
            standbys.push(w.clone());
        }
        let want = (p.standby_replicas as usize).min(n - 1).max(standbys.len());
        for s in prev
            .and_then(|a| a.tasks.get(&t))
            .map(|tp| tp.standbys.clone())
            .unwrap_or_default()
        {
            if standbys.len() < want && s != act && is_eligible(&s) && !standbys.contains(&s) {
                standbys.push(s);
            }
        }
        // A previous active that lost the task keeps its state warm as a standby.
        if let Some(old) = prev
            .and_then(|a| a.tasks.get(&t))
            .map(|tp| tp.active.clone())
            && standbys.len() < want
            && old != act
            && is_eligible(&old)
            && !standbys.contains(&old)
        {
            standbys.push(old);
        }
        while standbys.len() < want {
            let pick = eligible
                .iter()
                .filter(|f| f.pod != act && !standbys.contains(&f.pod))
                .min_by_key(|f| {
                    (
                        f.state_lag.get(&t).copied().unwrap_or(i64::MAX),
                        standby_load.get(&f.pod).copied().unwrap_or(0),
                        f.pod.clone(),
                    )
                })
                .map(|f| f.pod.clone());
            match pick {
                Some(pod) => standbys.push(pod),
                None => break,
            }
        }
        for s in &standbys {
            *standby_load.entry(s.clone()).or_default() += 1;
        }
        tasks.insert(
            t,
            TaskPlacement {
                active: act,
                standbys,
            },
        );
    }
    let changed = prev.is_none_or(|a| a.tasks != tasks);
    Assignment {
        generation: if changed { generation + 1 } else { generation },
        tasks,
        pods: pods.iter().map(|f| f.pod.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_has_exactly_one_standalone_owner() {
        for instances in 1..6 {
            let mut owners = vec![0; 13];
            for i in 0..instances {
                for t in standalone(13, i, instances).expect("valid") {
                    owners[t.0 as usize] += 1;
                }
            }
            assert!(owners.iter().all(|n| *n == 1), "{instances}: {owners:?}");
        }
    }

    #[test]
    fn an_instance_beyond_the_count_is_rejected() {
        assert_eq!(
            standalone(4, 2, 2),
            Err(AssignmentError::InstanceOutOfRange {
                instance: 2,
                instances: 2
            })
        );
        assert_eq!(standalone(4, 0, 0), Err(AssignmentError::NoInstances));
    }

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    fn pods(rng: &mut Rng, count: usize, tasks: u32) -> Vec<PodFacts> {
        let mut out = Vec::new();
        for i in 0..count {
            let eligible = rng.below(5) != 0;
            let mut state_lag = BTreeMap::new();
            for t in 0..tasks {
                if rng.below(3) == 0 {
                    state_lag.insert(TaskId(t), rng.below(3) as i64 * 500);
                }
            }
            out.push(PodFacts {
                pod: format!("app-{i}"),
                eligible,
                state_lag,
            });
        }
        out
    }

    fn check(a: &Assignment, pods: &[PodFacts], p: Params) {
        let eligible: Vec<&str> = pods
            .iter()
            .filter(|f| f.eligible)
            .map(|f| f.pod.as_str())
            .collect();
        if eligible.is_empty() {
            return;
        }
        assert_eq!(
            a.tasks.len(),
            p.tasks as usize,
            "every task is placed: {a:?}"
        );
        for (t, tp) in &a.tasks {
            assert!(
                eligible.contains(&tp.active.as_str()),
                "task {t}: active {} is not eligible",
                tp.active
            );
            assert!(
                !tp.standbys.contains(&tp.active),
                "task {t}: a standby on the active's pod"
            );
            let mut s = tp.standbys.clone();
            s.sort();
            s.dedup();
            assert_eq!(
                s.len(),
                tp.standbys.len(),
                "task {t}: standbys on distinct pods"
            );
            assert!(
                tp.standbys.iter().all(|s| eligible.contains(&s.as_str())),
                "task {t}: standby not eligible"
            );
            let want = (p.standby_replicas as usize).min(eligible.len() - 1);
            assert!(
                tp.standbys.len() >= want,
                "task {t}: {} standbys, want {want}",
                tp.standbys.len()
            );
        }
    }

    #[test]
    fn random_facts_always_give_one_eligible_active_and_distinct_standbys() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        for _ in 0..2000 {
            let p = Params {
                tasks: 1 + rng.below(24) as u32,
                standby_replicas: rng.below(3) as u32,
                warmup_max_lag: 100,
            };
            let n = 1 + rng.below(6) as usize;
            let before = pods(&mut rng, n, p.tasks);
            let prev = next(None, &before, p);
            let n = 1 + rng.below(6) as usize;
            let after = pods(&mut rng, n, p.tasks);
            let a = next(Some(&prev), &after, p);
            check(&a, &after, p);
            assert!(
                a.generation >= prev.generation,
                "the generation never goes back"
            );
            // With unchanged facts it settles (no flapping) and then stays put.
            let mut cur = a;
            let mut settled = false;
            for _ in 0..4 {
                let n2 = next(Some(&cur), &after, p);
                check(&n2, &after, p);
                if n2 == cur {
                    settled = true;
                    break;
                }
                assert_eq!(
                    n2.generation,
                    cur.generation + 1,
                    "a change bumps the generation by one"
                );
                cur = n2;
            }
            assert!(settled, "no fixed point within 4 rounds: {cur:?}");
        }
    }

    fn up(names: &[&str]) -> Vec<PodFacts> {
        names
            .iter()
            .map(|n| PodFacts {
                pod: n.to_string(),
                eligible: true,
                state_lag: BTreeMap::new(),
            })
            .collect()
    }

    fn actives(a: &Assignment) -> Vec<String> {
        a.tasks.values().map(|t| t.active.clone()).collect()
    }

    #[test]
    fn losing_a_pod_moves_only_its_tasks_to_the_freshest_standbys() {
        let p = Params {
            tasks: 6,
            standby_replicas: 1,
            warmup_max_lag: 0,
        };
        let a = next(None, &up(&["a", "b", "c"]), p);
        let counts =
            |a: &Assignment, pod: &str| a.tasks.values().filter(|t| t.active == pod).count();
        assert_eq!(
            (counts(&a, "a"), counts(&a, "b"), counts(&a, "c")),
            (2, 2, 2),
            "balanced: {a:?}"
        );
        let mut facts = up(&["a", "b"]);
        facts.push(PodFacts {
            pod: "c".into(),
            eligible: false,
            state_lag: BTreeMap::new(),
        });
        // Each of c's tasks has a standby somewhere; that pod reports its copy as fresh.
        for (t, tp) in &a.tasks {
            for s in &tp.standbys {
                if let Some(f) = facts.iter_mut().find(|f| &f.pod == s) {
                    f.state_lag.insert(*t, 0);
                }
            }
        }
        let b = next(Some(&a), &facts, p);
        for (t, tp) in &a.tasks {
            if tp.active != "c" {
                assert_eq!(
                    b.tasks[t].active, tp.active,
                    "task {t} was not on the lost pod and stays"
                );
            } else {
                assert_eq!(
                    b.tasks[t].active, tp.standbys[0],
                    "task {t} fails over to its standby"
                );
            }
        }
        assert_eq!(b.generation, a.generation + 1);
    }

    #[test]
    fn a_new_pod_warms_up_as_a_standby_before_it_takes_tasks_over() {
        let p = Params {
            tasks: 4,
            standby_replicas: 0,
            warmup_max_lag: 100,
        };
        let a = next(None, &up(&["a", "b"]), p);
        let mut facts = up(&["a", "b", "c"]);
        let b = next(Some(&a), &facts, p);
        assert_eq!(
            actives(&b),
            actives(&a),
            "no active moves to a pod without state"
        );
        let warming: Vec<TaskId> = b
            .tasks
            .iter()
            .filter(|(_, tp)| tp.standbys.contains(&"c".to_string()))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(
            warming.len(),
            1,
            "c warms up one task to take it over: {b:?}"
        );
        // c catches up on it.
        facts[2].state_lag.insert(warming[0], 40);
        let c = next(Some(&b), &facts, p);
        assert_eq!(
            c.tasks[&warming[0]].active, "c",
            "a warm copy takes the active over"
        );
        let moved = actives(&a)
            .iter()
            .zip(actives(&c))
            .filter(|(x, y)| *x != y)
            .count();
        assert_eq!(moved, 1, "exactly one task moved");
        assert!(c.generation > b.generation && b.generation > a.generation);
    }

    #[test]
    fn with_no_eligible_pod_the_last_assignment_stands() {
        let p = Params {
            tasks: 2,
            standby_replicas: 0,
            warmup_max_lag: 0,
        };
        let a = next(None, &up(&["a"]), p);
        let down = vec![PodFacts {
            pod: "a".into(),
            eligible: false,
            state_lag: BTreeMap::new(),
        }];
        assert_eq!(next(Some(&a), &down, p), a);
    }
}

//! `next` as a whole: scenarios of joins, failures, drains and scale-ins, and random
//! facts checked against the rules. Each phase has its own tests in its file.

use super::*;

mod scale_in;

#[test]
fn every_task_has_exactly_one_standalone_owner() {
    for instances in 1..6 {
        let tasks: Vec<TaskId> = TaskId::all(2, 13).collect();
        let mut owners = BTreeMap::new();
        for i in 0..instances {
            for t in standalone(&tasks, i, instances).expect("valid") {
                *owners.entry(t).or_insert(0) += 1;
            }
        }
        assert_eq!(owners.len(), tasks.len(), "every task has an owner");
        let owners: Vec<i32> = owners.into_values().collect();
        assert!(owners.iter().all(|n| *n == 1), "{instances}: {owners:?}");
    }
}

#[test]
fn an_instance_beyond_the_count_is_rejected() {
    assert_eq!(
        standalone(&[TaskId::new(0, 0)], 2, 2),
        Err(AssignmentError::InstanceOutOfRange {
            instance: 2,
            instances: 2
        })
    );
    assert_eq!(
        standalone(&[TaskId::new(0, 0)], 0, 0),
        Err(AssignmentError::NoInstances)
    );
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

fn pods(rng: &mut Rng, count: usize, p: Params) -> Vec<PodFacts> {
    let mut out = Vec::new();
    for i in 0..count {
        let eligible = rng.below(5) != 0;
        let draining = rng.below(4) == 0;
        let mut state_lag = BTreeMap::new();
        for t in TaskId::all(p.stages, p.tasks) {
            if rng.below(3) == 0 {
                state_lag.insert(t, rng.below(3) as i64 * 500);
            }
        }
        out.push(PodFacts {
            pod: format!("app-{i}"),
            eligible,
            draining,
            state_lag,
            acknowledged: (rng.below(2) == 0).then_some(1),
        });
    }
    out
}

fn facts_of<'a>(pods: &'a [PodFacts], pod: &str) -> Option<&'a PodFacts> {
    pods.iter().find(|f| f.pod == pod)
}

fn check(a: &Assignment, pods: &[PodFacts], p: Params) {
    let eligible: Vec<&PodFacts> = pods.iter().filter(|f| f.eligible).collect();
    if eligible.is_empty() {
        return;
    }
    let staying: Vec<&str> = eligible
        .iter()
        .filter(|f| !f.draining)
        .map(|f| f.pod.as_str())
        .collect();
    // Where tasks may go: the staying pods, or every eligible pod when all drain.
    let targets: Vec<&str> = if staying.is_empty() {
        eligible.iter().map(|f| f.pod.as_str()).collect()
    } else {
        staying.clone()
    };
    let lag = |pod: &str, t: &TaskId| facts_of(pods, pod).and_then(|f| f.state_lag.get(t));
    assert_eq!(
        a.tasks.len(),
        (p.tasks * p.stages) as usize,
        "every task is placed: {a:?}"
    );
    for (t, tp) in &a.tasks {
        let act = facts_of(pods, &tp.active);
        assert!(
            act.is_some_and(|f| f.eligible),
            "task {t}: active {} is not eligible",
            tp.active
        );
        if !targets.contains(&tp.active.as_str()) {
            // A draining active only while a staying pod warms up to take it over.
            let warming = tp.standbys.iter().any(|s| {
                staying.contains(&s.as_str())
                    && lag(&tp.active, t).is_some()
                    && lag(s, t).is_none_or(|l| *l > p.warmup_max_lag)
            });
            assert!(
                warming,
                "task {t}: active {} drains but no staying pod warms up for it: {tp:?}",
                tp.active
            );
        }
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
            tp.standbys.iter().all(|s| targets.contains(&s.as_str())),
            "task {t}: a standby on a pod that is not eligible or drains: {tp:?}"
        );
        let room = targets.iter().filter(|p| **p != tp.active).count();
        let want = (p.standby_replicas as usize).min(room);
        assert!(
            tp.standbys.len() >= want,
            "task {t}: {} standbys, want {want}",
            tp.standbys.len()
        );
    }
    let mut listed = a.pods.clone();
    listed.sort();
    let mut existing: Vec<String> = pods.iter().map(|f| f.pod.clone()).collect();
    existing.sort();
    assert_eq!(
        listed, existing,
        "the pods list names every pod that exists"
    );
}

#[test]
fn random_facts_always_give_one_eligible_active_and_distinct_standbys() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for _ in 0..2000 {
        let p = Params {
            tasks: 1 + rng.below(24) as u32,
            stages: 1 + rng.below(3) as u32,
            standby_replicas: rng.below(3) as u32,
            warmup_max_lag: 100,
        };
        let n = 1 + rng.below(6) as usize;
        let before = pods(&mut rng, n, p);
        let prev = next(None, &before, p);
        check(&prev, &before, p);
        let n = 1 + rng.below(6) as usize;
        let after = pods(&mut rng, n, p);
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
            ..Default::default()
        })
        .collect()
}

/// Every pod reports its actives as caught up and its standbys at `standby_lag`.
fn report(a: &Assignment, facts: &mut [PodFacts], standby_lag: i64) {
    for f in facts.iter_mut() {
        f.state_lag.clear();
    }
    for (t, tp) in &a.tasks {
        for f in facts.iter_mut() {
            if f.pod == tp.active {
                f.state_lag.insert(*t, 0);
            } else if tp.standbys.contains(&f.pod) {
                f.state_lag.insert(*t, standby_lag);
            }
        }
    }
}

fn settle(mut a: Assignment, facts: &[PodFacts], p: Params) -> Assignment {
    for _ in 0..8 {
        let b = next(Some(&a), facts, p);
        if b == a {
            return a;
        }
        a = b;
    }
    panic!("no fixed point: {a:?}");
}

fn actives(a: &Assignment) -> Vec<String> {
    a.tasks.values().map(|t| t.active.clone()).collect()
}

fn count(a: &Assignment, pod: &str) -> usize {
    a.tasks.values().filter(|t| t.active == pod).count()
}

#[test]
fn pods_that_joined_late_end_with_their_share_of_actives_and_standbys() {
    let p = Params {
        tasks: 12,
        stages: 1,
        standby_replicas: 1,
        warmup_max_lag: 100,
    };
    // The operator saw one pod first; the other two joined before anyone reported
    // (so moves were immediate, each leaving a standby behind), then all reported.
    let a0 = next(None, &up(&["a"]), p);
    let mut facts = up(&["a", "b", "c"]);
    let mut a = next(Some(&a0), &facts, p);
    for _ in 0..20 {
        report(&a, &mut facts, 0);
        let n = next(Some(&a), &facts, p);
        if n == a {
            break;
        }
        a = n;
    }
    let per_pod = |holds: &dyn Fn(&TaskPlacement, &str) -> bool| -> Vec<usize> {
        ["a", "b", "c"]
            .iter()
            .map(|pod| a.tasks.values().filter(|tp| holds(tp, pod)).count())
            .collect()
    };
    assert_eq!(
        per_pod(&|tp, pod| tp.active == pod),
        vec![4, 4, 4],
        "actives: {a:?}"
    );
    assert_eq!(
        per_pod(&|tp, pod| tp.standbys.iter().any(|s| s == pod)),
        vec![4, 4, 4],
        "standbys: {a:?}"
    );
}

#[test]
fn an_active_back_on_an_empty_volume_gives_way_to_its_warm_standby() {
    let p = Params {
        tasks: 6,
        stages: 1,
        standby_replicas: 1,
        warmup_max_lag: 100,
    };
    let a = next(None, &up(&["a", "b", "c"]), p);
    let mut facts = up(&["a", "b", "c"]);
    report(&a, &mut facts, 10);
    // c was recreated with an empty volume: it announces its actives' full restores.
    for lag in facts[2].state_lag.values_mut() {
        *lag = 50_000;
    }
    let b = next(Some(&a), &facts, p);
    for (t, tp) in &a.tasks {
        let want = if tp.active == "c" {
            &tp.standbys[0]
        } else {
            &tp.active
        };
        assert_eq!(&b.tasks[t].active, want, "task {t}");
    }
    // A restarted c that has not reported yet is unknown: nothing moves on a guess.
    facts[2].state_lag.clear();
    assert_eq!(next(Some(&a), &facts, p).tasks, a.tasks);
    // Once it runs the current generation without a copy, it is cold.
    facts[2].acknowledged = Some(a.generation);
    assert_ne!(
        next(Some(&a), &facts, p).tasks,
        a.tasks,
        "acknowledged, holds nothing"
    );
    // With nothing warm anywhere (a cold start), nobody moves.
    let cold = up(&["a", "b", "c"]);
    assert_eq!(next(Some(&a), &cold, p).tasks, a.tasks);
}

#[test]
fn losing_a_pod_moves_only_its_tasks_to_the_freshest_standbys() {
    let p = Params {
        tasks: 6,
        stages: 1,
        standby_replicas: 1,
        warmup_max_lag: 0,
    };
    let a = next(None, &up(&["a", "b", "c"]), p);
    assert_eq!(
        (count(&a, "a"), count(&a, "b"), count(&a, "c")),
        (2, 2, 2),
        "balanced: {a:?}"
    );
    let mut facts = up(&["a", "b", "c"]);
    report(&a, &mut facts, 0);
    facts[2].eligible = false;
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
fn a_moved_task_names_its_previous_active_until_that_pod_acknowledges_the_move() {
    let p = Params {
        tasks: 4,
        stages: 1,
        standby_replicas: 0,
        warmup_max_lag: 0,
    };
    let a = next(None, &up(&["a", "b"]), p);
    assert!(a.tracks_previous);
    assert!(
        a.tasks.values().all(|t| t.previous.is_empty()),
        "nothing moved yet"
    );
    // b stops being ready but its pod still exists: its tasks fail over to a, which
    // names b as previous (b may still be running them).
    let mut facts = up(&["a", "b"]);
    report(&a, &mut facts, 0);
    facts[1].eligible = false;
    facts[0].acknowledged = Some(a.generation);
    facts[1].acknowledged = Some(a.generation);
    let b = next(Some(&a), &facts, p);
    for (t, old) in &a.tasks {
        let moved = &b.tasks[t];
        if old.active == "b" {
            assert_eq!(moved.active, "a");
            assert_eq!(
                moved.previous,
                vec![PreviousActive {
                    pod: "b".into(),
                    until: b.generation
                }],
                "task {t}"
            );
        } else {
            assert!(moved.previous.is_empty(), "task {t} stayed");
        }
    }
    // Fed back unchanged, it settles with the same generation and lists.
    assert_eq!(next(Some(&b), &facts, p), b);
    // A later move drops b once it acknowledged the generation that moved the task.
    let mut facts = up(&["a", "c"]);
    facts[0].acknowledged = Some(b.generation);
    let c = next(Some(&b), &facts, p);
    assert!(
        c.tasks
            .values()
            .all(|t| t.previous.iter().all(|p| p.pod != "b")),
        "b is gone: it holds nothing back ({c:?})"
    );
}

#[test]
fn a_new_pod_warms_up_as_a_standby_before_it_takes_tasks_over() {
    let p = Params {
        tasks: 4,
        stages: 1,
        standby_replicas: 0,
        warmup_max_lag: 100,
    };
    let a = next(None, &up(&["a", "b"]), p);
    let mut facts = up(&["a", "b", "c"]);
    report(&a, &mut facts, 0);
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
fn a_task_whose_owner_reports_no_state_moves_without_waiting_for_a_warm_up() {
    let p = Params {
        tasks: 4,
        stages: 1,
        standby_replicas: 0,
        warmup_max_lag: 100,
    };
    let a = next(None, &up(&["a", "b"]), p);
    // Nobody reports state (a worker that keeps none, or does not report it): a
    // restore from the changelog is needed wherever the task runs.
    let b = settle(
        next(Some(&a), &up(&["a", "b", "c"]), p),
        &up(&["a", "b", "c"]),
        p,
    );
    assert_eq!(count(&b, "c"), 1, "c took its share at once: {b:?}");
    assert_eq!(count(&b, "a") + count(&b, "b"), 3, "{b:?}");
}

#[test]
fn an_assignment_that_tracked_no_previous_actives_names_every_pod_behind() {
    // From an older operator, or the floor after the ConfigMap was lost: where tasks
    // ran is unknown, so a pod that has not acknowledged it may run any of them.
    let p = Params {
        tasks: 4,
        stages: 1,
        standby_replicas: 0,
        warmup_max_lag: 0,
    };
    let mut old = next(None, &up(&["a", "b"]), p);
    old.tracks_previous = false;
    for tp in old.tasks.values_mut() {
        tp.previous.clear();
    }
    let mut facts = up(&["a", "b", "c"]);
    facts[0].acknowledged = Some(old.generation);
    facts[1].acknowledged = Some(old.generation - 1);
    let n = next(Some(&old), &facts, p);
    assert!(n.tracks_previous);
    assert_eq!(n.generation, old.generation + 1);
    for (t, tp) in &n.tasks {
        let mut want: Vec<&str> = Vec::new();
        if old.tasks[t].active != tp.active {
            want.push(&old.tasks[t].active);
        }
        if tp.active != "b" && !want.contains(&"b") {
            want.push("b");
        }
        if tp.active != "c" {
            want.push("c");
        }
        let got: Vec<&str> = tp.previous.iter().map(|p| p.pod.as_str()).collect();
        assert_eq!(got, want, "task {t}: {tp:?}");
    }
    // Once they acknowledged, a change drops them.
    for f in facts.iter_mut() {
        f.acknowledged = Some(n.generation);
    }
    facts.pop();
    let m = next(Some(&n), &facts, p);
    assert!(
        m.tasks
            .values()
            .all(|tp| tp.previous.iter().all(|p| p.until > n.generation))
    );
}

#[test]
fn with_no_eligible_pod_the_last_assignment_stands() {
    let p = Params {
        tasks: 2,
        stages: 1,
        standby_replicas: 0,
        warmup_max_lag: 0,
    };
    let a = next(None, &up(&["a"]), p);
    let down = vec![PodFacts {
        pod: "a".into(),
        ..Default::default()
    }];
    assert_eq!(next(Some(&a), &down, p), a);
}

#[test]
fn when_every_pod_drains_they_keep_their_tasks() {
    let p = Params {
        tasks: 3,
        stages: 1,
        standby_replicas: 1,
        warmup_max_lag: 0,
    };
    let a = next(None, &up(&["a", "b"]), p);
    let mut facts = up(&["a", "b"]);
    for f in &mut facts {
        f.draining = true;
    }
    let b = next(Some(&a), &facts, p);
    assert_eq!(actives(&b), actives(&a), "nowhere else to run them");
}

#[test]
fn a_new_pod_list_is_a_new_generation() {
    let p = Params {
        tasks: 2,
        stages: 1,
        standby_replicas: 0,
        warmup_max_lag: 0,
    };
    let mut facts = up(&["a"]);
    let a = next(None, &facts, p);
    facts.push(PodFacts {
        pod: "b".into(),
        ..Default::default()
    });
    let b = next(Some(&a), &facts, p);
    assert_eq!(b.tasks, a.tasks, "a pod that is not eligible gets nothing");
    assert_eq!(b.pods, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(
        b.generation,
        a.generation + 1,
        "but workers learn it exists"
    );
}

#[test]
fn the_assignment_round_trips_through_json_with_task_ids_as_keys() {
    let a = next(
        None,
        &up(&["a", "b"]),
        Params {
            tasks: 3,
            stages: 1,
            standby_replicas: 1,
            warmup_max_lag: 0,
        },
    );
    let text = serde_json::to_string(&a).expect("serializes");
    assert!(text.contains("\"0_0\":{\"active\":"), "{text}");
    // Written before tasks had stages: a bare partition is a stage-0 task.
    let old: Assignment =
        serde_json::from_str(&text.replace("\"0_0\"", "\"0\"")).expect("old form parses");
    assert_eq!(old, a);
    let back: Assignment = serde_json::from_str(&text).expect("parses");
    assert_eq!(back, a);
}

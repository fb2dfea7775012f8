//! Scaling in and draining: the leaving pods' tasks warm up elsewhere and move, and
//! tasks on the pods that stay never move.

use super::*;

#[test]
fn scaling_in_from_four_to_two_warms_up_then_empties_the_draining_pods() {
    let p = Params {
        tasks: 8,
        stages: 1,
        standby_replicas: 1,
        warmup_max_lag: 100,
    };
    let names = ["app-0", "app-1", "app-2", "app-3"];
    let mut facts = up(&names);
    let a = settle(next(None, &facts, p), &facts, p);
    for pod in names {
        assert_eq!(count(&a, pod), 2, "balanced before: {a:?}");
    }
    // Standbys are cold (lag 5000) when the scale-in starts.
    report(&a, &mut facts, 5000);
    facts[2].draining = true;
    facts[3].draining = true;
    let b = next(Some(&a), &facts, p);
    check(&b, &facts, p);
    assert_eq!(actives(&b), actives(&a), "no active moves to a cold copy");
    for (t, tp) in &b.tasks {
        assert!(
            tp.standbys.iter().all(|s| s == "app-0" || s == "app-1"),
            "task {t}: draining pods get no standby: {tp:?}"
        );
    }
    assert_eq!(
        b.tasks
            .iter()
            .filter(|(_, tp)| tp.active == "app-2" || tp.active == "app-3")
            .count(),
        4,
        "the draining pods keep running their tasks during the warm-up"
    );
    // Settled while cold: nothing moves until the copies catch up.
    let b = settle(b, &facts, p);
    assert_eq!(actives(&b), actives(&a));

    // The warming standbys catch up.
    for (t, tp) in &b.tasks {
        for s in &tp.standbys {
            if let Some(f) = facts.iter_mut().find(|f| &f.pod == s) {
                f.state_lag.insert(*t, 0);
            }
        }
    }
    let c = settle(next(Some(&b), &facts, p), &facts, p);
    check(&c, &facts, p);
    for pod in ["app-2", "app-3"] {
        assert_eq!(count(&c, pod), 0, "{pod} runs nothing: {c:?}");
        assert!(
            c.tasks
                .values()
                .all(|tp| !tp.standbys.iter().any(|s| s == pod)),
            "{pod} holds no standby: {c:?}"
        );
    }
    assert_eq!((count(&c, "app-0"), count(&c, "app-1")), (4, 4), "{c:?}");
    for (t, tp) in &a.tasks {
        if tp.active == "app-0" || tp.active == "app-1" {
            assert_eq!(
                c.tasks[t].active, tp.active,
                "task {t} was on a staying pod and stays"
            );
        }
    }
    assert!(c.generation > b.generation && b.generation > a.generation);
    assert!(
        c.active_pods()
            .iter()
            .all(|p| *p == "app-0" || *p == "app-1")
    );
}

#[test]
fn tasks_on_pods_that_stay_never_move_when_others_fail_or_drain() {
    let mut rng = Rng(0x2545f4914f6cdd1d);
    for _ in 0..500 {
        let p = Params {
            tasks: 1 + rng.below(24) as u32,
            stages: 1 + rng.below(3) as u32,
            standby_replicas: rng.below(3) as u32,
            warmup_max_lag: 100,
        };
        let n = 2 + rng.below(5) as usize;
        let names: Vec<String> = (0..n).map(|i| format!("app-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut facts = up(&refs);
        let a = settle(next(None, &facts, p), &facts, p);
        // Each pod knows only its own actives; some pods fail, some drain, one stays.
        report(&a, &mut facts, i64::MAX);
        for f in facts.iter_mut().skip(1) {
            match rng.below(3) {
                0 => f.eligible = false,
                1 => f.draining = true,
                _ => {}
            }
        }
        let b = settle(next(Some(&a), &facts, p), &facts, p);
        check(&b, &facts, p);
        for (t, tp) in &a.tasks {
            let stays = facts_of(&facts, &tp.active).is_some_and(|f| f.eligible && !f.draining);
            if stays {
                assert_eq!(
                    b.tasks[t].active, tp.active,
                    "task {t} was on a pod that stays and must not move: {a:?} -> {b:?}"
                );
            }
        }
    }
}

/// Three pods, 36 tasks and one standby each, settled from pods that came up one
/// after another (so the standby layout is uneven), every copy reported.
fn joined_one_by_one(first: &[&str], p: Params) -> (Assignment, Vec<PodFacts>) {
    let names = ["app-0", "app-1", "app-2"];
    let a = settle(next(None, &up(first), p), &up(first), p);
    let mut facts = up(&names);
    let mut a = settle(next(Some(&a), &facts, p), &facts, p);
    for _ in 0..8 {
        report(&a, &mut facts, 0);
        let n = settle(next(Some(&a), &facts, p), &facts, p);
        if n == a {
            break;
        }
        a = n;
    }
    (a, facts)
}

#[test]
fn a_drain_gives_the_tasks_that_stay_no_reason_to_move_even_with_warm_copies() {
    // The end-to-end scale-in: the drain's receivers follow the standbys, which were
    // not split evenly, so balancing used to hand a staying pod's task (its standby
    // warm on the other staying pod) over as well.
    let p = Params {
        tasks: 12,
        stages: 3,
        standby_replicas: 1,
        warmup_max_lag: 1000,
    };
    for first in [&["app-0"][..], &["app-1"], &["app-0", "app-2"]] {
        let (a, mut facts) = joined_one_by_one(first, p);
        // Cold standbys when the scale-in starts: nothing moves yet.
        report(&a, &mut facts, 5000);
        facts[2].draining = true;
        let b = settle(next(Some(&a), &facts, p), &facts, p);
        check(&b, &facts, p);
        assert_eq!(actives(&b), actives(&a), "{first:?}: copies are cold");
        // The copies catch up (every pod runs b): the draining pod's tasks move.
        report(&b, &mut facts, 0);
        let c = settle(next(Some(&b), &facts, p), &facts, p);
        check(&c, &facts, p);
        assert_eq!(count(&c, "app-2"), 0, "{first:?}: {c:?}");
        for (t, tp) in &a.tasks {
            if tp.active != "app-2" {
                assert_eq!(c.tasks[t].active, tp.active, "{first:?}: task {t} stays");
            }
        }
        assert_eq!((count(&c, "app-0"), count(&c, "app-1")), (18, 18), "{c:?}");
    }
}

#[test]
fn tasks_on_pods_that_stay_never_move_for_a_drain_even_with_warm_copies() {
    let mut rng = Rng(0x6a09e667f3bcc908);
    for _ in 0..300 {
        let p = Params {
            tasks: 1 + rng.below(24) as u32,
            stages: 1 + rng.below(3) as u32,
            standby_replicas: 1 + rng.below(2) as u32,
            warmup_max_lag: 100,
        };
        let n = 3 + rng.below(4) as usize;
        let names: Vec<String> = (0..n).map(|i| format!("app-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        // Some pods come up first, so the standbys are not laid out evenly.
        let early = 1 + rng.below(n as u64 - 1) as usize;
        let a = settle(next(None, &up(&refs[..early]), p), &up(&refs[..early]), p);
        let mut facts = up(&refs);
        let mut a = settle(next(Some(&a), &facts, p), &facts, p);
        report(&a, &mut facts, 0);
        a = settle(next(Some(&a), &facts, p), &facts, p);
        // The last pods drain, at least one stays; the copies are cold, then warm.
        let drain = 1 + rng.below(n as u64 - 1) as usize;
        report(&a, &mut facts, 5000);
        for f in facts.iter_mut().skip(n - drain) {
            f.draining = true;
        }
        let mut c = settle(next(Some(&a), &facts, p), &facts, p);
        // Each round, the copies placed last catch up.
        for _ in 0..4 {
            report(&c, &mut facts, 0);
            c = settle(next(Some(&c), &facts, p), &facts, p);
            check(&c, &facts, p);
            for (t, tp) in &a.tasks {
                let stays = facts_of(&facts, &tp.active).is_some_and(|f| !f.draining);
                assert!(
                    !stays || c.tasks[t].active == tp.active,
                    "task {t} was on a pod that stays: {a:?} -> {c:?}"
                );
            }
        }
        assert!(
            c.tasks
                .values()
                .all(|tp| facts_of(&facts, &tp.active).is_some_and(|f| !f.draining)),
            "the draining pods ran out of tasks: {c:?}"
        );
    }
}

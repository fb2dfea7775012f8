//! Hand-over never waits on an unrelated pod (issue 16, item 3). Pod A restores a big
//! task for a long time: it reports, but has not acknowledged the current assignment.
//! Pod B dies; its task moves to pod C. C must start it at once: A never ran B's task,
//! so A has nothing to release. (It used to hold back every new active task until its
//! restore ended.)
//!
//! Real parts: the local stack's API server and Kafka, the real `oxbow-worker` binary in
//! coordinated mode, exactly-once. The test plays the operator: it writes the
//! assignments, and lists only the pods that exist, as the operator does.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{TestNamespace, install_crd, kube_client, stack_var, unique, wait_for};
use oxbow_e2e::streams::{preload_task0_counts, produce, read_committed};
use oxbow_e2e::workers::{WorkerProc, assignment, placement as on, played_app, publish};

/// Group keys pre-loaded into task 0's changelog partition: a restore of several
/// seconds on the local stack, far longer than a hand-over between live pods.
const KEYS: usize = 2_000_000;

/// Pod `pod`'s report (its Lease): (acknowledged generation, records left to restore).
async fn entry(apps: &Api<StreamApp>, _app: &str, pod: &str) -> Option<(i64, i64)> {
    let ns = apps.namespace()?;
    let i = oxbow_e2e::reports::entry(&apps.clone().into_client(), ns, pod).await?;
    Some((
        i.assignment_generation.unwrap_or(0),
        i.restore_remaining.unwrap_or(0),
    ))
}

#[tokio::test]
async fn a_dead_pods_task_moves_at_once_while_an_unrelated_pod_is_still_restoring() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "handover").await;
    let played = played_app(&ns.name, &unique("handover"), "exactly_once", 3).await;
    let (app, source, dir, config) = (&played.name, &played.source, &played.dir, &played.config);
    let kubeconfig = stack_var("KUBECONFIG");
    let [a_pod, b_pod, c_pod] = [0, 1, 2].map(|i| format!("{app}-{i}"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let apps: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    let start =
        |pod: &str| WorkerProc::start(&ns.name, app, pod, config, dir, Path::new(&kubeconfig));

    // 1. Generation 1: task 0 on A, task 1 on B, task 2 on C. B and C start; A's task
    //    gets a big state in its changelog before A starts, so A restores for long.
    let everyone = [a_pod.as_str(), b_pod.as_str(), c_pod.as_str()];
    publish(
        &cms,
        app,
        &assignment(
            1,
            [on(&a_pod, &[]), on(&b_pod, &[]), on(&c_pod, &[])],
            &everyone,
        ),
    )
    .await;
    let mut b = start(&b_pod);
    let c = start(&c_pod);
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    produce(source, &keys, 2, 1);
    wait_for(
        "B and C to run their tasks",
        Duration::from_secs(90),
        || async {
            let (rb, rc) = (b.running(), c.running());
            (rb == ["0_1"] && rc == ["0_2"])
                .then_some(())
                .ok_or_else(|| format!("B {rb:?}, C {rc:?}\n--- B\n{}", b.logs()))
        },
    )
    .await;
    let t = Instant::now();
    preload_task0_counts(&ns.name, app, KEYS).await;
    println!(
        "pre-loaded {KEYS} keys into task 0's changelog in {:.1?}",
        t.elapsed()
    );
    let a = start(&a_pod);
    wait_for(
        "A to report a restore in its report",
        Duration::from_secs(60),
        || async {
            match entry(&apps, app, &a_pod).await {
                Some((acked, left)) if left > 0 && acked < 1 => Ok(()),
                other => Err(format!("A's entry: {other:?}\n--- A\n{}", a.logs())),
            }
        },
    )
    .await;

    // 2. B dies (SIGKILL: it releases nothing). Its pod is gone, so generation 2 no
    //    longer lists it, and moves its task to C.
    b.kill();
    let killed = Instant::now();
    publish(
        &cms,
        app,
        &assignment(
            2,
            [on(&a_pod, &[]), on(&c_pod, &[(&b_pod, 2)]), on(&c_pod, &[])],
            &[&a_pod, &c_pod],
        ),
    )
    .await;
    let took = wait_for(
        "C to run B's task as well as its own",
        Duration::from_secs(120),
        || async {
            let rc = c.running();
            (rc == ["0_1", "0_2"])
                .then(|| killed.elapsed())
                .ok_or_else(|| format!("C runs {rc:?}\n--- C\n{}", c.logs()))
        },
    )
    .await;
    // A was still restoring when C took the task over: C did not wait for it.
    let a_running = a.running();
    let a_entry = entry(&apps, app, &a_pod).await;
    println!(
        "C ran B's task {took:.1?} after B died; A then ran {a_running:?}, its entry (acked, left to restore): {a_entry:?}"
    );
    assert!(
        a_running.is_empty() && a_entry.is_some_and(|(acked, left)| acked < 2 && left > 0),
        "A had finished restoring before C took B's task over ({took:.1?} after B died): C waited for a pod that never ran the task. A runs {a_running:?}, entry {a_entry:?}\n--- C\n{}",
        c.logs()
    );
    assert!(
        took < Duration::from_secs(30),
        "C took B's task only {took:.1?} after B died"
    );

    // 3. A finishes its restore and acknowledges; all three tasks count on exactly once.
    wait_for(
        "A to run task 0 after its restore",
        Duration::from_secs(180),
        || async {
            let ra = a.running();
            (ra == ["0_0"])
                .then_some(())
                .ok_or_else(|| format!("A runs {ra:?}\n--- A\n{}", a.logs()))
        },
    )
    .await;
    produce(source, &keys, 2, 1);
    wait_for(
        "every key counted 4 times, each count once, in the committed output",
        Duration::from_secs(90),
        || async {
            let mut seen: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
            for (k, v) in read_committed(&format!("{app}-out")) {
                seen.entry(k)
                    .or_default()
                    .push(v["count"].as_i64().unwrap_or(-1));
            }
            let exact = seen.len() == keys.len() && seen.values().all(|c| c == &[1, 2, 3, 4]);
            exact.then_some(()).ok_or_else(|| format!("{seen:?}"))
        },
    )
    .await;
    drop((a, c));
    ns.delete().await;
}

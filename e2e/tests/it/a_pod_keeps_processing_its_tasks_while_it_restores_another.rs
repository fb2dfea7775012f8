//! A restore never pauses a pod's running tasks (issue 19, item 3). Pod A runs tasks 1
//! and 2. It is then given task 0, whose changelog holds millions of keys: a full
//! restore of several seconds. Records for A's running tasks must come out, committed,
//! while that restore is still going on (the restore used to run on the processing
//! loop's thread, which stopped A's running tasks for the whole restore), and every key
//! must be counted exactly once in the end.
//!
//! Real parts: the local stack's API server and Kafka, the real `oxbow-worker` binary in
//! coordinated mode, exactly-once. The test plays the operator: it writes the
//! assignments.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use oxbow_e2e::harness::{TestNamespace, install_crd, kube_client, stack_var, unique, wait_for};
use oxbow_e2e::streams::{preload_task0_counts, produce, read_committed};
use oxbow_e2e::workers::{WorkerProc, assignment, placement as on, played_app, publish};

/// Group keys pre-loaded into task 0's changelog partition: a restore of several
/// seconds on the local stack.
const KEYS: usize = 2_000_000;

/// The state of task `task` in `/v1/status`: (role, state, records left to restore).
fn task_state(w: &WorkerProc, task: &str) -> Option<(String, String, i64)> {
    let status = w.status()?;
    let t = status["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["task"] == task && t["role"] == "active")?
        .clone();
    Some((
        t["role"].as_str()?.to_string(),
        t["state"].as_str()?.to_string(),
        t["restore"]["remaining"].as_i64().unwrap_or(0),
    ))
}

/// Each key's counts in the committed output, in order.
fn committed_counts(sink: &str) -> BTreeMap<String, Vec<i64>> {
    let mut seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, v) in read_committed(sink) {
        seen.entry(k)
            .or_default()
            .push(v["count"].as_i64().unwrap_or(-1));
    }
    seen
}

#[tokio::test]
async fn a_pod_keeps_processing_its_running_tasks_while_it_restores_another() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "restore-beside").await;
    let played = played_app(&ns.name, &unique("beside"), "exactly_once", 3).await;
    let (app, source, sink) = (&played.name, &played.source, &played.sink);
    let kubeconfig = stack_var("KUBECONFIG");
    let [a_pod, gone_pod] = [0, 1].map(|i| format!("{app}-{i}"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

    // 1. Generation 1: tasks 1 and 2 on A; task 0 on a pod that never starts. Task 0's
    //    changelog gets a big state meanwhile.
    publish(
        &cms,
        app,
        &assignment(
            1,
            [on(&gone_pod, &[]), on(&a_pod, &[]), on(&a_pod, &[])],
            &[a_pod.as_str(), gone_pod.as_str()],
        ),
    )
    .await;
    let a = WorkerProc::start(
        &ns.name,
        app,
        &a_pod,
        &played.config,
        &played.dir,
        Path::new(&kubeconfig),
    );
    wait_for(
        "A to run tasks 1 and 2",
        Duration::from_secs(90),
        || async {
            let ra = a.running();
            (ra == ["0_1", "0_2"])
                .then_some(())
                .ok_or_else(|| format!("A runs {ra:?}\n--- A\n{}", a.logs()))
        },
    )
    .await;
    preload_task0_counts(&ns.name, app, KEYS).await;

    // 2. Generation 2: task 0 moves to A (its pod is gone), which restores it fully.
    publish(
        &cms,
        app,
        &assignment(
            2,
            [on(&a_pod, &[]), on(&a_pod, &[]), on(&a_pod, &[])],
            &[a_pod.as_str()],
        ),
    )
    .await;
    wait_for("A to restore task 0", Duration::from_secs(60), || async {
        match task_state(&a, "0_0") {
            Some((_, state, left)) if state == "Restoring" && left > 0 => Ok(()),
            other => Err(format!("task 0 on A: {other:?}\n--- A\n{}", a.logs())),
        }
    })
    .await;

    // 3. Records for every task while task 0 restores: those of tasks 1 and 2 come out
    //    committed before task 0 runs.
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let produced = Instant::now();
    produce(source, &keys, 1, 1);
    let (first_out, restoring_then) = wait_for(
        "A's running tasks to put out committed records while task 0 restores",
        Duration::from_secs(120),
        || async {
            let out = committed_counts(sink);
            let state = task_state(&a, "0_0");
            if !out.is_empty() {
                return Ok((produced.elapsed(), state));
            }
            Err(format!(
                "nothing committed yet; task 0 on A: {state:?}\n--- A\n{}",
                a.logs()
            ))
        },
    )
    .await;
    let restore_done = wait_for(
        "A to run task 0 after its restore",
        Duration::from_secs(180),
        || async {
            let ra = a.running();
            (ra == ["0_0", "0_1", "0_2"])
                .then(|| produced.elapsed())
                .ok_or_else(|| format!("A runs {ra:?}\n--- A\n{}", a.logs()))
        },
    )
    .await;
    println!(
        "first committed output {first_out:.2?} after the records were produced, while task 0 was {restoring_then:?}; task 0 running {restore_done:.2?} after"
    );
    assert!(
        restoring_then
            .as_ref()
            .is_some_and(|(_, state, _)| state == "Restoring"),
        "A's running tasks put nothing out until task 0's restore ended (first output {first_out:.2?} after producing, task 0 then {restoring_then:?}, running {restore_done:.2?} after): the restore stopped them"
    );

    // 4. Every key counted exactly once, task 0's keys after its restore.
    wait_for(
        "every key counted once in the committed output",
        Duration::from_secs(90),
        || async {
            let seen = committed_counts(sink);
            let exact = seen.len() == keys.len() && seen.values().all(|c| c == &[1]);
            exact.then_some(()).ok_or_else(|| format!("{seen:?}"))
        },
    )
    .await;
    drop(a);
    ns.delete().await;
}

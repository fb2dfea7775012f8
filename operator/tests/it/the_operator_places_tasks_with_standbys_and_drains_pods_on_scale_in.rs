//! Task placement end to end against the real API server: the operator publishes the
//! assignment ConfigMap (one active and `standbyReplicas` standbys per task, on distinct
//! pods), sums the workers' restore progress into `status.restoration` and `Restored`,
//! and on a scale-in keeps the pod going away until the pods taking its tasks over have
//! warmed up and it has let go.
//!
//! The workers are the stand-in image (it reports nothing); the test writes the
//! workers' report Leases itself, as the real worker does.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_crds::TaskId;
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_e2e::harness::{
    Deadline, OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl,
    unique, wait_for,
};
use serde_json::{Value, json};

const PARTITIONS: u32 = 12;
/// `apps::manifest` has three stages: the source, the dedupe by txId and the aggregate
/// by userId (each of the keyed steps behind its repartition topic).
const STAGES: u32 = 3;
const TASKS: u32 = PARTITIONS * STAGES;

async fn assignment(cms: &Api<ConfigMap>, app: &str) -> Result<Assignment, String> {
    let cm = cms
        .get_opt(&format!("{app}-assignment"))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no assignment ConfigMap yet")?;
    let text = cm
        .data
        .and_then(|d| d.get(CONFIG_MAP_KEY).cloned())
        .ok_or("no assignment.json")?;
    serde_json::from_str(&text).map_err(|e| format!("not an assignment: {e}: {text}"))
}

fn actives_of(a: &Assignment, pod: &str) -> Vec<TaskId> {
    a.tasks
        .iter()
        .filter(|(_, tp)| tp.active == pod)
        .map(|(t, _)| *t)
        .collect()
}

fn standbys_of(a: &Assignment, pod: &str) -> Vec<TaskId> {
    a.tasks
        .iter()
        .filter(|(_, tp)| tp.standbys.iter().any(|s| s == pod))
        .map(|(t, _)| *t)
        .collect()
}

/// A worker's status entry as the worker writes it: running what `a` gives it,
/// acknowledging `a`'s generation, its actives caught up and its standbys `standby_lag`
/// records behind. `fields` overrides or adds fields.
fn entry(pod: &str, a: &Assignment, standby_lag: i64, fields: Value) -> Value {
    let active = actives_of(a, pod);
    let standby = standbys_of(a, pod);
    let mut lag: BTreeMap<String, i64> = active.iter().map(|t| (t.to_string(), 0)).collect();
    lag.extend(standby.iter().map(|t| (t.to_string(), standby_lag)));
    let mut e = json!({
        "pod": pod, "state": "Running", "address": format!("{pod}:8080"),
        "activeTasks": active, "standbyTasks": standby, "stateLag": lag, "lag": 0,
        "assignmentGeneration": a.generation,
        "updatedAt": k8s_openapi::jiff::Timestamp::now().to_string(),
    });
    if let (Some(e), Some(extra)) = (e.as_object_mut(), fields.as_object()) {
        for (k, v) in extra {
            e.insert(k.clone(), v.clone());
        }
        // As the worker's serde does (skip_serializing_if): an applied empty map turns
        // into null on the server, which the schema refuses.
        e.retain(|_, v| {
            !(v.as_object().is_some_and(|o| o.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty()))
        });
    }
    e
}

/// Writes `entry` as pod `pod`'s worker would: its own report Lease.
async fn report(api: &Api<StreamApp>, _app: &str, pod: &str, entry: Value) {
    let ns = api.namespace().unwrap_or("default").to_string();
    oxbow_e2e::reports::write(&api.clone().into_client(), &ns, pod, entry).await;
}

/// Plays the workers in `pods` that run whatever is assigned: each time the published
/// generation changes, every one of them reports running it (caught up, acknowledged).
/// Returns once `check` passes on the StreamApp.
async fn run_workers_until<T>(
    api: &Api<StreamApp>,
    cms: &Api<ConfigMap>,
    name: &str,
    pods: &[String],
    what: &str,
    check: impl Fn(&StreamApp) -> Result<T, String>,
) -> T {
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut reported = None;
    loop {
        let last = match assignment(cms, name).await {
            Ok(a) if reported != Some(a.generation) => {
                for p in pods {
                    report(api, name, p, entry(p, &a, 0, json!({}))).await;
                }
                reported = Some(a.generation);
                format!("reported generation {}", a.generation)
            }
            Ok(_) => match api.get(name).await {
                Ok(app) => match check(&app) {
                    Ok(v) => return v,
                    Err(e) => e,
                },
                Err(e) => e.to_string(),
            },
            Err(e) => e,
        };
        deadline
            .next_poll_async(Duration::from_millis(200), || {
                format!("waiting for {what}; last observed: {last}")
            })
            .await;
    }
}

fn ready(app: &StreamApp) -> Result<(), String> {
    let current =
        app.status.as_ref().and_then(|s| s.observed_generation) == app.metadata.generation;
    match apps::condition(app, "Ready") {
        Some((s, _, _)) if s == "True" && current => Ok(()),
        other => Err(format!(
            "Ready: {other:?}, observedGeneration current: {current}"
        )),
    }
}

/// Checks that every task has one active among `pods` and `standbys` standbys on other,
/// distinct pods among `pods`.
fn well_placed(a: &Assignment, pods: &[String], standbys: usize) -> Result<(), String> {
    if a.tasks.len() != TASKS as usize {
        return Err(format!("{} tasks placed, want {TASKS}", a.tasks.len()));
    }
    for (t, tp) in &a.tasks {
        if !pods.contains(&tp.active) {
            return Err(format!(
                "task {t}: active {} is not one of {pods:?}",
                tp.active
            ));
        }
        let distinct: BTreeSet<&String> = tp.standbys.iter().collect();
        if tp.standbys.len() != standbys
            || distinct.len() != standbys
            || distinct.contains(&tp.active)
            || !tp.standbys.iter().all(|s| pods.contains(s))
        {
            return Err(format!(
                "task {t}: want {standbys} standbys on distinct pods other than the active: {tp:?}"
            ));
        }
    }
    Ok(())
}

async fn setup(prefix: &str) -> (kube::Client, TestNamespace, String, OperatorProcess) {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, prefix).await;
    let source = unique("events");
    kafka::create_topic(&source, PARTITIONS as i32).await;
    let operator = OperatorProcess::start(&ns.name);
    let name = unique("placed");
    let manifest = apps::manifest(&name, &[&source], "  standbyReplicas: 1\n")
        .replace("  replicas: 2\n", "  replicas: 3\n");
    let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    (client, ns, name, operator)
}

/// Waits for a balanced assignment over `pods` (as many actives on each, give or take
/// one) with one standby per task.
async fn wait_balanced(cms: &Api<ConfigMap>, name: &str, pods: &[String]) -> Assignment {
    wait_for(
        &format!("a balanced assignment over {pods:?} with one standby per task"),
        Duration::from_secs(90),
        || async {
            let a = assignment(cms, name).await?;
            well_placed(&a, pods, 1)?;
            let counts: Vec<usize> = pods.iter().map(|p| actives_of(&a, p).len()).collect();
            let (lo, hi) = (
                counts.iter().min().copied().unwrap_or(0),
                counts.iter().max().copied().unwrap_or(0),
            );
            if hi > lo + 1 || a.pods.len() != pods.len() {
                return Err(format!(
                    "actives per pod {counts:?}, pods listed {:?}",
                    a.pods
                ));
            }
            Ok(a)
        },
    )
    .await
}

#[tokio::test]
async fn every_task_gets_one_active_and_its_standbys_on_distinct_pods() {
    let (client, ns, name, operator) = setup("placement").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let pods: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    let a = wait_balanced(&cms, &name, &pods).await;
    for p in &pods {
        assert_eq!(
            actives_of(&a, p).len(),
            TASKS as usize / 3,
            "{TASKS} tasks over 3 pods: {a:?}"
        );
    }
    // Owned and labelled like every child, so it goes with the app.
    let cm = cms.get(&format!("{name}-assignment")).await.expect("cm");
    let owner = cm.metadata.owner_references.unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "StreamApp" && o.name == name && o.controller == Some(true)),
        "{owner:?}"
    );
    // The workers are told where to find it.
    let sts: StatefulSet = Api::namespaced(client.clone(), &ns.name)
        .get(&name)
        .await
        .expect("sts");
    let env = serde_json::to_value(
        sts.spec
            .expect("spec")
            .template
            .spec
            .expect("pod")
            .containers,
    )
    .expect("json");
    assert!(
        env[0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "OXBOW_ASSIGNMENT_CONFIGMAP"
                && e["value"] == format!("{name}-assignment")),
        "{env}"
    );
    // Nothing changes while nothing changes: the generation stays.
    let again = assignment(&cms, &name).await.expect("assignment");
    assert_eq!(again.generation, a.generation, "{again:?}");

    let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    apps::delete_all(&api).await;
    drop(operator);
    ns.delete().await;
}

#[tokio::test]
async fn restore_progress_reaches_the_status_and_a_scale_in_waits_for_warm_standbys() {
    let (client, ns, name, operator) = setup("drain").await;
    let n = ns.name.as_str();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), n);
    let pods: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    let a = wait_balanced(&cms, &name, &pods).await;

    // --- Restore progress: pod 0 restores, the others run.
    report(
        &api,
        &name,
        &pods[0],
        entry(
            &pods[0],
            &a,
            5000,
            json!({"state": "Restoring", "restored": 600, "restoreRemaining": 400,
                   "restoreTotal": 1000, "restoreRate": 100}),
        ),
    )
    .await;
    for p in &pods[1..] {
        report(&api, &name, p, entry(p, &a, 5000, json!({"restored": 500}))).await;
    }
    let app = wait_for(
        "Restored=False with the progress and ETA",
        Duration::from_secs(60),
        || async {
            let app = api.get(&name).await.map_err(|e| e.to_string())?;
            // Restored turns False on the first restoring report; the figures below
            // need every pod's report aggregated, which can take another reconcile.
            let total = app
                .status
                .as_ref()
                .and_then(|s| s.restoration.as_ref())
                .map(|r| r.total_records);
            match apps::condition(&app, "Restored") {
                Some((s, r, m)) if s == "False" && r == "Restoring" && total == Some(2000) => {
                    Ok((app, m))
                }
                other => Err(format!("Restored: {other:?}, total records {total:?}")),
            }
        },
    )
    .await;
    let (app, message) = app;
    let status = app.status.expect("status");
    let r = status.restoration.expect("restoration");
    assert_eq!((r.restored_records, r.total_records), (1600, 2000));
    assert_eq!(r.percent, "80%");
    assert_eq!((r.records_per_second, r.eta_seconds), (Some(100), Some(4)));
    assert!(r.tasks_restoring >= 1, "{r:?}");
    assert!(
        message.contains(&pods[0]) && message.contains("ETA 4s"),
        "{message}"
    );
    assert_eq!(format!("{:?}", status.phase), "Some(Restoring)");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False"),
        "not Ready while restoring: {:?}",
        status.conditions
    );

    // Restored: Ready once every worker runs the assignment.
    report(
        &api,
        &name,
        &pods[0],
        entry(&pods[0], &a, 5000, json!({"restored": 1000})),
    )
    .await;
    run_workers_until(&api, &cms, &name, &pods, "Ready after the restore", ready).await;
    // Standbys are cold again (5000 behind, over the default warm-up bound of 1000).
    let a = assignment(&cms, &name).await.expect("assignment");
    for p in &pods {
        report(&api, &name, p, entry(p, &a, 5000, json!({}))).await;
    }

    // --- Scale in to 2: the last pod drains. Its tasks' standbys are cold, so nothing
    // moves yet.
    let (ok, _, err) = kubectl(
        &[
            "scale",
            "-n",
            n,
            &format!("streamapp/{name}"),
            "--replicas=2",
        ],
        None,
    );
    assert!(ok, "kubectl scale: {err}");
    let staying = &pods[..2];
    let leaving = &pods[2];
    let b = wait_for(
        "an assignment with the leaving pod's tasks warming up on the staying pods",
        Duration::from_secs(60),
        || async {
            let b = assignment(&cms, &name).await?;
            let warming = actives_of(&b, leaving)
                .iter()
                .all(|t| b.tasks[t].standbys.iter().any(|s| staying.contains(s)));
            if b.generation > a.generation && standbys_of(&b, leaving).is_empty() && warming {
                Ok(b)
            } else {
                Err(format!("{b:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        actives_of(&b, leaving),
        actives_of(&a, leaving),
        "the leaving pod keeps running its tasks while the copies are cold"
    );
    let app = apps::wait_condition(
        &api,
        &name,
        "WorkloadReady",
        "False",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        apps::condition(&app, "WorkloadReady")
            .map(|c| c.1)
            .as_deref(),
        Some("Draining")
    );
    let sts = sts_api.get(&name).await.expect("sts");
    assert_eq!(
        sts.spec.and_then(|s| s.replicas),
        Some(3),
        "the StatefulSet keeps the draining pod"
    );
    assert_eq!(
        app.status.as_ref().map(|s| s.replicas),
        Some(3),
        "status.replicas counts the pods that exist"
    );

    // The staying pods acknowledge and warm up (lag 0); the leaving pod acknowledges too.
    for p in pods.iter() {
        report(&api, &name, p, entry(p, &b, 0, json!({}))).await;
    }
    let c = wait_for(
        "the leaving pod's tasks to move to the warm copies",
        Duration::from_secs(60),
        || async {
            let c = assignment(&cms, &name).await?;
            if actives_of(&c, leaving).is_empty() && standbys_of(&c, leaving).is_empty() {
                Ok(c)
            } else {
                Err(format!("{c:?}"))
            }
        },
    )
    .await;
    well_placed(&c, staying, 1).expect("placed on the staying pods");
    for p in staying {
        for t in actives_of(&a, p) {
            assert_eq!(
                c.tasks[&t].active, *p,
                "task {t} was on a staying pod and stays"
            );
        }
    }
    // The leaving pod still reports its actives: it has not let go, so it stays.
    let sts = sts_api.get(&name).await.expect("sts");
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(3));
    // It lets go (acknowledging with no actives); then the StatefulSet shrinks.
    for p in pods.iter() {
        report(&api, &name, p, entry(p, &c, 0, json!({}))).await;
    }
    wait_for(
        "the StatefulSet to shrink to 2 and the leaving pod to go",
        Duration::from_secs(90),
        || async {
            let sts = sts_api.get(&name).await.map_err(|e| e.to_string())?;
            let replicas = sts.spec.and_then(|s| s.replicas);
            let pod = Api::<Pod>::namespaced(client.clone(), n)
                .get_opt(leaving)
                .await
                .map_err(|e| e.to_string())?;
            if replicas == Some(2) && pod.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "replicas {replicas:?}, pod exists: {}",
                    pod.is_some()
                ))
            }
        },
    )
    .await;
    // The staying pods run the latest generation; the leaving pod's entry and its report
    // Lease are gone with it.
    run_workers_until(&api, &cms, &name, staying, "Ready at 2 replicas", |app| {
        ready(app)?;
        let s = app.status.as_ref().ok_or("no status")?;
        let pods: Vec<&str> = s.instances.iter().map(|i| i.pod.as_str()).collect();
        if (s.replicas, s.ready_replicas) == (2, 2) && !pods.contains(&leaving.as_str()) {
            Ok(())
        } else {
            Err(format!(
                "replicas {}, ready {}, entries of {pods:?}",
                s.replicas, s.ready_replicas
            ))
        }
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), n);
    wait_for(
        "the leaving pod's report Lease to be deleted",
        Duration::from_secs(30),
        || async {
            match leases
                .get_opt(&oxbow_crds::report::lease_name(leaving))
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        },
    )
    .await;

    apps::delete_all(&api).await;
    drop(operator);
    ns.delete().await;
}

/// An app whose Kafka Secret is gone, so the operator cannot read the source metadata,
/// after it ran Ready at 3 replicas with one standby per task: its workers are played
/// by the test (`pods`).
struct WithoutKafka {
    ns: TestNamespace,
    _operator: OperatorProcess,
    api: Api<StreamApp>,
    cms: Api<ConfigMap>,
    name: String,
    pods: Vec<String>,
}

async fn without_kafka(prefix: &str, operator_args: &[&str]) -> WithoutKafka {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, prefix).await;
    let n = ns.name.as_str();
    let source = unique("events");
    kafka::create_topic(&source, PARTITIONS as i32).await;
    let secret = unique("kafka-creds");
    let (ok, _, err) = kubectl(
        &[
            "create",
            "secret",
            "generic",
            &secret,
            "-n",
            n,
            "--from-literal=client.id=oxbow-test",
        ],
        None,
    );
    assert!(ok, "create secret: {err}");
    let operator = OperatorProcess::start_with(n, operator_args);
    let name = unique("placed");
    let manifest = apps::manifest(&name, &[&source], "  standbyReplicas: 1\n")
        .replace("  replicas: 2\n", "  replicas: 3\n")
        .replace(
            "  kafka:\n",
            &format!("  kafka:\n    secretRef: {{name: {secret}}}\n"),
        );
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), n);
    let pods: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    run_workers_until(&api, &cms, &name, &pods, "Ready at 3 replicas", ready).await;

    let (ok, _, err) = kubectl(&["delete", "secret", &secret, "-n", n], None);
    assert!(ok, "delete secret: {err}");
    run_workers_until(
        &api,
        &cms,
        &name,
        &pods,
        "KafkaSecretMissing",
        |app| match apps::condition(app, "TopicsReady") {
            Some((s, r, _)) if s == "False" && r == "KafkaSecretMissing" => Ok(()),
            other => Err(format!("TopicsReady {other:?}")),
        },
    )
    .await;
    WithoutKafka {
        ns,
        _operator: operator,
        api,
        cms,
        name,
        pods,
    }
}

/// Issue 16, item 4: placement does not need Kafka. With the app's Kafka Secret gone the
/// operator cannot read the source metadata, yet a scale-in still drains the leaving
/// pod, on the task count the published assignment already holds.
#[tokio::test]
async fn a_scale_in_drains_the_leaving_pod_while_the_operator_cannot_read_kafka() {
    let w = without_kafka("nokafka", &[]).await;
    let (n, api, cms, name, pods) = (w.ns.name.as_str(), &w.api, &w.cms, &w.name, &w.pods);
    let (ok, _, err) = kubectl(
        &[
            "scale",
            "-n",
            n,
            &format!("streamapp/{name}"),
            "--replicas=2",
        ],
        None,
    );
    assert!(ok, "kubectl scale: {err}");
    // Every pod keeps reporting what it is given, caught up: the leaving pod's tasks
    // warm up on the staying pods, move, and it is left with nothing.
    let leaving = pods[2].clone();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut reported = None;
    loop {
        let a = assignment(cms, name).await.expect("assignment");
        if actives_of(&a, &leaving).is_empty() && standbys_of(&a, &leaving).is_empty() {
            assert_eq!(
                a.tasks.len(),
                TASKS as usize,
                "every task still placed: {a:?}"
            );
            break;
        }
        if reported != Some(a.generation) {
            for p in pods {
                report(api, name, p, entry(p, &a, 0, json!({}))).await;
            }
            reported = Some(a.generation);
        }
        deadline
            .next_poll_async(Duration::from_millis(200), || {
                format!(
                    "after the scale-in without Kafka, {leaving} still holds {:?} (generation {})",
                    actives_of(&a, &leaving),
                    a.generation
                )
            })
            .await;
    }
    apps::delete_all(api).await;
    w.ns.delete().await;
}

/// Plays pods 0 and 1 reporting every second, as workers do, until `silent` holds no
/// active task (at most 45 s); returns that assignment.
async fn loses_its_actives(w: &WithoutKafka, silent: &str, how: &str) -> Assignment {
    let (api, cms, name) = (&w.api, &w.cms, &w.name);
    let deadline = Deadline::after(Duration::from_secs(45));
    let mut reported = std::time::Instant::now();
    loop {
        let a = assignment(cms, name).await.expect("assignment");
        if actives_of(&a, silent).is_empty() {
            return a;
        }
        if reported.elapsed() >= Duration::from_secs(1) {
            for p in &w.pods[..2] {
                report(api, name, p, entry(p, &a, 0, json!({}))).await;
            }
            reported = std::time::Instant::now();
        }
        deadline
            .next_poll_async(Duration::from_millis(200), || {
                format!(
                    "after {silent} went silent {how}, it still holds {:?} (generation {})",
                    actives_of(&a, silent),
                    a.generation
                )
            })
            .await;
    }
}

/// Issue 16, item 2, on the operator's side: a pod's report is judged by when the
/// operator saw its renewal change, not by the time the pod's clock wrote into it. A pod
/// whose clock runs an hour ahead and then goes silent loses its actives within the
/// failover timeout.
#[tokio::test]
async fn a_silent_pod_whose_clock_runs_ahead_still_fails_over() {
    let w = without_kafka("clock-ahead", &["--failover-timeout", "5s"]).await;
    let (api, cms, name) = (&w.api, &w.cms, &w.name);
    let ahead = w.pods[2].clone();
    let before = assignment(cms, name).await.expect("assignment");
    assert!(
        !actives_of(&before, &ahead).is_empty(),
        "{ahead} runs tasks before it goes silent: {before:?}"
    );
    // Its last renewal, written by a clock an hour ahead: judged by that time, it would
    // look fresh for an hour.
    let future = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(1))
        .expect("an hour ahead");
    let ns = api.namespace().unwrap_or("default").to_string();
    oxbow_e2e::reports::write_at(
        &api.clone().into_client(),
        &ns,
        &ahead,
        entry(&ahead, &before, 0, json!({})),
        Some(future),
    )
    .await;
    loses_its_actives(&w, &ahead, "with its clock an hour ahead").await;
    apps::delete_all(api).await;
    w.ns.delete().await;
}

/// Issue 16, item 4: without Kafka the operator still fails tasks over. A pod that stops
/// reporting (dead, or wedged while its readiness passes) loses its actives to their
/// standbys within the failover timeout, on the task count the assignment holds.
#[tokio::test]
async fn a_silent_pods_tasks_fail_over_while_the_operator_cannot_read_kafka() {
    let w = without_kafka("nokafka-fo", &["--failover-timeout", "5s"]).await;
    let (api, cms, name) = (&w.api, &w.cms, &w.name);
    let silent = w.pods[2].clone();
    let before = assignment(cms, name).await.expect("assignment");
    assert!(
        !actives_of(&before, &silent).is_empty(),
        "{silent} runs tasks before it goes silent: {before:?}"
    );
    let a = loses_its_actives(&w, &silent, "without Kafka").await;
    assert_eq!(
        a.tasks.len(),
        TASKS as usize,
        "every task still placed: {a:?}"
    );
    apps::delete_all(api).await;
    w.ns.delete().await;
}

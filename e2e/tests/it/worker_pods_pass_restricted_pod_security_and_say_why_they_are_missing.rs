//! Worker pods in a shared cluster (issue 17, item 6). In a namespace that enforces the
//! `restricted` Pod Security Standard, the real API server's admission refuses any pod
//! that is not: an app still runs to Ready there. And a pod the StatefulSet controller
//! cannot create (here a ResourceQuota) shows in the app's conditions with the
//! controller's message, instead of a silent "1/2 worker pods ready".

use std::time::Duration;

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl,
    requires_local_stack, unique, wait_for,
};
use oxbow_e2e::streams::{CountingApp, produce, read_committed};

async fn apply(ns: &str, replicas: i32) -> CountingApp {
    let source = unique("events");
    kafka::create_topic(&source, 2).await;
    let app = CountingApp::new(&unique("count"), &source)
        .replicas(replicas)
        .standbys(0);
    kafka::create_topic(&app.sink(), 2).await;
    let (ok, _, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(&app.manifest()));
    assert!(ok, "apply: {err}");
    app
}

#[tokio::test]
async fn an_app_runs_to_ready_in_a_namespace_that_enforces_the_restricted_standard() {
    if requires_local_stack("Pod Security admission is the local API server's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "restricted").await;
    let (ok, _, err) = kubectl(
        &[
            "label",
            "namespace",
            &ns.name,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    assert!(ok, "label: {err}");
    // Admission is on: a pod without the restricted settings is refused.
    let (ok, _, err) = kubectl(
        &[
            "run",
            "plain",
            "-n",
            &ns.name,
            "--image=oxbow-worker:test",
            "--restart=Never",
        ],
        None,
    );
    assert!(
        !ok && err.contains("violates PodSecurity \"restricted"),
        "a plain pod was not refused by Pod Security admission: {err}"
    );
    let operator = OperatorProcess::start(&ns.name);
    let app = apply(&ns.name, 1).await;
    let (ok, out, err) = kubectl(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            &format!("streamapp/{}", app.name),
            "--timeout=180s",
        ],
        None,
    );
    let (_, events, _) = kubectl(&["get", "events", "-n", &ns.name], None);
    assert!(
        ok,
        "not Ready under restricted: {out}{err}\n{events}\n{}",
        operator.logs()
    );
    let keys: Vec<String> = (0..10).map(|i| format!("user-{i}")).collect();
    produce(&app.source, &keys, 2, 1);
    wait_for(
        "every key counted twice in the committed output",
        Duration::from_secs(60),
        || async {
            let rows = read_committed(&app.sink());
            let done = keys
                .iter()
                .all(|k| rows.iter().any(|(rk, v)| rk == k && v["count"] == 2));
            done.then_some(())
                .ok_or_else(|| format!("{} rows", rows.len()))
        },
    )
    .await;
    apps::delete_all(&Api::<StreamApp>::namespaced(client, &ns.name)).await;
    ns.delete().await;
}

#[tokio::test]
async fn a_worker_pod_a_quota_refuses_shows_in_the_apps_conditions_with_the_reason() {
    if requires_local_stack("quota admission is the local API server's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "quota").await;
    let quota = r#"{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}"#;
    let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(quota));
    assert!(ok, "quota: {err}");
    let operator = OperatorProcess::start(&ns.name);
    let app = apply(&ns.name, 2).await;
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    let message = wait_for(
        "WorkloadReady to say PodCreationFailed, quoting the quota",
        Duration::from_secs(120),
        || async {
            let a = api.get(&app.name).await.map_err(|e| e.to_string())?;
            let stalled = apps::condition(&a, "Stalled");
            match apps::condition(&a, "WorkloadReady") {
                Some((s, r, m)) if s == "False" && r == "PodCreationFailed" => Ok((m, stalled)),
                other => Err(format!("{other:?}\n{}", operator.logs())),
            }
        },
    )
    .await;
    println!("{message:?}");
    let (m, stalled) = message;
    assert!(
        m.starts_with("1/2 worker pods exist") && m.contains("exceeded quota: one-pod"),
        "the message does not quote the quota: {m}"
    );
    assert_eq!(
        stalled.map(|(s, r, _)| (s, r)),
        Some(("True".to_string(), "PodCreationFailed".to_string())),
        "the app is not Stalled on the missing pod"
    );
    apps::delete_all(&api).await;
    ns.delete().await;
}

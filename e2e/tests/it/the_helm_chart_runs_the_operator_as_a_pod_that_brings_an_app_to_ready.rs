//! `helm install` of `charts/oxbow` on the local stack: the operator runs as a pod under
//! the chart's ServiceAccount and least-privilege RBAC (a namespaced Role, since it
//! watches one namespace), takes the leader Lease, and brings a StreamApp that names no
//! image to Ready on the chart's worker image, with the per-app NetworkPolicy; records
//! flow through exactly once; then the app is deleted through the operator's finalizer
//! and `helm uninstall` removes the operator.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    TestNamespace, apps, helm, install_crd, kafka, kube_client, kubectl, requires_local_stack,
    unique, wait_for, wait_streamapp_ready, workspace_root,
};
use oxbow_e2e::streams::{CountingApp, keys, produce, wait_exactly_once};

const SELECTOR: &str = "app.kubernetes.io/name=oxbow,app.kubernetes.io/component=operator";

/// The operator pod's last log lines, through the kubelet, for failure messages.
fn operator_logs(ns: &str, pod: &str) -> String {
    let (ok, out, err) = kubectl(&["logs", "-n", ns, pod, "--tail", "40"], None);
    if ok {
        out
    } else {
        format!("(kubectl logs {ns}/{pod} failed: {err})")
    }
}

#[tokio::test]
async fn the_chart_runs_the_operator_as_a_pod_that_brings_an_app_to_ready() {
    if requires_local_stack(
        "e2e/kind/run.sh installs the chart cluster-wide; a second operator would share the namespace",
    ) {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "helm").await;
    let release = unique("oxbow");
    let chart = workspace_root()
        .join("charts/oxbow")
        .to_string_lossy()
        .into_owned();
    let watch = format!("watchNamespace={}", ns.name);
    let (ok, out, err) = helm(&[
        "install",
        &release,
        &chart,
        "--namespace",
        &ns.name,
        "--skip-crds",
        "--set",
        &watch,
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "operator.resyncInterval=3s",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let operator_pod = || async {
        pods.list(&ListParams::default().labels(SELECTOR))
            .await
            .ok()
            .and_then(|l| l.items.into_iter().next())
    };
    let pod = operator_pod().await;
    let pod_name = pod
        .as_ref()
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or_default();
    assert!(
        ok,
        "helm install failed: {err}{out}\noperator log:\n{}",
        operator_logs(&ns.name, &pod_name)
    );
    let pod = pod.expect("an operator pod");
    let spec = pod.spec.as_ref().expect("pod spec");
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some(release.as_str()),
        "the operator runs under the chart's ServiceAccount (named after a release that contains the chart's name)"
    );

    // It elected itself leader on the Lease in its own namespace.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    wait_for(
        "the operator pod to hold the oxbow-operator Lease",
        Duration::from_secs(60),
        || async {
            let holder = leases
                .get_opt("oxbow-operator")
                .await
                .map_err(|e| e.to_string())?
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity);
            if holder.as_deref() == Some(pod_name.as_str()) {
                Ok(())
            } else {
                Err(format!("holder {holder:?}"))
            }
        },
    )
    .await;

    // An app that names no image runs on the chart's worker image.
    let source = unique("events");
    kafka::create_topic(&source, 4).await;
    let app = CountingApp::new(&unique("count"), &source)
        .replicas(2)
        .standbys(0);
    kafka::create_topic(&app.sink(), 4).await;
    let manifest = app.manifest().replace("  image: oxbow-worker:test\n", "");
    assert!(!manifest.contains("image:"), "the manifest names no image");
    let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    if let Err(e) = wait_streamapp_ready(&ns.name, &app.name, "180s") {
        panic!(
            "the app did not become Ready under the chart's operator: {e}\noperator log:\n{}",
            operator_logs(&ns.name, &pod_name)
        );
    }
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let image = sts
        .get(&app.name)
        .await
        .expect("the worker StatefulSet")
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers[0].image.clone().unwrap_or_default())
        .unwrap_or_default();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(image, format!("ghcr.io/oxbow/oxbow-worker:{version}"));
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns.name);
    let np = policies
        .get(&app.name)
        .await
        .expect("the app's NetworkPolicy (networkPolicy.enabled=true)");
    let labels = np
        .spec
        .and_then(|s| s.pod_selector.and_then(|p| p.match_labels))
        .unwrap_or_default();
    assert_eq!(
        labels.get("oxbow.dev/streamapp").map(String::as_str),
        Some(app.name.as_str()),
        "the policy selects the app's pods"
    );

    // Records go through the workers exactly once.
    let ks = keys(20);
    produce(&source, &ks, 3, 5);
    wait_exactly_once(&app.sink(), &ks, 3).await;

    // Deletion goes through the pod operator's finalizer, then the release goes.
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    apps::delete_and_wait(&api, &app.name).await;
    let (ok, out, err) = helm(&[
        "uninstall",
        &release,
        "--namespace",
        &ns.name,
        "--wait",
        "--timeout",
        "60s",
    ]);
    assert!(ok, "helm uninstall failed: {err}{out}");
    wait_for(
        "the operator pod to go after helm uninstall",
        Duration::from_secs(60),
        || async {
            match operator_pod().await {
                None => Ok(()),
                Some(p) => Err(format!("{:?} still there", p.metadata.name)),
            }
        },
    )
    .await;
    ns.delete().await;
}

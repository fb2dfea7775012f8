//! The worker's ServiceAccount, impersonated from the admin kubeconfig, can renew its
//! app's report Leases (and the operator aggregates them into `status.instances`); it
//! can read its two ConfigMaps. It is refused every status write, another app's report
//! Lease, creating Leases, Events, Secrets and Pods.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use oxbow_crds::StreamApp;
use oxbow_crds::report::lease_name;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, stack_var,
    unique, wait_for,
};
use serde_json::json;

/// A client that acts as `user` (impersonation by the admin identity of the stack).
async fn client_as(user: &str) -> kube::Client {
    let path = stack_var("KUBECONFIG");
    let kc = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("failed to read kubeconfig {path}: {e}"));
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("failed to load kubeconfig {path}: {e}"));
    cfg.auth_info.impersonate = Some(user.into());
    kube::Client::try_from(cfg).expect("impersonating client")
}

fn assert_forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: want 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn the_worker_service_account_renews_its_apps_report_leases_and_nothing_else() {
    install_crd();
    let admin = kube_client().await;
    let ns = TestNamespace::create(&admin, "worker-rbac").await;
    let n = ns.name.as_str();
    let source = unique("events");
    kafka::create_topic(&source, 2).await;
    let operator = OperatorProcess::start(n);

    let name = unique("rbac");
    let other = unique("other");
    for app in [&name, &other] {
        let (ok, _, err) = kubectl(
            &["apply", "-n", n, "-f", "-"],
            Some(&apps::manifest(app, &[&source], "")),
        );
        assert!(ok, "apply {app}: {err}");
    }
    let sa = format!("{name}-worker");
    let roles: Api<Role> = Api::namespaced(admin.clone(), n);
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), n);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), n);
    wait_for(
        "the worker Role, RoleBinding and both ConfigMaps",
        Duration::from_secs(60),
        || async {
            let role = roles.get_opt(&sa).await.map_err(|e| e.to_string())?;
            let rb = bindings.get_opt(&sa).await.map_err(|e| e.to_string())?;
            let cfg = cms
                .get_opt(&format!("{name}-config"))
                .await
                .map_err(|e| e.to_string())?;
            let asg = cms
                .get_opt(&format!("{name}-assignment"))
                .await
                .map_err(|e| e.to_string())?;
            match (role, rb, cfg, asg) {
                (Some(_), Some(_), Some(_), Some(_)) => Ok(()),
                other => Err(format!(
                    "role/binding/config/assignment present: {:?}",
                    (
                        other.0.is_some(),
                        other.1.is_some(),
                        other.2.is_some(),
                        other.3.is_some()
                    )
                )),
            }
        },
    )
    .await;

    let worker = client_as(&format!("system:serviceaccount:{n}:{sa}")).await;
    let pod = format!("{name}-0");
    let admin_apps: Api<StreamApp> = Api::namespaced(admin.clone(), n);
    let entry = |state: &str, error: Option<&str>| {
        let mut e = json!({
            "pod": pod, "state": state, "address": format!("{pod}.{name}-workers:8080"),
            "activeTasks": ["0_0"],
        });
        if let Some(err) = error {
            e["lastError"] = json!(err);
        }
        e
    };

    // Its own report: allowed, and the operator aggregates it into status.instances.
    oxbow_e2e::reports::write(&worker, n, &pod, entry("Running", None)).await;
    // The operator reacts to a failed report (Ready False, naming the pod and error).
    oxbow_e2e::reports::write(
        &worker,
        n,
        &pod,
        entry("Failed", Some("store seen: disk full")),
    )
    .await;
    let app = wait_for(
        "the operator to report the failed worker",
        Duration::from_secs(60),
        || async {
            let app = admin_apps.get(&name).await.map_err(|e| e.to_string())?;
            match apps::condition(&app, "Ready") {
                Some((s, r, m)) if s == "False" && r == "TaskFailed" => {
                    assert!(
                        m.contains(&pod) && m.contains("store seen: disk full"),
                        "the message names the pod and its error: {m}"
                    );
                    Ok(app)
                }
                other => Err(format!("Ready: {other:?}")),
            }
        },
    )
    .await;
    let aggregated = app
        .status
        .as_ref()
        .and_then(|s| s.instances.iter().find(|i| i.pod == pod).cloned())
        .expect("the operator aggregated the report into status.instances");
    assert_eq!(aggregated.state.as_deref(), Some("Failed"));
    assert_eq!(aggregated.active_tasks, vec!["0_0".to_string()]);
    assert!(aggregated.updated_at.is_some(), "the renewal time is shown");
    // Back to Running, so the app can be Ready again (and be deleted cleanly).
    oxbow_e2e::reports::write(&worker, n, &pod, entry("Running", None)).await;

    // No status write at all, not even its own app's.
    let as_worker: Api<StreamApp> = Api::namespaced(worker.clone(), n);
    assert_forbidden(
        "its own StreamApp's status",
        as_worker
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"instances": [{"pod": pod, "state": "Running"}]}})),
            )
            .await,
    );
    let worker_leases: Api<Lease> = Api::namespaced(worker.clone(), n);
    assert_forbidden(
        "another app's report Lease",
        worker_leases
            .patch(
                &lease_name(&format!("{other}-0")),
                &PatchParams::default(),
                &Patch::Merge(oxbow_e2e::reports::patch(&format!("{other}-0"), &json!({}))),
            )
            .await,
    );
    let stray: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease_name(&format!("{name}-9"))}, "spec": {},
    }))
    .expect("lease");
    assert_forbidden(
        "creating a Lease",
        worker_leases.create(&PostParams::default(), &stray).await,
    );
    let event: Event = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.forged")},
        "involvedObject": {"kind": "StreamApp", "name": name, "namespace": n},
        "reason": "Forged", "message": "a worker may not write events",
    }))
    .expect("event");
    assert_forbidden(
        "creating an Event",
        Api::<Event>::namespaced(worker.clone(), n)
            .create(&PostParams::default(), &event)
            .await,
    );

    // Its two ConfigMaps: readable.
    let worker_cms: Api<ConfigMap> = Api::namespaced(worker.clone(), n);
    for cm in [format!("{name}-config"), format!("{name}-assignment")] {
        worker_cms
            .get(&cm)
            .await
            .unwrap_or_else(|e| panic!("the worker may read ConfigMap {cm}: {e}"));
    }

    // Everything else: refused.
    assert_forbidden(
        "another app's ConfigMap",
        worker_cms.get(&format!("{other}-config")).await,
    );
    assert_forbidden(
        "Secrets",
        Api::<Secret>::namespaced(worker.clone(), n)
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "Pods",
        Api::<Pod>::namespaced(worker.clone(), n)
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "a Pod by name",
        Api::<Pod>::namespaced(worker.clone(), n).get(&pod).await,
    );

    apps::delete_all(&admin_apps).await;
    drop(operator);
    ns.delete().await;
}

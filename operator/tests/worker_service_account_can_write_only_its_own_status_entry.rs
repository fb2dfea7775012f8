//! The worker's ServiceAccount, impersonated from the admin kubeconfig, can write its own
//! pod's `status.instances[]` entry (server-side apply, its own field manager), and the
//! operator's status writes leave that entry alone; it can read its two ConfigMaps; it
//! is refused another StreamApp's status, Secrets and Pods.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams};
use oxbow_crds::StreamApp;
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

fn entry_of(app: &StreamApp, pod: &str) -> Option<oxbow_crds::InstanceStatus> {
    app.status
        .as_ref()?
        .instances
        .iter()
        .find(|i| i.pod == pod)
        .cloned()
}

#[tokio::test]
async fn the_worker_service_account_writes_its_own_status_entry_and_nothing_else() {
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
    let as_worker: Api<StreamApp> = Api::namespaced(worker.clone(), n);
    let admin_apps: Api<StreamApp> = Api::namespaced(admin.clone(), n);
    let manager = format!("oxbow-worker-{pod}");
    let report = |state: &str, error: Option<&str>| {
        let mut entry = json!({
            "pod": pod, "state": state, "address": format!("{pod}.{name}-workers:8080"),
            "activeTasks": ["0_0"],
            "updatedAt": k8s_openapi::jiff::Timestamp::now().to_string(),
        });
        if let Some(e) = error {
            entry["lastError"] = json!(e);
        }
        json!({
            "apiVersion": "oxbow.dev/v1alpha1", "kind": "StreamApp",
            "status": {"instances": [entry]},
        })
    };

    // Its own entry: allowed, and there afterwards.
    as_worker
        .patch_status(
            &name,
            &PatchParams::apply(&manager),
            &Patch::Apply(report("Running", None)),
        )
        .await
        .unwrap_or_else(|e| panic!("the worker may apply its own status entry: {e}"));
    let app = admin_apps.get(&name).await.expect("app");
    assert_eq!(
        entry_of(&app, &pod).and_then(|e| e.state).as_deref(),
        Some("Running"),
        "the entry is there: {:?}",
        app.status
    );

    // The operator reacts to the entry (a failed worker makes Ready False) and its status
    // write leaves the entry where it is.
    as_worker
        .patch_status(
            &name,
            &PatchParams::apply(&manager),
            &Patch::Apply(report("Failed", Some("store seen: disk full"))),
        )
        .await
        .unwrap_or_else(|e| panic!("the worker may update its own status entry: {e}"));
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
    let entry = entry_of(&app, &pod).expect("the operator's status write kept the entry");
    assert_eq!(entry.state.as_deref(), Some("Failed"));
    assert_eq!(entry.active_tasks, vec!["0_0".to_string()]);
    assert!(
        app.metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.manager.as_deref() == Some("oxbow-operator"))
            .all(|m| !serde_json::to_string(&m.fields_v1)
                .unwrap_or_default()
                .contains("k:{\\\"pod\\\"")),
        "the operator owns no instances entry"
    );
    // Back to Running, so the app can be Ready again (and be deleted cleanly).
    as_worker
        .patch_status(
            &name,
            &PatchParams::apply(&manager),
            &Patch::Apply(report("Running", None)),
        )
        .await
        .expect("update own entry");

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
        "another StreamApp's status",
        as_worker
            .patch_status(
                &other,
                &PatchParams::apply(&manager),
                &Patch::Apply(json!({
                    "apiVersion": "oxbow.dev/v1alpha1", "kind": "StreamApp",
                    "status": {"instances": [{"pod": format!("{other}-0"), "state": "Running"}]},
                })),
            )
            .await,
    );
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

//! The operator is SIGKILLed while it provisions several StreamApps and started again:
//! everything converges to Ready, with exactly one of each child and topic, and no
//! orphans.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

#[tokio::test]
async fn operator_killed_mid_reconcile_converges_without_duplicates() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "restart").await;
    let n = ns.name.as_str();
    let source = unique("events");
    kafka::create_topic(&source, 2).await;
    let names: Vec<String> = (0..4).map(|i| unique(&format!("app{i}"))).collect();
    for name in &names {
        let (ok, _, err) = kubectl(
            &["apply", "-n", n, "-f", "-"],
            Some(&apps::manifest(name, &[&source], "")),
        );
        assert!(ok, "apply: {err}");
    }
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);

    let mut op = OperatorProcess::start(n);
    // Kill it as soon as it has started writing, i.e. mid-way through the batch.
    wait_for(
        "the operator to start provisioning",
        Duration::from_secs(60),
        || async {
            let sts: Api<StatefulSet> = Api::namespaced(client.clone(), n);
            let k = sts
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if k >= 1 {
                Ok(())
            } else {
                Err("no StatefulSet yet".into())
            }
        },
    )
    .await;
    op.kill();
    let _op2 = OperatorProcess::start(n);

    for name in &names {
        apps::wait_condition(&api, name, "Ready", "True", Duration::from_secs(120)).await;
    }
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), n);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), n);
    let svcs: Api<Service> = Api::namespaced(client.clone(), n);
    let sts_names: BTreeSet<String> = sts
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert_eq!(
        sts_names,
        names.iter().cloned().collect(),
        "one StatefulSet per app, nothing else"
    );
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=oxbow-operator");
    assert_eq!(
        cms.list(&managed).await.expect("list").items.len(),
        2 * names.len(),
        "two ConfigMaps per app: the config and the task assignment"
    );
    assert_eq!(
        svcs.list(&managed).await.expect("list").items.len(),
        2 * names.len(),
        "two Services per app"
    );
    for s in sts.list(&ListParams::default()).await.expect("list").items {
        assert_eq!(
            s.owner_references().len(),
            1,
            "{} has exactly one owner",
            s.name_any()
        );
    }
    for name in &names {
        assert_eq!(
            kafka::partitions(&format!("{n}.{name}-seen-changelog")),
            Some(2)
        );
        let app = api.get(name).await.expect("app");
        assert_eq!(
            app.finalizers(),
            &["oxbow.dev/cleanup".to_string()],
            "finalizer added once"
        );
    }
    apps::delete_all(&api).await;
    ns.delete().await;
}

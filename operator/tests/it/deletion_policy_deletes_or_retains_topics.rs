//! Deleting a StreamApp honours `deletionPolicy`: `Delete` removes its changelog,
//! repartition and dead-letter topics and its state volumes, `Retain` keeps them. Source and sink topics
//! are never touched.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

#[tokio::test]
async fn delete_policy_removes_topics_and_retain_policy_keeps_them() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "deletion").await;
    let n = ns.name.as_str();
    let source = unique("clicks");
    kafka::create_topic(&source, 2).await;
    let _operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);

    let doomed = unique("doomed");
    let kept = unique("kept");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(
            &doomed,
            &[&source],
            "  deletionPolicy: {topics: Delete, consumerGroup: Delete, volumes: Delete}\n",
        )),
    );
    assert!(ok, "apply: {err}");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&kept, &[&source], "")),
    );
    assert!(ok, "apply: {err}");
    for app in [&doomed, &kept] {
        apps::wait_condition(&api, app, "Ready", "True", Duration::from_secs(120)).await;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), n);
    let claims_of = |app: String| {
        let claims = claims.clone();
        async move {
            let lp = ListParams::default().labels(&format!("oxbow.dev/streamapp={app}"));
            claims
                .list(&lp)
                .await
                .map(|l| l.items.len())
                .map_err(|e| e.to_string())
        }
    };
    assert_eq!(
        claims_of(doomed.clone()).await,
        Ok(2),
        "one state volume per worker"
    );
    assert_eq!(claims_of(kept.clone()).await, Ok(2));
    let topics = |app: &str| {
        [
            format!("{n}.{app}-seen-changelog"),
            format!("{n}.{app}-per-user-changelog"),
            format!("{n}.{app}-seen-repartition"),
            format!("{n}.{app}-per-user-repartition"),
            format!("{n}.{app}-dlq"),
        ]
    };
    for t in topics(&doomed).iter().chain(topics(&kept).iter()) {
        assert_eq!(kafka::partitions(t), Some(2), "{t} exists before deletion");
    }

    apps::delete_and_wait(&api, &doomed).await;
    for t in topics(&doomed) {
        wait_for(
            &format!("topic {t} to be deleted"),
            Duration::from_secs(30),
            || async {
                match kafka::partitions(&t) {
                    None => Ok(()),
                    Some(p) => Err(format!("still has {p} partitions")),
                }
            },
        )
        .await;
    }
    assert_eq!(
        kafka::partitions(&source),
        Some(2),
        "source topics are never deleted"
    );

    apps::delete_and_wait(&api, &kept).await;
    for t in topics(&kept) {
        assert_eq!(kafka::partitions(&t), Some(2), "{t} is retained");
    }
    assert_eq!(
        claims_of(kept.clone()).await,
        Ok(2),
        "Retain keeps the state volumes"
    );
    ns.delete().await;
}

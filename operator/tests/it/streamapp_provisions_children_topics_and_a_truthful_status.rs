//! Applying a StreamApp provisions every child (owner-referenced), the changelog and
//! dead-letter topics with the wanted configs, and a status that `kubectl wait` can use;
//! a hand-edited child is put back; a child no longer wanted is removed.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

fn owned_by(obj: &impl Resource, app: &StreamApp) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| Some(&o.uid) == app.metadata.uid.as_ref() && o.controller == Some(true))
}

#[tokio::test]
async fn a_streamapp_gets_its_children_topics_and_ready_status() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "provision").await;
    let n = ns.name.as_str();
    let source = unique("payments");
    kafka::create_topic(&source, 3).await;
    let _operator = OperatorProcess::start(n);

    let name = unique("fraud");
    let manifest = apps::manifest(
        &name,
        &[&source],
        "  stores:\n    per-user:\n      changelog: {minCleanableDirtyRatio: 0.05, segment: 10m}\n",
    );
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");

    let (ok, out, err) = kubectl(
        &[
            "wait",
            "-n",
            n,
            "--for=condition=Ready",
            &format!("streamapp/{name}"),
            "--timeout=120s",
        ],
        None,
    );
    assert!(
        ok,
        "kubectl wait for Ready failed: {out}{err}\noperator log:\n{}",
        _operator.logs()
    );
    let apps_api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let app = apps_api.get(&name).await.expect("app");
    let status = app.status.clone().expect("status");
    assert_eq!(status.observed_generation, app.metadata.generation);
    assert_eq!(
        status.tasks,
        Some(9),
        "3 source partitions x 3 stages (source, dedupe by txId, aggregate by userId)"
    );
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(format!("{:?}", status.phase), "Some(Running)");
    for t in ["Ready", "TopicsReady", "WorkloadReady", "Restored"] {
        assert_eq!(
            apps::condition(&app, t).map(|c| c.0).as_deref(),
            Some("True"),
            "{t}"
        );
    }
    for t in ["Reconciling", "Stalled"] {
        assert_eq!(
            apps::condition(&app, t).map(|c| c.0).as_deref(),
            Some("False"),
            "{t}"
        );
    }

    // Every child exists and is owned by the StreamApp.
    let sts: StatefulSet = Api::namespaced(client.clone(), n)
        .get(&name)
        .await
        .expect("StatefulSet");
    assert!(owned_by(&sts, &app));
    let sts_spec = sts.spec.clone().expect("spec");
    assert_eq!(sts_spec.replicas, Some(2));
    assert_eq!(sts_spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(
        sts_spec.volume_claim_templates.as_ref().map(|v| v.len()),
        Some(1)
    );
    let cm: ConfigMap = Api::namespaced(client.clone(), n)
        .get(&format!("{name}-config"))
        .await
        .expect("ConfigMap");
    assert!(owned_by(&cm, &app));
    assert!(cm.data.expect("data")["streamapp.yaml"].contains("kind: StreamApp"));
    for svc in [format!("{name}-workers"), format!("{name}-query")] {
        let s: Service = Api::namespaced(client.clone(), n)
            .get(&svc)
            .await
            .expect("Service");
        assert!(owned_by(&s, &app), "{svc}");
    }
    let sa: ServiceAccount = Api::namespaced(client.clone(), n)
        .get(&format!("{name}-worker"))
        .await
        .expect("SA");
    assert!(owned_by(&sa, &app));
    let role: Role = Api::namespaced(client.clone(), n)
        .get(&format!("{name}-worker"))
        .await
        .expect("Role");
    assert!(owned_by(&role, &app));
    let rb: RoleBinding = Api::namespaced(client.clone(), n)
        .get(&format!("{name}-worker"))
        .await
        .expect("RoleBinding");
    assert!(owned_by(&rb, &app));
    let pdb_api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), n);
    assert!(owned_by(&pdb_api.get(&name).await.expect("PDB"), &app));

    // Topics, with the wanted configs.
    let changelog = format!("{n}.{name}-per-user-changelog");
    assert_eq!(kafka::partitions(&changelog), Some(3));
    let cfg = kafka::config(&changelog).await;
    assert_eq!(cfg["cleanup.policy"], "compact");
    assert_eq!(cfg["min.cleanable.dirty.ratio"], "0.05");
    assert_eq!(cfg["segment.ms"], "600000");
    let seen = kafka::config(&format!("{n}.{name}-seen-changelog")).await;
    assert_eq!(
        seen["min.cleanable.dirty.ratio"], "0.1",
        "default dirty ratio"
    );
    assert_eq!(kafka::partitions(&format!("{n}.{name}-dlq")), Some(3));
    // The steps dedupe on value.txId and group by value.userId, neither the record key:
    // each is preceded by a repartition topic, one partition per task of its stage.
    for step in ["seen", "per-user"] {
        let t = format!("{n}.{name}-{step}-repartition");
        assert_eq!(kafka::partitions(&t), Some(3), "{t}");
        let cfg = kafka::config(&t).await;
        assert_eq!(cfg["cleanup.policy"], "delete", "{t}");
        assert_eq!(
            cfg["retention.ms"], "-1",
            "{t}: unprocessed records never expire"
        );
        let reported = status.topics.iter().find(|s| s.name == t);
        assert_eq!(
            reported.map(|s| (s.role.as_str(), s.ready)),
            Some(("repartition", true)),
            "{t} in status.topics"
        );
    }
    assert_eq!(
        kafka::config(&format!("{n}.{name}-dlq")).await["cleanup.policy"],
        "delete"
    );

    // A child edited by hand is put back.
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), n);
    let patch =
        serde_json::json!({"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 1}}}});
    sts_api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("hand edit");
    wait_for(
        "the hand-edited StatefulSet to be put back",
        Duration::from_secs(60),
        || async {
            let s = sts_api.get(&name).await.map_err(|e| e.to_string())?;
            let g = s
                .spec
                .and_then(|s| s.template.spec)
                .and_then(|p| p.termination_grace_period_seconds);
            if g == Some(60) {
                Ok(())
            } else {
                Err(format!("terminationGracePeriodSeconds = {g:?}"))
            }
        },
    )
    .await;
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), n);
    let patch = serde_json::json!({"data": {"streamapp.yaml": "tampered"}});
    cm_api
        .patch(
            &format!("{name}-config"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("hand edit");
    wait_for(
        "the hand-edited ConfigMap to be put back",
        Duration::from_secs(60),
        || async {
            let c = cm_api
                .get(&format!("{name}-config"))
                .await
                .map_err(|e| e.to_string())?;
            let d = c.data.unwrap_or_default();
            if d.get("streamapp.yaml")
                .is_some_and(|v| v.contains("kind: StreamApp"))
            {
                Ok(())
            } else {
                Err(format!("{d:?}"))
            }
        },
    )
    .await;

    // Scaling to one worker: the disruption budget is no longer wanted and goes.
    let (ok, _, err) = kubectl(
        &[
            "scale",
            "-n",
            n,
            &format!("streamapp/{name}"),
            "--replicas=1",
        ],
        None,
    );
    assert!(ok, "kubectl scale through the scale subresource: {err}");
    wait_for(
        "the PodDisruptionBudget to be removed at 1 replica",
        Duration::from_secs(60),
        || async {
            match pdb_api.get_opt(&name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still present".into()),
            }
        },
    )
    .await;
    let app =
        apps::wait_condition(&apps_api, &name, "Ready", "True", Duration::from_secs(90)).await;
    assert_eq!(app.status.expect("status").ready_replicas, 1);

    // Clean up while the operator runs, so its finalizer is honoured.
    apps::delete_and_wait(&apps_api, &name).await;
    ns.delete().await;
}

//! Two operator replicas: only the Lease holder reconciles; when it dies, the other
//! takes over and keeps reconciling.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

async fn holder(leases: &Api<Lease>) -> Result<String, String> {
    let l = leases
        .get_opt("oxbow-operator")
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no lease")?;
    l.spec
        .and_then(|s| s.holder_identity)
        .ok_or_else(|| "no holder".to_string())
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "leader").await;
    let n = ns.name.as_str();
    let source = unique("ticks");
    kafka::create_topic(&source, 1).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), n);

    let mut first = OperatorProcess::start(n);
    let first_id = format!("oxbow-operator-{}", first.pid());
    wait_for(
        "the first operator to take the Lease",
        Duration::from_secs(30),
        || async {
            let h = holder(&leases).await?;
            if h == first_id { Ok(()) } else { Err(h) }
        },
    )
    .await;
    let second = OperatorProcess::start(n);
    let second_id = format!("oxbow-operator-{}", second.pid());
    wait_for(
        "the second operator to wait for leadership",
        Duration::from_secs(30),
        || async {
            if second.logs().contains("waiting for leadership") {
                Ok(())
            } else {
                Err(second.logs())
            }
        },
    )
    .await;

    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let name = unique("led");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&name, &[&source], "")),
    );
    assert!(ok, "apply: {err}");
    apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;
    assert!(
        !second.logs().contains("reconciled"),
        "the standby must not reconcile"
    );
    assert_eq!(holder(&leases).await.as_deref(), Ok(first_id.as_str()));

    first.kill();
    wait_for(
        "the standby to take over the Lease",
        Duration::from_secs(60),
        || async {
            let h = holder(&leases).await?;
            if h == second_id { Ok(()) } else { Err(h) }
        },
    )
    .await;
    // The new leader reconciles: a spec change reaches the StatefulSet.
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
    assert!(ok, "scale: {err}");
    let app = apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(90)).await;
    assert_eq!(app.status.map(|s| s.ready_replicas), Some(1));

    apps::delete_all(&api).await;
    ns.delete().await;
}

//! Plays a worker's report in operator tests whose pods run the stand-in (which reports
//! nothing): writes a pod's report Lease the way the worker does (a merge patch of the
//! Lease the operator made, renewing it).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::report::{LEASE_DURATION, REPORT_ANNOTATION, lease_name};
use serde_json::{Value, json};

use crate::harness::wait_for;

/// The merge patch a worker sends for `entry` (an `instances[]` entry as JSON).
pub fn patch(pod: &str, entry: &Value) -> Value {
    patch_at(pod, entry, k8s_openapi::jiff::Timestamp::now())
}

/// [`patch`], renewed at `at` by the writer's clock (a node whose clock is off).
pub fn patch_at(pod: &str, entry: &Value, at: k8s_openapi::jiff::Timestamp) -> Value {
    let report = json!({"entry": entry});
    json!({
        "metadata": {"annotations": {REPORT_ANNOTATION: report.to_string()}},
        "spec": {
            "holderIdentity": pod,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            // A MicroTime: the API server refuses more than six decimals.
            "renewTime": format!("{at:.6}"),
        },
    })
}

/// Writes `entry` as `pod`'s report through `client` (any identity), waiting up to a
/// minute for the operator to have made the Lease. Panics with the API server's answer
/// if the write is refused for any other reason.
pub async fn write(client: &kube::Client, ns: &str, pod: &str, entry: Value) {
    write_at(client, ns, pod, entry, None).await
}

/// [`write`], renewed at `at` by the writer's clock (`None`: now).
pub async fn write_at(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    entry: Value,
    at: Option<k8s_openapi::jiff::Timestamp>,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let name = lease_name(pod);
    wait_for(
        &format!("{pod}'s report Lease to accept a report"),
        Duration::from_secs(60),
        || async {
            match api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(patch_at(
                        pod,
                        &entry,
                        at.unwrap_or_else(k8s_openapi::jiff::Timestamp::now),
                    )),
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Err("no Lease yet".to_string()),
                Err(e) => panic!("failed to write {pod}'s report: {e}"),
            }
        },
    )
    .await;
}

/// Makes report Leases for `pods` of `app`, as the operator does (for tests that play
/// the operator).
pub async fn make_leases(client: &kube::Client, ns: &str, app: &str, pods: &[String]) {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    for pod in pods {
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {
                "name": lease_name(pod),
                "labels": {oxbow_crds::report::REPORT_OF_LABEL: app},
            },
            "spec": {},
        }))
        .expect("a Lease");
        match api.create(&Default::default(), &lease).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("failed to make {pod}'s report Lease: {e}"),
        }
    }
}

/// `pod`'s report as its Lease holds it now, if it wrote one.
pub async fn entry(
    client: &kube::Client,
    ns: &str,
    pod: &str,
) -> Option<oxbow_crds::InstanceStatus> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease = api.get_opt(&lease_name(pod)).await.ok()??;
    oxbow_crds::report::read(&lease).map(|r| r.entry)
}

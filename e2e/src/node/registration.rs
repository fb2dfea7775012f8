//! The Node object and its heartbeat.
//!
//! Owns `Node/<name>` and `Lease kube-node-lease/<name>`, both by server-side apply under
//! the agent's field manager. The node lifecycle controller reads the Lease; if the agent
//! stops renewing it, the node goes NotReady and its pods are evicted, as with a kubelet.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{FIELD_MANAGER, NodeSettings};

pub async fn register(client: &kube::Client, s: &NodeSettings) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": s.node_name,
            "labels": {
                "kubernetes.io/hostname": s.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                "oxbow.dev/local-node": "true",
            },
        },
        "spec": {},
    });
    nodes.patch(&s.node_name, &pp, &Patch::Apply(node)).await?;
    update_status(client, s).await
}

pub async fn update_status(client: &kube::Client, s: &NodeSettings) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = Time(Timestamp::now());
    let resources = json!({
        "cpu": s.cpu,
        "memory": s.memory,
        "pods": s.max_pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": s.started})
    };
    let status = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": s.node_name},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "oxbow-node does not measure memory pressure"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "oxbow-node does not measure disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "oxbow-node does not measure PID pressure"),
                cond("Ready", "True", "KubeletReady", "oxbow-node is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": s.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "oxbow-local",
                "systemUUID": "oxbow-local",
                "bootID": s.boot_id,
                "kernelVersion": s.kernel_version,
                "osImage": "oxbow local node agent",
                "containerRuntimeVersion": concat!("oxbow-node://", env!("CARGO_PKG_VERSION")),
                "kubeletVersion": s.kubernetes_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
            },
        },
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    nodes
        .patch_status(&s.node_name, &pp, &Patch::Apply(status))
        .await?;
    Ok(())
}

pub async fn renew_lease(client: &kube::Client, s: &NodeSettings) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": s.node_name, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": s.node_name,
            "leaseDurationSeconds": 40,
            "renewTime": MicroTime(Timestamp::now()),
        },
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    leases
        .patch(&s.node_name, &pp, &Patch::Apply(lease))
        .await?;
    Ok(())
}

/// Renews the Lease every 10 s and re-posts node status every 30 s, forever. Failures
/// are logged and retried: the API server restarting must not kill the agent.
pub async fn heartbeat(client: kube::Client, s: NodeSettings) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        if let Err(e) = renew_lease(&client, &s).await {
            tracing::warn!(error = %e, "failed to renew node lease");
        }
        if n.is_multiple_of(3)
            && let Err(e) = register(&client, &s).await
        {
            tracing::warn!(error = %e, "failed to post node status");
        }
        n += 1;
    }
}

//! A StatefulSet on the local node behaves as Kubernetes says: pods become Running and
//! Ready through their readiness probe, each with its own pod IP; a file written to a
//! pod's volume survives the pod's deletion; scaling out adds pods and claims, scaling
//! in removes pods and keeps the claims (the default retention policy).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use oxbow_e2e::harness::{TestNamespace, kube_client, kubectl, requires_local_stack, wait_for};

const MANIFEST: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{name: http, port: 8080}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  replicas: 2
  serviceName: web
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: oxbow-testpod:e2e
        args: ["--listen", "$(POD_IP):8080", "--data-dir", "/data/files", "--ready-after", "1"]
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        ports: [{name: http, containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /readyz, port: http}
          periodSeconds: 1
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
"#;

/// The ready pods of the set, by name, as (uid, pod IP).
async fn ready_pods(pods: &Api<Pod>, want: usize) -> Result<Vec<(String, String, String)>, String> {
    let list = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .map_err(|e| e.to_string())?;
    let mut ready = Vec::new();
    let mut seen = Vec::new();
    for p in &list.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let st = p.status.clone().unwrap_or_default();
        let is_ready = st
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        seen.push(format!(
            "{name}:{}:{}",
            st.phase.clone().unwrap_or_default(),
            if is_ready { "ready" } else { "unready" }
        ));
        if is_ready
            && st.phase.as_deref() == Some("Running")
            && p.metadata.deletion_timestamp.is_none()
        {
            ready.push((
                name,
                p.metadata.uid.clone().unwrap_or_default(),
                st.pod_ip.clone().unwrap_or_default(),
            ));
        }
    }
    ready.sort();
    if ready.len() == want && list.items.len() == want {
        Ok(ready)
    } else {
        Err(format!("pods: {seen:?}"))
    }
}

async fn http(method: reqwest::Method, url: &str, body: &str) -> Result<(u16, String), String> {
    let c = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| e.to_string())?;
    let r = c
        .request(method, url)
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let code = r.status().as_u16();
    Ok((code, r.text().await.map_err(|e| e.to_string())?))
}

#[tokio::test]
async fn statefulset_pods_become_ready_keep_their_volume_and_scale() {
    if requires_local_stack("runs the oxbow-testpod image and checks the local stack's pod network")
    {
        return;
    }
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "sts").await;
    let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(MANIFEST));
    assert!(ok, "kubectl apply failed: {err}");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let long = Duration::from_secs(90);
    let two = wait_for("2 web pods Running and Ready", long, || {
        ready_pods(&pods, 2)
    })
    .await;
    let ips: BTreeSet<&String> = two.iter().map(|(_, _, ip)| ip).collect();
    assert_eq!(ips.len(), 2, "each pod has its own IP: {two:?}");
    assert!(
        two.iter().all(|(_, _, ip)| ip.starts_with("198.18.")),
        "pod IPs are on the node's bridge network 198.18.0.0/16: {two:?}"
    );
    let (_, uid0, ip0) = two
        .iter()
        .find(|(n, _, _)| n == "web-0")
        .cloned()
        .expect("web-0");

    let (code, whoami) = http(
        reqwest::Method::GET,
        &format!("http://{ip0}:8080/whoami"),
        "",
    )
    .await
    .expect("whoami");
    assert_eq!(code, 200);
    assert!(
        whoami.contains("\"pod\":\"web-0\"") && whoami.contains(&ip0),
        "downward API env reached the pod: {whoami}"
    );

    let marker = format!("written-by-{uid0}");
    let (code, _) = http(
        reqwest::Method::PUT,
        &format!("http://{ip0}:8080/files/marker"),
        &marker,
    )
    .await
    .expect("put");
    assert_eq!(code, 201, "file written into web-0's volume");

    pods.delete("web-0", &DeleteParams::default())
        .await
        .expect("delete web-0");
    let again = wait_for(
        "web-0 to be recreated (new uid) and Ready",
        long,
        || async {
            let ready = ready_pods(&pods, 2).await?;
            let p = ready
                .iter()
                .find(|(n, _, _)| n == "web-0")
                .cloned()
                .ok_or("web-0 not ready")?;
            if p.1 == uid0 {
                Err("web-0 still has its old uid".to_string())
            } else {
                Ok(p)
            }
        },
    )
    .await;
    let (code, body) = http(
        reqwest::Method::GET,
        &format!("http://{}:8080/files/marker", again.2),
        "",
    )
    .await
    .expect("get");
    assert_eq!(
        (code, body.as_str()),
        (200, marker.as_str()),
        "the recreated pod sees the file in its volume"
    );

    let (ok, _, err) = kubectl(
        &["scale", "-n", &ns.name, "statefulset/web", "--replicas=3"],
        None,
    );
    assert!(ok, "scale to 3: {err}");
    wait_for("3 web pods Ready after scaling out", long, || {
        ready_pods(&pods, 3)
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns.name);
    let bound_claims = || async {
        let list = claims
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let bound: Vec<String> = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        if bound.len() == 3 {
            Ok(bound)
        } else {
            Err(format!("bound claims: {bound:?}"))
        }
    };
    wait_for("3 bound claims after scaling out", long, bound_claims).await;

    let (ok, _, err) = kubectl(
        &["scale", "-n", &ns.name, "statefulset/web", "--replicas=1"],
        None,
    );
    assert!(ok, "scale to 1: {err}");
    let one = wait_for("only web-0 left after scaling in", long, || {
        ready_pods(&pods, 1)
    })
    .await;
    assert_eq!(one[0].0, "web-0");
    let mut kept = wait_for(
        "claims kept after scaling in",
        Duration::from_secs(10),
        bound_claims,
    )
    .await;
    kept.sort();
    assert_eq!(
        kept,
        vec!["data-web-0", "data-web-1", "data-web-2"],
        "scale-in keeps every claim"
    );
    ns.delete().await;
}

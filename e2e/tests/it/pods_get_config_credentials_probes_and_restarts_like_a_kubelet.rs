//! The node agent gives a pod what a kubelet would: ConfigMap env and volumes, a
//! ServiceAccount identity that RBAC governs, liveness-driven restarts, restart back-off
//! for a crashing container, and termination of the process when the pod is deleted.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use oxbow_e2e::containers::{main_pid, process_alive};
use oxbow_e2e::harness::{TestNamespace, kube_client, kubectl, requires_local_stack, wait_for};

fn pod_manifest(name: &str, extra_container_yaml: &str, args: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: main
    image: oxbow-testpod:e2e
    args: {args}
    env:
    - name: POD_IP
      valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
    - name: GREETING
      valueFrom: {{configMapKeyRef: {{name: settings, key: greeting}}}}
    ports: [{{name: http, containerPort: 8080}}]
    volumeMounts: [{{name: settings, mountPath: /etc/settings}}]
{extra_container_yaml}
  volumes:
  - name: settings
    configMap: {{name: settings}}
"#
    )
}

async fn pod_status(pods: &Api<Pod>, name: &str) -> Result<Pod, String> {
    pods.get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("pod {name} absent"))
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

#[tokio::test]
async fn pods_get_config_an_rbac_identity_probes_restarts_and_termination() {
    if requires_local_stack(
        "runs the oxbow-testpod image and reads container processes in the node's /proc",
    ) {
        return;
    }
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "kubelet").await;
    let n = &ns.name;
    let (ok, _, err) = kubectl(
        &[
            "create",
            "configmap",
            "settings",
            "-n",
            n,
            "--from-literal=greeting=hello-from-configmap",
        ],
        None,
    );
    assert!(ok, "create configmap: {err}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let t = Duration::from_secs(60);

    // 1. Env + ConfigMap volume + identity: the exec readiness probe passes only if the
    //    pod's own kubeconfig authenticates as its ServiceAccount and RBAC denies it
    //    what it was not granted.
    // The test image carries kubectl; in the pod it uses the in-cluster configuration.
    let kubectl_bin = "kubectl";
    let identity_probe = format!(
        r#"    readinessProbe:
      periodSeconds: 1
      exec:
        command: ["sh", "-c", "[ \"$({kubectl_bin} auth whoami -o jsonpath='{{.status.userInfo.username}}')\" = system:serviceaccount:{n}:default ] && [ \"$({kubectl_bin} auth can-i list secrets)\" = no ] && [ \"$GREETING\" = hello-from-configmap ]"]"#
    );
    let manifest = pod_manifest(
        "config",
        &identity_probe,
        r#"["--listen", "$(POD_IP):8080", "--data-dir", "/etc/settings"]"#,
    );
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply config pod: {err}");
    let p = wait_for(
        "pod config Ready (identity, RBAC and env checked by its probe)",
        t,
        || async {
            let p = pod_status(&pods, "config").await?;
            if is_ready(&p) {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status.map(|s| s.container_statuses)))
            }
        },
    )
    .await;
    let ip = p
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    let body = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http")
        .get(format!("http://{ip}:8080/files/greeting"))
        .send()
        .await
        .expect("GET greeting")
        .text()
        .await
        .expect("body");
    assert_eq!(
        body, "hello-from-configmap",
        "ConfigMap volume file is readable at its mount path"
    );

    // 2. Deleting the pod stops its process and removes the object.
    let id = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first()?.container_id.clone())
        .expect("container ID");
    let pid = main_pid(&id).expect("the container's process on the node");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    pods.delete("config", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("pod config to be gone", t, || async {
        match pods.get_opt("config").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still present".into()),
        }
    })
    .await;
    assert!(
        !process_alive(pid),
        "process {pid} of the deleted pod must be gone"
    );

    // 3. A failing liveness probe restarts the container.
    let liveness = "    livenessProbe:\n      httpGet: {path: /no-such-path, port: http}\n      periodSeconds: 1\n      failureThreshold: 2";
    let manifest = pod_manifest("unhealthy", liveness, r#"["--listen", "$(POD_IP):8080"]"#);
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply unhealthy pod: {err}");
    wait_for(
        "pod unhealthy restarted by its liveness probe",
        t,
        || async {
            let p = pod_status(&pods, "unhealthy").await?;
            if restarts(&p) >= 1 {
                Ok(())
            } else {
                Err(format!("restarts: {}", restarts(&p)))
            }
        },
    )
    .await;

    // 4. A container that exits with an error is restarted with back-off and reports why.
    let manifest = pod_manifest("crashing", "", r#"["--no-such-flag"]"#);
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply crashing pod: {err}");
    // The kubelet may publish a restart's count before the crash it follows (one run saw
    // two restarts and no lastState): wait for both.
    let p = wait_for(
        "pod crashing to restart twice and report the last crash",
        t,
        || async {
            let p = pod_status(&pods, "crashing").await?;
            let crashed = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .and_then(|c| c.last_state.as_ref())
                .is_some_and(|s| s.terminated.is_some());
            if restarts(&p) >= 2 && crashed {
                Ok(p)
            } else {
                Err(format!(
                    "restarts: {}, last state terminated: {crashed}",
                    restarts(&p)
                ))
            }
        },
    )
    .await;
    let cs = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .expect("container status");
    let last = cs
        .last_state
        .and_then(|s| s.terminated)
        .expect("last state terminated");
    assert_eq!(last.exit_code, 2, "the exit code of the crash is reported");
    assert!(!cs.ready);

    ns.delete().await;
}

//! The local stack's node is a real kubelet with containerd (issue 18): a worker pod is a
//! container from the `oxbow-worker` image, running as the image's non-root user, whose
//! log `kubectl logs` reads and into which `kubectl exec` runs a command through the
//! kubelet; other pods reach it by its DNS name `<pod>.<headless service>`; and the
//! image's entrypoint is the worker, so `kubectl run --image=oxbow-worker:<version> --
//! --help` prints its usage.

use std::time::Duration;

use oxbow_e2e::containers::pod_container_pid;
use oxbow_e2e::harness::{kubectl, requires_local_stack, unique, wait_for};
use oxbow_e2e::streams::{RunningApp, pod_field};

/// Runs `args` as a pod from `image` in `ns` to completion and returns its log.
async fn run_to_completion(ns: &str, image: &str, args: &[&str]) -> String {
    let name = unique("run");
    let image = format!("--image={image}");
    let mut cmd = vec!["run", "-n", ns, &name, &image, "--restart=Never"];
    cmd.extend_from_slice(args);
    let (ok, _, err) = kubectl(&cmd, None);
    assert!(ok, "kubectl run {args:?}: {err}");
    let phase = wait_for(
        &format!("pod {name} ({args:?}) to finish"),
        Duration::from_secs(60),
        || async {
            match pod_field(ns, &name, "{.status.phase}").as_str() {
                p @ ("Succeeded" | "Failed") => Ok(p.to_string()),
                other => Err(format!("phase {other:?}")),
            }
        },
    )
    .await;
    let (_, log, _) = kubectl(&["logs", "-n", ns, &name], None);
    assert_eq!(
        phase, "Succeeded",
        "pod {name} ({args:?}) failed; its log:\n{log}"
    );
    log
}

#[tokio::test]
async fn a_worker_pod_is_a_container_with_logs_exec_a_user_and_a_dns_name() {
    if requires_local_stack("reads the worker container's process in the node's /proc") {
        return;
    }
    let run = RunningApp::start("node", |a| a.replicas(1).standbys(0)).await;
    run.wait_ready("180s");
    let ns = run.ns.name.clone();
    let pod = format!("{}-0", run.name());

    let (ok, log, err) = kubectl(&["logs", "-n", &ns, &pod, "-c", "worker"], None);
    assert!(ok, "kubectl logs {pod}: {err}");
    assert!(
        !log.trim().is_empty(),
        "kubectl logs {pod} shows the worker's log"
    );

    let (ok, out, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            &pod,
            "-c",
            "worker",
            "--",
            "/usr/local/bin/oxbow-worker",
            "--version",
        ],
        None,
    );
    assert!(ok, "kubectl exec into {pod}: {err}");
    assert_eq!(
        out.trim(),
        format!("oxbow-worker {}", env!("CARGO_PKG_VERSION"))
    );

    let pid = pod_container_pid(&ns, &pod, "worker").expect("the worker's process on the node");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    assert!(
        uids.split_whitespace().all(|u| u == "65532"),
        "the worker runs as the image's nonroot user 65532, not {uids}"
    );

    // Another pod reaches the worker by name: cluster DNS answers for the StatefulSet's
    // headless Service.
    let url = format!("http://{pod}.{}-workers:8080/healthz", run.name());
    let body = run_to_completion(&ns, "oxbow-testpod:e2e", &["--", "get", &url]).await;
    assert!(!body.trim().is_empty(), "GET {url} from a pod answers");

    // The image's entrypoint is the worker.
    let usage = run_to_completion(
        &ns,
        &format!("oxbow-worker:{}", env!("CARGO_PKG_VERSION")),
        &["--", "--help"],
    )
    .await;
    assert!(
        usage.contains("Usage: oxbow-worker"),
        "the worker image prints its usage: {usage}"
    );

    run.finish().await;
}

/// A pod from the test image labelled `labels`, running and Ready, to `exec` from.
async fn client_pod(ns: &str, labels: &str) -> String {
    let name = unique("client");
    let labels = format!("--labels={labels}");
    let (ok, _, err) = kubectl(
        &[
            "run",
            "-n",
            ns,
            &name,
            "--image=oxbow-testpod:e2e",
            &labels,
            "--",
            "--listen",
            "0.0.0.0:8080",
        ],
        None,
    );
    assert!(ok, "kubectl run {name}: {err}");
    let (ok, _, err) = kubectl(
        &[
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "client pod {name} Ready: {err}");
    name
}

/// One GET of `url` from inside `pod`: its body, or why it failed.
fn get_from(ns: &str, pod: &str, url: &str) -> Result<String, String> {
    let (ok, out, err) = kubectl(
        &["exec", "-n", ns, pod, "--", "oxbow-testpod", "get", url],
        None,
    );
    if ok { Ok(out) } else { Err(err) }
}

#[tokio::test]
async fn with_network_policy_on_only_labelled_clients_reach_a_workers_query_port() {
    if requires_local_stack("the local stack's node enforces NetworkPolicy") {
        return;
    }
    let run = RunningApp::start_with("netpol", &["--network-policy"], |a| {
        a.replicas(1).standbys(0)
    })
    .await;
    run.wait_ready("180s");
    let ns = run.ns.name.clone();
    let ip = pod_field(&ns, &format!("{}-0", run.name()), "{.status.podIP}");
    let url = format!("http://{ip}:8080/healthz");
    let metrics = format!("http://{ip}:9090/metrics");
    let client = client_pod(&ns, "oxbow.dev/query-client=true").await;
    let stranger = client_pod(&ns, "role=stranger").await;
    // The policy controller learns a new pod's IP from the API: until it has, even an
    // admitted client is refused, so wait for the first answer.
    wait_for(
        &format!("a pod with the client label to reach {url}"),
        Duration::from_secs(60),
        || async { get_from(&ns, &client, &url) },
    )
    .await;
    for _ in 0..3 {
        let refused = get_from(&ns, &stranger, &url);
        assert!(
            refused.is_err(),
            "a pod without the client label must not reach {url}: {refused:?}"
        );
    }
    wait_for(
        &format!("a pod without the client label to reach the metrics port {metrics}"),
        Duration::from_secs(60),
        || async { get_from(&ns, &stranger, &metrics) },
    )
    .await;
    run.finish().await;
}

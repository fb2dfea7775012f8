//! Liveness that reflects the engine (issue 16, item 6), on worker pods under the
//! operator: a pod whose processing loop is wedged (a step that never returns, as one
//! blocked on a dead dependency would; the `oxbow-stuck` fixture image) stops
//! heartbeating, so the operator moves its tasks to the other pod, which processes the
//! record; its `/healthz` fails, so the kubelet restarts it. Exactly-once throughout:
//! every key's running counts are 1..n, each once.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, install_crd, kafka, kafka_bootstrap, kube_client, kubectl,
    requires_local_stack, unique, wait_for,
};
use oxbow_e2e::streams::{
    CountingApp, exact_running_counts, http_get, keys, pod_field, produce, read_committed,
};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

/// The partition of an active task of `pod`, from its status entry.
async fn a_partition_of(api: &Api<StreamApp>, name: &str, pod: &str) -> i32 {
    wait_for(
        &format!("{pod} to report an active task"),
        Duration::from_secs(60),
        || async {
            let st = api
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            st.instances
                .iter()
                .find(|i| i.pod == pod)
                .and_then(|i| i.active_tasks.first())
                .and_then(|t| t.parse::<oxbow_crds::TaskId>().ok())
                .map(|t| t.kafka_partition())
                .ok_or_else(|| format!("instances: {:?}", st.instances))
        },
    )
    .await
}

fn restart_count(ns: &str, pod: &str) -> i64 {
    pod_field(ns, pod, "{.status.containerStatuses[0].restartCount}")
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_wedged_worker_pod_is_failed_over_and_restarted_by_its_liveness_probe() {
    if requires_local_stack("runs the oxbow-stuck fixture image, which only the local node maps") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "wedged").await;
    let n = ns.name.clone();
    let source = unique("events");
    kafka::create_topic(&source, 4).await;
    let _operator = OperatorProcess::start_with(&n, &["--failover-timeout", "15s"]);
    let app = CountingApp::new(&unique("wedged"), &source)
        .replicas(2)
        .standbys(0);
    kafka::create_topic(&app.sink(), 4).await;
    let manifest = app
        .manifest()
        .replace("image: oxbow-worker:test", "image: oxbow-stuck:test")
        + "  podTemplate:\n    env:\n    - {name: OXBOW_LIVENESS_TIMEOUT, value: 5s}\n";
    let (ok, _, err) = kubectl(&["apply", "-n", &n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    let (ok, out, err) = kubectl(
        &[
            "wait",
            "-n",
            &n,
            "--for=condition=Ready",
            &format!("streamapp/{}", app.name),
            "--timeout=180s",
        ],
        None,
    );
    assert!(ok, "not Ready: {out}{err}");
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &n);
    let keys = keys(16);
    produce(&source, &keys, 2, 1);

    // A record that wedges pod 0's loop, sent to a partition pod 0 owns.
    let pod0 = format!("{}-0", app.name);
    let partition = a_partition_of(&api, &app.name, &pod0).await;
    let stuck_key = format!("stuck-on-{pod0}");
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("producer");
    p.send(
        BaseRecord::to(&source)
            .key(stuck_key.as_str())
            .payload("{\"amount\": 1}")
            .partition(partition),
    )
    .map_err(|(e, _)| e)
    .expect("send");
    p.flush(Duration::from_secs(30)).expect("flush");
    let restarts_before = restart_count(&n, &pod0);

    // The operator sees pod 0 stop heartbeating and moves its tasks: pod 1 counts it.
    wait_for(
        "the wedged pod's record to be counted by the pod its task moved to",
        Duration::from_secs(90),
        || async {
            let out = read_committed(&app.sink());
            match out.iter().find(|(k, _)| *k == stuck_key) {
                Some((_, v)) if v["count"] == 1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // The kubelet restarts it: /healthz failed since the loop stopped turning.
    wait_for(
        "the kubelet to restart the wedged pod's container",
        Duration::from_secs(150),
        || async {
            let now = restart_count(&n, &pod0);
            if now > restarts_before {
                Ok(())
            } else {
                let ip = pod_field(&n, &pod0, "{.status.podIP}");
                let health = http_get(&format!("{ip}:8080"), "/healthz").await;
                let me = api
                    .get(&app.name)
                    .await
                    .ok()
                    .and_then(|a| a.status)
                    .map(|s| {
                        s.instances
                            .iter()
                            .map(|i| format!("{}:{:?}@{:?}", i.pod, i.active_tasks, i.updated_at))
                            .collect::<Vec<_>>()
                    });
                Err(format!(
                    "restartCount {now}; /healthz of {pod0}: {health:?}; instances {me:?}; stuck on partition {partition}"
                ))
            }
        },
    )
    .await;

    // Records keep flowing and nothing was counted twice.
    produce(&source, &keys, 1, 1);
    wait_for(
        "every key counted 3 times, exactly once",
        Duration::from_secs(120),
        || async {
            let out = read_committed(&app.sink());
            let counts = exact_running_counts(&out)?;
            let want: BTreeMap<String, u64> = keys
                .iter()
                .map(|k| (k.clone(), 3))
                .chain([(stuck_key.clone(), 1)])
                .collect();
            if counts == want {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            }
        },
    )
    .await;
    oxbow_e2e::harness::apps::delete_all(&api).await;
    ns.delete().await;
}

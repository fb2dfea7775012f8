//! Kafka unreachable: the StreamApp says so (not Ready, reason KafkaUnreachable), the
//! operator keeps running and retries with back-off, other apps are unaffected, and
//! deleting the app is not blocked forever by cleanup it cannot do.

use std::time::{Duration, Instant};

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

#[tokio::test]
async fn unreachable_kafka_is_reported_and_deletion_gives_up_after_the_timeout() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "nokafka").await;
    let n = ns.name.as_str();
    let source = unique("feed");
    kafka::create_topic(&source, 1).await;
    let operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);

    // Port 9 on loopback: nothing listens, connections are refused at once.
    let lost = unique("lost");
    let manifest = apps::manifest(&lost, &[&source], "  deletionPolicy: {topics: Delete}\n")
        .replace(
            &oxbow_e2e::harness::kafka_bootstrap_in_cluster(),
            "127.0.0.1:9",
        );
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    let healthy = unique("healthy");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&healthy, &[&source], "")),
    );
    assert!(ok, "apply: {err}");

    let app = wait_for(
        "the lost app to report Kafka unreachable",
        Duration::from_secs(90),
        || async {
            let app = api.get(&lost).await.map_err(|e| e.to_string())?;
            match apps::condition(&app, "TopicsReady") {
                Some((s, r, _)) if s == "False" && r == "KafkaUnreachable" => Ok(app),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let (status, reason, msg) = apps::condition(&app, "Ready").expect("Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "KafkaUnreachable")
    );
    assert!(
        msg.contains("127.0.0.1:9"),
        "the message names the address: {msg}"
    );
    assert_eq!(
        apps::condition(&app, "Reconciling").map(|c| c.0).as_deref(),
        Some("True"),
        "transient, not stalled"
    );

    apps::wait_condition(&api, &healthy, "Ready", "True", Duration::from_secs(120)).await;

    // The failure is counted when the reconcile returns, after its status write and
    // events: wait for it rather than race it.
    let url = format!("http://{}/metrics", operator.metrics_addr);
    wait_for(
        "the reconcile failure to be counted as KafkaUnreachable",
        Duration::from_secs(30),
        || async {
            let metrics = reqwest::get(&url)
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            match metrics
                .contains("oxbow_operator_reconcile_failures_total{error=\"KafkaUnreachable\"}")
            {
                true => Ok(()),
                false => Err(metrics),
            }
        },
    )
    .await;

    // Deleting it cannot delete its topics; after the cleanup timeout (20 s here) the
    // finalizer lets go rather than wedging the namespace.
    let start = Instant::now();
    api.delete(&lost, &Default::default())
        .await
        .expect("delete");
    wait_for(
        "the lost app to be let go after the cleanup timeout",
        Duration::from_secs(90),
        || async {
            api.get_opt(&lost)
                .await
                .map_err(|e| e.to_string())?
                .map_or(Ok(()), |_| Err("still present".into()))
        },
    )
    .await;
    assert!(
        start.elapsed() >= Duration::from_secs(15),
        "it tried for the timeout first ({:?})",
        start.elapsed()
    );
    let (ok, events, _) = kubectl(
        &[
            "get",
            "events",
            "-n",
            n,
            "--field-selector",
            "reason=CleanupTimedOut",
            "-o",
            "name",
        ],
        None,
    );
    assert!(
        ok && !events.trim().is_empty(),
        "a CleanupTimedOut event tells the user what was left behind"
    );

    apps::delete_all(&api).await;
    ns.delete().await;
}

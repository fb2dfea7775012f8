//! Someone changes a changelog topic's config behind the operator's back: under
//! `driftPolicy: Report` the StreamApp says so (Stalled, topic and key in the message,
//! drift listed in status.topics); switching to `Enforce` corrects the topic.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

#[tokio::test]
async fn changelog_drift_is_reported_then_corrected_under_enforce() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "drift").await;
    let n = ns.name.as_str();
    let source = unique("orders");
    kafka::create_topic(&source, 2).await;
    let _operator = OperatorProcess::start(n);
    let name = unique("drift");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&name, &[&source], "")),
    );
    assert!(ok, "apply: {err}");
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;

    let changelog = format!("{n}.{name}-seen-changelog");
    kafka::set_config(&changelog, "min.cleanable.dirty.ratio", "0.5").await;
    let app = wait_for("drift to be reported", Duration::from_secs(60), || async {
        let app = api.get(&name).await.map_err(|e| e.to_string())?;
        match apps::condition(&app, "Stalled") {
            Some((s, r, _)) if s == "True" && r == "ConfigDrift" => Ok(app),
            other => Err(format!("Stalled: {other:?}")),
        }
    })
    .await;
    let (_, _, msg) = apps::condition(&app, "Stalled").expect("Stalled");
    assert!(
        msg.contains(&changelog) && msg.contains("min.cleanable.dirty.ratio: 0.5 (want 0.1)"),
        "{msg}"
    );
    assert_eq!(
        apps::condition(&app, "Ready").map(|c| c.0).as_deref(),
        Some("False"),
        "drift is not Ready"
    );
    let st = app.status.expect("status");
    let topic = st
        .topics
        .iter()
        .find(|t| t.name == changelog)
        .expect("topic status");
    assert!(!topic.ready);
    assert_eq!(
        topic.drift,
        vec!["min.cleanable.dirty.ratio: 0.5 (want 0.1)".to_string()]
    );
    assert_eq!(
        kafka::config(&changelog).await["min.cleanable.dirty.ratio"],
        "0.5",
        "Report never changes the topic"
    );

    // Drift on a repartition topic is reported the same way.
    let repartition = format!("{n}.{name}-per-user-repartition");
    kafka::set_config(&repartition, "retention.ms", "3600000").await;
    wait_for(
        "drift on the repartition topic to be reported",
        Duration::from_secs(60),
        || async {
            let app = api.get(&name).await.map_err(|e| e.to_string())?;
            let st = app.status.ok_or("no status")?;
            let t = st.topics.iter().find(|t| t.name == repartition);
            match t {
                Some(t) if t.drift == vec!["retention.ms: 3600000 (want -1)".to_string()] => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    let patch = serde_json::json!({"spec": {"driftPolicy": "Enforce"}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set Enforce");
    apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(60)).await;
    let cfg = kafka::config(&changelog).await;
    assert_eq!(
        cfg["min.cleanable.dirty.ratio"], "0.1",
        "Enforce corrected the topic"
    );
    assert_eq!(cfg["cleanup.policy"], "compact", "other settings kept");
    assert_eq!(
        kafka::config(&repartition).await["retention.ms"],
        "-1",
        "Enforce corrected the repartition topic"
    );

    apps::delete_all(&api).await;
    ns.delete().await;
}

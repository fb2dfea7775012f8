//! Source topics decide the task count. Missing topics, or topics with different
//! partition counts, stall the StreamApp with a message naming them (and nothing is
//! rolled out); creating the missing topic lets it proceed. Partitions added to the
//! source of a running app stall it too: its state is split by the old count.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

async fn stalled(api: &Api<StreamApp>, name: &str, reason: &str) -> String {
    let what = format!("{name} Stalled with reason {reason}");
    wait_for(&what, Duration::from_secs(60), || async {
        let app = api.get(name).await.map_err(|e| e.to_string())?;
        match apps::condition(&app, "Stalled") {
            Some((s, r, m)) if s == "True" && r == reason => Ok(m),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn missing_or_unequal_source_topics_stall_with_their_partition_counts() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "copart").await;
    let n = ns.name.as_str();
    let (a, b) = (unique("left"), unique("right"));
    kafka::create_topic(&a, 4).await;
    kafka::create_topic(&b, 6).await;
    let _operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), n);

    let name = unique("joined");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&name, &[&a, &b], "")),
    );
    assert!(ok, "apply: {err}");
    let msg = stalled(&api, &name, "SourceTopicsNotCoPartitioned").await;
    assert!(
        msg.contains(&format!("{a} has 4")) && msg.contains(&format!("{b} has 6")),
        "{msg}"
    );
    let app = api.get(&name).await.expect("app");
    assert_eq!(
        apps::condition(&app, "Ready").map(|c| c.0).as_deref(),
        Some("False")
    );
    assert_eq!(
        format!("{:?}", app.status.and_then(|s| s.phase)),
        "Some(Failed)"
    );
    assert!(
        sts.get_opt(&name).await.expect("get").is_none(),
        "nothing is rolled out for an app that cannot run"
    );

    let lonely = unique("lonely");
    let missing = unique("not-yet");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&lonely, &[&missing], "")),
    );
    assert!(ok, "apply: {err}");
    let msg = stalled(&api, &lonely, "SourceTopicsMissing").await;
    assert!(msg.contains(&missing), "{msg}");
    // The operator looks again: once the topic exists the app proceeds.
    kafka::create_topic(&missing, 2).await;
    let app = apps::wait_condition(&api, &lonely, "Ready", "True", Duration::from_secs(120)).await;
    // Two partitions in each of three stages: the source, then the dedupe by txId and
    // the aggregate by userId, each behind its own repartition topic.
    assert_eq!(app.status.and_then(|s| s.tasks), Some(6));

    apps::delete_all(&api).await;
    ns.delete().await;
}

#[tokio::test]
async fn partitions_added_to_a_running_apps_source_stall_it_and_grow_no_changelog() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "grown").await;
    let n = ns.name.as_str();
    let source = unique("grown-in");
    kafka::create_topic(&source, 2).await;
    let _operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let name = unique("grown");
    let (ok, _, err) = kubectl(
        &["apply", "-n", n, "-f", "-"],
        Some(&apps::manifest(&name, &[&source], "")),
    );
    assert!(ok, "apply: {err}");
    apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;
    let changelog = format!("{n}.{name}-seen-changelog");
    assert_eq!(kafka::partitions(&changelog), Some(2));

    // Someone grows the source: keys would now go to tasks that do not hold their state.
    kafka::add_partitions(&source, 4).await;
    let msg = stalled(&api, &name, "SourcePartitionsChanged").await;
    assert!(
        msg.contains("have 4 partitions") && msg.contains("split into 2 tasks"),
        "says what changed and what to do: {msg}"
    );
    let app = api.get(&name).await.expect("app");
    assert_eq!(
        apps::condition(&app, "TopicsReady").map(|c| (c.0, c.1)),
        Some(("False".to_string(), "SourcePartitionsChanged".to_string()))
    );
    assert_eq!(
        kafka::partitions(&changelog),
        Some(2),
        "the changelogs are not grown: that would split the state silently"
    );
    apps::delete_all(&api).await;
    ns.delete().await;
}

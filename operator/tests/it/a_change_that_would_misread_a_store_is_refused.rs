//! State compatibility across spec changes (issue 16, item 8): an aggregate keeps its
//! accumulators by position, so a new field would shift every stored value. The
//! operator records what each store's data means (`status.storeLayouts`), refuses a
//! spec that would read it as something else (`IncompatibleStateChange`, nothing rolled
//! out), and rolls out compatible changes as usual. Real API server, stand-in workers.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
};

/// The config hash on the workers' pod template: it changes with every rollout.
async fn rolled_out_hash(sts: &Api<StatefulSet>, name: &str) -> Option<String> {
    sts.get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .template
        .metadata?
        .annotations?
        .get("oxbow.dev/config-hash")
        .cloned()
}

#[tokio::test]
async fn a_change_that_would_misread_a_store_stalls_and_a_compatible_one_rolls_out() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "layout").await;
    let n = ns.name.as_str();
    let source = unique("layout-in");
    kafka::create_topic(&source, 2).await;
    let _operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), n);
    let name = unique("layout");
    let original = apps::manifest(&name, &[&source], "");
    let apply = |m: &str| {
        let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(m));
        assert!(ok, "apply: {err}");
    };
    apply(&original);
    let app = apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;
    let layouts = app.status.expect("status").store_layouts;
    assert_eq!(
        layouts.get("per-user").map(String::as_str),
        Some("aggregate window=tumbling fields=count:count"),
        "{layouts:?}"
    );
    let before = rolled_out_hash(&sts, &name).await.expect("rolled out");

    // A second accumulator: the stored counts would be read by position.
    apply(&original.replace(
        "fields: {count: {count: {}}}",
        "fields: {amount: {sum: value.amount}, count: {count: {}}}",
    ));
    let msg = apps::wait_stalled(&api, &name, "IncompatibleStateChange").await;
    assert!(
        msg.contains("\"per-user\"") && msg.contains("new store name"),
        "names the store and the way out: {msg}"
    );
    assert_eq!(
        rolled_out_hash(&sts, &name).await.as_deref(),
        Some(before.as_str()),
        "nothing is rolled out: the workers keep the previous spec"
    );

    // A compatible change (a filter after the aggregate, a longer window) rolls out.
    apply(
        &original
            .replace("tumbling: 1m", "tumbling: 5m")
            .replace("  sink:", "  - filter: {cel: \"value.count > 1\"}\n  sink:"),
    );
    let app = apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;
    assert_eq!(
        app.status.and_then(|s| s.observed_generation),
        app.metadata.generation
    );
    assert_ne!(
        rolled_out_hash(&sts, &name).await.as_deref(),
        Some(before.as_str()),
        "the compatible change rolled out"
    );
    apps::delete_all(&api).await;
    ns.delete().await;
}

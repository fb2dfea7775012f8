//! One owner per application id on a Kafka cluster (issue 16, item 1), recorded in
//! Kafka's claims topic so operators watching different namespaces see each other:
//! same-named apps in two namespaces get ids of their own, a second app with a taken id
//! stalls and its deletion leaves the owner's topics alone, and a topic that already
//! exists is taken over only when the app says so.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

fn apply(ns: &str, manifest: &str) {
    let (ok, _, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(manifest));
    assert!(ok, "apply in {ns}: {err}");
}

async fn no_workload(client: &kube::Client, ns: &str, name: &str) {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    assert!(
        sts.get_opt(name).await.expect("read StatefulSet").is_none(),
        "nothing is rolled out for {ns}/{name}"
    );
}

#[tokio::test]
async fn same_named_apps_in_two_namespaces_get_ids_and_topics_of_their_own() {
    install_crd();
    let client = kube_client().await;
    let (a, b) = (
        TestNamespace::create(&client, "team-a").await,
        TestNamespace::create(&client, "team-b").await,
    );
    let source = unique("orders-in");
    kafka::create_topic(&source, 2).await;
    // One operator per namespace: they share nothing but Kafka.
    let _op_a = OperatorProcess::start(&a.name);
    let _op_b = OperatorProcess::start(&b.name);
    let name = unique("orders");
    for ns in [&a.name, &b.name] {
        apply(ns, &apps::manifest(&name, &[&source], ""));
    }
    for ns in [&a.name, &b.name] {
        let api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
        let app =
            apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;
        let id = format!("{ns}.{name}");
        assert_eq!(
            app.status.as_ref().and_then(|s| s.application_id.clone()),
            Some(id.clone()),
            "the default id is <namespace>.<name>, recorded in status"
        );
        assert_eq!(
            kafka::partitions(&format!("{id}-seen-changelog")),
            Some(2),
            "{ns}'s own changelog"
        );
    }
    assert_eq!(
        kafka::partitions(&format!("{name}-seen-changelog")),
        None,
        "no app uses the bare name"
    );
    for ns in [&a.name, &b.name] {
        let api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
        apps::delete_all(&api).await;
    }
    a.delete().await;
    b.delete().await;
}

#[tokio::test]
async fn a_second_app_with_a_taken_id_stalls_and_its_deletion_leaves_the_owner_alone() {
    install_crd();
    let client = kube_client().await;
    let (a, b) = (
        TestNamespace::create(&client, "owner").await,
        TestNamespace::create(&client, "intruder").await,
    );
    let source = unique("shared-in");
    kafka::create_topic(&source, 2).await;
    let _op_a = OperatorProcess::start(&a.name);
    let _op_b = OperatorProcess::start(&b.name);
    let id = unique("shared-id");
    let (owner, intruder) = (unique("owner"), unique("intruder"));
    apply(
        &a.name,
        &apps::manifest(&owner, &[&source], &format!("  applicationId: {id}\n")),
    );
    let api_a: Api<StreamApp> = Api::namespaced(client.clone(), &a.name);
    apps::wait_condition(&api_a, &owner, "Ready", "True", Duration::from_secs(120)).await;
    let changelogs = [
        format!("{id}-seen-changelog"),
        format!("{id}-per-user-changelog"),
    ];
    for t in &changelogs {
        assert_eq!(kafka::partitions(t), Some(2), "{t} created for the owner");
    }

    apply(
        &b.name,
        &apps::manifest(
            &intruder,
            &[&source],
            &format!(
                "  applicationId: {id}\n  deletionPolicy: {{topics: Delete, consumerGroup: Delete}}\n"
            ),
        ),
    );
    let api_b: Api<StreamApp> = Api::namespaced(client.clone(), &b.name);
    let msg = apps::wait_stalled(&api_b, &intruder, "ApplicationIdConflict").await;
    assert!(
        msg.contains(&format!("{}/{owner}", a.name)),
        "the message names the owner: {msg}"
    );
    no_workload(&client, &b.name, &intruder).await;

    apps::delete_and_wait(&api_b, &intruder).await;
    for t in &changelogs {
        assert_eq!(
            kafka::partitions(t),
            Some(2),
            "deleting the intruder with topics: Delete leaves the owner's {t}"
        );
    }
    let app = api_a.get(&owner).await.expect("owner");
    assert_eq!(
        apps::condition(&app, "Ready").map(|c| c.0),
        Some("True".into()),
        "the owner stays Ready"
    );

    // Once the owner is gone, the id is free: a new app may claim it.
    apps::delete_and_wait(&api_a, &owner).await;
    let heir = unique("heir");
    apply(
        &b.name,
        &apps::manifest(&heir, &[&source], &format!("  applicationId: {id}\n")),
    );
    // The owner retained its topics, recorded as its own: the heir may not take them.
    let msg = apps::wait_stalled(&api_b, &heir, "TopicNotOwned").await;
    assert!(
        msg.contains(&changelogs[0]) && msg.contains(&format!("{}/{owner}", a.name)),
        "names the topic and whose it is: {msg}"
    );
    no_workload(&client, &b.name, &heir).await;
    apps::delete_all(&api_b).await;
    a.delete().await;
    b.delete().await;
}

#[tokio::test]
async fn an_existing_topic_is_adopted_only_when_the_app_says_so() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "adopt").await;
    let n = ns.name.as_str();
    let source = unique("adopt-in");
    kafka::create_topic(&source, 2).await;
    let _operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let name = unique("migrated");
    // A changelog left by an earlier deployment (Kafka Streams, or by hand).
    let changelog = format!("{n}.{name}-seen-changelog");
    kafka::create_topic(&changelog, 2).await;
    kafka::set_config(&changelog, "min.cleanable.dirty.ratio", "0.5").await;

    let extra = "  driftPolicy: Enforce\n";
    apply(n, &apps::manifest(&name, &[&source], extra));
    let msg = apps::wait_stalled(&api, &name, "TopicNotOwned").await;
    assert!(
        msg.contains(&changelog) && msg.contains("adoptExistingTopics"),
        "says which topic and how to adopt it: {msg}"
    );
    no_workload(&client, n, &name).await;
    assert_eq!(
        kafka::config(&changelog).await["min.cleanable.dirty.ratio"],
        "0.5",
        "a topic that is not the app's is never altered, even under Enforce"
    );

    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"adoptExistingTopics": true}})),
    )
    .await
    .expect("set adoptExistingTopics");
    apps::wait_condition(&api, &name, "Ready", "True", Duration::from_secs(120)).await;
    wait_for(
        "the adopted changelog's drift to be corrected",
        Duration::from_secs(30),
        || async {
            match kafka::config(&changelog).await["min.cleanable.dirty.ratio"].as_str() {
                "0.1" => Ok(()),
                other => Err(other.to_string()),
            }
        },
    )
    .await;

    // spec.applicationId may be written down once, as the id in force (the migration
    // path for apps that relied on a default), and is then immutable.
    let pinned = |id: &str| {
        format!(
            "{}  adoptExistingTopics: true\n  applicationId: {id}\n",
            apps::manifest(&name, &[&source], extra)
        )
    };
    apply(n, &pinned(&format!("{n}.{name}")));
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&pinned("another-id")));
    assert!(
        !ok && err.contains("applicationId is immutable"),
        "once set it is immutable: {err}"
    );
    // Written down as another id than the one in force, it is refused by the operator.
    let other = unique("renamed");
    apply(n, &apps::manifest(&other, &[&source], ""));
    apps::wait_condition(&api, &other, "Ready", "True", Duration::from_secs(120)).await;
    let new_id = unique("a-new-id");
    let renamed = |extra: &str| {
        format!(
            "{}  applicationId: {new_id}\n",
            apps::manifest(&other, &[&source], extra)
        )
    };
    apply(n, &renamed(""));
    let msg = apps::wait_stalled(&api, &other, "ApplicationIdChanged").await;
    assert!(
        msg.contains(&format!("{n}.{other}")),
        "names the id in force: {msg}"
    );
    // Refused for good, not for one reconciliation: a later generation still runs as the
    // id in force and creates nothing under the new one.
    apply(n, &renamed("  driftPolicy: Enforce\n"));
    let generation = api
        .get(&other)
        .await
        .expect("renamed app")
        .metadata
        .generation;
    wait_for(
        "the renamed app's next generation to be refused too",
        Duration::from_secs(90),
        || async {
            let app = api.get(&other).await.map_err(|e| e.to_string())?;
            let st = app.status.clone().unwrap_or_default();
            match apps::condition(&app, "Stalled") {
                Some((s, r, _))
                    if st.observed_generation == generation
                        && s == "True"
                        && r == "ApplicationIdChanged" =>
                {
                    Ok(st)
                }
                other => Err(format!(
                    "generation {:?} of {generation:?}: {other:?}",
                    st.observed_generation
                )),
            }
        },
    )
    .await;
    let app = api.get(&other).await.expect("renamed app");
    assert_eq!(
        app.status.and_then(|s| s.application_id),
        Some(format!("{n}.{other}")),
        "the status keeps the id in force"
    );
    assert_eq!(
        kafka::partitions(&format!("{new_id}-seen-changelog")),
        None,
        "no topic is created under a refused id"
    );
    let app = api.get(&name).await.expect("pinned app");
    assert_eq!(
        apps::condition(&app, "Ready").map(|c| c.0),
        Some("True".into()),
        "pinning the id in force changes nothing"
    );
    apps::delete_all(&api).await;
    ns.delete().await;
}

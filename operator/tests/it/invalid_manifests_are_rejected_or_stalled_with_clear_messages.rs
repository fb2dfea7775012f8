//! A table of bad StreamApps. What the schema can tell, the API server rejects at
//! `kubectl apply` with the message we wrote; what only a runtime check can tell (CEL
//! syntax, store use) the operator reports as Stalled with a message naming the field.

use std::time::Duration;

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};

/// (case, text replaced in the base manifest, replacement, expected message fragment)
const REJECTED: &[(&str, &str, &str, &str)] = &[
    (
        "a name too long for pod and Service names",
        "metadata:\n  name: ",
        "metadata:\n  name: this-name-is-far-too-long-for-a-statefulset-pod-",
        "metadata.name must be a DNS-1035 label of at most 47 characters",
    ),
    (
        "dead letters into the sink topic",
        "replicas: 2",
        "replicas: 2\n  errors: {policy: deadLetter, topic: NAME-out}",
        "errors.topic must not be the sink topic",
    ),
    (
        "negative replicas",
        "replicas: 2",
        "replicas: -1",
        "should be greater than or equal to 0",
    ),
    (
        "standbys not below replicas",
        "replicas: 2",
        "replicas: 2\n  standbyReplicas: 2",
        "standbyReplicas must be less than replicas",
    ),
    (
        "unparsable commit interval",
        "replicas: 2",
        "replicas: 2\n  commitInterval: fast",
        "commitInterval must be a duration such as 100ms",
    ),
    (
        "unknown processing guarantee",
        "replicas: 2",
        "replicas: 2\n  processingGuarantee: maybe_once",
        "Unsupported value: \"maybe_once\"",
    ),
    (
        "unknown error policy",
        "replicas: 2",
        "replicas: 2\n  errors: {policy: ignore}",
        "Unsupported value: \"ignore\"",
    ),
    (
        "step with two kinds",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- {filter: {cel: 'true'}, map: {value: value}}",
        "each step must set exactly one of filter, map, flatMap, dedupe, aggregate, batch, join or to",
    ),
    (
        "step with no kind",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- name: nothing",
        "each step must set exactly one of",
    ),
    (
        "stateful step naming no store",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- dedupe: {id: value.txId, within: 1h}",
        "store: Required value",
    ),
    (
        "store name not usable in a topic",
        "store: seen",
        "store: Seen_Store",
        "store names are lowercase letters, digits and '-'",
    ),
    (
        "no source topic",
        "topics: [SOURCE]",
        "topics: []",
        "should have at least 1 items",
    ),
    (
        "no bootstrap servers",
        "  kafka:\n    bootstrapServers:",
        "  kafka: {}\n    # bootstrapServers:",
        "spec.kafka.bootstrapServers: Required value",
    ),
    (
        "misspelt field",
        "replicas: 2",
        "replica: 2",
        "unknown field \"spec.replica\"",
    ),
    (
        "unknown step type",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- explode: {}",
        "unknown field \"spec.steps[0].explode\"",
    ),
    (
        "two window kinds",
        "window: {tumbling: 1m}",
        "window: {tumbling: 1m, session: {gap: 1m}}",
        "a window is exactly one of tumbling, hopping or session",
    ),
    (
        "aggregate field with two aggregations",
        "fields: {count: {count: {}}}",
        "fields: {count: {count: {}, sum: value.x}}",
        "each aggregate field is exactly one of count, sum, min, max, avg or last",
    ),
    (
        "unparsable dedupe span",
        "within: 1h",
        "within: 1w",
        "within must be a duration such as 10m, 24h or 7d",
    ),
    (
        "sink reads its own input",
        "sink: {topic: NAME-out}",
        "sink: {topic: SOURCE}",
        "sink.topic must not be a source topic",
    ),
    (
        "application id unfit for topic names",
        "replicas: 2",
        "replicas: 2\n  applicationId: my app",
        "applicationId may use letters, digits",
    ),
    (
        "min ISR above replication",
        "replicas: 2",
        "replicas: 2\n  stores: {seen: {changelog: {replicationFactor: 2, minInsyncReplicas: 3}}}",
        "minInsyncReplicas must not exceed replicationFactor",
    ),
    (
        "dirty ratio above 1",
        "replicas: 2",
        "replicas: 2\n  stores: {seen: {changelog: {minCleanableDirtyRatio: 1.5}}}",
        "should be less than or equal to 1",
    ),
    (
        "map that maps nothing",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- map: {}",
        "map needs key, value or both",
    ),
    (
        "zero storage",
        "replicas: 2",
        "replicas: 2\n  storage: {size: 0Gi}",
        "storage.size must be a positive quantity",
    ),
    (
        "dead letters into a source topic",
        "replicas: 2",
        "replicas: 2\n  errors: {policy: deadLetter, topic: SOURCE}",
        "errors.topic must not be a source topic",
    ),
    (
        "an aggregate field written n, which YAML 1.1 reads as false",
        "fields: {count: {count: {}}}",
        "fields: {n: {count: {}}}",
        "an aggregate field is named true or false: kubectl reads an unquoted key n, y, no, yes, on or off as a YAML 1.1 boolean; quote the key",
    ),
    (
        "store settings under a key written on, which YAML 1.1 reads as true",
        "replicas: 2",
        "replicas: 2\n  stores: {on: {changelog: {segment: 1h}}}",
        "a store is named true or false in spec.stores",
    ),
    (
        "a step name unfit for a topic name",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- {name: 'by user', dedupe: {store: seen, id: value.txId, within: 1h}}",
        "step names may use letters, digits, '.', '_' and '-'",
    ),
];

/// (case, replaced, replacement, Stalled reason, message fragment)
const STALLED: &[(&str, &str, &str, &str, &str)] = &[
    (
        "CEL syntax error",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- filter: {cel: 'value.count >'}",
        "InvalidExpression",
        "spec.steps[0].filter.cel: failed to parse CEL expression",
    ),
    (
        "two steps sharing a store",
        "store: per-user",
        "store: seen",
        "DuplicateStore",
        "store \"seen\" is used by dedupe-0 and aggregate-1",
    ),
    (
        "settings for an unused store",
        "replicas: 2",
        "replicas: 2\n  stores: {sene: {changelog: {segment: 1h}}}",
        "UnusedStoreSettings",
        "spec.stores.sene: no step uses store \"sene\"",
    ),
    (
        "a Kafka Secret that does not exist",
        "  kafka:\n",
        "  kafka:\n    secretRef: {name: no-such-secret}\n",
        "KafkaSecretMissing",
        "Secret no-such-secret named by spec.kafka.secretRef does not exist",
    ),
    (
        "a partitionedBy that cannot be evaluated",
        "topics: [SOURCE]",
        "topics: [SOURCE]\n    partitionedBy: 'value.userId +'",
        "InvalidExpression",
        "spec.source.partitionedBy: failed to parse CEL expression",
    ),
    (
        "two steps with one name",
        "- dedupe: {store: seen, id: value.txId, within: 1h}",
        "- {name: twice, dedupe: {store: seen, id: value.txId, within: 1h}}\n  - {name: twice, filter: {cel: 'true'}}",
        "DuplicateStepName",
        "spec.steps[1].name: step name \"twice\" is also the name of spec.steps[0]",
    ),
    (
        "a repartition topic that is the sink topic",
        "  sink: {topic: ",
        "  sink: {topic: APPID-per-user-repartition}\n  # was: ",
        "TopicCollision",
        "-per-user-repartition\", which is also the sink topic; give the step another name",
    ),
];

/// `APPID` stands for the app's default id, `<namespace>.<name>`.
fn render(ns: &str, name: &str, source: &str, from: &str, to: &str) -> String {
    let base = apps::manifest(name, &[source], "");
    let id = format!("{ns}.{name}");
    let fill = |text: &str| {
        text.replace("SOURCE", source)
            .replace("APPID", &id)
            .replace("NAME", name)
    };
    let from = fill(from);
    assert!(
        base.contains(&from),
        "fixture text {from:?} not in the base manifest"
    );
    base.replacen(&from, &fill(to), 1)
}

#[tokio::test]
async fn every_bad_manifest_gets_a_clear_message() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "invalid").await;
    let n = ns.name.as_str();
    let source = unique("in");
    kafka::create_topic(&source, 1).await;

    let mut failures = Vec::new();
    for (case, from, to, want) in REJECTED {
        let name = unique("bad");
        let manifest = render(n, &name, &source, from, to);
        let (ok, out, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
        if ok || !err.contains(want) {
            failures.push(format!(
                "{case}: accepted={ok}, wanted {want:?} in: {out}{err}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        REJECTED.len(),
        failures.join("\n")
    );

    // applicationId is immutable once set.
    let name = unique("fixed");
    let with_id = |id: &str| apps::manifest(&name, &[&source], &format!("  applicationId: {id}\n"));
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&with_id("first-id")));
    assert!(ok, "a valid app is accepted: {err}");
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&with_id("second-id")));
    assert!(
        !ok && err.contains("applicationId is immutable"),
        "immutability: {err}"
    );
    // So is storage: a StatefulSet's volume claim template cannot change.
    let resized = format!("{}  storage: {{size: 5Gi}}\n", with_id("first-id"));
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&resized));
    assert!(
        !ok && err.contains("storage is immutable"),
        "storage immutability: {err}"
    );
    let (ok, _, err) = kubectl(&["delete", "-n", n, "streamapp", &name], None);
    assert!(ok, "{err}");

    // Runtime checks: the operator reports them as Stalled, and rolls nothing out.
    let _operator = OperatorProcess::start(n);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), n);
    let mut names = Vec::new();
    for (case, from, to, reason, want) in STALLED {
        let name = unique("stall");
        let manifest = render(n, &name, &source, from, to);
        let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&manifest));
        assert!(
            ok,
            "{case}: the API server cannot tell, so it accepts: {err}"
        );
        let what = format!("{case}: Stalled {reason}");
        let msg = wait_for(&what, Duration::from_secs(60), || async {
            let app = api.get(&name).await.map_err(|e| e.to_string())?;
            match apps::condition(&app, "Stalled") {
                Some((s, r, m)) if s == "True" && r == *reason => Ok(m),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert!(msg.contains(want), "{case}: wanted {want:?} in {msg:?}");
        names.push(name);
    }
    apps::delete_all(&api).await;
    ns.delete().await;
}

//! Every child object of a StreamApp, built from the spec alone.
//!
//! Pure: no I/O, no clock. The same spec always yields the same objects, so applying
//! them with server-side apply is idempotent and a hand-edited child is put back. This
//! module owns the shape of the children; it must not decide when or whether to apply.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::{Resource, ResourceExt};
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_crds::{Retention, StreamApp};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The worker's HTTP port (queries, health, metrics).
pub const HTTP_PORT: i32 = 8080;
/// The worker's `/metrics` port: apart from the queries, so the NetworkPolicy can admit
/// Prometheus there while the query port stays closed.
pub const METRICS_PORT: i32 = 9090;
pub const CONFIG_MOUNT: &str = "/etc/oxbow";
pub const CONFIG_FILE: &str = "streamapp.yaml";
pub const STATE_MOUNT: &str = "/var/lib/oxbow";
pub const STATE_VOLUME: &str = "state";
/// Where the Secret of `spec.kafka.secretRef` is mounted: one file per librdkafka property.
pub const KAFKA_SECRET_MOUNT: &str = "/etc/oxbow/kafka-secret";
pub const CONFIG_HASH_ANNOTATION: &str = "oxbow.dev/config-hash";
/// The resourceVersion of the Secret of `spec.kafka.secretRef` the pods were started with.
pub const KAFKA_SECRET_VERSION_ANNOTATION: &str = "oxbow.dev/kafka-secret-version";
/// Label on every child; `prune` finds leftovers by it.
pub const APP_LABEL: &str = "oxbow.dev/streamapp";
/// Tells a worker to run the tasks the operator assigns in this ConfigMap (coordinated
/// mode) instead of computing its share itself (standalone mode).
pub const ASSIGNMENT_ENV: &str = "OXBOW_ASSIGNMENT_CONFIGMAP";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("failed to build children: the StreamApp has no {0}")]
    MissingMetadata(&'static str),
    #[error("failed to render the worker config: {0}")]
    RenderConfig(#[from] serde_yaml::Error),
    #[error("failed to build {kind}: {source}")]
    Convert {
        kind: &'static str,
        source: serde_json::Error,
    },
}

/// Facts the build needs that are not in the spec.
#[derive(Debug, Clone)]
pub struct BuildContext {
    /// Image when `spec.image` is unset: the worker released with this operator.
    pub default_image: String,
    /// When set, each app gets a NetworkPolicy admitting its query port only from its
    /// own pods and from pods carrying this label (`key`, `value`).
    pub query_client_label: Option<(String, String)>,
}

/// Every child, in the order they are applied.
#[derive(Debug, Clone)]
pub struct Children {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub config_map: ConfigMap,
    pub headless_service: Service,
    pub client_service: Service,
    pub stateful_set: StatefulSet,
    pub pod_disruption_budget: PodDisruptionBudget,
    /// `None` when the operator runs without `--network-policy`: any leftover is pruned.
    pub network_policy: Option<NetworkPolicy>,
    /// One report Lease per pod of the StatefulSet (see `oxbow_crds::report`): made by
    /// the operator, renewed by its pod, which may patch it and nothing else.
    pub report_leases: Vec<Lease>,
}

pub fn labels(app: &StreamApp) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "oxbow-worker".into()),
        ("app.kubernetes.io/instance".into(), app.name_any()),
        ("app.kubernetes.io/component".into(), "worker".into()),
        (
            "app.kubernetes.io/managed-by".into(),
            "oxbow-operator".into(),
        ),
        (APP_LABEL.into(), app.name_any()),
    ])
}

/// The label selector of the worker pods (also reported for the scale subresource).
pub fn selector_labels(app: &StreamApp) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_LABEL.into(), app.name_any()),
        ("app.kubernetes.io/component".into(), "worker".into()),
    ])
}

pub fn selector_string(app: &StreamApp) -> String {
    selector_labels(app)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The worker's configuration file: the StreamApp itself, as a user would write it
/// (the worker reads the same manifest standalone), without server-managed fields.
/// `replicas`, `standbyReplicas`, `deletionPolicy` and `driftPolicy` are left out: the
/// config's hash rolls the pods, and scaling or an operator-only setting must not restart
/// running workers (they learn their peers and their standby tasks from the assignment,
/// not the config).
pub fn render_config(app: &StreamApp) -> Result<String, BuildError> {
    let mut spec = serde_json::to_value(&app.spec).map_err(|source| BuildError::Convert {
        kind: "StreamApp",
        source,
    })?;
    if let Some(o) = spec.as_object_mut() {
        // Fields only the operator acts on: changing them must not restart the workers.
        for k in [
            "replicas",
            "standbyReplicas",
            "deletionPolicy",
            "driftPolicy",
            "adoptExistingTopics",
        ] {
            o.remove(k);
        }
        // The id in force (it may come from status or the default): the worker's group,
        // changelogs and transactional ids must be the operator's.
        o.insert("applicationId".into(), json!(app.application_id()));
    }
    let doc = json!({
        "apiVersion": "oxbow.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": app.name_any(), "namespace": app.namespace()},
        "spec": spec,
    });
    Ok(serde_yaml::to_string(&doc)?)
}

/// Share of the container's memory limit given to RocksDB (block cache and write
/// buffers). The rest is for what RocksDB does not account: Kafka clients' fetch and
/// produce queues, a restore's bulk-load chunk, query buffers and the process itself.
const ROCKSDB_SHARE_OF_LIMIT: f64 = 0.5;
/// Below this RocksDB thrashes its cache; a limit this small cannot run the worker anyway.
const ROCKSDB_MIN_MIB: u64 = 32;
/// A limit far beyond any node still yields a budget the worker can hold in bytes.
const ROCKSDB_MAX_MIB: u64 = 1 << 30;

/// The worker's `--memory-mib` for a container with these resources: a share of the
/// memory limit, or `None` (the worker's own default) without a limit. A limit that does
/// not parse also gives `None`: the API server rejects it in the StatefulSet anyway.
pub fn rocksdb_memory_mib(
    resources: Option<&k8s_openapi::api::core::v1::ResourceRequirements>,
) -> Option<u64> {
    let limit = resources?.limits.as_ref()?.get("memory")?;
    let bytes = parse_quantity(&limit.0)?;
    let mib = (bytes * ROCKSDB_SHARE_OF_LIMIT / f64::from(1u32 << 20)).floor();
    // `as` saturates a float; the clamp keeps the floor and the ceiling.
    Some((mib as u64).clamp(ROCKSDB_MIN_MIB, ROCKSDB_MAX_MIB))
}

/// A Kubernetes quantity (`512Mi`, `1.5Gi`, `2G`, `1536M`, `1e9`, `128974848`) as a
/// number of base units, or `None` if it is not one. Floating point is exact to the byte
/// below 8 PiB, which is plenty for a memory limit.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    // The grammar's sign is optional and leading; digits must surround at most one dot.
    let unsigned = number.strip_prefix(['+', '-']).unwrap_or(number);
    if unsigned.is_empty()
        || unsigned == "."
        || unsigned.contains(['+', '-'])
        || unsigned.matches('.').count() > 1
    {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "Ki" => 2f64.powi(10),
        "Mi" => 2f64.powi(20),
        "Gi" => 2f64.powi(30),
        "Ti" => 2f64.powi(40),
        "Pi" => 2f64.powi(50),
        "Ei" => 2f64.powi(60),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        // A decimal exponent: `1e9`, `5E-3`.
        s => {
            let exp = s.strip_prefix(['e', 'E'])?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            10f64.powi(exp.parse().ok()?)
        }
    };
    let v = value * multiplier;
    v.is_finite().then_some(v)
}

fn config_hash(data: &str) -> String {
    let digest = Sha256::digest(data.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn convert<T: serde::de::DeserializeOwned>(kind: &'static str, v: Value) -> Result<T, BuildError> {
    serde_json::from_value(v).map_err(|source| BuildError::Convert { kind, source })
}

/// The metadata of every child: its name, the namespace, the labels and the controller
/// owner reference (so Kubernetes collects it with the StreamApp).
fn child_meta(app: &StreamApp) -> Result<impl Fn(String) -> Value, BuildError> {
    let ns = app
        .namespace()
        .ok_or(BuildError::MissingMetadata("namespace"))?;
    let owner = app
        .controller_owner_ref(&())
        .ok_or(BuildError::MissingMetadata("uid"))?;
    let owner = serde_json::to_value(&owner).map_err(|source| BuildError::Convert {
        kind: "OwnerReference",
        source,
    })?;
    let labels = labels(app);
    Ok(
        move |obj_name: String| json!({"name": obj_name, "namespace": ns, "labels": labels, "ownerReferences": [owner]}),
    )
}

/// The assignment ConfigMap (`<name>-assignment`): the JSON of the assignment under
/// [`CONFIG_MAP_KEY`]. The workers watch it.
pub fn assignment_config_map(app: &StreamApp, a: &Assignment) -> Result<ConfigMap, BuildError> {
    let meta = child_meta(app)?;
    let text = serde_json::to_string(a).map_err(|source| BuildError::Convert {
        kind: "Assignment",
        source,
    })?;
    convert(
        "ConfigMap",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(app.assignment_config_map_name()),
            "data": {CONFIG_MAP_KEY: text},
        }),
    )
}

/// Every child but the assignment ConfigMap. `replicas` is the StatefulSet's size: the
/// spec's, or more while pods above it still hand their tasks over (see
/// `placement::stateful_set_replicas`).
/// `kafka_secret_version`: the resourceVersion of the Secret of `spec.kafka.secretRef`.
pub fn build(
    app: &StreamApp,
    cx: &BuildContext,
    replicas: i32,
    kafka_secret_version: Option<&str>,
) -> Result<Children, BuildError> {
    let name = app.name_any();
    let ns = app
        .namespace()
        .ok_or(BuildError::MissingMetadata("namespace"))?;
    let labels = labels(app);
    let meta = child_meta(app)?;
    let spec = &app.spec;
    let sa_name = app.service_account_name();

    let service_account = convert(
        "ServiceAccount",
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(sa_name.clone()),
        }),
    )?;
    // Each pod's report Lease, labelled for the watches of its app's pods and the operator.
    let report_leases = (0..replicas.max(0))
        .map(|i| {
            let mut m = meta(oxbow_crds::report::lease_name(&format!(
                "{}-{i}",
                app.worker_name()
            )));
            m["labels"][oxbow_crds::report::REPORT_OF_LABEL] = json!(name);
            convert(
                "Lease",
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": m, "spec": {}}),
            )
        })
        .collect::<Result<Vec<Lease>, _>>()?;
    // Least privilege: a worker reads its own ConfigMaps and its app's reports, and
    // renews its app's report Leases; nothing else. It writes no status and no events.
    let mut rules = vec![
        json!({"apiGroups": [""], "resources": ["configmaps"],
               "resourceNames": [app.config_map_name(), app.assignment_config_map_name()], "verbs": ["get", "list", "watch"]}),
        // A label selector cannot be combined with resourceNames: reading Leases is
        // namespace-wide (they hold no secrets); writing them is not.
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch"]}),
    ];
    let lease_names: Vec<String> = report_leases
        .iter()
        .filter_map(|l| l.metadata.name.clone())
        .collect();
    // An empty resourceNames would grant every name: no rule at all without pods.
    if !lease_names.is_empty() {
        rules.push(
            json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                          "resourceNames": lease_names, "verbs": ["patch"]}),
        );
    }
    let role = convert(
        "Role",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(sa_name.clone()),
            "rules": rules,
        }),
    )?;
    let role_binding = convert(
        "RoleBinding",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(sa_name.clone()),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa_name},
            "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": ns}],
        }),
    )?;

    let config = render_config(app)?;
    let hash = config_hash(&config);
    let config_map = convert(
        "ConfigMap",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(app.config_map_name()),
            "data": {CONFIG_FILE: config},
        }),
    )?;

    let selector = selector_labels(app);
    let port = json!({"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"});
    let headless_service = convert(
        "Service",
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": meta(app.headless_service_name()),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": selector, "ports": [port]},
        }),
    )?;
    let client_service = convert(
        "Service",
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": meta(app.client_service_name()),
            "spec": {"type": "ClusterIP", "selector": selector, "ports": [port]},
        }),
    )?;

    let overrides = spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(labels.clone());
    let mut pod_annotations = overrides.annotations.clone();
    pod_annotations.insert(CONFIG_HASH_ANNOTATION.into(), hash);
    // The worker reads the mounted Secret once, at start: a changed Secret rolls it.
    // The resourceVersion, not a digest of the content: a digest of a short password in
    // a pod's annotations could be brute-forced by anyone who may read pods.
    if let Some(v) = kafka_secret_version {
        pod_annotations.insert(KAFKA_SECRET_VERSION_ANNOTATION.into(), v.to_string());
    }
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let mut env = vec![
        json!({"name": "POD_NAME", "valueFrom": field("metadata.name")}),
        json!({"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")}),
        json!({"name": "POD_IP", "valueFrom": field("status.podIP")}),
        json!({"name": "OXBOW_STREAMAPP", "value": name}),
        json!({"name": ASSIGNMENT_ENV, "value": app.assignment_config_map_name()}),
    ];
    env.extend(
        overrides
            .env
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null)),
    );
    let mut container = json!({
        "name": "worker",
        "image": spec.image.clone().unwrap_or_else(|| cx.default_image.clone()),
        // A tagged image is immutable here: pull it only when the node lacks it, so nodes
        // loaded without a registry (kind load, the local stack) run it too.
        "imagePullPolicy": "IfNotPresent",
        "args": ["run", "--config", format!("{CONFIG_MOUNT}/{CONFIG_FILE}"), "--state-dir", STATE_MOUNT,
                 // All addresses (the worker reports $(POD_IP)); peers are reached by
                 // their DNS names under the headless Service.
                 "--listen", format!("0.0.0.0:{HTTP_PORT}"),
                 "--metrics-listen", format!("0.0.0.0:{METRICS_PORT}"),
                 "--peer-domain", format!("{}.{}.svc", app.headless_service_name(), app.namespace().unwrap_or_default())],
        "env": env,
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        // Ready only when every active task is restored and running: a rolling update
        // waits for each pod's restore before touching the next.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 2, "failureThreshold": 3},
        // /healthz answers while restoring; only a wedged process fails it.
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": true},
            {"name": STATE_VOLUME, "mountPath": STATE_MOUNT},
        ],
        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
    });
    if spec.kafka.secret_ref.is_some() {
        if let Some(m) = container["volumeMounts"].as_array_mut() {
            m.push(
                json!({"name": "kafka-secret", "mountPath": KAFKA_SECRET_MOUNT, "readOnly": true}),
            );
        }
        if let Some(a) = container["args"].as_array_mut() {
            a.push(json!("--kafka-secret-dir"));
            a.push(json!(KAFKA_SECRET_MOUNT));
        }
    }
    if let Some(r) = &spec.resources {
        container["resources"] = serde_json::to_value(r).unwrap_or(Value::Null);
    }
    if let Some(mib) = rocksdb_memory_mib(spec.resources.as_ref())
        && let Some(a) = container["args"].as_array_mut()
    {
        a.push(json!("--memory-mib"));
        a.push(json!(mib.to_string()));
    }
    let mut pod_spec = json!({
        "serviceAccountName": sa_name,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": overrides.termination_grace_period_seconds.unwrap_or(60),
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": app.config_map_name()}}],
    });
    if let Some(secret) = &spec.kafka.secret_ref
        && let Some(v) = pod_spec["volumes"].as_array_mut()
    {
        v.push(json!({"name": "kafka-secret", "secret": {"secretName": secret.name}}));
    }
    if !overrides.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(overrides.node_selector);
    }
    if !overrides.tolerations.is_empty() {
        pod_spec["tolerations"] =
            serde_json::to_value(&overrides.tolerations).unwrap_or(Value::Null);
    }
    if let Some(a) = &overrides.affinity {
        pod_spec["affinity"] = serde_json::to_value(a).unwrap_or(Value::Null);
    }
    if let Some(p) = &overrides.priority_class_name {
        pod_spec["priorityClassName"] = json!(p);
    }
    let mut claim_spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": spec.storage.size}}});
    if let Some(class) = &spec.storage.storage_class_name {
        claim_spec["storageClassName"] = json!(class);
    }
    let when_deleted = match spec.deletion_policy.volumes {
        Retention::Retain => "Retain",
        Retention::Delete => "Delete",
    };
    let stateful_set = convert(
        "StatefulSet",
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(app.worker_name()),
            "spec": {
                "replicas": replicas,
                "serviceName": app.headless_service_name(),
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": selector},
                "updateStrategy": {"type": "RollingUpdate"},
                // Scaling in keeps volumes so a later scale-out finds its state again.
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": when_deleted, "whenScaled": "Retain"},
                "template": {"metadata": {"labels": pod_labels, "annotations": pod_annotations}, "spec": pod_spec},
                "volumeClaimTemplates": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                          "metadata": {"name": STATE_VOLUME, "labels": labels}, "spec": claim_spec}],
            },
        }),
    )?;
    let pod_disruption_budget = convert(
        "PodDisruptionBudget",
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(app.worker_name()),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        }),
    )?;
    // Workers forward queries to the owner of a key, so the app's own pods must be
    // admitted; anyone else needs the client label (in the app's namespace, or in a
    // namespace that carries the same label). Egress stays open: Kafka is wherever the
    // spec says.
    let network_policy = match &cx.query_client_label {
        None => None,
        Some((key, value)) => {
            let client = json!({key.clone(): value});
            Some(convert(
                "NetworkPolicy",
                json!({
                    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(app.worker_name()),
                    "spec": {
                        "podSelector": {"matchLabels": selector},
                        "policyTypes": ["Ingress"],
                        "ingress": [{
                            "from": [
                                {"podSelector": {"matchLabels": selector}},
                                {"podSelector": {"matchLabels": client}},
                                {"namespaceSelector": {"matchLabels": client}, "podSelector": {"matchLabels": client}},
                            ],
                            "ports": [{"port": "http", "protocol": "TCP"}],
                        }, {
                            // Metrics hold no state and no secret: any scraper.
                            "ports": [{"port": "metrics", "protocol": "TCP"}],
                        }],
                    },
                }),
            )?)
        }
    };
    Ok(Children {
        report_leases,
        network_policy,
        service_account,
        role,
        role_binding,
        config_map,
        headless_service,
        client_service,
        stateful_set,
        pod_disruption_budget,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(extra: &str) -> StreamApp {
        let yaml = format!(
            r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: fraud, namespace: risk, uid: 0000-1111}}
spec:
  replicas: 3
  kafka: {{bootstrapServers: "127.0.0.1:9092"}}
  source: {{topics: [payments]}}
  steps:
  - dedupe: {{store: seen, id: value.txId, within: 24h}}
{extra}"#
        );
        serde_yaml::from_str(&yaml).expect("valid manifest")
    }

    fn hash(a: &StreamApp) -> String {
        hash_at(a, a.spec.replicas)
    }

    fn hash_at(a: &StreamApp, replicas: i32) -> String {
        let c = build(a, &cx(), replicas, None).expect("builds");
        c.stateful_set
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
            .expect("hash")
    }

    fn cx() -> BuildContext {
        BuildContext {
            default_image: "oxbow-worker:0.1.0".into(),
            query_client_label: None,
        }
    }

    #[test]
    fn statefulset_carries_storage_probes_env_and_retention() {
        let a = app(
            "  storage: {size: 5Gi, storageClassName: fast}\n  deletionPolicy: {volumes: Delete}\n",
        );
        let c = build(&a, &cx(), a.spec.replicas, None).expect("builds");
        let sts = serde_json::to_value(&c.stateful_set).expect("json");
        let spec = &sts["spec"];
        assert_eq!(spec["replicas"], 3);
        assert_eq!(spec["podManagementPolicy"], "Parallel");
        assert_eq!(spec["serviceName"], "fraud-workers");
        assert_eq!(
            spec["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Delete", "whenScaled": "Retain"})
        );
        let claim = &spec["volumeClaimTemplates"][0]["spec"];
        assert_eq!(claim["resources"]["requests"]["storage"], "5Gi");
        assert_eq!(claim["storageClassName"], "fast");
        let ctr = &spec["template"]["spec"]["containers"][0];
        assert_eq!(ctr["image"], "oxbow-worker:0.1.0");
        assert_eq!(ctr["imagePullPolicy"], "IfNotPresent");
        assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(ctr["livenessProbe"]["httpGet"]["path"], "/healthz");
        let env: Vec<&str> = ctr["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(
            env.contains(&"POD_NAME") && env.contains(&"POD_IP"),
            "{env:?}"
        );
        let assignment = ctr["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == ASSIGNMENT_ENV)
            .expect("the workers are told to run coordinated");
        assert_eq!(assignment["value"], "fraud-assignment");
        assert_eq!(
            spec["template"]["spec"]["serviceAccountName"],
            "fraud-worker"
        );
        assert_eq!(sts["metadata"]["ownerReferences"][0]["kind"], "StreamApp");
        assert_eq!(sts["metadata"]["ownerReferences"][0]["controller"], true);
    }

    #[test]
    fn a_spec_change_changes_the_config_hash_on_the_pod_template() {
        let a = app("");
        assert_eq!(hash(&a), hash(&a.clone()), "same spec, same hash");
        assert_ne!(
            hash(&a),
            hash(&app("  commitInterval: 1s\n")),
            "a config change rolls the pods"
        );
    }

    #[test]
    fn scaling_does_not_change_the_config_hash() {
        let a = app("");
        let mut scaled = a.clone();
        scaled.spec.replicas = 7;
        assert_eq!(
            hash(&a),
            hash(&scaled),
            "kubectl scale must not roll every worker"
        );
        let mut policy = a.clone();
        policy.spec.drift_policy = oxbow_crds::DriftPolicy::Enforce;
        policy.spec.deletion_policy.topics = oxbow_crds::Retention::Delete;
        assert_eq!(
            hash(&a),
            hash(&policy),
            "operator-only settings must not roll the workers"
        );
    }

    #[test]
    fn a_kafka_secret_is_mounted_into_the_workers() {
        let mut a = app("");
        a.spec.kafka.secret_ref = Some(oxbow_crds::SecretRef {
            name: "kafka-creds".into(),
        });
        let c = build(&a, &cx(), a.spec.replicas, None).expect("builds");
        let t = serde_json::to_value(c.stateful_set.spec.expect("spec").template).expect("json");
        assert!(
            t["spec"]["volumes"]
                .as_array()
                .expect("volumes")
                .iter()
                .any(|v| v["secret"]["secretName"] == "kafka-creds")
        );
        let ctr = &t["spec"]["containers"][0];
        assert!(
            ctr["volumeMounts"]
                .as_array()
                .expect("mounts")
                .iter()
                .any(|m| m["mountPath"] == KAFKA_SECRET_MOUNT)
        );
        assert!(
            ctr["args"]
                .as_array()
                .expect("args")
                .iter()
                .any(|a| a == "--kafka-secret-dir")
        );
    }

    #[test]
    fn a_changed_kafka_secret_rolls_the_workers_without_its_content_in_the_pods() {
        let a = app("");
        let annotations = |version| {
            build(&a, &cx(), 3, version)
                .expect("builds")
                .stateful_set
                .spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.annotations)
                .unwrap_or_default()
        };
        let v1 = annotations(Some("101"));
        assert_eq!(v1[KAFKA_SECRET_VERSION_ANNOTATION], "101");
        assert_ne!(
            v1,
            annotations(Some("102")),
            "a new Secret version must roll the pods"
        );
        assert!(!annotations(None).contains_key(KAFKA_SECRET_VERSION_ANNOTATION));
    }

    #[test]
    fn worker_role_is_limited_to_its_own_objects() {
        let c = build(&app(""), &cx(), 3, None).expect("builds");
        let rules = serde_json::to_value(&c.role.rules).expect("json");
        assert_eq!(
            rules[0]["resourceNames"],
            json!(["fraud-config", "fraud-assignment"])
        );
        assert_eq!(rules[1]["resources"], json!(["leases"]));
        assert_eq!(rules[1]["verbs"], json!(["get", "list", "watch"]));
        assert_eq!(
            rules[2]["resourceNames"],
            json!(["fraud-0-report", "fraud-1-report", "fraud-2-report"])
        );
        assert_eq!(rules[2]["verbs"], json!(["patch"]));
        assert_eq!(
            rules.as_array().map(Vec::len),
            Some(3),
            "no status, no events"
        );
        let leases: Vec<_> = c.report_leases.iter().map(|l| l.name_any()).collect();
        assert_eq!(
            leases,
            ["fraud-0-report", "fraud-1-report", "fraud-2-report"]
        );
        assert_eq!(
            c.report_leases[0].labels()[oxbow_crds::report::REPORT_OF_LABEL],
            "fraud"
        );
        let none = build(&app(""), &cx(), 0, None).expect("builds");
        let rules = serde_json::to_value(&none.role.rules).expect("json");
        assert!(
            rules
                .as_array()
                .expect("rules")
                .iter()
                .all(|r| r["verbs"] != json!(["patch"])),
            "without pods no Lease may be written (empty resourceNames means all): {rules}"
        );
        for r in rules.as_array().expect("rules") {
            assert!(
                !r["verbs"]
                    .as_array()
                    .expect("verbs")
                    .iter()
                    .any(|v| v == "delete" || v == "*"),
                "{r}"
            );
        }
    }

    #[test]
    fn pod_template_overrides_add_labels_env_and_scheduling() {
        let a = app(
            "  podTemplate:\n    labels: {team: risk}\n    nodeSelector: {disk: ssd}\n    env: [{name: EXTRA, value: x}]\n",
        );
        let c = build(&a, &cx(), a.spec.replicas, None).expect("builds");
        let t = serde_json::to_value(c.stateful_set.spec.expect("spec").template).expect("json");
        assert_eq!(t["metadata"]["labels"]["team"], "risk");
        assert_eq!(
            t["metadata"]["labels"][APP_LABEL], "fraud",
            "own labels win"
        );
        assert_eq!(t["spec"]["nodeSelector"]["disk"], "ssd");
        assert!(
            t["spec"]["containers"][0]["env"]
                .as_array()
                .expect("env")
                .iter()
                .any(|e| e["name"] == "EXTRA")
        );
    }

    #[test]
    fn changing_the_standby_count_does_not_roll_the_pods() {
        // Placement alone acts on standbyReplicas (the workers get their standby tasks
        // from the assignment): restarting every worker to add a standby would cause the
        // very failover the standby is meant to soften.
        let a = app("");
        let mut more = a.clone();
        more.spec.standby_replicas = 2;
        assert_eq!(hash(&a), hash(&more));
        let config = render_config(&more).expect("renders");
        assert!(!config.contains("standbyReplicas"), "{config}");
    }

    fn args(a: &StreamApp) -> Vec<String> {
        let c = build(a, &cx(), a.spec.replicas, None).expect("builds");
        let t = serde_json::to_value(c.stateful_set.spec.expect("spec").template).expect("json");
        t["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect()
    }

    fn memory_flag(a: &StreamApp) -> Option<String> {
        let args = args(a);
        let i = args.iter().position(|a| a == "--memory-mib")?;
        args.get(i + 1).cloned()
    }

    #[test]
    fn a_memory_limit_gives_rocksdb_half_of_it() {
        let a = app("  resources: {limits: {memory: 1Gi}, requests: {memory: 512Mi}}\n");
        assert_eq!(memory_flag(&a).as_deref(), Some("512"));
        let a = app("  resources: {limits: {memory: 2G}}\n");
        assert_eq!(memory_flag(&a).as_deref(), Some("953"), "2 GB is 1907 MiB");
    }

    #[test]
    fn without_a_memory_limit_the_worker_keeps_its_default_budget() {
        assert_eq!(memory_flag(&app("")), None);
        // A request is no ceiling: the pod may use more, so it says nothing about OOM.
        let a = app("  resources: {requests: {memory: 4Gi}, limits: {cpu: \"2\"}}\n");
        assert_eq!(memory_flag(&a), None);
    }

    #[test]
    fn a_tiny_memory_limit_still_leaves_rocksdb_a_working_cache() {
        let a = app("  resources: {limits: {memory: 40Mi}}\n");
        assert_eq!(memory_flag(&a).as_deref(), Some("32"));
    }

    #[test]
    fn quantities_parse_in_binary_decimal_and_exponent_notation() {
        let mib = 1024.0 * 1024.0;
        for (q, bytes) in [
            ("512Mi", 512.0 * mib),
            ("1Gi", 1024.0 * mib),
            ("1.5Gi", 1536.0 * mib),
            ("64Ki", 65536.0),
            ("2G", 2e9),
            ("1536M", 1.536e9),
            ("500k", 5e5),
            ("128974848", 128_974_848.0),
            ("129e6", 1.29e8),
            ("1E3", 1e3),
            ("+1Gi", 1024.0 * mib),
            ("500m", 0.5),
            (" 1Gi ", 1024.0 * mib),
        ] {
            assert_eq!(parse_quantity(q), Some(bytes), "{q}");
        }
    }

    #[test]
    fn malformed_quantities_are_refused_rather_than_guessed() {
        for q in [
            "", "Gi", "1GB", "1gi", "1.2.3Mi", "--1", "1-2", ".", "1e", "1e+", "1ex", "1 Gi",
        ] {
            assert_eq!(parse_quantity(q), None, "{q:?}");
        }
    }

    #[test]
    fn an_absurd_memory_limit_is_capped_rather_than_overflowing_the_worker() {
        let a = app("  resources: {limits: {memory: 9999999E}}\n");
        assert_eq!(memory_flag(&a), Some((1u64 << 30).to_string()));
    }

    #[test]
    fn the_statefulset_size_is_the_one_passed_in_while_pods_drain() {
        let a = app("");
        let c = build(&a, &cx(), 5, None).expect("builds");
        assert_eq!(c.stateful_set.spec.and_then(|s| s.replicas), Some(5));
        assert_eq!(hash(&a), hash_at(&a, 5), "a drain does not roll the pods");
    }

    #[test]
    fn the_assignment_configmap_holds_the_json_and_is_owned_like_every_child() {
        let a = app("");
        let assignment = oxbow_crds::assignment::next(
            None,
            &[oxbow_crds::assignment::PodFacts {
                pod: "fraud-0".into(),
                eligible: true,
                ..Default::default()
            }],
            oxbow_crds::assignment::Params {
                tasks: 2,
                stages: 1,
                standby_replicas: 0,
                warmup_max_lag: 0,
            },
        );
        let cm = assignment_config_map(&a, &assignment).expect("builds");
        let v = serde_json::to_value(&cm).expect("json");
        assert_eq!(v["metadata"]["name"], "fraud-assignment");
        assert_eq!(v["metadata"]["labels"][APP_LABEL], "fraud");
        assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
        let text = v["data"][CONFIG_MAP_KEY].as_str().expect("data");
        let back: Assignment = serde_json::from_str(text).expect("an assignment");
        assert_eq!(back, assignment);
    }

    #[test]
    fn a_network_policy_admits_the_query_port_only_from_own_pods_and_labelled_clients() {
        let a = app("");
        assert!(
            build(&a, &cx(), 3, None)
                .expect("builds")
                .network_policy
                .is_none(),
            "no policy unless the operator is asked for one"
        );
        let cx = BuildContext {
            query_client_label: Some(("oxbow.dev/query-client".into(), "true".into())),
            ..cx()
        };
        let np = build(&a, &cx, 3, None)
            .expect("builds")
            .network_policy
            .expect("a policy");
        let v = serde_json::to_value(&np).expect("json");
        let selector = json!({APP_LABEL: "fraud", "app.kubernetes.io/component": "worker"});
        assert_eq!(v["metadata"]["name"], "fraud");
        assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(v["spec"]["podSelector"]["matchLabels"], selector);
        assert_eq!(v["spec"]["policyTypes"], json!(["Ingress"]));
        let rules = v["spec"]["ingress"].as_array().expect("ingress");
        assert_eq!(rules.len(), 2, "the query port, and the metrics port");
        assert_eq!(
            rules[1],
            json!({"ports": [{"port": "metrics", "protocol": "TCP"}]}),
            "metrics from anywhere"
        );
        assert_eq!(
            rules[0]["ports"],
            json!([{"port": "http", "protocol": "TCP"}])
        );
        let client = json!({"oxbow.dev/query-client": "true"});
        assert_eq!(
            rules[0]["from"],
            json!([
                {"podSelector": {"matchLabels": selector}},
                {"podSelector": {"matchLabels": client}},
                {"namespaceSelector": {"matchLabels": client}, "podSelector": {"matchLabels": client}},
            ])
        );
    }

    /// Every child of an app that sets every field the build reads, as JSON: the committed
    /// snapshot (`operator/tests/snapshots/children.json`) is what the build gives. Run with
    /// `OXBOW_UPDATE_SNAPSHOT=1` to rewrite it after a deliberate change, and review the diff.
    #[test]
    fn the_children_of_a_full_spec_match_the_committed_snapshot() {
        let a = app(r#"  image: registry.local/oxbow-worker:9.9.9
  storage: {size: 5Gi, storageClassName: fast}
  deletionPolicy: {volumes: Delete}
  resources:
    requests: {cpu: 500m, memory: 512Mi}
    limits: {cpu: "2", memory: 1Gi}
  podTemplate:
    labels: {team: risk}
    annotations: {note: hello}
    nodeSelector: {disk: ssd}
    tolerations: [{key: dedicated, operator: Equal, value: stream, effect: NoSchedule}]
    affinity:
      podAntiAffinity:
        preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {oxbow.dev/streamapp: fraud}}
    priorityClassName: streaming
    terminationGracePeriodSeconds: 90
    env: [{name: RUST_LOG, value: debug}]
"#);
        let mut a = a;
        a.spec.kafka.secret_ref = Some(serde_yaml::from_str("{name: kafka-creds}").expect("ref"));
        let cx = BuildContext {
            default_image: "oxbow-worker:0.1.0".into(),
            query_client_label: Some(("oxbow.dev/query-client".into(), "true".into())),
        };
        let c = build(&a, &cx, 4, Some("12345")).expect("builds");
        let assignment = oxbow_crds::assignment::next(
            None,
            &[oxbow_crds::assignment::PodFacts {
                pod: "fraud-0".into(),
                eligible: true,
                ..Default::default()
            }],
            oxbow_crds::assignment::Params {
                tasks: 2,
                stages: 1,
                standby_replicas: 0,
                warmup_max_lag: 0,
            },
        );
        let got = json!({
            "serviceAccount": c.service_account,
            "role": c.role,
            "roleBinding": c.role_binding,
            "configMap": c.config_map,
            "headlessService": c.headless_service,
            "clientService": c.client_service,
            "statefulSet": c.stateful_set,
            "podDisruptionBudget": c.pod_disruption_budget,
            "networkPolicy": c.network_policy,
            "reportLeases": c.report_leases,
            "assignmentConfigMap": assignment_config_map(&a, &assignment).expect("builds"),
        });
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/children.json");
        let text = serde_json::to_string_pretty(&got).expect("json") + "\n";
        if std::env::var_os("OXBOW_UPDATE_SNAPSHOT").is_some() {
            std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
            std::fs::write(&path, &text).expect("write snapshot");
        }
        let want: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&path)
                .expect("the snapshot exists (OXBOW_UPDATE_SNAPSHOT=1 writes it)"),
        )
        .expect("snapshot JSON");
        assert!(
            got == want,
            "the children differ from {}: run with OXBOW_UPDATE_SNAPSHOT=1 and review the diff",
            path.display()
        );
    }
}

//! Every child object of a StreamApp, built from the spec alone.
//!
//! Pure: no I/O, no clock. The same spec always yields the same objects, so applying
//! them with server-side apply is idempotent and a hand-edited child is put back. This
//! module owns the shape of the children; it must not decide when or whether to apply.
//!
//! One file per kind of child, each built from the `k8s-openapi` types so the compiler
//! checks every field; this file holds what they share (names, labels, metadata, the
//! worker's config) and [`build`], which puts them together.

mod config_map;
mod network_policy;
mod pod_disruption_budget;
mod report_lease;
mod role;
mod role_binding;
mod service;
mod service_account;
mod stateful_set;

pub use stateful_set::{image, live_image, live_store_encoding, template_rolled_out};

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_crds::{StoreEncoding, StreamApp};
use serde_json::json;
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

/// The worker's processing threads: the container's CPU limit rounded up (`500m` → 1,
/// `1500m` → 2), at most [`MAX_THREADS`]. `None` without a CPU limit: the worker then
/// takes the CPUs it may use, as the node and the container's cgroup say.
pub fn processing_threads(
    resources: Option<&k8s_openapi::api::core::v1::ResourceRequirements>,
) -> Option<u64> {
    let limit = resources?.limits.as_ref()?.get("cpu")?;
    let cpus = parse_quantity(&limit.0)?;
    // `as` saturates a float (and maps NaN to 0); the clamp keeps at least one thread.
    Some((cpus.ceil() as u64).clamp(1, MAX_THREADS))
}

/// More processing threads than this buy nothing: a pod's tasks are the most it can
/// run side by side, and the worker's own flag stops at 256.
pub const MAX_THREADS: u64 = 64;

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

/// The metadata of every child: its name, the namespace, the labels and the controller
/// owner reference (so Kubernetes collects it with the StreamApp).
#[derive(Debug, Clone)]
pub(crate) struct ChildMeta {
    namespace: String,
    labels: BTreeMap<String, String>,
    owner: OwnerReference,
}

impl ChildMeta {
    fn of(app: &StreamApp) -> Result<Self, BuildError> {
        Ok(Self {
            namespace: app
                .namespace()
                .ok_or(BuildError::MissingMetadata("namespace"))?,
            labels: labels(app),
            owner: app
                .controller_owner_ref(&())
                .ok_or(BuildError::MissingMetadata("uid"))?,
        })
    }

    /// The metadata of the child called `name`.
    fn named(&self, name: impl Into<String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels.clone()),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// The assignment ConfigMap (`<name>-assignment`): the JSON of the assignment under
/// [`CONFIG_MAP_KEY`]. The workers watch it.
pub fn assignment_config_map(app: &StreamApp, a: &Assignment) -> Result<ConfigMap, BuildError> {
    let meta = ChildMeta::of(app)?;
    let text = serde_json::to_string(a).map_err(|source| BuildError::Convert {
        kind: "Assignment",
        source,
    })?;
    Ok(config_map::with_file(
        meta.named(app.assignment_config_map_name()),
        CONFIG_MAP_KEY,
        text,
    ))
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
    store_encoding: StoreEncoding,
) -> Result<Children, BuildError> {
    let meta = ChildMeta::of(app)?;
    let sa_name = app.service_account_name();
    let report_leases = report_lease::all(app, &meta, replicas);
    let config = render_config(app)?;
    let hash = config_hash(&config);
    let selector = selector_labels(app);
    Ok(Children {
        service_account: service_account::build(meta.named(sa_name.clone())),
        role: role::build(app, meta.named(sa_name.clone()), &report_leases),
        role_binding: role_binding::build(meta.named(sa_name.clone()), &sa_name, &meta.namespace),
        config_map: config_map::with_file(meta.named(app.config_map_name()), CONFIG_FILE, config),
        headless_service: service::headless(meta.named(app.headless_service_name()), &selector),
        client_service: service::client(meta.named(app.client_service_name()), &selector),
        stateful_set: stateful_set::build(
            app,
            cx,
            stateful_set::Facts {
                meta: meta.named(app.worker_name()),
                replicas,
                config_hash: hash,
                kafka_secret_version,
                store_encoding,
            },
        ),
        pod_disruption_budget: pod_disruption_budget::build(
            meta.named(app.worker_name()),
            &selector,
        ),
        network_policy: cx
            .query_client_label
            .as_ref()
            .map(|client| network_policy::build(meta.named(app.worker_name()), &selector, client)),
        report_leases,
    })
}

/// `matchLabels` of `labels`.
fn match_labels(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        ..LabelSelector::default()
    }
}

#[cfg(test)]
mod tests;

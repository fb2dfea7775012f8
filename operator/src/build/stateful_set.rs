//! The workers' StatefulSet: one pod per instance, each with its state volume, the
//! worker container, its probes and the least privilege it runs with.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use oxbow_crds::{Retention, StoreEncoding, StreamApp};

use super::{
    ASSIGNMENT_ENV, BuildContext, CONFIG_FILE, CONFIG_HASH_ANNOTATION, CONFIG_MOUNT, HTTP_PORT,
    KAFKA_SECRET_MOUNT, KAFKA_SECRET_VERSION_ANNOTATION, METRICS_PORT, STATE_MOUNT, STATE_VOLUME,
    labels, match_labels, processing_threads, rocksdb_memory_mib, selector_labels,
};

/// The worker runs as this user and group (distroless' nonroot).
const NONROOT: i64 = 65532;
const SECRET_VOLUME: &str = "kafka-secret";
const CONFIG_VOLUME: &str = "config";
/// The worker's flag for its store encoding; its presence in a live template also says
/// the pods run a worker that reads every encoding.
const STORE_ENCODING_FLAG: &str = "--store-encoding";

/// The store encoding a live StatefulSet's worker container is told, if any (`None`: it
/// was built by an operator from before store encodings, for a worker that reads JSON
/// alone).
pub fn live_store_encoding(sts: &StatefulSet) -> Option<StoreEncoding> {
    let args = live_worker(sts)?.args.as_ref()?;
    let at = args.iter().position(|a| a == STORE_ENCODING_FLAG)?;
    args.get(at + 1)?.parse().ok()
}

/// The worker image a live StatefulSet runs.
pub fn live_image(sts: &StatefulSet) -> Option<&str> {
    live_worker(sts)?.image.as_deref()
}

/// The worker container of a live StatefulSet's template.
fn live_worker(sts: &StatefulSet) -> Option<&Container> {
    let pod = sts.spec.as_ref()?.template.spec.as_ref()?;
    pod.containers.iter().find(|c| c.name == "worker")
}

/// The StatefulSet controller has seen the latest template and moved every pod's
/// revision to it (the status it writes; pod readiness is not part of it).
pub fn template_rolled_out(sts: &StatefulSet) -> bool {
    let Some(st) = &sts.status else {
        return false;
    };
    st.observed_generation.unwrap_or(0) >= sts.metadata.generation.unwrap_or(0)
        && st.current_revision.is_some()
        && st.current_revision == st.update_revision
}

/// The worker image the app's pods are to run.
pub fn image<'a>(app: &'a StreamApp, cx: &'a BuildContext) -> &'a str {
    app.spec.image.as_deref().unwrap_or(&cx.default_image)
}

/// What the StatefulSet needs besides the app and the build context.
pub(super) struct Facts<'a> {
    pub meta: ObjectMeta,
    pub replicas: i32,
    /// Of the rendered worker config: a change rolls the pods.
    pub config_hash: String,
    /// The resourceVersion of the Secret of `spec.kafka.secretRef`.
    pub kafka_secret_version: Option<&'a str>,
    /// How the workers write their aggregate stores (`controller::encoding` decides).
    pub store_encoding: StoreEncoding,
}

pub(super) fn build(app: &StreamApp, cx: &BuildContext, f: Facts<'_>) -> StatefulSet {
    let spec = &app.spec;
    let when_deleted = match spec.deletion_policy.volumes {
        Retention::Retain => "Retain",
        Retention::Delete => "Delete",
    };
    StatefulSet {
        metadata: f.meta.clone(),
        spec: Some(StatefulSetSpec {
            replicas: Some(f.replicas),
            service_name: Some(app.headless_service_name()),
            pod_management_policy: Some("Parallel".into()),
            selector: match_labels(&selector_labels(app)),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                ..StatefulSetUpdateStrategy::default()
            }),
            // Scaling in keeps volumes so a later scale-out finds its state again.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(when_deleted.into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            template: pod_template(app, cx, &f),
            volume_claim_templates: Some(vec![state_claim(app)]),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

fn state_claim(app: &StreamApp) -> PersistentVolumeClaim {
    let storage = &app.spec.storage;
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(STATE_VOLUME.into()),
            labels: Some(labels(app)),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".into(),
                    Quantity(storage.size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: storage.storage_class_name.clone(),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

fn pod_template(app: &StreamApp, cx: &BuildContext, f: &Facts<'_>) -> PodTemplateSpec {
    let spec = &app.spec;
    let overrides = spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(labels(app));
    let mut annotations = overrides.annotations.clone();
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), f.config_hash.clone());
    // The worker reads the mounted Secret once, at start: a changed Secret rolls it.
    // The resourceVersion, not a digest of the content: a digest of a short password in
    // a pod's annotations could be brute-forced by anyone who may read pods.
    if let Some(v) = f.kafka_secret_version {
        annotations.insert(KAFKA_SECRET_VERSION_ANNOTATION.into(), v.to_string());
    }
    let mut volumes = vec![Volume {
        name: CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: app.config_map_name(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    if let Some(secret) = &spec.kafka.secret_ref {
        volumes.push(Volume {
            name: SECRET_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.name.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let non_empty = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(app.service_account_name()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(NONROOT),
                fs_group: Some(NONROOT),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            termination_grace_period_seconds: Some(
                overrides.termination_grace_period_seconds.unwrap_or(60),
            ),
            containers: vec![container(app, cx, overrides.env.clone(), f.store_encoding)],
            volumes: Some(volumes),
            node_selector: non_empty(&overrides.node_selector),
            tolerations: (!overrides.tolerations.is_empty()).then(|| overrides.tolerations.clone()),
            affinity: overrides.affinity.clone(),
            priority_class_name: overrides.priority_class_name.clone(),
            ..PodSpec::default()
        }),
    }
}

fn env(app: &StreamApp, extra: Vec<EnvVar>) -> Vec<EnvVar> {
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let value = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..EnvVar::default()
    };
    let mut env = vec![
        field("POD_NAME", "metadata.name"),
        field("POD_NAMESPACE", "metadata.namespace"),
        field("POD_IP", "status.podIP"),
        value("OXBOW_STREAMAPP", app.name_any()),
        value(ASSIGNMENT_ENV, app.assignment_config_map_name()),
    ];
    env.extend(extra);
    env
}

fn args(app: &StreamApp, encoding: StoreEncoding) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "--config".into(),
        format!("{CONFIG_MOUNT}/{CONFIG_FILE}"),
        "--state-dir".into(),
        STATE_MOUNT.into(),
        // All addresses (the worker reports $(POD_IP)); peers are reached by their DNS
        // names under the headless Service.
        "--listen".into(),
        format!("0.0.0.0:{HTTP_PORT}"),
        "--metrics-listen".into(),
        format!("0.0.0.0:{METRICS_PORT}"),
        "--peer-domain".into(),
        format!(
            "{}.{}.svc",
            app.headless_service_name(),
            app.namespace().unwrap_or_default()
        ),
    ];
    if app.spec.kafka.secret_ref.is_some() {
        args.extend(["--kafka-secret-dir".into(), KAFKA_SECRET_MOUNT.into()]);
    }
    if let Some(mib) = rocksdb_memory_mib(app.spec.resources.as_ref()) {
        args.extend(["--memory-mib".into(), mib.to_string()]);
    }
    if let Some(n) = processing_threads(app.spec.resources.as_ref()) {
        args.extend(["--threads".into(), n.to_string()]);
    }
    args.extend([STORE_ENCODING_FLAG.into(), encoding.as_str().into()]);
    args
}

fn http_probe(path: &str, period_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}

fn container(
    app: &StreamApp,
    cx: &BuildContext,
    extra_env: Vec<EnvVar>,
    encoding: StoreEncoding,
) -> Container {
    let spec = &app.spec;
    let port = |name: &str, container_port: i32| ContainerPort {
        name: Some(name.into()),
        container_port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    let mut mounts = vec![
        VolumeMount {
            name: CONFIG_VOLUME.into(),
            mount_path: CONFIG_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: STATE_VOLUME.into(),
            mount_path: STATE_MOUNT.into(),
            ..VolumeMount::default()
        },
    ];
    if spec.kafka.secret_ref.is_some() {
        mounts.push(VolumeMount {
            name: SECRET_VOLUME.into(),
            mount_path: KAFKA_SECRET_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    Container {
        name: "worker".into(),
        image: Some(image(app, cx).to_string()),
        // A tagged image is immutable here: pull it only when the node lacks it, so nodes
        // loaded without a registry (kind load, the local stack) run it too.
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args(app, encoding)),
        env: Some(env(app, extra_env)),
        ports: Some(vec![port("http", HTTP_PORT), port("metrics", METRICS_PORT)]),
        // Ready only when every active task is restored and running: a rolling update
        // waits for each pod's restore before touching the next.
        readiness_probe: Some(http_probe("/readyz", 2, 3)),
        // /healthz answers while restoring; only a wedged process fails it.
        liveness_probe: Some(http_probe("/healthz", 10, 6)),
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        resources: spec.resources.clone(),
        ..Container::default()
    }
}

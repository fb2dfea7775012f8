//! The dereference step of a reconciliation: everything it reads before it decides,
//! besides the StreamApp: its Kafka Secret and clients, the sources' partition counts,
//! its StatefulSet, worker pods, their report Leases (from the controller's store) and the
//! published assignment, and the time it read them.
//!
//! It must not write anything or decide on what it read (a Kafka client configuration
//! librdkafka refuses is the one verdict here: without a client nothing else is read).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use oxbow_crds::StreamApp;

use super::{Cluster, Context, Error};
use crate::build;
use crate::status::{Verdict, reason};
use crate::topics::TopicError;

/// What a reconciliation read.
pub(super) struct Observed {
    /// The Kafka Secret; `None`: `spec.kafka.secretRef` names one that does not exist.
    pub secret: Option<KafkaSecret>,
    /// The app's Kafka clients, unless its client configuration is refused.
    pub cluster: Option<Arc<Cluster>>,
    /// Why the client configuration is refused (then there is no `cluster`).
    pub client_refused: Option<Verdict>,
    pub sts: Option<StatefulSet>,
    pub pods: Vec<Pod>,
    /// The assignment ConfigMap the workers read.
    pub assignment: Option<ConfigMap>,
    /// The pods' own reports (their Leases), by pod, judged by this operator's clock.
    pub reports: BTreeMap<String, oxbow_crds::report::Report>,
    /// When these were read: the time placement judges silence and failover by.
    pub now: Timestamp,
}

/// The partition counts of the sources, tables and joined streams, or why Kafka could
/// not say.
pub(super) type SourceCounts = Result<BTreeMap<String, Option<i32>>, TopicError>;

/// Reads everything the reconciliation decides on. A refused Kafka client configuration
/// is `client_refused`, for the validate step.
pub(super) async fn observe(
    app: &StreamApp,
    ctx: &Context,
) -> Result<(Observed, SourceCounts), Error> {
    let ns = app.namespace().unwrap_or_default();
    let secret = kafka_secret(app, ctx).await?;
    // A client config librdkafka refuses (a misspelt property) is a spec problem.
    let no_secret = KafkaSecret::default();
    let (cluster, client_refused) =
        match ctx.cluster(app, &secret.as_ref().unwrap_or(&no_secret).properties) {
            Ok(c) => (Some(c), None),
            Err(e) => {
                let reason = match e {
                    Error::RefusedProperties { .. } => reason::KAFKA_PROPERTY_REFUSED,
                    _ => reason::INVALID_KAFKA_PROPERTIES,
                };
                (None, Some(Verdict::stalled(reason, e.to_string())))
            }
        };
    // The sources, the tables and joined streams: all but global tables are co-partitioned.
    let mut read_topics = app.spec.source.topics.clone();
    read_topics.extend(oxbow_crds::validate::join_topics(&app.spec));
    let counts = match &cluster {
        Some(c) => c.admin.partition_counts(&read_topics).await,
        None => Ok(BTreeMap::new()),
    };
    let sts = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&app.name_any())
        .await
        .map_err(|source| Error::ReadCluster {
            what: "StatefulSet".into(),
            source,
        })?;
    let pods = worker_pods(app, ctx).await?;
    let assignment = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&app.assignment_config_map_name())
        .await
        .map_err(|source| Error::ReadCluster {
            what: format!("ConfigMap {}", app.assignment_config_map_name()),
            source,
        })?;
    let now = Timestamp::now();
    let reports = reports(app, ctx, now);
    Ok((
        Observed {
            secret,
            cluster,
            client_refused,
            sts,
            pods,
            assignment,
            reports,
            now,
        },
        counts,
    ))
}

/// The pods' own reports (their Leases) from the controller's store, not
/// status.instances: that is only the operator's aggregate of them, written on a
/// bounded schedule. Judged by this operator's clock, not the pods' (see `Renewals`).
fn reports(
    app: &StreamApp,
    ctx: &Context,
    now: Timestamp,
) -> BTreeMap<String, oxbow_crds::report::Report> {
    let ns = app.namespace().unwrap_or_default();
    let mut reports = ctx
        .reports
        .get()
        .map(|store| crate::reports::of_app(store, &ns, &app.name_any()))
        .unwrap_or_default();
    let seen_at = std::time::Instant::now();
    crate::reports::judged_locally(
        &mut reports,
        |pod| {
            let key = format!("{ns}/{}", oxbow_crds::report::lease_name(pod));
            ctx.renewals.age(&key, seen_at)
        },
        now,
    );
    reports
}

/// The Secret of `spec.kafka.secretRef`, read.
#[derive(Debug, Clone, Default)]
pub struct KafkaSecret {
    /// Its librdkafka properties (empty without a Secret).
    pub properties: BTreeMap<String, String>,
    /// Its resourceVersion: a change rolls the worker pods, which read it at start.
    pub version: Option<String>,
}

/// The Secret of `spec.kafka.secretRef` (empty without one). `Ok(None)`: the Secret
/// does not exist.
pub(super) async fn kafka_secret(
    app: &StreamApp,
    ctx: &Context,
) -> Result<Option<KafkaSecret>, Error> {
    let Some(r) = &app.spec.kafka.secret_ref else {
        return Ok(Some(KafkaSecret::default()));
    };
    let api: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &app.namespace().unwrap_or_default());
    let secret = api
        .get_opt(&r.name)
        .await
        .map_err(|source| Error::ReadCluster {
            what: format!("Secret {}", r.name),
            source,
        })?;
    Ok(secret.map(|s| {
        let properties: BTreeMap<String, String> = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).trim_end().to_string()))
            .collect();
        oxbow_crds::redact::Redactor::new(&properties, properties.keys()).remember();
        KafkaSecret {
            properties,
            version: s.metadata.resource_version,
        }
    }))
}

/// How long a reconcile waits for the pod watch's first list before it lists itself.
const POD_CACHE_WAIT: Duration = Duration::from_secs(5);

/// The app's worker pods (by the StatefulSet's selector), from the controller's pod watch
/// once it has listed them all. A pod event reaches the store before it triggers the
/// reconcile it causes, so a reconcile never sees less than what woke it; the report
/// Leases that placement also decides on come from a watch in the same way.
pub(super) async fn worker_pods(app: &StreamApp, ctx: &Context) -> Result<Vec<Pod>, Error> {
    let ns = app.namespace().unwrap_or_default();
    if let Some(store) = ctx.pods.get()
        && let Ok(Ok(())) = tokio::time::timeout(POD_CACHE_WAIT, store.wait_until_ready()).await
    {
        let selector = build::selector_labels(app);
        return Ok(store
            .state()
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
            .map(|p| Pod::clone(p))
            .collect());
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let lp = ListParams::default().labels(&build::selector_string(app));
    Ok(api
        .list(&lp)
        .await
        .map_err(|source| Error::ReadCluster {
            what: "worker Pods".into(),
            source,
        })?
        .items)
}

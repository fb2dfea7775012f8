//! The dereference step of a reconciliation: the objects it reads from the cluster
//! besides the StreamApp (its Kafka Secret and its worker pods).
//!
//! It must not write anything or decide on what it read.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use oxbow_crds::StreamApp;

use super::{Context, Error};
use crate::build;

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

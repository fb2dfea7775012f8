//! The watches that wake the controller and the stores reconcile reads from: the
//! StreamApps, their children, their worker pods and their pods' report Leases.
//!
//! It must not decide anything about an app: it only starts [`super::reconcile`].

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use oxbow_crds::StreamApp;
use serde::de::DeserializeOwned;

use super::{Context, MAX_CONCURRENT_RECONCILES, error_policy, reconcile, short_kind};
use crate::build::APP_LABEL;

/// Converts raw watch events to StreamApps, dropping (and logging) objects that do not
/// deserialize, so one malformed object cannot stop the controller.
fn typed(
    ev: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> Option<Result<watcher::Event<StreamApp>, watcher::Error>> {
    let parse = |o: DynamicObject| {
        let name = o.name_any();
        let ns = o.namespace();
        match o.try_parse::<StreamApp>() {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::error!(streamapp = %name, namespace = ?ns, error = %e, "skipping a StreamApp that does not deserialize");
                None
            }
        }
    };
    Some(Ok(match ev {
        Err(e) => return Some(Err(e)),
        Ok(watcher::Event::Apply(o)) => watcher::Event::Apply(parse(o)?),
        Ok(watcher::Event::InitApply(o)) => watcher::Event::InitApply(parse(o)?),
        Ok(watcher::Event::Delete(o)) => watcher::Event::Delete(parse(o)?),
        Ok(watcher::Event::Init) => watcher::Event::Init,
        Ok(watcher::Event::InitDone) => watcher::Event::InitDone,
    }))
}

/// The watch of a child kind, noting each child's resourceVersion for [`ssa`]'s skip.
fn observed<K>(
    api: Api<K>,
    config: watcher::Config,
    ctx: &Arc<Context>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug + Send + 'static,
{
    let ctx = ctx.clone();
    watcher(api, config)
        .default_backoff()
        .inspect(move |ev| {
            let note = |o: &K, rv: Option<String>| {
                let key = (
                    short_kind::<K>(),
                    o.meta().namespace.clone().unwrap_or_default(),
                    o.meta().name.clone().unwrap_or_default(),
                );
                ctx.applied.seen(key, rv);
            };
            match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    note(o, o.meta().resource_version.clone())
                }
                Ok(watcher::Event::Delete(o)) => note(o, None),
                _ => {}
            }
        })
        .touched_objects()
}

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let client = ctx.client.clone();
    let ar = ApiResource::erase::<StreamApp>(&());
    let apps: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let (reader, writer) = reflector::store::<StreamApp>();
    let stream = watcher(apps, watcher::Config::default().any_semantic())
        .default_backoff()
        .filter_map(|ev| futures::future::ready(typed(ev)))
        .reflect(writer)
        .applied_objects();
    let children = watcher::Config::default().labels("app.kubernetes.io/managed-by=oxbow-operator");
    macro_rules! api {
        ($k:ty) => {
            match &namespace {
                Some(ns) => Api::<$k>::namespaced(client.clone(), ns),
                None => Api::<$k>::all(client.clone()),
            }
        };
    }
    let report_changes = report_changes(&ctx, api!(Lease));
    let pods = worker_pods(&ctx, api!(Pod));
    Controller::for_stream(stream, reader)
        .with_config(controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        .owns_stream(observed(api!(StatefulSet), children.clone(), &ctx))
        .owns_stream(observed(api!(ConfigMap), children.clone(), &ctx))
        .owns_stream(observed(api!(Service), children.clone(), &ctx))
        .owns_stream(observed(api!(ServiceAccount), children.clone(), &ctx))
        .owns_stream(observed(api!(Role), children.clone(), &ctx))
        .owns_stream(observed(api!(RoleBinding), children.clone(), &ctx))
        .owns_stream(observed(api!(PodDisruptionBudget), children.clone(), &ctx))
        .owns_stream(observed(api!(NetworkPolicy), children, &ctx))
        // Worker pods belong to the StatefulSet, not the StreamApp: map them by label,
        // so a pod that goes away or turns unready starts a failover at once.
        .watches_stream(pods, |pod: Pod| {
            let ns = pod.namespace().unwrap_or_default();
            pod.labels()
                .get(APP_LABEL)
                .map(|app| ObjectRef::<StreamApp>::new(app).within(&ns))
        })
        .watches_stream(report_changes, |lease: Lease| {
            let ns = lease.namespace().unwrap_or_default();
            lease
                .labels()
                .get(oxbow_crds::report::REPORT_OF_LABEL)
                .map(|app| ObjectRef::<StreamApp>::new(app).within(&ns))
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(streamapp = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
}

/// The workers' report Leases: kept in a store for reconcile (with each renewal noted
/// by this operator's clock), and a reconcile only when what a report says changes,
/// not on every renewal.
fn report_changes(
    ctx: &Arc<Context>,
    api: Api<Lease>,
) -> impl futures::Stream<Item = Result<Lease, watcher::Error>> + Send + 'static {
    let (report_reader, report_writer) = reflector::store::<Lease>();
    let _ = ctx.reports.set(report_reader);
    let renewals = ctx.clone();
    watcher(
        api,
        watcher::Config::default().labels(oxbow_crds::report::REPORT_OF_LABEL),
    )
    .default_backoff()
    .inspect(move |ev| {
        let note = |l: &Lease, deleted: bool| {
            let key = format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any());
            let renew = l
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string());
            renewals
                .renewals
                .observe(key, renew, deleted, std::time::Instant::now());
        };
        match ev {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => note(l, false),
            Ok(watcher::Event::Delete(l)) => note(l, true),
            _ => {}
        }
    })
    .reflect(report_writer)
    .touched_objects()
    .predicate_filter(crate::reports::relevant, Default::default())
}

/// The worker pods: kept in a store for reconcile (without their managed fields, which
/// are most of a pod's size), and a reconcile of their app on each change.
fn worker_pods(
    ctx: &Arc<Context>,
    api: Api<Pod>,
) -> impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let _ = ctx.pods.set(pod_reader);
    watcher(
        api,
        watcher::Config::default().labels(
            "app.kubernetes.io/managed-by=oxbow-operator,app.kubernetes.io/component=worker",
        ),
    )
    .default_backoff()
    .modify(|pod: &mut Pod| pod.managed_fields_mut().clear())
    .reflect(pod_writer)
    .touched_objects()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "oxbow.dev/v1alpha1", "kind": "StreamApp",
            "metadata": {"name": "x", "namespace": "ns"}, "spec": spec,
        }))
        .expect("dynamic object")
    }

    #[test]
    fn a_malformed_streamapp_is_skipped_instead_of_stopping_the_watch() {
        let good =
            raw(json!({"kafka": {"bootstrapServers": "k:9092"}, "source": {"topics": ["a"]}}));
        let bad = raw(json!({"replicas": "many"}));
        assert!(matches!(
            typed(Ok(watcher::Event::Apply(good))),
            Some(Ok(watcher::Event::Apply(_)))
        ));
        assert!(
            typed(Ok(watcher::Event::Apply(bad.clone()))).is_none(),
            "dropped, not an error"
        );
        assert!(typed(Ok(watcher::Event::InitApply(bad))).is_none());
        assert!(matches!(
            typed(Ok(watcher::Event::InitDone)),
            Some(Ok(watcher::Event::InitDone))
        ));
    }
}

//! The apply step of a reconciliation: every child by server-side apply with one field
//! manager, in dependency order, and the removal of children no longer wanted.
//!
//! It must not decide what a child holds (that is [`crate::build`]) or read anything a
//! later step decides on.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use oxbow_crds::StreamApp;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{Context, Error, FIELD_MANAGER};
use crate::build::{APP_LABEL, Children};

/// Applies `obj` unless its last apply is still what the cluster holds; returns the object
/// as the API server stored it when it was applied (`None` when skipped).
pub(super) async fn ssa<K>(ctx: &Context, ns: &str, obj: &K) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + serde::Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let mut v = serde_json::to_value(obj).map_err(|e| Error::ApplyChild {
        kind: short_kind::<K>(),
        name: name.clone(),
        source: kube::Error::SerdeError(e),
    })?;
    v["apiVersion"] = json!(K::api_version(&()));
    v["kind"] = json!(K::kind(&()));
    let key = (short_kind::<K>(), ns.to_string(), name.clone());
    let digest = crate::applied::digest(&v);
    if ctx.applied.unchanged(&key, digest) {
        return Ok(None);
    }
    let live = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(v),
        )
        .await
        .map_err(|source| Error::ApplyChild {
            kind: short_kind::<K>(),
            name,
            source,
        })?;
    ctx.applied
        .applied(key, digest, live.meta().resource_version.clone());
    Ok(Some(live))
}

pub(super) fn short_kind<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()).as_ref() {
        "ServiceAccount" => "ServiceAccount",
        "Role" => "Role",
        "RoleBinding" => "RoleBinding",
        "ConfigMap" => "ConfigMap",
        "Service" => "Service",
        "StatefulSet" => "StatefulSet",
        "PodDisruptionBudget" => "PodDisruptionBudget",
        "NetworkPolicy" => "NetworkPolicy",
        _ => "object",
    }
}

/// Applies every child in dependency order, then removes the ones no longer wanted.
pub(super) async fn apply_children(
    app: &StreamApp,
    ns: &str,
    c: &Children,
    assignment: Option<&ConfigMap>,
    ctx: &Context,
) -> Result<Option<StatefulSet>, Error> {
    let client = &ctx.client;
    // Each step skips a child whose last apply is still what the cluster holds.
    // 1. Identity first, so pods never start without their ServiceAccount and RBAC.
    ssa(ctx, ns, &c.service_account).await?;
    ssa(ctx, ns, &c.role).await?;
    ssa(ctx, ns, &c.role_binding).await?;
    // 1b. Each pod's report Lease before the pod that renews it; those of pods the
    //     StatefulSet no longer has go (with them, their entries in status.instances).
    crate::reports::sync_leases(client, ctx.reports.get(), app, ns, &c.report_leases)
        .await
        .map_err(|source| Error::ReadCluster {
            what: "report Leases".into(),
            source,
        })?;
    // 2. Config before the pods that mount it.
    ssa(ctx, ns, &c.config_map).await?;
    // 3. Services: the StatefulSet's serviceName must exist for stable pod identities.
    ssa(ctx, ns, &c.headless_service).await?;
    ssa(ctx, ns, &c.client_service).await?;
    // 4. The NetworkPolicy before the workload, so no pod serves queries unguarded;
    //    removed when the operator no longer runs with --network-policy.
    match &c.network_policy {
        Some(np) => {
            ssa(ctx, ns, np).await?;
        }
        None => prune::<NetworkPolicy>(ctx, ns, app, &[]).await?,
    }
    // 5. The workload.
    let stateful_set = ssa(ctx, ns, &c.stateful_set).await?;
    // 6. The task assignment, only when it changed, after the StatefulSet: its pods
    //    may be new to it, and a scale-in that it completes was sized by it.
    if let Some(cm) = assignment {
        ssa(ctx, ns, cm).await?;
    }
    // 7. Disruption budget: only meaningful with more than one worker; removed otherwise.
    if app.spec.replicas > 1 {
        ssa(ctx, ns, &c.pod_disruption_budget).await?;
    } else {
        prune::<PodDisruptionBudget>(ctx, ns, app, &[]).await?;
    }
    Ok(stateful_set)
}

/// Deletes objects of kind K labelled as this app's children whose names are not wanted.
/// Skipped, without a request, when the controller's watch of that kind shows none of
/// the operator's objects in the namespace: a list per pruned kind was a third of the
/// GETs of a steady reconcile (make bench-operator at 500 apps).
pub(super) async fn prune<K>(
    ctx: &Context,
    ns: &str,
    app: &StreamApp,
    keep: &[String],
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    if !ctx.applied.any_seen(short_kind::<K>(), ns) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{APP_LABEL}={}", app.name_any()));
    let list = api.list(&lp).await.map_err(|source| Error::ReadCluster {
        what: short_kind::<K>().into(),
        source,
    })?;
    let uid = app.uid().unwrap_or_default();
    for obj in list.items {
        let name = obj.meta().name.clone().unwrap_or_default();
        let owned = obj
            .meta()
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid);
        if owned && !keep.contains(&name) {
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {
                    tracing::info!(kind = short_kind::<K>(), %name, "pruned child no longer wanted")
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(Error::PruneChild {
                        kind: short_kind::<K>(),
                        name,
                        source,
                    });
                }
            }
        }
    }
    Ok(())
}

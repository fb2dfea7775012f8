//! The status step of a reconciliation: the StreamApp's status by server-side apply
//! (only when it changed, and redacted), `status.instances` from the pods' reports on
//! their own schedule, and the workers' notices as Events.
//!
//! It must not decide what the status says (that is [`crate::status`]).

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use oxbow_crds::{StreamApp, StreamAppStatus};
use serde_json::json;

use super::{Context, Error, FIELD_MANAGER};

/// `status.instances` from the reports of the live pods, on their bounded schedule, and
/// the workers' notices as Events.
pub(super) async fn publish_reports(
    ctx: &Context,
    app: &StreamApp,
    ns: &str,
    live: &[&oxbow_crds::InstanceStatus],
    previous: &[oxbow_crds::InstanceStatus],
    reports: &BTreeMap<String, oxbow_crds::report::Report>,
) -> Result<(), Error> {
    let key = format!("{ns}/{}", app.name_any());
    let next: Vec<oxbow_crds::InstanceStatus> = live.iter().map(|i| (*i).clone()).collect();
    if crate::reports::due(previous, &next, ctx.instances_schedule.since(&key)) {
        crate::reports::write_instances(&ctx.client, app, ns, &next)
            .await
            .map_err(Error::WriteStatus)?;
        ctx.instances_schedule.written(&key);
    }
    let notices = {
        let mut published = ctx
            .notices_published
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        crate::reports::unpublished(reports, &mut published, ns)
    };
    for (pod, n) in notices {
        ctx.event(
            app,
            EventType::Warning,
            &n.reason,
            format!("{pod}: {}", n.note),
        )
        .await;
    }
    Ok(())
}

pub(super) async fn write_status(
    ctx: &Context,
    app: &StreamApp,
    status: &StreamAppStatus,
) -> Result<(), Error> {
    let api: Api<StreamApp> =
        Api::namespaced(ctx.client.clone(), &app.namespace().unwrap_or_default());
    let mut st =
        serde_json::to_value(status).map_err(|e| Error::WriteStatus(kube::Error::SerdeError(e)))?;
    // instances[] is the aggregate of the reports, written on its own schedule
    // (`publish_reports`): never sent here.
    if let Some(o) = st.as_object_mut() {
        o.remove("instances");
    }
    // Conditions quote Kafka's errors, which may quote a secret.
    oxbow_crds::redact::scrub_json(&mut st);
    // Nothing changed: no write (a steady app costs the API server no status writes).
    let mut current = app
        .status
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_default();
    if let Some(o) = current.as_object_mut() {
        o.remove("instances");
    }
    if current == st {
        return Ok(());
    }
    let patch = json!({"apiVersion": "oxbow.dev/v1alpha1", "kind": "StreamApp", "status": st});
    api.patch_status(
        &app.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await
    .map_err(Error::WriteStatus)?;
    Ok(())
}

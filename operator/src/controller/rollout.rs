//! The rollout step of a reconciliation: build the children (pure) and apply them in
//! order, publish the assignment, and move a requested reset on. Nothing is rolled out
//! for a spec that cannot run, for an id another app owns, or next to a topic that is
//! not the app's; while the claims cannot be read, only a workload that already runs is
//! kept up (it was claimed). A failure here is reported in status before it is returned.
//!
//! It must not decide placement or topics (they are decided before it).

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use oxbow_crds::StreamApp;
use oxbow_crds::assignment::Assignment;

use super::apply::Problems;
use super::children::{apply_children, ssa};
use super::claim::Owned;
use super::dereference::Observed;
use super::place::Placed;
use super::reset;
use super::{Context, Error};
use crate::build;
use crate::status::{Verdict, reason};

/// What the rollout did.
pub(super) struct RolledOut {
    /// The StatefulSet as the apply returned it, when it was applied.
    pub applied_sts: Option<StatefulSet>,
    /// The children were applied.
    pub rolled_out: bool,
    /// The assignment the workers now read.
    pub in_force: Option<Assignment>,
    /// Why applying or publishing failed, with the verdict it gives.
    pub apply_error: Option<Error>,
    pub apply_verdict: Option<Verdict>,
    /// A reset under way: its verdict, and whether it is done.
    pub reset_verdict: Option<Verdict>,
    pub reset_done: bool,
    /// The store encoding of the template applied, when the children were applied.
    pub store_encoding: Option<oxbow_crds::StoreEncoding>,
}

/// Builds and applies the children, or only publishes the assignment when nothing else
/// may be rolled out; then moves a reset on. `owned`: the claim (and the stores it lets
/// reset); `topics_stalled`: a topic is not the app's. The problem found: Kafka failed
/// a reset's step (`kafka`).
pub(super) async fn roll_out(
    app: &StreamApp,
    ctx: &Context,
    obs: &Observed,
    placed: &Placed,
    owned: &Owned,
    topics_stalled: bool,
    problems: &Problems,
) -> (RolledOut, Problems) {
    let mut found = Problems::default();
    let reset_stores = owned.reset_stores.as_deref();
    let owned = owned.view.is_some()
        || ((problems.claims.is_some() || problems.kafka.is_some()) && obs.sts.is_some());
    let mut apply_error = None;
    let mut rolled_out = false;
    let mut in_force = placed.published.clone();
    let mut applied_sts = None;
    let mut store_encoding = None;
    let to_publish = placed
        .plan
        .as_ref()
        .filter(|p| p.publish)
        .map(|p| &p.assignment);
    if problems.invalid.is_none() && problems.source.is_none() && owned && !topics_stalled {
        let encoding = super::encoding::decide(obs.sts.as_ref(), build::image(app, &ctx.build));
        match apply_all(app, ctx, obs, placed, to_publish, encoding).await {
            Ok(live) => {
                applied_sts = live;
                rolled_out = true;
                store_encoding = Some(encoding);
                if let Some(a) = to_publish {
                    tracing::info!(generation = a.generation, "published task assignment");
                    in_force = Some(a.clone());
                }
            }
            Err(e) => apply_error = Some(e),
        }
    } else if problems.invalid.is_none()
        && obs.sts.is_some()
        && let Some(a) = to_publish
    {
        // Nothing else is rolled out, but the assignment moves on, so pods that die
        // still hand their tasks over.
        match publish(app, ctx, a).await {
            Ok(()) => {
                tracing::info!(generation = a.generation, "published task assignment");
                in_force = Some(a.clone());
            }
            Err(e) => apply_error = Some(e),
        }
    }
    // A reset goes one step further once the workers are told to stop.
    let mut reset_progress = None;
    if rolled_out && let (Some(stores), Some(c)) = (reset_stores, &obs.cluster) {
        match reset::advance(c, &app.application_id(), stores, obs.pods.len()).await {
            Ok(p) => reset_progress = Some(p),
            Err(Error::Topics(e)) => found.kafka = Some(e),
            Err(e) => apply_error = Some(e),
        }
    }
    let reset_done = reset_progress == Some(reset::Progress::Done);
    let reset_verdict = reset_stores.map(|stores| {
        let msg = match &reset_progress {
            Some(p) => p.message(stores),
            None => format!(
                "resetting store(s) {}: stopping the workers",
                stores.join(", ")
            ),
        };
        Verdict::waiting(reason::RESETTING_STATE, msg)
    });
    let apply_verdict = apply_error.as_ref().map(|e| match e {
        // The API server refused the object (invalid, or RBAC): retrying cannot help.
        Error::ApplyChild {
            source: kube::Error::Api(s),
            ..
        } if matches!(s.code, 400 | 403 | 422) => {
            Verdict::stalled(reason::APPLY_REJECTED, e.to_string())
        }
        Error::BuildChildren(_) => Verdict::stalled(reason::BUILD_FAILED, e.to_string()),
        _ => Verdict::waiting(reason::APPLY_FAILED, e.to_string()),
    });
    let rolled = RolledOut {
        applied_sts,
        rolled_out,
        in_force,
        apply_error,
        apply_verdict,
        reset_verdict,
        reset_done,
        store_encoding,
    };
    (rolled, found)
}

/// Builds every child (and the assignment to publish, if any) and applies them in order;
/// the StatefulSet as the apply returned it.
async fn apply_all(
    app: &StreamApp,
    ctx: &Context,
    obs: &Observed,
    placed: &Placed,
    to_publish: Option<&Assignment>,
    encoding: oxbow_crds::StoreEncoding,
) -> Result<Option<StatefulSet>, Error> {
    let ns = app.namespace().unwrap_or_default();
    let secret_version = obs.secret.as_ref().and_then(|s| s.version.as_deref());
    let children = build::build(
        app,
        &ctx.build,
        placed.sts_replicas,
        secret_version,
        encoding,
    )?;
    let cm = to_publish
        .map(|a| build::assignment_config_map(app, a))
        .transpose()?;
    apply_children(app, &ns, &children, cm.as_ref(), ctx).await
}

/// Publishes the assignment alone.
async fn publish(app: &StreamApp, ctx: &Context, a: &Assignment) -> Result<(), Error> {
    let ns = app.namespace().unwrap_or_default();
    let cm = build::assignment_config_map(app, a)?;
    ssa(ctx, &ns, &cm).await.map(|_| ())
}

//! The events step of a reconciliation: an Event for each notable transition the new
//! status makes (Ready, not Ready, a new reason to be Stalled, a finished reset).
//!
//! It must not decide the status (that is the status step's).

use kube::runtime::events::EventType;
use oxbow_crds::StreamApp;

use super::status::NextStatus;
use super::{Context, EventReason};
use crate::status::{self, ConditionType, Verdict};

/// Emits the events of the transitions from the previous status to `next`.
/// `reset_done`: the verdict of a reset that just finished.
pub(super) async fn transitions(
    app: &StreamApp,
    ctx: &Context,
    next: &NextStatus<'_>,
    reset_done: Option<&Verdict>,
) {
    if let Some(v) = reset_done {
        ctx.event(
            app,
            EventType::Normal,
            EventReason::StateReset.as_str(),
            v.message.clone(),
        )
        .await;
    }
    if next.ready && !next.was_ready {
        ctx.event(
            app,
            EventType::Normal,
            EventReason::Ready.as_str(),
            "topics exist, every worker is ready and restored".into(),
        )
        .await;
    } else if !next.ready && next.was_ready {
        let why = status::find(&next.status.conditions, ConditionType::Ready)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        ctx.event(app, EventType::Warning, EventReason::NotReady.as_str(), why)
            .await;
    }
    if let Some(s) = &next.stalled
        && next.was_stalled_reason.as_deref() != Some(s.reason.as_str())
    {
        ctx.event(app, EventType::Warning, &s.reason, s.message.clone())
            .await;
    }
}

//! `apply`: the whole reconciliation of a live StreamApp, as its steps in order, each a
//! file of its own. Idempotent.
//!
//! dereference (reads) → validate (pure) → own (claim the id) → place (pure) → topics
//! → roll out (build, apply, publish) → why pods cannot be created (reads) → status
//! (pure) → write → events → what next.
//!
//! It must not do a step's work itself: it only hands each step's typed result to the
//! next, records the problems each step returns, and turns them into the reconcile's
//! outcome.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use oxbow_crds::StreamApp;

use super::status::NextStatus;
use super::status_write::{publish_reports, write_status};
use super::{Context, Error, claim, dereference, events, internal_topics, place, pod_creation};
use super::{reset, rollout, status, validate};
use crate::claims::ClaimsError;
use crate::status::{Verdict, reason};
use crate::topics::TopicError;

/// What stops or holds back this reconcile. Each step reads the problems found before
/// it and returns those it found itself; only `apply` records them, in step order.
#[derive(Default)]
pub(super) struct Problems {
    /// The spec cannot run, or its id is another app's: nothing is rolled out.
    pub invalid: Option<Verdict>,
    /// The sources (or the app's Kafka client configuration or Secret) do not let the
    /// app run as it is.
    pub source: Option<Verdict>,
    /// Kafka could not be reached or refused an operation: retried with back-off.
    pub kafka: Option<TopicError>,
    /// The claims topic could not be read or written: retried with back-off.
    pub claims: Option<ClaimsError>,
}

impl Problems {
    /// Records what a step found: a problem of a kind replaces the one found before.
    fn record(&mut self, found: Problems) {
        let Problems {
            invalid,
            source,
            kafka,
            claims,
        } = found;
        if invalid.is_some() {
            self.invalid = invalid;
        }
        if source.is_some() {
            self.source = source;
        }
        if kafka.is_some() {
            self.kafka = kafka;
        }
        if claims.is_some() {
            self.claims = claims;
        }
    }
}

/// Apply: the whole reconciliation of a live StreamApp. Idempotent.
pub(super) async fn apply(app: &StreamApp, ctx: &Context) -> Result<Action, Error> {
    let ns = app.namespace().unwrap_or_default();
    let mut problems = Problems::default();
    let previous = app.status.clone().unwrap_or_default();

    // Everything we need to read, before deciding anything.
    let (obs, counts) = dereference::observe(app, ctx).await?;
    let (validated, found) = validate::validate(app, &obs, counts);
    problems.record(found);
    // Claim the application id on this Kafka cluster before anything is rolled out:
    // two apps with one id would share changelogs, group and transactional ids.
    let (owned, found) = claim::own(
        app,
        obs.cluster.as_deref(),
        validated.resetting.clone(),
        &problems,
    )
    .await;
    problems.record(found);
    let reset_stores = owned.reset_stores.as_deref();
    let (placed, found) = place::place(
        app,
        &ctx.placement,
        &obs,
        validated.tasks,
        reset_stores.is_some(),
        &problems,
    );
    problems.record(found);
    // Topics before the workload: pods must never write to a topic not the app's.
    let (topics, found) = internal_topics::step(
        app,
        ctx,
        obs.cluster.as_deref(),
        owned.view.as_ref(),
        validated.tasks,
        reset_stores.is_some(),
        &problems,
    )
    .await?;
    problems.record(found);
    let (rolled, found) = rollout::roll_out(
        app,
        ctx,
        &obs,
        &placed,
        &owned,
        topics.verdict.stalled,
        &problems,
    )
    .await;
    problems.record(found);
    // Why the StatefulSet cannot create pods (its Events) is the one read left.
    let create_failure = pod_creation::of_app(ctx, &obs, &rolled).await;
    let next = status::next_status(
        app,
        status::Findings {
            obs: &obs,
            placed: &placed,
            validated,
            rolled: &rolled,
            topics,
            invalid: problems.invalid.clone(),
            reset_stores,
            create_failure,
        },
        Timestamp::now(),
    );
    // The instances first: a condition naming a pod and its error is never seen before
    // that pod's entry in status.instances.
    publish_reports(
        ctx,
        app,
        &ns,
        &next.instances,
        &previous.instances,
        &placed.reports,
    )
    .await?;
    write_status(ctx, app, &next.status).await?;
    let reset_done = rolled.reset_verdict.as_ref().filter(|_| rolled.reset_done);
    events::transitions(app, ctx, &next, reset_done).await;
    if rolled.reset_done {
        // Recorded first: a failure here leaves an annotation with nothing to reset.
        reset::finish(&ctx.client, app).await?;
    }

    let when_clean = next_action(
        ctx,
        &problems,
        reset_stores.is_some(),
        &next,
        &placed.reports,
    );
    outcome(rolled, problems, when_clean)
}

/// What the reconciliation returns once status is written: a failed apply, Kafka or
/// claims problem is an error the error policy retries with back-off (status already
/// says why; an apply the spec stalls waits for a change instead); without one,
/// `when_clean`.
fn outcome(
    rolled: rollout::RolledOut,
    problems: Problems,
    when_clean: Action,
) -> Result<Action, Error> {
    if let Some(e) = rolled.apply_error {
        return match rolled.apply_verdict {
            Some(v) if v.stalled => Ok(Action::await_change()),
            _ => Err(e),
        };
    }
    if let Some(e) = problems.kafka {
        return Err(Error::Topics(e));
    }
    if let Some(e) = problems.claims {
        return Err(Error::Claims(e));
    }
    Ok(when_clean)
}

/// When to look at the app again, when nothing failed.
fn next_action(
    ctx: &Context,
    problems: &Problems,
    resetting: bool,
    next: &NextStatus<'_>,
    reports: &std::collections::BTreeMap<String, oxbow_crds::report::Report>,
) -> Action {
    if problems.invalid.is_some()
        && next
            .stalled
            .as_ref()
            .is_some_and(|s| s.reason == reason::APPLICATION_ID_CONFLICT.as_str())
    {
        // The owner may be deleted: look again later.
        Action::requeue(Duration::from_secs(30))
    } else if problems.invalid.is_some() {
        // Only a spec change can fix it.
        Action::await_change()
    } else if resetting {
        // Pods stop and Kafka deletes topics without telling us.
        Action::requeue(Duration::from_secs(2))
    } else if problems.source.is_some() || next.stalled.is_some() {
        // Someone may create or fix the topics: look again later.
        Action::requeue(Duration::from_secs(30))
    } else if next.placing {
        // A report that changes what a pod runs triggers a reconciliation; this
        // bounds the wait for one whose pod went silent.
        Action::requeue(Duration::from_secs(2))
    } else {
        let base = if next.ready {
            ctx.resync
        } else {
            Duration::from_secs(5)
        };
        // Renewals trigger nothing: look again when a pod that reports now would
        // have been silent for the failover timeout.
        let silence =
            crate::reports::until_silent(reports, Timestamp::now(), ctx.placement.failover_timeout);
        Action::requeue(silence.map_or(base, |s| s.min(base)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_a_step_finds_replaces_the_one_of_its_kind_and_keeps_the_others() {
        let mut problems = Problems {
            invalid: Some(Verdict::stalled(reason::SPEC_INVALID, "first")),
            source: Some(Verdict::stalled(reason::KAFKA_SECRET_MISSING, "secret")),
            ..Problems::default()
        };
        problems.record(Problems {
            invalid: Some(Verdict::stalled(reason::APPLICATION_ID_CONFLICT, "second")),
            claims: Some(ClaimsError::NotReadBack {
                topic: "claims".into(),
                key: "k".into(),
            }),
            ..Problems::default()
        });
        let invalid = problems.invalid.expect("invalid stays found");
        assert_eq!(invalid.reason, reason::APPLICATION_ID_CONFLICT);
        assert_eq!(
            problems.source.map(|v| v.message).as_deref(),
            Some("secret"),
            "a step that found nothing about the sources leaves their problem"
        );
        assert!(problems.claims.is_some());
        assert!(problems.kafka.is_none());
    }
}

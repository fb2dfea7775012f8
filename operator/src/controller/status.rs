//! The status step of a reconciliation: the status the StreamApp should have, from
//! what the steps before found (the verdicts) and what the workload and the pods'
//! reports say (pure). What each condition says is [`crate::status`]'s; this step only
//! gathers its input. Why the StatefulSet cannot create pods is read before
//! ([`super::pod_creation::of_app`]).
//!
//! It must not write (that is `status_write`).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use oxbow_crds::{InstanceStatus, StreamApp, StreamAppStatus};

use super::dereference::Observed;
use super::internal_topics::{self, TopicsStep};
use super::place::Placed;
use super::rollout::RolledOut;
use super::validate::Validated;
use crate::build;
use crate::placement::PodObservation;
use crate::status::{self, ConditionType, StatusInput, Verdict, WorkloadFacts};

/// The status to write, and what the events and the next reconcile depend on.
pub(super) struct NextStatus<'a> {
    pub status: StreamAppStatus,
    /// The live pods' `status.instances` entries.
    pub instances: Vec<&'a InstanceStatus>,
    pub ready: bool,
    pub was_ready: bool,
    pub stalled: Option<Condition>,
    pub was_stalled_reason: Option<String>,
    /// Placement is under way: another step is due, or workers have yet to acknowledge.
    pub placing: bool,
}

/// What the steps before found, for the status.
pub(super) struct Findings<'a> {
    pub obs: &'a Observed,
    pub placed: &'a Placed,
    pub validated: Validated,
    pub rolled: &'a RolledOut,
    pub topics: TopicsStep,
    /// Why the spec cannot run (`Problems::invalid`).
    pub invalid: Option<Verdict>,
    /// The stores a reset empties, while it runs.
    pub reset_stores: Option<&'a [String]>,
    /// Why the StatefulSet cannot create pods ([`super::pod_creation::of_app`]).
    pub create_failure: Option<String>,
}

/// The status from the steps' findings, as of `now`. The StatefulSet is the one the
/// apply returned (its new generation), else the one read at the start: no second read.
pub(super) fn next_status<'a>(
    app: &StreamApp,
    found: Findings<'a>,
    now: Timestamp,
) -> NextStatus<'a> {
    let Findings {
        obs,
        placed,
        validated,
        rolled,
        topics,
        invalid,
        reset_stores,
        create_failure,
    } = found;
    let previous = app.status.clone().unwrap_or_default();
    let sts = rolled.applied_sts.as_ref().or(obs.sts.as_ref());
    let workload = workload_facts(
        app,
        sts,
        placed.sts_replicas,
        &placed.observed,
        create_failure,
    );
    let live: Vec<&str> = placed
        .observed
        .iter()
        .filter(|p| !p.terminating)
        .map(|p| p.name.as_str())
        .collect();
    let instances = status::current_instances(&live, &placed.reported);
    let (restoration, restored) = status::restoration(&instances);
    let tasks_verdict =
        status::tasks_verdict(rolled.in_force.as_ref(), &instances, app.spec.replicas);
    // (No assignment at all waits for pods, which the pod watch reports.)
    let placing = placed.plan.as_ref().is_some_and(|p| !p.settled)
        || rolled
            .in_force
            .as_ref()
            .is_some_and(|a| !status::unacknowledged(a, &instances).is_empty());
    let input = StatusInput {
        generation: app.metadata.generation,
        invalid: invalid
            .or(rolled.apply_verdict.clone())
            .or(rolled.reset_verdict.clone()),
        topics: topics.verdict,
        tasks: tasks_verdict,
        workload: status::workload_verdict(&workload),
        restored,
        previous: &previous.conditions,
        now,
    };
    let (conditions, phase) = status::conditions(&input);
    let ready = status::when_true(&conditions, ConditionType::Ready).is_some();
    let was_ready = status::when_true(&previous.conditions, ConditionType::Ready).is_some();
    let stalled = status::when_true(&conditions, ConditionType::Stalled).cloned();
    let was_stalled_reason =
        status::when_true(&previous.conditions, ConditionType::Stalled).map(|c| c.reason.clone());
    let stages = oxbow_crds::topology::Topology::of(&app.application_id(), &app.spec).stage_count();
    let status = StreamAppStatus {
        observed_generation: app.metadata.generation,
        // An app an earlier operator ran keeps reading as legacy until its topics are
        // recorded (adopted), so a failure in between does not lose that.
        application_id: (!internal_topics::legacy(&previous) || topics.recorded)
            .then(|| app.application_id()),
        conditions,
        phase: Some(phase),
        replicas: workload.replicas,
        ready_replicas: workload.ready_replicas,
        selector: Some(build::selector_string(app)),
        tasks: validated.tasks.map(|n| n * stages as i32),
        lag: instances.iter().filter_map(|i| i.lag).reduce(|a, b| a + b),
        restoration,
        // The layouts the workers now run with; until a rollout (or a reset's end),
        // the ones before.
        store_layouts: if rolled.reset_done || (rolled.rolled_out && reset_stores.is_none()) {
            validated.layouts
        } else {
            validated.recorded
        },
        store_encoding: rolled.store_encoding.or(previous.store_encoding),
        instances: vec![],
        topics: topics.statuses,
    };
    NextStatus {
        status,
        instances,
        ready,
        was_ready,
        stalled,
        was_stalled_reason,
        placing,
    }
}

/// `sts_replicas`: the size the StatefulSet should have (above `spec.replicas` while
/// pods drain); `pods`: the worker pods that exist.
fn workload_facts(
    app: &StreamApp,
    sts: Option<&StatefulSet>,
    sts_replicas: i32,
    pods: &[PodObservation],
    create_failure: Option<String>,
) -> WorkloadFacts {
    let draining = (sts_replicas - app.spec.replicas).max(0);
    // The StatefulSet's status may still count a pod it is removing as ready.
    let stopping = pods.iter().filter(|p| p.ordinal >= sts_replicas).count();
    let stopping = i32::try_from(stopping).unwrap_or(i32::MAX);
    let Some(sts) = sts else {
        return WorkloadFacts {
            want_replicas: app.spec.replicas,
            draining,
            stopping,
            ..Default::default()
        };
    };
    let st = sts.status.clone().unwrap_or_default();
    let spec_replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    WorkloadFacts {
        exists: true,
        want_replicas: app.spec.replicas,
        replicas: st.replicas,
        ready_replicas: st.ready_replicas.unwrap_or(0),
        updated_replicas: st.updated_replicas.unwrap_or(0),
        rolled_out: build::template_rolled_out(sts) && spec_replicas == sts_replicas,
        draining,
        stopping,
        create_failure,
    }
}

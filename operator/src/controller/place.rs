//! The place step of a reconciliation: who runs which task, and how large the
//! StatefulSet must stay while pods drain. Pure: it decides from what dereference read
//! (the pods, their report Leases judged by this operator's clock, the published
//! assignment, the time); the rules are [`crate::placement`]'s.
//!
//! It must not read or write anything.

use std::collections::BTreeMap;

use oxbow_crds::StreamApp;
use oxbow_crds::assignment::{Assignment, Params};

use super::apply::Problems;
use super::dereference::Observed;
use crate::placement::{self, PlacementConfig, Plan, PodObservation};
use crate::status::{Verdict, reason};

/// Where the tasks go, and what it was decided from.
pub(super) struct Placed {
    /// The pods' own reports (their Leases), by pod.
    pub reports: BTreeMap<String, oxbow_crds::report::Report>,
    /// Their `status.instances` entries.
    pub reported: Vec<oxbow_crds::InstanceStatus>,
    /// The worker pods as placement sees them.
    pub observed: Vec<PodObservation>,
    /// The assignment the workers were last given (the ConfigMap), if readable.
    pub published: Option<Assignment>,
    /// The next placement, when the task count is known and the spec valid.
    pub plan: Option<Plan>,
    /// The size the StatefulSet must have (above `spec.replicas` while pods drain).
    pub sts_replicas: i32,
}

/// Places the app's `tasks` (per stage). `resetting`: a reset stops every worker. The
/// problem found: the sources' partition count differs from the placed one (`source`).
pub(super) fn place(
    app: &StreamApp,
    settings: &PlacementConfig,
    obs: &Observed,
    tasks: Option<i32>,
    resetting: bool,
    problems: &Problems,
) -> (Placed, Problems) {
    let reports = obs.reports.clone();
    let reported: Vec<oxbow_crds::InstanceStatus> =
        reports.values().map(|r| r.entry.clone()).collect();
    let observed: Vec<PodObservation> = obs
        .pods
        .iter()
        .filter_map(|p| placement::observe(&app.worker_name(), p))
        .collect();
    let facts = placement::pod_facts(
        &observed,
        &reported,
        app.spec.replicas,
        obs.now,
        settings.failover_timeout,
    );
    let published = placement::published(obs.assignment.as_ref()).unwrap_or_else(|why| {
        // Edited by hand: placement starts over from what the workers report.
        tracing::warn!(configmap = %app.assignment_config_map_name(), %why, "ignoring an unreadable assignment");
        None
    });
    let published_tasks = published.as_ref().and_then(published_task_count);
    let (place_tasks, partitions_changed) =
        task_count(tasks, published_tasks, problems.source.as_ref());
    let plan: Option<Plan> = match place_tasks {
        Some(n) if problems.invalid.is_none() => Some(placement::plan(
            published.as_ref(),
            &facts,
            &reported,
            Params {
                tasks: u32::try_from(n).unwrap_or(0),
                stages: oxbow_crds::topology::Topology::of(&app.application_id(), &app.spec)
                    .stage_count(),
                standby_replicas: u32::try_from(app.spec.standby_replicas).unwrap_or(0),
                warmup_max_lag: settings.warmup_max_lag,
            },
        )),
        _ => None,
    };
    let wanted = plan.as_ref().map(|p| &p.assignment).or(published.as_ref());
    // A reset stops every worker before the changelogs it would write are deleted.
    let sts_replicas = if resetting {
        0
    } else {
        placement::stateful_set_replicas(
            app.spec.replicas,
            &app.worker_name(),
            wanted,
            &facts,
            &reported,
        )
    };
    let placed = Placed {
        reports,
        reported,
        observed,
        published,
        plan,
        sts_replicas,
    };
    let found = Problems {
        source: partitions_changed,
        ..Problems::default()
    };
    (placed, found)
}

/// The task count to place: the sources' (`tasks`), stalling the app when it differs
/// from the published one, since it fixes which keys each task's state holds (a source
/// that gained partitions would move keys to tasks that start empty). Without the
/// source metadata (Kafka or its Secret unreachable, or the partitions changed),
/// placement goes on with the published count: a dead pod's tasks still fail over.
/// `source`: the sources' problem found before; also returned: the stall, if this finds it.
fn task_count(
    tasks: Option<i32>,
    published_tasks: Option<i32>,
    source: Option<&Verdict>,
) -> (Option<i32>, Option<Verdict>) {
    let changed = match (tasks, published_tasks, source) {
        (Some(n), Some(had), None) if n != had => Some(Verdict::stalled(
            reason::SOURCE_PARTITIONS_CHANGED,
            format!(
                "the source topics have {n} partitions but the app's state is split into {had} tasks: records of a key would go to a task that does not hold its state. Either restore {had} partitions (re-create the source topics), or start over with the new partitioning under a new StreamApp (another applicationId; it reprocesses the sources), then delete this one"
            ),
        )),
        _ => None,
    };
    let place = match changed.as_ref().or(source) {
        None => tasks.or(published_tasks),
        Some(p)
            if p.reason == reason::SOURCE_PARTITIONS_CHANGED
                || p.reason == reason::KAFKA_SECRET_MISSING =>
        {
            published_tasks
        }
        Some(_) => None,
    };
    (place, changed)
}

/// Tasks per stage in a published assignment (its stage-0 tasks).
fn published_task_count(a: &Assignment) -> Option<i32> {
    let n = a.tasks.keys().filter(|t| t.stage == 0).count();
    (n > 0).then(|| i32::try_from(n).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sources_count_is_placed_when_nothing_was_published() {
        assert_eq!(task_count(Some(4), None, None), (Some(4), None));
    }

    #[test]
    fn a_changed_partition_count_stalls_the_app_and_keeps_placing_the_published_tasks() {
        let (n, stall) = task_count(Some(6), Some(4), None);
        assert_eq!(n, Some(4), "a dead pod's tasks must still fail over");
        let stall = stall.expect("the changed count is a problem of the sources");
        assert!(stall.stalled);
        assert_eq!(stall.reason, reason::SOURCE_PARTITIONS_CHANGED);
        assert!(stall.message.contains("6 partitions"), "{}", stall.message);
    }

    #[test]
    fn a_missing_secret_keeps_placing_the_published_tasks_and_adds_no_stall() {
        let missing = Verdict::stalled(reason::KAFKA_SECRET_MISSING, "no Secret");
        assert_eq!(task_count(None, Some(4), Some(&missing)), (Some(4), None));
    }

    #[test]
    fn any_other_problem_of_the_sources_places_nothing() {
        let refused = Verdict::stalled(reason::KAFKA_PROPERTY_REFUSED, "refused");
        assert_eq!(task_count(Some(4), Some(4), Some(&refused)), (None, None));
    }
}

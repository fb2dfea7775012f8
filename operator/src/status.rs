//! The StreamApp's status from facts already read: conditions (kstatus: Ready,
//! Reconciling, Stalled, plus TopicsReady, TasksAssigned, WorkloadReady, Restored),
//! phase and the restoration summary.
//!
//! Pure. Transition times are carried over from the previous status when a condition's
//! status did not change, so `lastTransitionTime` means what it says.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use oxbow_crds::assignment::Assignment;
use oxbow_crds::{InstanceStatus, Phase, RestorationStatus, TopicStatus, WorkerState};

/// The condition types the operator sets: kstatus' three, then the details. The
/// variant's name is the type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, strum::IntoStaticStr, strum::VariantArray,
)]
pub enum ConditionType {
    Ready,
    Reconciling,
    Stalled,
    TopicsReady,
    TasksAssigned,
    WorkloadReady,
    Restored,
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for ConditionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A condition's status. The API keeps it as a string; the operator reads and writes
/// it through this type, so "true" or "Ture" never compare equal to anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// Anything but "True" or "False" is unknown, as the API conventions say.
    pub fn of(c: &Condition) -> Self {
        Self::parse(&c.status)
    }

    /// The status of any kind's condition (a pod's, say), read the same way.
    pub fn parse(status: &str) -> Self {
        match status {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// The condition of type `t` in `conditions`, if set.
pub fn find(conditions: &[Condition], t: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == t.as_str())
}

/// The condition of type `t` when it is set and `True`.
pub fn when_true(conditions: &[Condition], t: ConditionType) -> Option<&Condition> {
    find(conditions, t).filter(|c| ConditionStatus::of(c) == ConditionStatus::True)
}

/// A condition reason. Only the constants of [`reason`] exist (the field is private), so
/// a new reason cannot be set without being listed in [`reason::ALL`], which a test
/// holds against the conditions table of docs/streamapp.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(&'static str);

impl Reason {
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Every reason the operator sets on a condition, with the condition types it is set on
/// (the detail condition it comes from; `Ready` and `Reconciling` or `Stalled` repeat
/// the reason of whatever blocks Ready).
pub mod reason {
    use oxbow_crds::validate::ValidationError;

    use super::Reason;

    macro_rules! reasons {
        ($($name:ident = $text:literal on [$($on:expr),+];)+) => {
            $(pub const $name: Reason = Reason($text);)+
            /// Each reason with the condition types it is set on.
            pub const ALL: &[(Reason, &[super::ConditionType])] = &[$(($name, &[$($on),+])),+];
        };
    }

    reasons! {
        READY = "Ready" on [super::ConditionType::Ready];
        NOT_RECONCILING = "NotReconciling" on [super::ConditionType::Reconciling];
        NOT_STALLED = "NotStalled" on [super::ConditionType::Stalled];
        CLEANUP_TIMED_OUT = "CleanupTimedOut" on [super::ConditionType::Stalled];
        // Spec problems found by crds/src/validate.rs, and children the API server refuses.
        INVALID_EXPRESSION = "InvalidExpression" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        EXPRESSION_TOO_COSTLY = "ExpressionTooCostly" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        INVALID_DURATION = "InvalidDuration" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        DUPLICATE_STORE = "DuplicateStore" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        UNUSED_STORE_SETTINGS = "UnusedStoreSettings" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        DUPLICATE_STEP_NAME = "DuplicateStepName" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        TOPIC_COLLISION = "TopicCollision" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        YAML_BOOLEAN_KEY = "YamlBooleanKey" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        UNKNOWN_TABLE = "UnknownTable" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        TABLE_IN_TWO_STAGES = "TableInTwoStages" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        TABLE_NAME_TAKEN = "TableNameTaken" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        OUTPUT_TOPIC_TAKEN = "OutputTopicTaken" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        STREAM_JOIN_WITHOUT_WINDOW = "StreamJoinWithoutWindow" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        NOT_FOR_TABLE_JOINS = "NotForTableJoins" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        JOIN_STREAM_TAKEN = "JoinStreamTaken" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        APPLICATION_ID_CONFLICT = "ApplicationIdConflict" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        APPLICATION_ID_CHANGED = "ApplicationIdChanged" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        INCOMPATIBLE_STATE_CHANGE = "IncompatibleStateChange" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        APPLY_REJECTED = "ApplyRejected" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        BUILD_FAILED = "BuildFailed" on [super::ConditionType::Ready, super::ConditionType::Stalled];
        APPLY_FAILED = "ApplyFailed" on [super::ConditionType::Ready, super::ConditionType::Reconciling];
        RESETTING_STATE = "ResettingState" on [super::ConditionType::Ready, super::ConditionType::Reconciling, super::ConditionType::TopicsReady];
        TOPICS_READY = "TopicsReady" on [super::ConditionType::TopicsReady];
        TOPICS_PROVISIONING = "TopicsProvisioning" on [super::ConditionType::TopicsReady];
        CONFIG_DRIFT = "ConfigDrift" on [super::ConditionType::TopicsReady];
        SOURCE_TOPICS_MISSING = "SourceTopicsMissing" on [super::ConditionType::TopicsReady];
        SOURCE_TOPICS_NOT_CO_PARTITIONED = "SourceTopicsNotCoPartitioned" on [super::ConditionType::TopicsReady];
        TABLE_NOT_CO_PARTITIONED = "TableNotCoPartitioned" on [super::ConditionType::TopicsReady];
        TABLE_TOPIC_MISSING = "TableTopicMissing" on [super::ConditionType::TopicsReady];
        JOIN_STREAM_NOT_CO_PARTITIONED = "JoinStreamNotCoPartitioned" on [super::ConditionType::TopicsReady];
        JOIN_STREAM_MISSING = "JoinStreamMissing" on [super::ConditionType::TopicsReady];
        KAFKA_SECRET_MISSING = "KafkaSecretMissing" on [super::ConditionType::TopicsReady];
        INVALID_KAFKA_PROPERTIES = "InvalidKafkaProperties" on [super::ConditionType::TopicsReady];
        KAFKA_PROPERTY_REFUSED = "KafkaPropertyRefused" on [super::ConditionType::Ready, super::ConditionType::Stalled, super::ConditionType::TopicsReady];
        KAFKA_UNREACHABLE = "KafkaUnreachable" on [super::ConditionType::TopicsReady];
        KAFKA_AUTHENTICATION_FAILED = "KafkaAuthenticationFailed" on [super::ConditionType::TopicsReady];
        KAFKA_TLS_FAILED = "KafkaTlsFailed" on [super::ConditionType::TopicsReady];
        TOPIC_OPERATION_FAILED = "TopicOperationFailed" on [super::ConditionType::TopicsReady];
        TOPIC_NOT_OWNED = "TopicNotOwned" on [super::ConditionType::TopicsReady];
        SOURCE_PARTITIONS_CHANGED = "SourcePartitionsChanged" on [super::ConditionType::TopicsReady];
        SPEC_INVALID = "SpecInvalid" on [super::ConditionType::TopicsReady];
        TASKS_UNKNOWN = "TasksUnknown" on [super::ConditionType::TopicsReady];
        ASSIGNED = "Assigned" on [super::ConditionType::TasksAssigned];
        ASSIGNMENT_PENDING = "AssignmentPending" on [super::ConditionType::TasksAssigned];
        TASK_FAILED = "TaskFailed" on [super::ConditionType::TasksAssigned];
        SCALED_TO_ZERO = "ScaledToZero" on [super::ConditionType::TasksAssigned, super::ConditionType::WorkloadReady];
        ALL_WORKERS_READY = "AllWorkersReady" on [super::ConditionType::WorkloadReady];
        STATEFUL_SET_MISSING = "StatefulSetMissing" on [super::ConditionType::WorkloadReady];
        POD_CREATION_FAILED = "PodCreationFailed" on [super::ConditionType::WorkloadReady];
        DRAINING = "Draining" on [super::ConditionType::WorkloadReady];
        SCALING_IN = "ScalingIn" on [super::ConditionType::WorkloadReady];
        ROLLING_UPDATE = "RollingUpdate" on [super::ConditionType::WorkloadReady];
        WORKERS_NOT_READY = "WorkersNotReady" on [super::ConditionType::WorkloadReady];
        RESTORED = "Restored" on [super::ConditionType::Restored];
        NO_STATE = "NoState" on [super::ConditionType::Restored];
        RESTORING = "Restoring" on [super::ConditionType::Restored];
    }

    /// The reason for a failed Kafka admin operation: the listed one the error's variant
    /// names (a test holds every such name listed).
    pub fn of_topics(e: &crate::topics::TopicError) -> Reason {
        listed(e.into()).unwrap_or(TOPIC_OPERATION_FAILED)
    }

    /// The reason of a problem found by validation: the listed one the crds crate
    /// names it with. A test holds every such name listed, so `SpecInvalid` (for one
    /// that is not) is never given.
    pub fn of(e: &ValidationError) -> Reason {
        listed(e.reason()).unwrap_or(SPEC_INVALID)
    }

    /// The listed reason of this name, if there is one.
    fn listed(name: &str) -> Option<Reason> {
        ALL.iter().map(|(r, _)| *r).find(|r| r.as_str() == name)
    }
}

/// A detail condition's verdict before it becomes a `Condition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub reason: Reason,
    pub message: String,
    /// Progress cannot be made without a change from outside (spec or cluster).
    pub stalled: bool,
}

impl Verdict {
    pub fn ok(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            ok: true,
            reason,
            message: message.into(),
            stalled: false,
        }
    }
    pub fn waiting(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason,
            message: message.into(),
            stalled: false,
        }
    }
    pub fn stalled(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason,
            message: message.into(),
            stalled: true,
        }
    }
}

/// What the StatefulSet reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadFacts {
    pub exists: bool,
    pub want_replicas: i32,
    pub replicas: i32,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
    /// The StatefulSet controller has seen the latest spec and finished rolling it out.
    pub rolled_out: bool,
    /// Pods above `want_replicas` kept while they hand their tasks over (scale-in).
    pub draining: i32,
    /// Pods above the StatefulSet's size that still exist (stopping after a scale-in).
    pub stopping: i32,
    /// Why the StatefulSet controller cannot create a missing pod (its latest
    /// `FailedCreate` event: a quota, Pod Security admission).
    pub create_failure: Option<String>,
}

pub fn workload_verdict(w: &WorkloadFacts) -> Verdict {
    if !w.exists {
        return Verdict::waiting(
            reason::STATEFUL_SET_MISSING,
            "the worker StatefulSet has not been created yet",
        );
    }
    if w.want_replicas == 0 {
        return Verdict::ok(
            reason::SCALED_TO_ZERO,
            "replicas is 0: no worker runs, state is kept",
        );
    }
    if let Some(why) = &w.create_failure
        && w.replicas < w.want_replicas
    {
        return Verdict::stalled(
            reason::POD_CREATION_FAILED,
            format!(
                "{}/{} worker pods exist: the StatefulSet controller cannot create the others: {why}",
                w.replicas, w.want_replicas
            ),
        );
    }
    if w.draining > 0 {
        return Verdict::waiting(
            reason::DRAINING,
            format!(
                "scaling in to {}: {} pods above it keep running their tasks until the pods taking them over have warmed up",
                w.want_replicas, w.draining
            ),
        );
    }
    if w.stopping > 0 {
        return Verdict::waiting(
            reason::SCALING_IN,
            format!(
                "scaling in to {}: {} pods above it are stopping",
                w.want_replicas, w.stopping
            ),
        );
    }
    if w.ready_replicas >= w.want_replicas && w.updated_replicas >= w.want_replicas && w.rolled_out
    {
        return Verdict::ok(
            reason::ALL_WORKERS_READY,
            format!("{}/{} worker pods ready", w.ready_replicas, w.want_replicas),
        );
    }
    let reason = if !w.rolled_out || w.updated_replicas < w.want_replicas {
        reason::ROLLING_UPDATE
    } else {
        reason::WORKERS_NOT_READY
    };
    Verdict::waiting(
        reason,
        format!(
            "{}/{} worker pods ready, {}/{} updated to the current spec",
            w.ready_replicas, w.want_replicas, w.updated_replicas, w.want_replicas
        ),
    )
}

pub fn topics_verdict(topics: &[TopicStatus]) -> Verdict {
    let drifted: Vec<String> = topics
        .iter()
        .filter(|t| !t.drift.is_empty())
        .map(|t| format!("{}: {}", t.name, t.drift.join("; ")))
        .collect();
    if !drifted.is_empty() {
        return Verdict::stalled(
            reason::CONFIG_DRIFT,
            format!(
                "topics differ from the spec (driftPolicy: Enforce corrects config; extra partitions can only be removed by recreating the topic): {}",
                drifted.join(" | ")
            ),
        );
    }
    let pending: Vec<&str> = topics
        .iter()
        .filter(|t| !t.ready)
        .map(|t| t.name.as_str())
        .collect();
    if !pending.is_empty() {
        return Verdict::waiting(
            reason::TOPICS_PROVISIONING,
            format!("creating or updating topics: {}", pending.join(", ")),
        );
    }
    Verdict::ok(
        reason::TOPICS_READY,
        format!(
            "{} topics exist with the wanted partitions and config",
            topics.len()
        ),
    )
}

/// The workers' reports from pods that exist and are not going away: a pod removed by
/// scaling in may have left its last entry behind, and a dead pod's report must not
/// hold Ready back. `live` names the existing, non-terminating worker pods.
pub fn current_instances<'a>(
    live: &[&str],
    instances: &'a [InstanceStatus],
) -> Vec<&'a InstanceStatus> {
    instances
        .iter()
        .filter(|i| live.contains(&i.pod.as_str()))
        .collect()
}

fn restoring(i: &InstanceStatus) -> bool {
    i.worker_state() == Some(WorkerState::Restoring) || i.restore_remaining.unwrap_or(0) > 0
}

/// How many of a restoring worker's active tasks are still behind: those it reports a
/// positive state lag for, or all of them when it reports none.
fn tasks_restoring(i: &InstanceStatus) -> usize {
    let behind = i
        .active_tasks
        .iter()
        .filter(|t| i.state_lag.get(*t).is_some_and(|l| *l > 0))
        .count();
    if behind > 0 {
        behind
    } else {
        i.active_tasks.len()
    }
}

/// Restoration summed over the workers' own reports: records restored of the total
/// (restored + still to restore), the summed rate, the ETA at that rate, and the tasks
/// still restoring. `Restored` is False while any current worker restores.
pub fn restoration(instances: &[&InstanceStatus]) -> (Option<RestorationStatus>, Verdict) {
    if instances.is_empty() {
        return (
            None,
            Verdict::ok(reason::NO_STATE, "no worker has reported restoring state"),
        );
    }
    let restored: i64 = instances
        .iter()
        .map(|i| i.restored.unwrap_or(0).max(0))
        .sum();
    let remaining: i64 = instances
        .iter()
        .map(|i| i.restore_remaining.unwrap_or(0).max(0))
        .sum();
    let total = restored.saturating_add(remaining);
    let busy: Vec<&InstanceStatus> = instances.iter().copied().filter(|i| restoring(i)).collect();
    let rate: i64 = busy
        .iter()
        .map(|i| i.restore_rate.unwrap_or(0).max(0))
        .sum();
    let tasks: usize = busy.iter().map(|i| tasks_restoring(i)).sum();
    // Whole percent, rounded down, so "100%" only ever means done.
    let percent = if busy.is_empty() {
        100
    } else if total > 0 {
        (restored.saturating_mul(100) / total).min(99)
    } else {
        0
    };
    let eta = (rate > 0 && !busy.is_empty()).then(|| (remaining + rate - 1) / rate);
    let summary = RestorationStatus {
        restored_records: restored,
        total_records: total,
        percent: format!("{percent}%"),
        records_per_second: (rate > 0).then_some(rate),
        eta_seconds: eta,
        tasks_restoring: i32::try_from(tasks).unwrap_or(i32::MAX),
    };
    if busy.is_empty() {
        return (
            Some(summary),
            Verdict::ok(reason::RESTORED, "every active task's state is restored"),
        );
    }
    let rate_text = if rate > 0 {
        format!(", {rate} records/s")
    } else {
        String::new()
    };
    let eta_text = eta.map(|s| format!(", ETA {s}s")).unwrap_or_default();
    let pods = busy
        .iter()
        .map(|i| i.pod.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    (
        Some(summary),
        Verdict::waiting(
            reason::RESTORING,
            format!(
                "{tasks} tasks restoring on {pods}: {restored}/{total} records ({percent}%){rate_text}{eta_text}"
            ),
        ),
    )
}

/// The current workers that report but have not acknowledged `a`'s generation yet.
pub fn unacknowledged<'a>(
    a: &Assignment,
    instances: &[&'a InstanceStatus],
) -> Vec<&'a InstanceStatus> {
    instances
        .iter()
        .copied()
        .filter(|i| i.assignment_generation.is_none_or(|g| g < a.generation))
        .collect()
}

/// Whether the workers run what the operator assigned: no worker reports `Failed`, and
/// every current worker that reports acknowledged the published generation. A worker
/// that writes no status entry at all is not waited for (it cannot acknowledge).
pub fn tasks_verdict(
    assignment: Option<&Assignment>,
    instances: &[&InstanceStatus],
    replicas: i32,
) -> Verdict {
    let failed: Vec<String> = instances
        .iter()
        .filter(|i| i.worker_state() == Some(WorkerState::Failed))
        .map(|i| match &i.last_error {
            Some(e) => format!("{}: {e}", i.pod),
            None => format!("{}: no error reported", i.pod),
        })
        .collect();
    if !failed.is_empty() {
        return Verdict::waiting(
            reason::TASK_FAILED,
            format!("worker failed: {}", failed.join("; ")),
        );
    }
    if replicas == 0 {
        return Verdict::ok(reason::SCALED_TO_ZERO, "replicas is 0: no task runs");
    }
    let Some(a) = assignment.filter(|a| !a.tasks.is_empty()) else {
        return Verdict::waiting(
            reason::ASSIGNMENT_PENDING,
            "no task assignment yet: waiting for an eligible worker pod",
        );
    };
    let behind: Vec<String> = unacknowledged(a, instances)
        .iter()
        .map(|i| match i.assignment_generation {
            Some(g) => format!("{} (at {g})", i.pod),
            None => format!("{} (none yet)", i.pod),
        })
        .collect();
    if !behind.is_empty() {
        return Verdict::waiting(
            reason::ASSIGNMENT_PENDING,
            format!(
                "waiting for {} to acknowledge assignment generation {}",
                behind.join(", "),
                a.generation
            ),
        );
    }
    let pods = a.active_pods().len();
    Verdict::ok(
        reason::ASSIGNED,
        format!(
            "{} tasks run on {pods} pods under assignment generation {}",
            a.tasks.len(),
            a.generation
        ),
    )
}

/// All conditions plus the phase. `invalid` is a spec problem found by validation.
pub struct StatusInput<'a> {
    pub generation: Option<i64>,
    pub invalid: Option<Verdict>,
    pub topics: Verdict,
    /// From [`tasks_verdict`].
    pub tasks: Verdict,
    pub workload: Verdict,
    pub restored: Verdict,
    pub previous: &'a [Condition],
    pub now: Timestamp,
}

fn condition(
    input: &StatusInput<'_>,
    type_: ConditionType,
    status: impl Into<ConditionStatus>,
    reason: Reason,
    message: &str,
) -> Condition {
    let status = status.into();
    let last = find(input.previous, type_)
        .filter(|c| ConditionStatus::of(c) == status)
        .map(|c| c.last_transition_time.clone());
    Condition {
        type_: type_.as_str().into(),
        status: status.as_str().into(),
        reason: reason.as_str().into(),
        message: message.into(),
        observed_generation: input.generation,
        last_transition_time: last.unwrap_or(Time(input.now)),
    }
}

pub fn conditions(input: &StatusInput<'_>) -> (Vec<Condition>, Phase) {
    let details = [
        (ConditionType::TopicsReady, &input.topics),
        (ConditionType::TasksAssigned, &input.tasks),
        (ConditionType::WorkloadReady, &input.workload),
        (ConditionType::Restored, &input.restored),
    ];
    let blocking = blocking(input);
    let stalled = blocking.filter(|v| v.stalled);
    let mut out = Vec::new();
    out.push(match blocking {
        None => condition(
            input,
            ConditionType::Ready,
            true,
            reason::READY,
            "topics exist, every worker is ready and every task is restored",
        ),
        Some(v) => condition(input, ConditionType::Ready, false, v.reason, &v.message),
    });
    out.push(match (stalled, blocking) {
        (Some(_), _) | (None, None) => condition(
            input,
            ConditionType::Reconciling,
            false,
            reason::NOT_RECONCILING,
            "",
        ),
        (None, Some(v)) => condition(
            input,
            ConditionType::Reconciling,
            true,
            v.reason,
            &v.message,
        ),
    });
    out.push(match stalled {
        Some(v) => condition(input, ConditionType::Stalled, true, v.reason, &v.message),
        None => condition(
            input,
            ConditionType::Stalled,
            false,
            reason::NOT_STALLED,
            "",
        ),
    });
    for (t, v) in details {
        out.push(condition(input, t, v.ok, v.reason, &v.message));
    }
    (out, phase(input, blocking.is_none(), stalled.is_some()))
}

/// The verdict that keeps the app from Ready, if any: an invalid spec trumps everything,
/// then the first stalled detail, then the first failing one.
fn blocking<'a>(input: &'a StatusInput<'_>) -> Option<&'a Verdict> {
    // Tasks come before the workload: a failed task says more than "1/3 pods ready".
    // A restore explains a pending acknowledgement (a worker acknowledges once its new
    // tasks are restored) and pods not ready (readiness waits for the restore): then
    // Ready names the restore, ahead of those two.
    let explained = |v: &Verdict| {
        v.ok || [reason::ASSIGNMENT_PENDING, reason::WORKERS_NOT_READY].contains(&v.reason)
    };
    let restore_first = !input.restored.ok && explained(&input.tasks) && explained(&input.workload);
    let order: [&Verdict; 4] = if restore_first {
        [
            &input.topics,
            &input.restored,
            &input.tasks,
            &input.workload,
        ]
    } else {
        [
            &input.topics,
            &input.tasks,
            &input.workload,
            &input.restored,
        ]
    };
    input
        .invalid
        .as_ref()
        .or_else(|| order.iter().copied().find(|v| v.stalled))
        .or_else(|| order.iter().copied().find(|v| !v.ok))
}

/// The phase for humans, from the same verdicts.
fn phase(input: &StatusInput<'_>, ready: bool, stalled: bool) -> Phase {
    if stalled {
        Phase::Failed
    } else if ready {
        Phase::Running
    } else if input.tasks.reason == reason::TASK_FAILED {
        Phase::Degraded
    } else if !input.restored.ok {
        Phase::Restoring
    } else if input.tasks.reason == reason::ASSIGNMENT_PENDING
        && input.topics.ok
        && input.workload.ok
    {
        // Tasks are changing hands; their new owners start (and restore) them.
        Phase::Restoring
    } else if input.topics.ok && input.workload.reason == reason::WORKERS_NOT_READY {
        Phase::Degraded
    } else if input.workload.reason == reason::STATEFUL_SET_MISSING && !input.topics.ok {
        Phase::Pending
    } else {
        Phase::Provisioning
    }
}

#[cfg(test)]
mod tests;

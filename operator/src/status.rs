//! The StreamApp's status from facts already read: conditions (kstatus: Ready,
//! Reconciling, Stalled, plus TopicsReady, WorkloadReady, Restored), phase and the
//! restoration summary.
//!
//! Pure. Transition times are carried over from the previous status when a condition's
//! status did not change, so `lastTransitionTime` means what it says.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use oxbow_crds::{InstanceStatus, Phase, RestorationStatus, TopicStatus};

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
pub const TOPICS_READY: &str = "TopicsReady";
pub const WORKLOAD_READY: &str = "WorkloadReady";
pub const RESTORED: &str = "Restored";

/// A detail condition's verdict before it becomes a `Condition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub reason: String,
    pub message: String,
    /// Progress cannot be made without a change from outside (spec or cluster).
    pub stalled: bool,
}

impl Verdict {
    pub fn ok(reason: &str, message: impl Into<String>) -> Self {
        Self {
            ok: true,
            reason: reason.into(),
            message: message.into(),
            stalled: false,
        }
    }
    pub fn waiting(reason: &str, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason: reason.into(),
            message: message.into(),
            stalled: false,
        }
    }
    pub fn stalled(reason: &str, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason: reason.into(),
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
}

pub fn workload_verdict(w: &WorkloadFacts) -> Verdict {
    if !w.exists {
        return Verdict::waiting(
            "StatefulSetMissing",
            "the worker StatefulSet has not been created yet",
        );
    }
    if w.want_replicas == 0 {
        return Verdict::ok(
            "ScaledToZero",
            "replicas is 0: no worker runs, state is kept",
        );
    }
    if w.ready_replicas >= w.want_replicas && w.updated_replicas >= w.want_replicas && w.rolled_out
    {
        return Verdict::ok(
            "AllWorkersReady",
            format!("{}/{} worker pods ready", w.ready_replicas, w.want_replicas),
        );
    }
    let reason = if !w.rolled_out || w.updated_replicas < w.want_replicas {
        "RollingUpdate"
    } else {
        "WorkersNotReady"
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
            "ConfigDrift",
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
            "TopicsProvisioning",
            format!("creating or updating topics: {}", pending.join(", ")),
        );
    }
    Verdict::ok(
        "TopicsReady",
        format!(
            "{} topics exist with the wanted partitions and config",
            topics.len()
        ),
    )
}

/// The workers' reports from pods that should exist: a pod removed by scaling in may
/// have left its last entry behind, and a dead pod's report must not hold Ready back.
pub fn current_instances<'a>(
    app_name: &str,
    replicas: i32,
    instances: &'a [InstanceStatus],
) -> Vec<&'a InstanceStatus> {
    instances
        .iter()
        .filter(|i| {
            i.pod
                .strip_prefix(app_name)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|ordinal| ordinal.parse::<i32>().ok())
                .is_some_and(|n| n < replicas)
        })
        .collect()
}

/// Restoration summed over the workers' own reports.
pub fn restoration(instances: &[&InstanceStatus]) -> (Option<RestorationStatus>, Verdict) {
    let restoring: Vec<&InstanceStatus> = instances
        .iter()
        .copied()
        .filter(|i| i.state.as_deref() == Some("Restoring") || i.restore_remaining.unwrap_or(0) > 0)
        .collect();
    if instances.is_empty() {
        return (
            None,
            Verdict::ok("NoState", "no worker has reported restoring state"),
        );
    }
    let remaining: i64 = restoring
        .iter()
        .map(|i| i.restore_remaining.unwrap_or(0))
        .sum();
    let rate: i64 = restoring.iter().map(|i| i.restore_rate.unwrap_or(0)).sum();
    if restoring.is_empty() {
        let summary = RestorationStatus {
            percent: "100%".into(),
            ..Default::default()
        };
        return (
            Some(summary),
            Verdict::ok("Restored", "every task's state is restored"),
        );
    }
    let eta = (rate > 0).then(|| remaining / rate.max(1));
    let summary = RestorationStatus {
        restored_records: 0,
        total_records: remaining,
        percent: "0%".into(),
        records_per_second: (rate > 0).then_some(rate),
        eta_seconds: eta,
        tasks_restoring: restoring.len() as i32,
    };
    let eta_text = eta.map(|s| format!(", ETA {s}s")).unwrap_or_default();
    (
        Some(summary),
        Verdict::waiting(
            "Restoring",
            format!(
                "{} pods restoring, {remaining} records to go{eta_text}",
                restoring.len()
            ),
        ),
    )
}

/// All conditions plus the phase. `invalid` is a spec problem found by validation.
pub struct StatusInput<'a> {
    pub generation: Option<i64>,
    pub invalid: Option<Verdict>,
    pub topics: Verdict,
    pub workload: Verdict,
    pub restored: Verdict,
    pub previous: &'a [Condition],
    pub now: Timestamp,
}

fn condition(
    input: &StatusInput<'_>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> Condition {
    let status_str = if status { "True" } else { "False" };
    let last = input
        .previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status_str)
        .map(|c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: status_str.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: input.generation,
        last_transition_time: last.unwrap_or(Time(input.now)),
    }
}

pub fn conditions(input: &StatusInput<'_>) -> (Vec<Condition>, Phase) {
    // The first failing detail explains Ready=False; an invalid spec trumps everything.
    let details = [
        (TOPICS_READY, &input.topics),
        (WORKLOAD_READY, &input.workload),
        (RESTORED, &input.restored),
    ];
    let blocking = input
        .invalid
        .as_ref()
        .or_else(|| details.iter().map(|(_, v)| *v).find(|v| v.stalled))
        .or_else(|| details.iter().map(|(_, v)| *v).find(|v| !v.ok));
    let ready = blocking.is_none();
    let stalled = blocking.filter(|v| v.stalled);
    let mut out = Vec::new();
    match blocking {
        None => out.push(condition(
            input,
            READY,
            true,
            "Ready",
            "topics exist, every worker is ready and every task is restored",
        )),
        Some(v) => out.push(condition(input, READY, false, &v.reason, &v.message)),
    }
    match (stalled, blocking) {
        (Some(_), _) | (None, None) => {
            out.push(condition(input, RECONCILING, false, "NotReconciling", ""))
        }
        (None, Some(v)) => out.push(condition(input, RECONCILING, true, &v.reason, &v.message)),
    }
    match stalled {
        Some(v) => out.push(condition(input, STALLED, true, &v.reason, &v.message)),
        None => out.push(condition(input, STALLED, false, "NotStalled", "")),
    }
    for (t, v) in details {
        out.push(condition(input, t, v.ok, &v.reason, &v.message));
    }
    let phase = if stalled.is_some() {
        Phase::Failed
    } else if ready {
        Phase::Running
    } else if !input.restored.ok {
        Phase::Restoring
    } else if input.topics.ok && input.workload.reason == "WorkersNotReady" {
        Phase::Degraded
    } else if input.workload.reason == "StatefulSetMissing" && !input.topics.ok {
        Phase::Pending
    } else {
        Phase::Provisioning
    };
    (out, phase)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(prev: &'a [Condition], topics: Verdict, workload: Verdict) -> StatusInput<'a> {
        StatusInput {
            generation: Some(3),
            invalid: None,
            topics,
            workload,
            restored: Verdict::ok("Restored", ""),
            previous: prev,
            now: Timestamp::from_second(1_800_000_000).expect("ts"),
        }
    }

    fn get<'a>(cs: &'a [Condition], t: &str) -> &'a Condition {
        cs.iter().find(|c| c.type_ == t).expect("condition present")
    }

    #[test]
    fn ready_only_when_every_detail_is_ready() {
        let (cs, phase) = conditions(&input(
            &[],
            Verdict::ok("TopicsReady", ""),
            Verdict::ok("AllWorkersReady", ""),
        ));
        assert_eq!(get(&cs, READY).status, "True");
        assert_eq!(get(&cs, RECONCILING).status, "False");
        assert_eq!(get(&cs, STALLED).status, "False");
        assert_eq!(phase, Phase::Running);
        assert!(cs.iter().all(|c| c.observed_generation == Some(3)));
    }

    #[test]
    fn missing_pods_keep_ready_false_and_reconciling_true() {
        let w = workload_verdict(&WorkloadFacts {
            exists: true,
            want_replicas: 3,
            replicas: 3,
            ready_replicas: 1,
            updated_replicas: 3,
            rolled_out: true,
        });
        let (cs, phase) = conditions(&input(&[], Verdict::ok("TopicsReady", ""), w));
        assert_eq!(get(&cs, READY).status, "False");
        assert_eq!(get(&cs, READY).reason, "WorkersNotReady");
        assert_eq!(
            get(&cs, READY).message,
            "1/3 worker pods ready, 3/3 updated to the current spec"
        );
        assert_eq!(get(&cs, RECONCILING).status, "True");
        assert_eq!(phase, Phase::Degraded);
    }

    #[test]
    fn drift_stalls_with_the_topic_and_key_in_the_message() {
        let t = topics_verdict(&[TopicStatus {
            name: "a-s-changelog".into(),
            drift: vec!["min.cleanable.dirty.ratio: 0.5 (want 0.1)".into()],
            ..Default::default()
        }]);
        let (cs, phase) = conditions(&input(&[], t, Verdict::ok("AllWorkersReady", "")));
        let s = get(&cs, STALLED);
        assert_eq!(
            (s.status.as_str(), s.reason.as_str()),
            ("True", "ConfigDrift")
        );
        assert!(
            s.message
                .contains("a-s-changelog: min.cleanable.dirty.ratio: 0.5 (want 0.1)"),
            "{}",
            s.message
        );
        assert_eq!(get(&cs, RECONCILING).status, "False");
        assert_eq!(phase, Phase::Failed);
    }

    #[test]
    fn reports_of_pods_removed_by_scaling_in_are_ignored() {
        let report = |pod: &str, remaining| InstanceStatus {
            pod: pod.into(),
            state: Some("Restoring".into()),
            restore_remaining: Some(remaining),
            ..Default::default()
        };
        let all = vec![
            report("app-0", 10),
            report("app-2", 99),
            report("other-0", 5),
        ];
        let current = current_instances("app", 2, &all);
        assert_eq!(
            current.iter().map(|i| i.pod.as_str()).collect::<Vec<_>>(),
            vec!["app-0"]
        );
        let (summary, verdict) = restoration(&current);
        assert_eq!(summary.map(|s| s.total_records), Some(10));
        assert_eq!(verdict.reason, "Restoring");
    }

    #[test]
    fn transition_time_is_kept_while_the_status_is_unchanged() {
        let old = Time(Timestamp::from_second(1_700_000_000).expect("ts"));
        let prev = vec![Condition {
            type_: READY.into(),
            status: "False".into(),
            reason: "X".into(),
            message: "".into(),
            observed_generation: Some(2),
            last_transition_time: old.clone(),
        }];
        let (cs, _) = conditions(&input(
            &prev,
            Verdict::waiting("TopicsProvisioning", ""),
            Verdict::ok("AllWorkersReady", ""),
        ));
        assert_eq!(
            get(&cs, READY).last_transition_time,
            old,
            "still False: time kept"
        );
        let (cs, _) = conditions(&input(
            &prev,
            Verdict::ok("TopicsReady", ""),
            Verdict::ok("AllWorkersReady", ""),
        ));
        assert_ne!(
            get(&cs, READY).last_transition_time,
            old,
            "flipped to True: new time"
        );
    }

    #[test]
    fn an_invalid_spec_stalls_everything() {
        let mut i = input(
            &[],
            Verdict::ok("TopicsReady", ""),
            Verdict::ok("AllWorkersReady", ""),
        );
        i.invalid = Some(Verdict::stalled(
            "InvalidExpression",
            "spec.steps[0].filter.cel: …",
        ));
        let (cs, phase) = conditions(&i);
        assert_eq!(get(&cs, READY).reason, "InvalidExpression");
        assert_eq!(get(&cs, STALLED).status, "True");
        assert_eq!(phase, Phase::Failed);
    }
}

//! Task placement, the operator's side: what it knows about each worker pod (fed to the
//! pure [`assignment::next`]), how far the StatefulSet may shrink during a scale-in, and
//! reading back the published assignment.
//!
//! Pure: the caller reads the pods, the ConfigMap and the clock, and applies the result.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use oxbow_crds::assignment::{self, Assignment, CONFIG_MAP_KEY, Params, PodFacts};
use oxbow_crds::{InstanceStatus, TaskId};

use crate::status::ConditionStatus;

/// Operator-wide placement settings (flags of `oxbow-operator run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementConfig {
    /// How long a pod that is not Ready keeps its tasks while it still reports (or was
    /// just created). After that its tasks fail over to the freshest standby.
    pub failover_timeout: Duration,
    /// A warming copy takes an active over once it is at most this many changelog
    /// records behind.
    pub warmup_max_lag: i64,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            failover_timeout: Duration::from_secs(30),
            warmup_max_lag: 1000,
        }
    }
}

/// One worker pod as read from the API, reduced to what placement needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodObservation {
    pub name: String,
    pub ordinal: i32,
    /// Being deleted (deletionTimestamp set) or finished (phase Failed/Succeeded): it
    /// will not run tasks again.
    pub terminating: bool,
    pub ready: bool,
    pub created: Option<Timestamp>,
}

/// The ordinal of StatefulSet pod `pod` of `sts` (`<sts>-<n>`).
pub fn ordinal(sts: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(sts)?
        .strip_prefix('-')?
        .parse::<i32>()
        .ok()
        .filter(|n| *n >= 0)
}

/// A pod's phase, as the API defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString)]
enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

/// The pod condition the kubelet sets once every container is ready.
const POD_READY: &str = "Ready";

/// `None` for a pod that is not one of the StatefulSet's (its name has no ordinal).
pub fn observe(sts: &str, pod: &Pod) -> Option<PodObservation> {
    let name = pod.metadata.name.clone()?;
    let ordinal = ordinal(sts, &name)?;
    let status = pod.status.as_ref();
    let finished = status
        .and_then(|s| s.phase.as_deref()?.parse().ok())
        .is_some_and(|p| matches!(p, PodPhase::Failed | PodPhase::Succeeded));
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == POD_READY && ConditionStatus::parse(&c.status) == ConditionStatus::True
            })
        });
    Some(PodObservation {
        name,
        ordinal,
        terminating: pod.metadata.deletion_timestamp.is_some() || finished,
        ready,
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
    })
}

fn within(now: Timestamp, then: Timestamp, timeout: Duration) -> bool {
    let age_ms = now.as_millisecond().saturating_sub(then.as_millisecond());
    age_ms <= i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

/// The facts the assignment is computed from, one per existing pod, in ordinal order.
///
/// A pod is eligible when it is not terminating and it is Ready, or its status entry
/// was updated within the failover timeout (it restores, or briefly failed a probe), or
/// it was created less than the failover timeout ago (it has not reported yet). A pod
/// that does not exist has no facts at all, so its tasks fail over at once. A pod at or
/// above `replicas` is draining.
pub fn pod_facts(
    pods: &[PodObservation],
    instances: &[InstanceStatus],
    replicas: i32,
    now: Timestamp,
    failover_timeout: Duration,
) -> Vec<PodFacts> {
    let mut pods: Vec<&PodObservation> = pods.iter().collect();
    pods.sort_by_key(|p| p.ordinal);
    pods.into_iter()
        .map(|p| {
            let entry = instances.iter().find(|i| i.pod == p.name);
            let reported_lately = entry
                .and_then(|e| e.updated_at.as_deref())
                .and_then(|t| t.parse::<Timestamp>().ok())
                .is_some_and(|t| within(now, t, failover_timeout));
            let young = p.created.is_some_and(|t| within(now, t, failover_timeout));
            // A pod that reports is judged by its reports: a wedged engine stops them
            // while its /readyz may still pass, and its tasks must fail over. Readiness
            // only stands in for a pod that has never reported.
            let alive = match entry {
                Some(_) => reported_lately,
                None => p.ready,
            };
            PodFacts {
                pod: p.name.clone(),
                eligible: !p.terminating && (alive || young),
                draining: p.ordinal >= replicas,
                acknowledged: entry.and_then(|e| e.assignment_generation),
                // Keys the worker wrote; one that is not a task number is ignored.
                state_lag: entry
                    .map(|e| {
                        e.state_lag
                            .iter()
                            .filter_map(|(k, v)| Some((k.parse::<TaskId>().ok()?, *v)))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// The assignment ConfigMap holds something that is not an assignment (edited by hand).
#[derive(Debug, thiserror::Error)]
#[error("{CONFIG_MAP_KEY} is not an assignment: {0}")]
pub struct UnreadableAssignment(#[source] serde_json::Error);

/// The assignment in the ConfigMap. `Ok(None)`: there is none yet; `Err`: it is there
/// but not an assignment, with the parser's reason.
pub fn published(cm: Option<&ConfigMap>) -> Result<Option<Assignment>, UnreadableAssignment> {
    let Some(text) = cm.and_then(|c| c.data.as_ref()?.get(CONFIG_MAP_KEY)) else {
        return Ok(None);
    };
    serde_json::from_str(text)
        .map(Some)
        .map_err(UnreadableAssignment)
}

/// The outcome of one placement round.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub assignment: Assignment,
    /// Differs from what the ConfigMap holds: apply it.
    pub publish: bool,
    /// Another round with the same facts would change it again (a warm-up or balance
    /// step is under way): look again soon.
    pub settled: bool,
}

/// The next assignment and whether to publish it. Without a readable previous one
/// (none yet, deleted or garbled), placement starts over from the pods' reported state,
/// and the generation still grows past every generation a worker acknowledged.
pub fn plan(
    previous: Option<&Assignment>,
    facts: &[PodFacts],
    instances: &[InstanceStatus],
    params: Params,
) -> Plan {
    let floor;
    let prev = match previous {
        Some(a) => Some(a),
        None => {
            let acked = instances
                .iter()
                .filter_map(|i| i.assignment_generation)
                .max();
            floor = acked.map(|generation| Assignment {
                generation,
                ..Default::default()
            });
            floor.as_ref()
        }
    };
    let assignment = assignment::next(prev, facts, params);
    let again = assignment::next(Some(&assignment), facts, params);
    Plan {
        publish: previous != Some(&assignment),
        settled: again == assignment,
        assignment,
    }
}

/// The StatefulSet's replicas: `spec.replicas`, or more while a pod above it still runs
/// active tasks, so a scale-in removes a pod only after its tasks moved (warm-up first)
/// and it released them. A pod that still *reports* actives counts only while it is
/// eligible: a dead pod cannot hold the scale-in. At 0 replicas everything stops.
pub fn stateful_set_replicas(
    spec_replicas: i32,
    sts: &str,
    assignment: Option<&Assignment>,
    facts: &[PodFacts],
    instances: &[InstanceStatus],
) -> i32 {
    if spec_replicas <= 0 {
        return 0;
    }
    let in_assignment = assignment
        .map(|a| a.active_pods().into_iter().collect::<Vec<_>>())
        .unwrap_or_default();
    let still_running = instances
        .iter()
        .filter(|i| !i.active_tasks.is_empty())
        .filter(|i| facts.iter().any(|f| f.pod == i.pod && f.eligible))
        .map(|i| i.pod.as_str());
    in_assignment
        .into_iter()
        .chain(still_running)
        .filter_map(|pod| ordinal(sts, pod))
        .map(|n| n + 1)
        .fold(spec_replicas, i32::max)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use oxbow_crds::assignment::TaskPlacement;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("ts")
    }

    fn obs(name: &str, ordinal: i32) -> PodObservation {
        PodObservation {
            name: name.into(),
            ordinal,
            terminating: false,
            ready: true,
            created: Some(ts(-3600)),
        }
    }

    fn entry(pod: &str, updated: Option<Timestamp>) -> InstanceStatus {
        InstanceStatus {
            pod: pod.into(),
            updated_at: updated.map(|t| t.to_string()),
            ..Default::default()
        }
    }

    const T30: Duration = Duration::from_secs(30);

    #[test]
    fn ordinals_come_from_the_statefulset_pod_names_only() {
        assert_eq!(ordinal("app", "app-3"), Some(3));
        assert_eq!(ordinal("app", "app-x"), None);
        assert_eq!(ordinal("app", "app2-3"), None);
        assert_eq!(ordinal("app", "other-0"), None);
    }

    #[test]
    fn a_ready_pod_is_eligible_and_one_at_or_above_replicas_drains() {
        let f = pod_facts(&[obs("app-2", 2), obs("app-0", 0)], &[], 1, ts(0), T30);
        assert_eq!(
            f.iter().map(|f| f.pod.as_str()).collect::<Vec<_>>(),
            ["app-0", "app-2"],
            "in ordinal order"
        );
        assert!(f.iter().all(|f| f.eligible));
        assert!(!f[0].draining);
        assert!(f[1].draining);
    }

    #[test]
    fn an_unready_pod_stays_eligible_while_it_reports_or_is_new() {
        let mut p = obs("app-0", 0);
        p.ready = false;
        let fresh = [entry("app-0", Some(ts(-10)))];
        let stale = [entry("app-0", Some(ts(-31)))];
        assert!(pod_facts(&[p.clone()], &fresh, 1, ts(0), T30)[0].eligible);
        assert!(
            !pod_facts(&[p.clone()], &stale, 1, ts(0), T30)[0].eligible,
            "silent for longer than the failover timeout"
        );
        assert!(
            !pod_facts(&[p.clone()], &[], 1, ts(0), T30)[0].eligible,
            "never reported and old"
        );
        p.created = Some(ts(-5));
        assert!(
            pod_facts(&[p], &[], 1, ts(0), T30)[0].eligible,
            "just created: it has not had time to report"
        );
    }

    #[test]
    fn a_ready_pod_whose_reports_stopped_is_not_eligible() {
        // A wedged engine stops its reports while /readyz still passes.
        let p = obs("app-0", 0);
        assert!(p.ready);
        let stale = [entry("app-0", Some(ts(-31)))];
        assert!(!pod_facts(std::slice::from_ref(&p), &stale, 1, ts(0), T30)[0].eligible);
        assert!(
            pod_facts(&[p], &[], 1, ts(0), T30)[0].eligible,
            "a ready pod that never reported is judged by its readiness"
        );
    }

    #[test]
    fn a_terminating_pod_is_never_eligible() {
        let mut p = obs("app-0", 0);
        p.terminating = true;
        let fresh = [entry("app-0", Some(ts(0)))];
        assert!(!pod_facts(&[p], &fresh, 1, ts(0), T30)[0].eligible);
    }

    #[test]
    fn state_lag_comes_from_the_pods_own_entry_and_ignores_keys_that_are_not_tasks() {
        let mut e = entry("app-0", Some(ts(0)));
        e.state_lag = BTreeMap::from([("3".into(), 40), ("x".into(), 1)]);
        let other = InstanceStatus {
            pod: "app-1".into(),
            state_lag: BTreeMap::from([("5".into(), 7)]),
            ..Default::default()
        };
        let f = pod_facts(&[obs("app-0", 0)], &[e, other], 1, ts(0), T30);
        assert_eq!(f[0].state_lag, BTreeMap::from([(TaskId::new(0, 3), 40)]));
    }

    #[test]
    fn observing_a_pod_reads_readiness_deletion_and_phase() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app-1", "creationTimestamp": "2027-01-15T08:00:00Z"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("pod");
        let o = observe("app", &pod).expect("one of ours");
        assert_eq!((o.ordinal, o.ready, o.terminating), (1, true, false));
        let mut gone = pod.clone();
        gone.metadata.deletion_timestamp = pod.metadata.creation_timestamp.clone();
        assert!(observe("app", &gone).expect("ours").terminating);
        let failed: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app-0"}, "status": {"phase": "Failed"},
        }))
        .expect("pod");
        assert!(observe("app", &failed).expect("ours").terminating);
    }

    fn placed(actives: &[&str]) -> Assignment {
        Assignment {
            generation: 4,
            tasks: actives
                .iter()
                .enumerate()
                .map(|(t, a)| {
                    (
                        TaskId::new(0, t as u32),
                        TaskPlacement {
                            active: a.to_string(),
                            standbys: vec![],
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            pods: vec![],
            tracks_previous: true,
        }
    }

    fn up(names: &[&str]) -> Vec<PodFacts> {
        names
            .iter()
            .map(|n| PodFacts {
                pod: n.to_string(),
                eligible: true,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn the_statefulset_keeps_a_draining_pod_while_it_is_still_an_active() {
        let a = placed(&["app-0", "app-3", "app-1"]);
        let facts = up(&["app-0", "app-1", "app-2", "app-3"]);
        assert_eq!(
            stateful_set_replicas(2, "app", Some(&a), &facts, &[]),
            4,
            "app-3 still runs a task"
        );
        let a = placed(&["app-0", "app-1", "app-1"]);
        assert_eq!(stateful_set_replicas(2, "app", Some(&a), &facts, &[]), 2);
        assert_eq!(
            stateful_set_replicas(3, "app", Some(&a), &facts, &[]),
            3,
            "never below spec.replicas"
        );
    }

    #[test]
    fn the_statefulset_keeps_a_pod_until_it_released_its_actives() {
        let a = placed(&["app-0", "app-1"]);
        let mut facts = up(&["app-0", "app-1", "app-2"]);
        let reports = [InstanceStatus {
            pod: "app-2".into(),
            active_tasks: vec!["0_1".into()],
            ..Default::default()
        }];
        assert_eq!(
            stateful_set_replicas(2, "app", Some(&a), &facts, &reports),
            3,
            "moved in the assignment, but app-2 has not let go yet"
        );
        facts[2].eligible = false;
        assert_eq!(
            stateful_set_replicas(2, "app", Some(&a), &facts, &reports),
            2,
            "a dead pod's last report does not hold the scale-in"
        );
    }

    #[test]
    fn scaling_to_zero_stops_every_pod_at_once() {
        let a = placed(&["app-0", "app-1"]);
        let facts = up(&["app-0", "app-1"]);
        assert_eq!(stateful_set_replicas(0, "app", Some(&a), &facts, &[]), 0);
    }

    #[test]
    fn a_garbled_assignment_is_reported_and_a_missing_one_is_none() {
        assert!(matches!(published(None), Ok(None)));
        let cm = |v: &str| ConfigMap {
            data: Some(BTreeMap::from([(
                CONFIG_MAP_KEY.to_string(),
                v.to_string(),
            )])),
            ..Default::default()
        };
        let garbled = published(Some(&cm("{"))).expect_err("not an assignment");
        assert!(
            std::error::Error::source(&garbled).is_some(),
            "the parser's error is kept as the cause: {garbled}"
        );
        let a = placed(&["app-0"]);
        let text = serde_json::to_string(&a).expect("json");
        assert_eq!(published(Some(&cm(&text))).ok(), Some(Some(a)));
    }

    #[test]
    fn without_a_previous_assignment_the_generation_still_grows_past_every_acknowledged_one() {
        let facts = up(&["app-0", "app-1"]);
        let acked = [InstanceStatus {
            pod: "app-0".into(),
            assignment_generation: Some(9),
            ..Default::default()
        }];
        let p = Params {
            tasks: 4,
            stages: 1,
            standby_replicas: 1,
            warmup_max_lag: 0,
        };
        let plan = plan(None, &facts, &acked, p);
        assert_eq!(plan.assignment.generation, 10);
        assert!(plan.publish);
        assert!(plan.settled);
    }

    #[test]
    fn an_unchanged_assignment_is_not_published_again() {
        let facts = up(&["app-0", "app-1"]);
        let p = Params {
            tasks: 4,
            stages: 1,
            standby_replicas: 1,
            warmup_max_lag: 0,
        };
        let first = plan(None, &facts, &[], p).assignment;
        let again = plan(Some(&first), &facts, &[], p);
        assert!(!again.publish);
        assert!(again.settled);
        assert_eq!(again.assignment, first);
    }
}

//! Which worker runs which task. Pure.
//!
//! Standalone mode (no operator-published assignment): instance `n` of `m` runs the
//! tasks `t` with `t % m == n`. Every task has exactly one owner as long as every
//! instance is started with the same `m`; the operator's sticky assignment with standbys
//! replaces this when it publishes one.
//!
//! [`next`] computes the operator's assignment in five phases, one file each, every
//! one a pure function of the facts ([`view::View`]) and the placement so far
//! ([`view::Plan`]): `failover`, `drain`, `balance`, `standbys`, `generation`.

mod balance;
mod drain;
mod failover;
mod generation;
mod standbys;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
mod view;

use std::collections::BTreeMap;

use crate::names::TaskId;
use view::View;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    #[error("instance {instance} is out of range: instances are numbered 0..{instances}")]
    InstanceOutOfRange { instance: u32, instances: u32 },
    #[error("instances must be at least 1")]
    NoInstances,
}

/// The tasks instance `instance` of `instances` runs in standalone mode.
pub fn standalone(
    tasks: &[TaskId],
    instance: u32,
    instances: u32,
) -> Result<Vec<TaskId>, AssignmentError> {
    if instances == 0 {
        return Err(AssignmentError::NoInstances);
    }
    if instance >= instances {
        return Err(AssignmentError::InstanceOutOfRange {
            instance,
            instances,
        });
    }
    Ok(tasks
        .iter()
        .filter(|t| t.partition % instances == instance)
        .copied()
        .collect())
}

/// What the operator knows about one worker pod when it computes an assignment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    pub pod: String,
    /// Ready, or not ready for less than the failover timeout: it keeps its tasks.
    pub eligible: bool,
    /// Going away (its ordinal is at or above `spec.replicas` during a scale-in): it gets
    /// no new active and no standby, and hands its actives over as soon as a receiving
    /// pod's copy is warm. It keeps running them until then, so nothing restores cold.
    pub draining: bool,
    /// Tasks whose state this pod holds (active or standby), with how far its copy is
    /// behind the changelog end (0 = caught up).
    pub state_lag: BTreeMap<TaskId, i64>,
    /// The assignment generation the pod acknowledged running. Until it acknowledged
    /// the current one, a task it does not report yet is unknown, not cold.
    pub acknowledged: Option<i64>,
}

/// One task's placement.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TaskPlacement {
    pub active: String,
    /// Standby pods, fed from the changelog; a pod warming up to take the active over is
    /// one of them.
    pub standbys: Vec<String>,
    /// Pods that were the task's active in an earlier generation and may still run it:
    /// the new active waits for these, and only these, to let go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<PreviousActive>,
}

/// A pod that ran a task before it moved, until the pod acknowledges `until`, the first
/// generation that gave the task to another pod (it has let go by then).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PreviousActive {
    pub pod: String,
    pub until: i64,
}

/// The key of the assignment ConfigMap (`<name>-assignment`) holding the JSON of
/// [`Assignment`].
pub const CONFIG_MAP_KEY: &str = "assignment.json";

/// The published assignment.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    /// Grows by one with every change (of `tasks` or `pods`); workers acknowledge the
    /// generation they run.
    pub generation: i64,
    pub tasks: BTreeMap<TaskId, TaskPlacement>,
    /// The worker pods that exist, as the operator saw them when it published. A new
    /// active starts a task only when no *listed* pod still reports it as active: a pod
    /// that is gone cannot release what it held, and is not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    /// Tasks list their previous actives ([`TaskPlacement::previous`]). Without it (an
    /// assignment from an older operator) a pod that has not acknowledged the current
    /// generation holds back every new active.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tracks_previous: bool,
}

impl Assignment {
    /// The pods running at least one active task.
    pub fn active_pods(&self) -> std::collections::BTreeSet<&str> {
        self.tasks.values().map(|t| t.active.as_str()).collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Tasks per stage (the source partition count).
    pub tasks: u32,
    /// Sub-topologies: every stage has `tasks` tasks.
    pub stages: u32,
    pub standby_replicas: u32,
    /// A warming standby takes the active over once its lag is at most this.
    pub warmup_max_lag: i64,
}

/// The next assignment from the previous one and the pods' facts. Pure and
/// deterministic; fed back with unchanged facts it settles within a few rounds and then
/// returns itself with the same generation (no flapping).
///
/// - **Failover**: a task whose active pod is not eligible moves at once to the
///   non-draining eligible pod with the freshest copy of its state (lowest lag), else
///   the least loaded.
/// - **Sticky**: otherwise a task stays on its active pod.
/// - **Drain**: a task on a draining pod moves to a non-draining pod (the freshest copy,
///   preferring its standbys, else the least loaded) once that pod's copy is warm; until
///   then the receiver holds it as a warming standby and the draining pod keeps running
///   it. Draining pods get nothing new. When every eligible pod drains, they keep what
///   they have: someone has to run the tasks.
/// - **Balance with warm-up**: a pod with more than its share of actives gives tasks to
///   pods with less, but a task moves only once the receiving pod's copy is within
///   `warmup_max_lag`; until then the receiver holds it as a (warming) standby.
/// - **Warm**: a receiver is warm when its copy is within `warmup_max_lag`, or when the
///   giving pod reports no copy of the task at all (it has nothing to lose: the task
///   restores from the changelog wherever it runs, e.g. a worker that does not report
///   state).
/// - **Standbys**: `standby_replicas` per task on distinct eligible non-draining pods
///   other than the active, kept where they are when possible, otherwise on the pods
///   with the freshest copy, then the least loaded.
pub fn next(prev: Option<&Assignment>, pods: &[PodFacts], p: Params) -> Assignment {
    let Some(view) = View::new(prev, pods, p) else {
        // Nobody can run anything: keep the last word rather than publish an empty one.
        return prev.cloned().unwrap_or_default();
    };
    // 1. Actives: sticky, with failover; draining pods keep theirs for now.
    let mut plan = failover::actives(&view);
    // 2. Drain: each task of a draining pod goes to a staying pod, once warm.
    drain::hand_off(&view, &mut plan);
    // 3. Balance, the drain's receivers first.
    balance::balance(&view, &mut plan);
    // 4. Standbys, on staying pods only.
    let tasks = standbys::place(&view, &plan);
    // 5. A new generation if anything changed, with each task's previous actives.
    generation::publish(prev, tasks, pods)
}

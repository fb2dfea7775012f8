//! What every phase of [`next`](super::next) reads and what it works on: the pods'
//! facts seen from the rules ([`View`]) and the placement being worked out ([`Plan`]).
//!
//! Owns the questions the rules ask of the facts (who may run a task, how fresh a
//! copy is, whether a move would restore cold). Must not decide a placement: that is
//! the phases' job.

use std::collections::BTreeMap;

use super::{Assignment, Params, PodFacts, TaskPlacement};
use crate::names::TaskId;

/// The facts as the phases read them.
pub(super) struct View<'a> {
    pub prev: Option<&'a Assignment>,
    /// Ready, or not ready for less than the failover timeout.
    pub eligible: Vec<&'a PodFacts>,
    /// Where tasks may go: the eligible pods that stay. If every eligible pod drains,
    /// they are all targets, because the tasks must run somewhere.
    pub targets: Vec<&'a PodFacts>,
    pub p: Params,
    /// The previous assignment's generation (0 without one).
    pub generation: i64,
}

impl<'a> View<'a> {
    /// `None` when no pod is eligible: nobody can run anything.
    pub fn new(prev: Option<&'a Assignment>, pods: &'a [PodFacts], p: Params) -> Option<Self> {
        let eligible: Vec<&PodFacts> = pods.iter().filter(|f| f.eligible).collect();
        if eligible.is_empty() {
            return None;
        }
        let staying: Vec<&PodFacts> = eligible.iter().copied().filter(|f| !f.draining).collect();
        let targets = if staying.is_empty() {
            eligible.clone()
        } else {
            staying
        };
        Some(Self {
            prev,
            eligible,
            targets,
            p,
            generation: prev.map_or(0, |a| a.generation),
        })
    }

    pub fn is_eligible(&self, pod: &str) -> bool {
        self.eligible.iter().any(|f| f.pod == pod)
    }

    pub fn is_target(&self, pod: &str) -> bool {
        self.targets.iter().any(|f| f.pod == pod)
    }

    /// How far `pod`'s copy of `t` is behind, if it is eligible and holds one.
    pub fn lag_on(&self, pod: &str, t: TaskId) -> Option<i64> {
        self.eligible
            .iter()
            .find(|f| f.pod == pod)
            .and_then(|f| f.state_lag.get(&t).copied())
    }

    /// May `receiver` take task `t` over from `giver` without a cold restore? Yes when
    /// its copy is within the warm-up lag, or when the giver holds no copy at all (it
    /// has nothing to lose).
    pub fn warm(&self, giver: &str, receiver: &str, t: TaskId) -> bool {
        self.lag_on(giver, t).is_none()
            || self
                .lag_on(receiver, t)
                .is_some_and(|l| l <= self.p.warmup_max_lag)
    }

    /// Task `t`'s placement in the previous assignment.
    pub fn prev_of(&self, t: TaskId) -> Option<&'a TaskPlacement> {
        self.prev.and_then(|a| a.tasks.get(&t))
    }

    /// Every task of the app, in order.
    pub fn tasks(&self) -> impl Iterator<Item = TaskId> + use<> {
        TaskId::all(self.p.stages, self.p.tasks)
    }
}

/// The placement being worked out, handed from phase to phase.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Each task's active pod.
    pub active: BTreeMap<TaskId, String>,
    /// Actives per target pod, counting the tasks a drain or balance is warming up.
    pub load: BTreeMap<String, usize>,
    /// Tasks whose receiver is still warming up its copy: it holds a standby meanwhile.
    pub warming: BTreeMap<TaskId, String>,
    /// Tasks the drain hands over, with their (draining) giver.
    pub drained: BTreeMap<TaskId, String>,
    /// Tasks still on a draining pod, for the drain phase.
    pub draining: Vec<TaskId>,
}

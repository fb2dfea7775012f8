//! Small fact and assignment builders for the phases' tests (stage 0 only).

use std::collections::BTreeMap;

use super::{Assignment, Params, PodFacts, TaskPlacement};
use crate::names::TaskId;

/// One stage of `tasks` tasks, one standby each, warm within 100 records.
pub(super) fn params(tasks: u32) -> Params {
    Params {
        tasks,
        stages: 1,
        standby_replicas: 1,
        warmup_max_lag: 100,
    }
}

/// An eligible, staying pod holding copies of stage-0 tasks: (partition, lag).
pub(super) fn facts(pod: &str, lags: &[(u32, i64)]) -> PodFacts {
    PodFacts {
        pod: pod.into(),
        eligible: true,
        draining: false,
        state_lag: lags.iter().map(|(p, l)| (TaskId::new(0, *p), *l)).collect(),
        acknowledged: None,
    }
}

/// An assignment at `generation` whose task `i` (stage 0) runs on `placements[i].0`
/// with standbys `placements[i].1`.
pub(super) fn assignment(generation: i64, placements: &[(&str, &[&str])]) -> Assignment {
    let tasks: BTreeMap<TaskId, TaskPlacement> = placements
        .iter()
        .enumerate()
        .map(|(i, (active, standbys))| {
            (
                TaskId::new(0, i as u32),
                TaskPlacement {
                    active: (*active).into(),
                    standbys: standbys.iter().map(|s| (*s).into()).collect(),
                    previous: vec![],
                },
            )
        })
        .collect();
    let mut pods: Vec<String> = placements
        .iter()
        .flat_map(|(a, s)| std::iter::once(*a).chain(s.iter().copied()))
        .map(String::from)
        .collect();
    pods.sort();
    pods.dedup();
    Assignment {
        generation,
        tasks,
        pods,
        tracks_previous: true,
    }
}

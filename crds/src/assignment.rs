//! Which worker runs which task. Pure.
//!
//! Standalone mode (no operator-published assignment): instance `n` of `m` runs the
//! tasks `t` with `t % m == n`. Every task has exactly one owner as long as every
//! instance is started with the same `m`; the operator's sticky assignment with standbys
//! replaces this when it publishes one.

use crate::names::TaskId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    #[error("instance {instance} is out of range: instances are numbered 0..{instances}")]
    InstanceOutOfRange { instance: u32, instances: u32 },
    #[error("instances must be at least 1")]
    NoInstances,
}

/// The tasks instance `instance` of `instances` runs in standalone mode.
pub fn standalone(
    tasks: u32,
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
    Ok((0..tasks)
        .filter(|t| t % instances == instance)
        .map(TaskId)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_has_exactly_one_standalone_owner() {
        for instances in 1..6 {
            let mut owners = vec![0; 13];
            for i in 0..instances {
                for t in standalone(13, i, instances).expect("valid") {
                    owners[t.0 as usize] += 1;
                }
            }
            assert!(owners.iter().all(|n| *n == 1), "{instances}: {owners:?}");
        }
    }

    #[test]
    fn an_instance_beyond_the_count_is_rejected() {
        assert_eq!(
            standalone(4, 2, 2),
            Err(AssignmentError::InstanceOutOfRange {
                instance: 2,
                instances: 2
            })
        );
        assert_eq!(standalone(4, 0, 0), Err(AssignmentError::NoInstances));
    }
}

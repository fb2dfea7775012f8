//! At-least-once fencing: the lease a coordinated worker holds on its tasks.
//!
//! Under exactly-once a zombie (a pod cut off from the API server but not from Kafka,
//! the leftover process of a force-deleted pod) is fenced by its tasks' transactional
//! ids. Under at-least-once nothing in Kafka fences it, so the worker fences itself:
//! each status write the API server accepts renews its lease, timed from when the write
//! was *sent* on this process's monotonic clock (a write the server applied late only
//! makes the lease look older). A worker that has not renewed for [`LEASE`] stops
//! processing: it exits without committing, so the kubelet restarts it and it rejoins
//! through the hand-over. Another pod starts a task only once this pod's entry has not
//! changed for `HOLDER_SILENT` (15 s) by its own clock, which is after the lease ran
//! out here (10 s), with 5 s to spare for the last loop turn.
//!
//! This module owns the lease bookkeeping and the pure verdict; it performs no I/O.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a worker may go without a status write the API server accepted.
pub const LEASE: Duration = Duration::from_secs(10);

/// What the engine does about the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// Not renewed yet (the worker is starting: it runs no task before it has read the
    /// assignment, and its first write renews), or renewed within the lease.
    Held,
    /// Not renewed for longer than the lease: stop processing.
    Lapsed { since: Duration },
}

/// The pure rule: `renewed` is how long ago the last accepted write was sent.
pub fn judge(renewed: Option<Duration>, lease: Duration) -> LeaseVerdict {
    match renewed {
        Some(age) if age > lease => LeaseVerdict::Lapsed { since: age },
        _ => LeaseVerdict::Held,
    }
}

#[derive(Default)]
pub struct Lease {
    renewed: Mutex<Option<Instant>>,
}

impl Lease {
    /// A status write sent at `sent` was accepted.
    pub fn renewed(&self, sent: Instant) {
        if let Ok(mut r) = self.renewed.lock() {
            *r = Some(r.map_or(sent, |prev| prev.max(sent)));
        }
    }

    pub fn verdict(&self) -> LeaseVerdict {
        let age = self
            .renewed
            .lock()
            .ok()
            .and_then(|r| r.map(|at| at.elapsed()));
        judge(age, LEASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_worker_that_never_wrote_holds_nothing_to_lose() {
        assert_eq!(judge(None, LEASE), LeaseVerdict::Held);
    }

    #[test]
    fn the_lease_lapses_only_past_its_length() {
        assert_eq!(judge(Some(S(10)), S(10)), LeaseVerdict::Held);
        assert_eq!(
            judge(Some(S(11)), S(10)),
            LeaseVerdict::Lapsed { since: S(11) }
        );
    }

    #[test]
    fn an_older_write_accepted_late_never_moves_the_lease_back() {
        let l = Lease::default();
        let now = Instant::now();
        l.renewed(now);
        l.renewed(now.checked_sub(S(60)).unwrap_or(now));
        assert_eq!(l.verdict(), LeaseVerdict::Held);
    }

    #[test]
    fn the_lease_is_shorter_than_the_wait_of_the_next_owner_with_a_margin() {
        assert!(LEASE + S(5) <= crate::coord::HOLDER_SILENT);
    }
}

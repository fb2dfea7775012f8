//! At-least-once fencing: the lease a coordinated worker holds on its tasks.
//!
//! Under exactly-once a zombie (a pod cut off from the API server but not from Kafka,
//! the leftover process of a force-deleted pod) is fenced by its tasks' transactional
//! ids. Under at-least-once nothing in Kafka fences it, so the worker fences itself:
//! each write of its report Lease the API server accepts renews its lease, timed from
//! when the write was *sent* on this process's monotonic clock (a write the server
//! applied late only makes the lease look older). A worker that has not renewed for
//! [`LEASE`] stops processing: it exits without committing, so the kubelet restarts it
//! and it rejoins through the hand-over. Another pod starts a task only once this pod's
//! report has not changed for `HOLDER_SILENT` (36 s, the duration it declares) by its
//! own clock, which is after the lease ran out here (24 s, two heartbeats), with 12 s to
//! spare for the last loop turn.
//!
//! This module owns the lease bookkeeping and the pure verdict; it performs no I/O.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a worker may go without a report write the API server accepted.
pub const LEASE: Duration = Duration::from_secs(24);

/// What the engine does about the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// Renewed within the lease (a worker that has not written yet counts from its
    /// start: one whose writes never land is as unproven as one whose writes stopped).
    Held,
    /// Not renewed for longer than the lease: stop processing.
    Lapsed { since: Duration },
}

/// The pure rule: `renewed` is how long ago the last accepted write was sent (or the
/// worker started, if none was accepted yet).
pub fn judge(renewed: Duration, lease: Duration) -> LeaseVerdict {
    if renewed > lease {
        LeaseVerdict::Lapsed { since: renewed }
    } else {
        LeaseVerdict::Held
    }
}

pub struct Lease {
    /// The last accepted write's send time; the worker's start until there is one.
    renewed: Mutex<Instant>,
}

impl Default for Lease {
    fn default() -> Self {
        Self {
            renewed: Mutex::new(Instant::now()),
        }
    }
}

impl Lease {
    /// A status write sent at `sent` was accepted.
    pub fn renewed(&self, sent: Instant) {
        if let Ok(mut r) = self.renewed.lock() {
            *r = (*r).max(sent);
        }
    }

    pub fn verdict(&self) -> LeaseVerdict {
        let since = *self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        judge(since.elapsed(), LEASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_worker_whose_writes_never_landed_loses_the_lease_a_lease_after_its_start() {
        let started = Instant::now()
            .checked_sub(LEASE + S(1))
            .expect("an instant a lease ago");
        let l = Lease {
            renewed: Mutex::new(started),
        };
        assert!(matches!(l.verdict(), LeaseVerdict::Lapsed { since } if since > LEASE));
        assert_eq!(Lease::default().verdict(), LeaseVerdict::Held);
    }

    #[test]
    fn the_lease_lapses_only_past_its_length() {
        assert_eq!(judge(S(10), S(10)), LeaseVerdict::Held);
        assert_eq!(judge(S(11), S(10)), LeaseVerdict::Lapsed { since: S(11) });
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
        assert!(LEASE + S(10) <= crate::coord::HOLDER_SILENT);
        // A heartbeat lost to a slow API server does not fence a healthy worker.
        assert!(LEASE >= oxbow_crds::report::HEARTBEAT * 2);
    }
}

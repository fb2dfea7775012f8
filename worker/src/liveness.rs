//! Whether the engine is alive: the processing loop (and a restore it runs) beats on
//! every turn, `/healthz` fails once no beat came for the liveness timeout, and the
//! coordinator writes its heartbeat into the StreamApp only while beats come. So a
//! wedged engine (a blocked call, a deadlock, a step that never returns) is restarted
//! by the kubelet's liveness probe, and its tasks fail over, instead of holding its
//! partitions while the process still answers HTTP.
//!
//! Time is this process's monotonic clock, never the wall clock: a clock step cannot
//! make a silent loop look alive. This module owns that bookkeeping and the pure verdict;
//! it knows nothing of HTTP or Kubernetes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The default liveness timeout (`--liveness-timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What `/healthz` says of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The loop has not started yet (the engine is still connecting, or waits for its
    /// topics): nothing to judge, the process is alive.
    NotStarted,
    /// The loop beat within the timeout.
    Alive,
    /// No beat for `silent`, longer than the timeout.
    Wedged { silent: Duration },
}

/// The pure rule: `last` is when the loop last beat (since the process's origin), `now`
/// the same clock now.
pub fn judge(last: Option<Duration>, now: Duration, timeout: Duration) -> Verdict {
    match last {
        None => Verdict::NotStarted,
        Some(last) => {
            let silent = now.saturating_sub(last);
            if silent > timeout {
                Verdict::Wedged { silent }
            } else {
                Verdict::Alive
            }
        }
    }
}

/// The beats, shared by the engine thread (writer) and the HTTP and coordination tasks
/// (readers). Lock-free: a beat is one atomic store.
pub struct Liveness {
    origin: Instant,
    /// Milliseconds since `origin` of the last beat, plus one (0: never beat).
    last_beat: AtomicU64,
    timeout_ms: AtomicU64,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_beat: AtomicU64::new(0),
            timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
        }
    }
}

impl Liveness {
    /// The processing loop made a turn (or a restore it runs applied a batch).
    pub fn beat(&self) {
        let ms = self.origin.elapsed().as_millis() as u64 + 1;
        self.last_beat.store(ms, Ordering::Relaxed);
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    pub fn verdict(&self) -> Verdict {
        let last = match self.last_beat.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms - 1)),
        };
        judge(last, self.origin.elapsed(), self.timeout())
    }

    /// Whether the loop beat within `within`: the coordinator's heartbeat into the
    /// StreamApp is only written while this holds, so a wedged engine stops looking
    /// alive to the operator as well.
    pub fn beat_within(&self, within: Duration) -> bool {
        match self.last_beat.load(Ordering::Relaxed) {
            0 => true,
            ms => {
                self.origin
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1))
                    <= within
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_loop_that_never_started_is_not_judged() {
        assert_eq!(judge(None, S(1_000), S(60)), Verdict::NotStarted);
    }

    #[test]
    fn a_loop_that_beat_within_the_timeout_is_alive() {
        assert_eq!(judge(Some(S(100)), S(160), S(60)), Verdict::Alive);
    }

    #[test]
    fn a_loop_silent_past_the_timeout_is_wedged_and_says_for_how_long() {
        assert_eq!(
            judge(Some(S(100)), S(161), S(60)),
            Verdict::Wedged { silent: S(61) }
        );
    }

    #[test]
    fn the_first_beat_starts_the_judging() {
        let l = Liveness::default();
        assert_eq!(l.verdict(), Verdict::NotStarted);
        assert!(
            l.beat_within(Duration::ZERO),
            "no beat yet: nothing to hold back"
        );
        l.beat();
        assert_eq!(l.verdict(), Verdict::Alive);
        assert!(l.beat_within(S(1)));
    }
}

//! Waiting on a condition, never a bare sleep: every wait has a deadline and panics
//! saying what did not happen.

use std::time::{Duration, Instant};

/// Polls `f` every 50 ms until it returns `Some`, or panics after `timeout` saying
/// `what` did not happen.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Deadline::after(timeout);
    loop {
        if let Some(v) = f() {
            return v;
        }
        deadline.next_poll(Duration::from_millis(50), || format!("waiting for {what}"));
    }
}

/// Polls `check` every 200 ms until it returns `Ok`, or panics after `timeout` naming
/// what did not happen and the last thing observed (the last `Err`).
#[cfg(feature = "kube")]
pub async fn wait_for_async<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Deadline::after(timeout);
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => {
                deadline
                    .next_poll_async(Duration::from_millis(200), || {
                        format!("waiting for {what}; last observed: {last}")
                    })
                    .await
            }
        }
    }
}

/// The deadline of a wait loop that needs more than [`wait_for`]: state kept across
/// polls, an early exit (a process that died), or a failure message that is costly to
/// build (a worker's log) and so is built only when the wait fails.
pub struct Deadline {
    start: Instant,
    timeout: Duration,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self {
            start: Instant::now(),
            timeout,
        }
    }

    /// Panics with `why()` once the deadline has passed; otherwise sleeps `every`
    /// before the caller polls again.
    pub fn next_poll(&self, every: Duration, why: impl FnOnce() -> String) {
        self.check(why);
        std::thread::sleep(every);
    }

    /// [`Deadline::next_poll`] for async tests: sleeps without blocking the runtime.
    #[cfg(feature = "kube")]
    pub async fn next_poll_async(&self, every: Duration, why: impl FnOnce() -> String) {
        self.check(why);
        tokio::time::sleep(every).await;
    }

    /// Panics with `why()` once the deadline has passed: for a loop whose poll blocks
    /// by itself (a Kafka consumer's `poll` with a timeout).
    pub fn check(&self, why: impl FnOnce() -> String) {
        if self.start.elapsed() >= self.timeout {
            panic!("timed out after {:?}: {}", self.timeout, why());
        }
    }
}

/// Polls `check` every `every` for the whole of `period` and panics at once when it
/// fails: for what must stay true (an idle worker stays healthy), where [`wait_for`]
/// is for what must become true.
pub fn holds_for(period: Duration, every: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    while start.elapsed() < period {
        if let Err(why) = check() {
            panic!("failed {:?} into a {period:?} hold: {why}", start.elapsed());
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "timed out after 0ns: the thing did not happen")]
    fn a_passed_deadline_panics_saying_what_did_not_happen() {
        Deadline::after(Duration::ZERO)
            .next_poll(Duration::ZERO, || "the thing did not happen".to_string());
    }

    #[test]
    fn a_deadline_not_yet_passed_builds_no_message() {
        let deadline = Deadline::after(Duration::from_secs(60));
        deadline.next_poll(Duration::ZERO, || unreachable!("built only on failure"));
        deadline.check(|| unreachable!("built only on failure"));
    }

    #[test]
    #[should_panic(expected = "into a 60s hold: broke on poll 3")]
    fn a_hold_fails_at_the_first_poll_that_fails() {
        let mut polls = 0;
        holds_for(Duration::from_secs(60), Duration::ZERO, || {
            polls += 1;
            if polls < 3 {
                Ok(())
            } else {
                Err(format!("broke on poll {polls}"))
            }
        });
    }

    #[test]
    fn a_hold_that_stays_true_returns_after_its_period() {
        let mut polls = 0;
        holds_for(Duration::from_millis(30), Duration::from_millis(5), || {
            polls += 1;
            Ok(())
        });
        assert!(
            polls >= 2,
            "polled throughout the period, not once: {polls}"
        );
    }
}

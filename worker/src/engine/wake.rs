//! What an idle loop waits on: a flag that any of its consumers' queues raises when
//! records or events arrive in it (librdkafka calls back on its own thread when a queue
//! goes from empty to non-empty). The loop reads several queues (the main consumer's,
//! each processing thread's consumer's, and each partition's split off of them);
//! blocking in the poll of one of them would leave records of the others waiting until
//! that poll timed out, and under exactly-once a later stage's input arrives in bursts,
//! at each upstream commit, so a stage lost up to a timeout per burst.
//!
//! It owns only the flag; it must not poll or decide what a turn reads.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub(super) struct Wake {
    ready: Mutex<bool>,
    cv: Condvar,
}

impl Wake {
    /// Raises the flag: something arrived in a queue since the last wait.
    pub(super) fn notify(&self) {
        if let Ok(mut ready) = self.ready.lock() {
            *ready = true;
            self.cv.notify_one();
        }
    }

    /// Waits until the flag is raised or `timeout` passes, and lowers it. A flag raised
    /// while the loop was reading (after a queue it had read went empty) makes the next
    /// wait return at once: a notification is never lost between a poll and the wait.
    pub(super) fn wait(&self, timeout: Duration) {
        let Ok(ready) = self.ready.lock() else {
            return;
        };
        if let Ok((mut ready, _)) = self.cv.wait_timeout_while(ready, timeout, |r| !*r) {
            *ready = false;
        }
    }

    /// The callback a queue raises the flag with.
    pub(super) fn callback(self: &Arc<Self>) -> impl Fn() + Send + Sync + 'static {
        let wake = self.clone();
        move || wake.notify()
    }
}

#[cfg(test)]
mod tests {
    use super::Wake;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_notification_before_the_wait_ends_it_at_once() {
        let wake = Arc::new(Wake::default());
        (wake.callback())();
        let started = Instant::now();
        wake.wait(Duration::from_secs(5));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a raised flag did not end the wait"
        );
    }

    #[test]
    fn a_wait_lowers_the_flag_so_the_next_one_waits_its_timeout() {
        let wake = Wake::default();
        wake.notify();
        wake.wait(Duration::from_secs(5));
        let started = Instant::now();
        wake.wait(Duration::from_millis(50));
        assert!(
            started.elapsed() >= Duration::from_millis(50),
            "the flag stayed raised after a wait"
        );
    }

    #[test]
    fn a_notification_from_another_thread_wakes_the_waiter() {
        let wake = Arc::new(Wake::default());
        let notify = wake.callback();
        let t = std::thread::spawn(notify);
        let started = Instant::now();
        wake.wait(Duration::from_secs(5));
        t.join().expect("notifier");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the waiter was not woken by the other thread"
        );
    }
}

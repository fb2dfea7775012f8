//! Waiting on a condition, never a bare sleep: every wait has a deadline and panics
//! saying what did not happen.

use std::time::{Duration, Instant};

/// Polls `f` every 50 ms until it returns `Some`, or panics after `timeout` saying
/// `what` did not happen.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
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
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => {
                if start.elapsed() > timeout {
                    panic!("timed out after {timeout:?} waiting for {what}; last observed: {last}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

//! This pod's report (pods only): writes its own report Lease (see
//! [`oxbow_crds::report`]) on every change that matters to a hand-over, throttled for
//! progress figures, and as a heartbeat that renews the fencing [`crate::lease`].
//!
//! Owns the worker's only Kubernetes writes. It writes nothing but this pod's Lease: the
//! StreamApp's status belongs to the operator, which aggregates the reports, and the
//! worker's warnings travel in the report for the operator to publish as Events.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::InstanceStatus;
use oxbow_crds::report::{self, HEARTBEAT, LEASE_DURATION, Notice, Report};

use crate::coord::{CoordConfig, CoordError, instance_entry};
use crate::status::{Shared, WorkerStatus};

/// No heartbeat is written once the processing loop has been silent this long.
const LOOP_SILENCE: Duration = Duration::from_secs(10);
/// Restore progress is written at most this often: the operator shows it, no hand-over
/// waits on it.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
/// Notices stay in the report this long: enough for the operator to see them once.
const NOTICE_KEPT: Duration = Duration::from_secs(120);

/// How soon a changed report is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// A hand-over waits for this pod's word (a released task, an acknowledged
    /// generation, a failure, a notice): at once.
    Now,
    /// Restore progress: throttled.
    Progress,
    /// Only the heartbeat (lag, how far each copy trails) changed, or nothing did.
    Heartbeat,
}

/// What kind of change `next` is from `prev`: pure, for the write policy.
pub fn due(prev: &InstanceStatus, next: &InstanceStatus) -> Due {
    if prev.state != next.state
        || prev.active_tasks != next.active_tasks
        || prev.standby_tasks != next.standby_tasks
        || prev.assignment_generation != next.assignment_generation
        || prev.last_error != next.last_error
        || prev.address != next.address
    {
        Due::Now
    } else if prev.restore_remaining != next.restore_remaining
        || prev.restored != next.restored
        || prev.restore_total != next.restore_total
        || !prev
            .state_lag
            .iter()
            .map(|(t, l)| (t, magnitude(*l)))
            .eq(next.state_lag.iter().map(|(t, l)| (t, magnitude(*l))))
    {
        Due::Progress
    } else {
        Due::Heartbeat
    }
}

/// How far a copy trails, to the order of magnitude: a standby under load trails by a
/// figure that moves with every record (heartbeat news), one catching up crosses
/// magnitudes on its way to the operator's warm-up bound (progress).
fn magnitude(lag: i64) -> u32 {
    if lag <= 0 { 0 } else { lag.ilog10() + 1 }
}

/// Whether a report is to be written now, `since` the last accepted one.
pub fn write_now(due: Due, since: Duration, new_notices: bool) -> bool {
    new_notices
        || match due {
            Due::Now => true,
            Due::Progress => since >= PROGRESS_INTERVAL,
            Due::Heartbeat => since >= HEARTBEAT,
        }
}

/// Writes this pod's report on every change that is due and as a heartbeat.
pub async fn write_loop(client: kube::Client, cfg: CoordConfig, shared: Arc<Shared>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last: Option<(InstanceStatus, Instant)> = None;
    let mut notices: VecDeque<(Notice, Instant)> = VecDeque::new();
    let mut backoff = Duration::ZERO;
    let mut silenced = false;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if shared.reporting_closed() {
            // The final report has the last word.
            return;
        }
        let fresh_notices = shared.take_notices();
        let new_notices = !fresh_notices.is_empty();
        for (reason, note) in fresh_notices {
            notices.push_back((notice(reason, note), Instant::now()));
        }
        while notices
            .front()
            .is_some_and(|(_, at)| at.elapsed() > NOTICE_KEPT)
        {
            notices.pop_front();
        }
        let Some(s) = shared.snapshot() else {
            continue;
        };
        // The heartbeat speaks for the processing loop, not for this task: a loop that
        // stopped turning stops the heartbeat, so its tasks fail over.
        if !shared.liveness.beat_within(LOOP_SILENCE) {
            if !silenced {
                tracing::warn!(silent_for = ?LOOP_SILENCE, "the processing loop is not turning: report heartbeat suspended");
                silenced = true;
            }
            continue;
        }
        silenced = false;
        let entry = instance_entry(&cfg.pod, &cfg.address, &s);
        let write = match &last {
            None => true,
            Some((prev, at)) => write_now(due(prev, &entry), at.elapsed(), new_notices),
        };
        if !write {
            continue;
        }
        let sent = Instant::now();
        let r = Report {
            entry: entry.clone(),
            notices: notices.iter().map(|(n, _)| n.clone()).collect(),
        };
        match write_report(&api, &cfg, r).await {
            Ok(()) => {
                shared.lease.renewed(sent);
                last = Some((entry, Instant::now()));
                backoff = Duration::ZERO;
            }
            Err(e) => {
                if new_notices {
                    // Not lost: they go out with the next write that lands.
                    tracing::debug!("notices kept for the next report");
                }
                // Refused (RBAC, not created yet) or unreachable: do not hammer the API
                // server. The lease is not renewed meanwhile.
                backoff = (backoff * 2).clamp(Duration::from_millis(500), Duration::from_secs(10));
                tracing::warn!(error = %e, retry_in = ?backoff, "report not written");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

fn notice(reason: String, note: String) -> Notice {
    Notice {
        at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        reason,
        note: oxbow_crds::redact::scrub(&note),
    }
}

/// Renews this pod's Lease with `r`. A JSON merge patch of a Lease the operator made:
/// the worker's Role allows `patch` on its app's report Leases only, and no `create`.
pub async fn write_report(
    api: &Api<Lease>,
    cfg: &CoordConfig,
    r: Report,
) -> Result<(), CoordError> {
    let mut body = serde_json::to_value(&r).map_err(CoordError::Encode)?;
    // lastError and notices may quote Kafka's errors, which may quote a secret.
    oxbow_crds::redact::scrub_json(&mut body);
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let patch = serde_json::json!({
        "metadata": {"annotations": {report::REPORT_ANNOTATION: body.to_string()}},
        "spec": {
            "holderIdentity": cfg.pod,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            "renewTime": now,
        },
    });
    api.patch(
        &report::lease_name(&cfg.pod),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .map_err(CoordError::WriteStatus)?;
    Ok(())
}

/// The last word before exiting: the final state (Stopping, Failed) and no task, since
/// the process holds nothing any more (committed, or fenced and aborted), so the next
/// owners need not wait for it. Also after an engine panic (the status is poisoned).
pub async fn final_report(cfg: &CoordConfig, shared: &Shared) {
    shared.close_reporting();
    let Ok(client) = kube::Client::try_default().await else {
        return;
    };
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut s = shared.snapshot().unwrap_or_else(|| WorkerStatus {
        state: oxbow_crds::WorkerState::Failed,
        last_error: Some("the engine thread panicked".into()),
        ..Default::default()
    });
    s.tasks.clear();
    let r = Report {
        entry: instance_entry(&cfg.pod, &cfg.address, &s),
        notices: shared
            .take_notices()
            .into_iter()
            .map(|(reason, note)| notice(reason, note))
            .collect(),
    };
    if let Err(e) = write_report(&api, cfg, r).await {
        tracing::warn!(error = %e, "final report not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> InstanceStatus {
        InstanceStatus {
            pod: "app-0".into(),
            state: Some("Running".into()),
            active_tasks: vec!["0_0".into()],
            assignment_generation: Some(3),
            lag: Some(10),
            ..Default::default()
        }
    }

    #[test]
    fn a_released_task_or_an_acknowledged_generation_is_written_at_once() {
        let prev = entry();
        let mut next = prev.clone();
        next.active_tasks.clear();
        assert_eq!(due(&prev, &next), Due::Now);
        let mut next = prev.clone();
        next.assignment_generation = Some(4);
        assert_eq!(due(&prev, &next), Due::Now);
        assert!(write_now(Due::Now, Duration::ZERO, false));
    }

    #[test]
    fn lag_alone_waits_for_the_heartbeat_and_progress_is_throttled() {
        let prev = entry();
        let mut next = prev.clone();
        next.lag = Some(99);
        assert_eq!(due(&prev, &next), Due::Heartbeat);
        assert!(!write_now(Due::Heartbeat, Duration::from_secs(9), false));
        assert!(write_now(Due::Heartbeat, HEARTBEAT, false));
        next.restored = Some(1000);
        assert_eq!(due(&prev, &next), Due::Progress);
        assert!(!write_now(Due::Progress, Duration::from_secs(1), false));
        assert!(write_now(Due::Progress, PROGRESS_INTERVAL, false));
    }

    #[test]
    fn a_standby_trailing_by_a_moving_figure_waits_for_the_heartbeat_but_one_catching_up_does_not()
    {
        let mut prev = entry();
        prev.standby_tasks = vec!["0_1".into()];
        prev.state_lag.insert("0_1".into(), 40);
        let mut next = prev.clone();
        next.state_lag.insert("0_1".into(), 75);
        assert_eq!(due(&prev, &next), Due::Heartbeat, "same magnitude");
        next.state_lag.insert("0_1".into(), 0);
        assert_eq!(due(&prev, &next), Due::Progress, "caught up");
        prev.state_lag.insert("0_1".into(), 25_000);
        next.state_lag.insert("0_1".into(), 900);
        assert_eq!(
            due(&prev, &next),
            Due::Progress,
            "within a warm-up bound of 1000"
        );
    }

    #[test]
    fn a_new_notice_is_written_at_once() {
        assert!(write_now(Due::Heartbeat, Duration::ZERO, true));
    }
}

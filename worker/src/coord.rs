//! Coordination with the operator (pods only): watches the assignment ConfigMap and
//! the StreamApp, turns them into this worker's [`Desired`] tasks and query routing, and
//! writes this pod's own `status.instances[]` entry.
//!
//! Owns every Kubernetes call of the worker. It must not touch state or Kafka: the
//! engine applies what this module publishes in [`Shared`]. The decisions are pure
//! functions ([`desired_for`], [`instance_entry`]) from facts already read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_crds::{InstanceStatus, StreamApp, TaskId};

use crate::status::{Desired, Role, Routing, Shared, TaskState, WorkerStatus};

/// Where this worker sits: from the pod's environment.
#[derive(Debug, Clone)]
pub struct CoordConfig {
    pub namespace: String,
    pub app: String,
    pub pod: String,
    pub config_map: String,
    /// `host:port` of this pod's HTTP server, for routed queries.
    pub address: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("failed to create the Kubernetes client: {0}")]
    Client(kube::Error),
    #[error("failed to write this pod's status entry: {0}")]
    WriteStatus(kube::Error),
    #[error("failed to encode this pod's status entry: {0}")]
    Encode(serde_json::Error),
}

/// How often the entry is rewritten while nothing changes: the operator reads its
/// `updatedAt` as a heartbeat (failover of a silent pod).
const HEARTBEAT: Duration = Duration::from_secs(5);
/// No heartbeat is written once the processing loop has been silent this long.
const LOOP_SILENCE: Duration = Duration::from_secs(10);
/// Changes are written at most this often (a restore's progress changes constantly).
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// A pod whose entry has not been rewritten for this long (three heartbeats) is taken
/// for dead: it holds nothing back any more.
pub const HOLDER_SILENT: Duration = Duration::from_secs(15);

/// This worker's tasks from the published assignment and the pods' reports.
///
/// A new active task is held back (`held_elsewhere`) while another pod listed in the
/// assignment, whose entry is still fresh (it changed within [`HOLDER_SILENT`] by this
/// pod's own clock, see [`Freshness`]):
/// - reports the task as active: its previous owner has not released it yet; or
/// - is one of the task's previous actives and has not acknowledged the generation
///   that moved the task away: it may still be starting it from an older generation (a
///   pod acknowledges generation G only after releasing everything G does not give it,
///   and its tasks and acknowledgement come from one snapshot). Any other pod, however
///   far behind (a long restore), holds nothing back. An assignment from an older
///   operator lists no previous actives: then every unacknowledging pod holds back.
///
/// A pod that is gone is not listed, and one that went silent no longer counts, so
/// their tasks start at once. A pod that never wrote an entry never ran a task. An
/// assignment without a pod list (hand-edited) lists everyone.
pub fn desired_for(
    me: &str,
    a: &Assignment,
    instances: &[InstanceStatus],
    fresh: &dyn Fn(&InstanceStatus) -> bool,
) -> Desired {
    let mut d = Desired {
        generation: a.generation,
        ..Default::default()
    };
    for (t, p) in &a.tasks {
        if p.active == me {
            d.active.insert(*t);
        } else if p.standbys.iter().any(|s| s == me) {
            d.standby.insert(*t);
        }
    }
    for i in instances {
        let listed = a.pods.is_empty() || a.pods.contains(&i.pod);
        if i.pod == me || !listed || !fresh(i) {
            continue;
        }
        let acked = i.assignment_generation.unwrap_or(0);
        if acked < a.generation {
            if !a.tracks_previous {
                d.held_elsewhere.extend(d.active.iter().copied());
                continue;
            }
            for t in &d.active {
                let was_its = a.tasks.get(t).is_some_and(|p| {
                    p.previous
                        .iter()
                        .any(|prev| prev.pod == i.pod && acked < prev.until)
                });
                if was_its {
                    d.held_elsewhere.insert(*t);
                }
            }
        }
        for t in &i.active_tasks {
            if let Ok(t) = t.parse::<TaskId>()
                && d.active.contains(&t)
            {
                d.held_elsewhere.insert(t);
            }
        }
    }
    d
}

/// When each pod's entry last changed, by this pod's monotonic clock. A holder is fresh
/// while its entry keeps changing (every heartbeat rewrites `updatedAt`): the writer's
/// wall clock is never compared with ours, so a node whose clock runs ahead cannot look
/// fresh forever, and one that runs behind is not taken for dead.
#[derive(Debug, Default)]
pub struct Freshness {
    seen: BTreeMap<String, (Option<String>, Instant)>,
}

impl Freshness {
    /// Records the entries as seen now.
    pub fn observe(&mut self, instances: &[InstanceStatus], now: Instant) {
        for i in instances {
            let changed = self
                .seen
                .get(&i.pod)
                .is_none_or(|(stamp, _)| *stamp != i.updated_at);
            if changed {
                self.seen.insert(i.pod.clone(), (i.updated_at.clone(), now));
            }
        }
    }

    /// The entry changed within [`HOLDER_SILENT`] before `now`.
    pub fn fresh(&self, i: &InstanceStatus, now: Instant) -> bool {
        self.seen.get(&i.pod).is_some_and(|(stamp, at)| {
            i.updated_at.is_some()
                && *stamp == i.updated_at
                && now.saturating_duration_since(*at) < HOLDER_SILENT
        })
    }
}

/// This pod's status entry from the worker's own status.
pub fn instance_entry(pod: &str, address: &str, s: &WorkerStatus) -> InstanceStatus {
    let ids = |role: Role| -> Vec<String> {
        s.tasks
            .iter()
            .filter(|t| t.role == role)
            .map(|t| t.task.to_string())
            .collect()
    };
    let restoring: Vec<_> = s
        .tasks
        .iter()
        .filter(|t| t.role == Role::Active && t.state == TaskState::Restoring)
        .filter_map(|t| t.restore.as_ref())
        .collect();
    let failed: Vec<String> = s
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Failed)
        .map(|t| {
            format!(
                "task {}: {}",
                t.task,
                t.last_error.clone().unwrap_or_default()
            )
        })
        .collect();
    let state = if !failed.is_empty() {
        "Failed".to_string()
    } else {
        s.state.clone()
    };
    let state_lag: BTreeMap<String, i64> = s
        .tasks
        .iter()
        .filter_map(|t| {
            let lag = match (t.role, t.state) {
                (Role::Active, TaskState::Running) => Some(0),
                (Role::Active, _) => t.restore.as_ref().map(|r| r.remaining as i64),
                (Role::Standby, _) => t.state_lag,
            }?;
            Some((t.task.to_string(), lag))
        })
        .collect();
    let sum = |f: &dyn Fn(&crate::status::RestoreProgress) -> i64| -> Option<i64> {
        (!restoring.is_empty()).then(|| restoring.iter().map(|r| f(r)).sum())
    };
    InstanceStatus {
        pod: pod.to_string(),
        state: Some(state),
        address: Some(address.to_string()),
        active_tasks: ids(Role::Active),
        standby_tasks: ids(Role::Standby),
        restore_remaining: sum(&|r| r.remaining as i64),
        restored: sum(&|r| (r.restored + r.skipped) as i64),
        restore_total: sum(&|r| r.total as i64),
        // Tasks of the batch already restored (or still waiting) read nothing now.
        restore_rate: sum(&|r| {
            if r.remaining > 0 {
                r.records_per_second as i64
            } else {
                0
            }
        }),
        lag: Some(
            s.tasks
                .iter()
                .filter(|t| t.role == Role::Active)
                .filter_map(|t| t.lag)
                .sum(),
        ),
        state_lag,
        assignment_generation: Some(s.generation),
        last_error: s.last_error.clone().or_else(|| failed.first().cloned()),
        updated_at: None,
    }
}

/// Watches the assignment and the StreamApp; publishes desired tasks and routing.
pub async fn run(cfg: CoordConfig, shared: Arc<Shared>) -> Result<(), CoordError> {
    let client = kube::Client::try_default()
        .await
        .map_err(CoordError::Client)?;
    tokio::spawn(write_status_loop(
        client.clone(),
        cfg.clone(),
        shared.clone(),
    ));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    let apps: Api<StreamApp> = Api::namespaced(client, &cfg.namespace);
    // The Role grants list/watch on these names only: the watches select by name.
    let cm_events = watcher(
        cms,
        watcher::Config::default().fields(&format!("metadata.name={}", cfg.config_map)),
    )
    .default_backoff()
    .applied_objects()
    .map(|r| r.map(|cm| Fact::Assignment(Box::new(cm))));
    let app_events = watcher(
        apps,
        watcher::Config::default().fields(&format!("metadata.name={}", cfg.app)),
    )
    .default_backoff()
    .applied_objects()
    .map(|r| r.map(|a: StreamApp| Fact::Instances(a.status.unwrap_or_default().instances)));
    let mut events = std::pin::pin!(futures::stream::select(cm_events, app_events));
    let mut assignment: Option<Assignment> = None;
    // Nothing is published before both watches delivered: without the pods' reports a
    // task could start while its previous owner still runs it.
    let mut instances: Option<Vec<InstanceStatus>> = None;
    let mut freshness = Freshness::default();
    // Reports go stale without any event: look again now and then.
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        let ev = tokio::select! {
            ev = events.next() => match ev {
                Some(ev) => Some(ev),
                None => break,
            },
            _ = tick.tick() => None,
        };
        match ev {
            Some(Ok(Fact::Assignment(cm))) => {
                let raw = cm.data.as_ref().and_then(|d| d.get(CONFIG_MAP_KEY));
                match raw.map(|r| serde_json::from_str::<Assignment>(r)) {
                    Some(Ok(a)) => assignment = Some(a),
                    Some(Err(e)) => {
                        tracing::error!(configmap = %cfg.config_map, error = %e, "failed to parse the assignment: keeping the previous one")
                    }
                    None => {
                        tracing::warn!(configmap = %cfg.config_map, key = CONFIG_MAP_KEY, "the assignment ConfigMap has no assignment yet")
                    }
                }
            }
            Some(Ok(Fact::Instances(i))) => instances = Some(i),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "watch error (retrying)");
                continue;
            }
            None => {}
        }
        let (Some(a), Some(instances)) = (&assignment, &instances) else {
            continue;
        };
        let now = Instant::now();
        freshness.observe(instances, now);
        shared.set_desired(desired_for(&cfg.pod, a, instances, &|i| {
            freshness.fresh(i, now)
        }));
        let addresses = instances
            .iter()
            .filter_map(|i| Some((i.pod.clone(), i.address.clone()?)))
            .chain([(cfg.pod.clone(), cfg.address.clone())])
            .collect();
        if let Ok(mut r) = shared.routing.write() {
            *r = Routing {
                me: cfg.pod.clone(),
                task_count: r.task_count,
                generation: a.generation,
                placements: a.tasks.clone(),
                addresses,
            };
        }
    }
    Ok(())
}

enum Fact {
    Assignment(Box<ConfigMap>),
    Instances(Vec<InstanceStatus>),
}

/// Writes this pod's entry on every change (at most once a second) and as a heartbeat.
async fn write_status_loop(client: kube::Client, cfg: CoordConfig, shared: Arc<Shared>) {
    let events = Notices::new(client.clone(), &cfg);
    let api: Api<StreamApp> = Api::namespaced(client, &cfg.namespace);
    let mut last: Option<(InstanceStatus, Instant)> = None;
    let mut backoff = Duration::ZERO;
    let mut silenced = false;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if shared.reporting_closed() {
            // The final report has the last word.
            return;
        }
        events.publish(shared.take_notices()).await;
        let Some(s) = shared.snapshot() else {
            continue;
        };
        // The heartbeat speaks for the processing loop, not for this task: a loop that
        // stopped turning stops the heartbeat, so the operator fails its tasks over.
        if !shared.liveness.beat_within(LOOP_SILENCE) {
            if !silenced {
                tracing::warn!(silent_for = ?LOOP_SILENCE, "the processing loop is not turning: status heartbeat suspended");
                silenced = true;
            }
            continue;
        }
        silenced = false;
        let entry = instance_entry(&cfg.pod, &cfg.address, &s);
        let due = match &last {
            None => true,
            // A hand-over waits for this pod's word (a released task, an acknowledged
            // generation): such changes go out at once; progress figures are throttled.
            Some((prev, _)) if significant_change(prev, &entry) => true,
            Some((prev, at)) => {
                (prev != &entry && at.elapsed() >= MIN_INTERVAL) || at.elapsed() >= HEARTBEAT
            }
        };
        if !due {
            continue;
        }
        let sent = Instant::now();
        match write_entry(&api, &cfg, entry.clone()).await {
            Ok(()) => {
                shared.lease.renewed(sent);
                last = Some((entry, Instant::now()));
                backoff = Duration::ZERO;
            }
            Err(e) => {
                // Refused (RBAC, validation) or unreachable: do not hammer the API server.
                backoff = (backoff * 2).clamp(Duration::from_millis(500), Duration::from_secs(10));
                tracing::warn!(error = %e, retry_in = ?backoff, "status entry not written");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// The engine's warnings (state moved aside, …) as Warning events on the StreamApp,
/// so `kubectl describe sapp` shows them next to the operator's.
struct Notices {
    recorder: kube::runtime::events::Recorder,
    reference: k8s_openapi::api::core::v1::ObjectReference,
}

impl Notices {
    fn new(client: kube::Client, cfg: &CoordConfig) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: "oxbow-worker".into(),
            instance: Some(cfg.pod.clone()),
        };
        Self {
            recorder: kube::runtime::events::Recorder::new(client, reporter),
            reference: k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(format!("{}/v1alpha1", oxbow_crds::API_GROUP)),
                kind: Some("StreamApp".into()),
                name: Some(cfg.app.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..Default::default()
            },
        }
    }

    async fn publish(&self, notices: Vec<(String, String)>) {
        for (reason, note) in notices {
            let ev = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason,
                note: Some(oxbow_crds::redact::scrub(&note)),
                action: "OpenState".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&ev, &self.reference).await {
                tracing::warn!(error = %e, "failed to publish an event");
            }
        }
    }
}

/// Whether two entries differ in what other pods and the operator act on.
fn significant_change(a: &InstanceStatus, b: &InstanceStatus) -> bool {
    a.state != b.state
        || a.active_tasks != b.active_tasks
        || a.standby_tasks != b.standby_tasks
        || a.assignment_generation != b.assignment_generation
        || a.last_error != b.last_error
}

/// Server-side applies this pod's entry under its own field manager: the list is a map
/// keyed by `pod`, so each pod owns exactly its entry and the operator none of them.
pub async fn write_entry(
    api: &Api<StreamApp>,
    cfg: &CoordConfig,
    mut entry: InstanceStatus,
) -> Result<(), CoordError> {
    entry.updated_at = Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let mut patch = serde_json::json!({
        "apiVersion": "oxbow.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": cfg.app},
        "status": {"instances": [serde_json::to_value(&entry).map_err(CoordError::Encode)?]},
    });
    // lastError may quote Kafka's errors, which may quote a secret.
    oxbow_crds::redact::scrub_json(&mut patch);
    api.patch_status(
        &cfg.app,
        &PatchParams::apply(&format!("oxbow-worker-{}", cfg.pod)).force(),
        &Patch::Apply(patch),
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
    let api: Api<StreamApp> = Api::namespaced(client, &cfg.namespace);
    let mut s = shared.snapshot().unwrap_or_else(|| WorkerStatus {
        state: "Failed".into(),
        last_error: Some("the engine thread panicked".into()),
        ..Default::default()
    });
    s.tasks.clear();
    let entry = instance_entry(&cfg.pod, &cfg.address, &s);
    if let Err(e) = write_entry(&api, cfg, entry).await {
        tracing::warn!(error = %e, "final status entry not written");
    }
}

/// The tasks a pod reports, as a set (for tests and logs).
pub fn reported(i: &InstanceStatus) -> BTreeSet<String> {
    i.active_tasks.iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::TaskStatus;
    use oxbow_crds::assignment::{PreviousActive, TaskPlacement};

    fn assignment(
        generation: i64,
        placements: &[(u32, &str, &[&str])],
        pods: &[&str],
    ) -> Assignment {
        Assignment {
            generation,
            tasks: placements
                .iter()
                .map(|(t, a, s)| {
                    (
                        TaskId::new(0, *t),
                        TaskPlacement {
                            active: a.to_string(),
                            standbys: s.iter().map(|x| x.to_string()).collect(),
                            previous: vec![],
                        },
                    )
                })
                .collect(),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            tracks_previous: true,
        }
    }

    fn always(_: &InstanceStatus) -> bool {
        true
    }

    /// A report acknowledging `generation`.
    fn report(pod: &str, generation: i64, active: &[i32]) -> InstanceStatus {
        InstanceStatus {
            pod: pod.into(),
            active_tasks: active.iter().map(|t| format!("0_{t}")).collect(),
            assignment_generation: Some(generation),
            updated_at: Some("2026-11-29T12:00:25Z".into()),
            ..Default::default()
        }
    }

    /// Tasks 0 and 1 on app-1; task 0 came from app-0 in generation 3.
    fn three_tasks(generation: i64) -> Assignment {
        let mut a = assignment(
            generation,
            &[
                (0, "app-1", &["app-0"]),
                (1, "app-1", &[]),
                (2, "app-0", &["app-1"]),
            ],
            &["app-0", "app-1", "app-2"],
        );
        if let Some(t) = a.tasks.get_mut(&TaskId::new(0, 0)) {
            t.previous = vec![PreviousActive {
                pod: "app-0".into(),
                until: 3,
            }];
        }
        a
    }

    #[test]
    fn a_task_still_reported_by_a_live_previous_owner_is_held_back() {
        let a = three_tasks(3);
        let d = desired_for(
            "app-1",
            &a,
            &[report("app-0", 3, &[0, 2]), report("app-1", 2, &[1])],
            &always,
        );
        assert_eq!(
            d.active,
            BTreeSet::from([TaskId::new(0, 0), TaskId::new(0, 1)])
        );
        assert_eq!(d.standby, BTreeSet::from([TaskId::new(0, 2)]));
        assert_eq!(
            d.held_elsewhere,
            BTreeSet::from([TaskId::new(0, 0)]),
            "app-0 has not released task 0 yet"
        );
        assert_eq!(d.generation, 3);
    }

    #[test]
    fn only_a_previous_active_that_has_not_acknowledged_the_move_holds_a_task_back() {
        // app-0 restarted and may be starting task 0 from an older generation: its report
        // lists nothing, but it has not acknowledged generation 3, which moved task 0.
        let d = desired_for(
            "app-1",
            &three_tasks(3),
            &[report("app-0", 2, &[])],
            &always,
        );
        assert_eq!(d.held_elsewhere, BTreeSet::from([TaskId::new(0, 0)]));
        let d = desired_for(
            "app-1",
            &three_tasks(3),
            &[report("app-0", 3, &[2])],
            &always,
        );
        assert!(d.held_elsewhere.is_empty(), "acknowledged and released");
        // app-2 restores for a long time and never acknowledges: it ran none of app-1's
        // tasks, so it holds none of them back.
        let d = desired_for(
            "app-1",
            &three_tasks(5),
            &[report("app-2", 1, &[])],
            &always,
        );
        assert!(d.held_elsewhere.is_empty(), "{:?}", d.held_elsewhere);
        // From an older operator (no previous actives): any unacknowledging pod holds.
        let mut old = three_tasks(5);
        old.tracks_previous = false;
        let d = desired_for("app-1", &old, &[report("app-2", 1, &[])], &always);
        assert_eq!(d.held_elsewhere.len(), 2);
    }

    #[test]
    fn a_gone_or_silent_previous_owner_does_not_hold_a_task_back() {
        let a = assignment(4, &[(0, "app-1", &[])], &["app-1"]);
        let d = desired_for("app-1", &a, &[report("app-0", 3, &[0])], &always);
        assert!(
            d.held_elsewhere.is_empty(),
            "app-0 is not listed: it is gone"
        );
        let d = desired_for(
            "app-1",
            &three_tasks(4),
            &[report("app-0", 3, &[0])],
            &|_| false,
        );
        assert!(
            d.held_elsewhere.is_empty(),
            "app-0 has not written for a while: it is dead or wedged"
        );
    }

    #[test]
    fn freshness_is_measured_on_this_pods_clock_not_the_writers() {
        let t0 = Instant::now();
        let mut f = Freshness::default();
        // Written by a node whose clock runs an hour ahead: fresh only while it changes.
        let mut ahead = report("app-0", 3, &[0]);
        ahead.updated_at = Some("2099-01-01T00:00:00Z".into());
        f.observe(std::slice::from_ref(&ahead), t0);
        assert!(f.fresh(&ahead, t0 + Duration::from_secs(5)));
        let later = t0 + HOLDER_SILENT + Duration::from_secs(1);
        f.observe(std::slice::from_ref(&ahead), later);
        assert!(
            !f.fresh(&ahead, later),
            "an entry that stopped changing goes stale, whatever its timestamp says"
        );
        // One whose clock runs behind stays fresh while it keeps writing.
        let mut behind = report("app-1", 3, &[1]);
        for n in 0..5u64 {
            behind.updated_at = Some(format!("2000-01-01T00:00:{:02}Z", n * 5));
            let now = t0 + Duration::from_secs(n * 5);
            f.observe(std::slice::from_ref(&behind), now);
            assert!(f.fresh(&behind, now + Duration::from_secs(4)));
        }
        assert!(!f.fresh(&report("app-9", 3, &[]), t0), "never seen");
    }

    #[test]
    fn the_entry_reports_roles_restore_progress_and_state_lag() {
        let mut active = TaskStatus::new(TaskId::new(0, 0));
        active.state = TaskState::Restoring;
        active.restore = Some(crate::status::RestoreProgress {
            restored: 40,
            total: 100,
            remaining: 60,
            records_per_second: 20.0,
            ..Default::default()
        });
        let mut running = TaskStatus::new(TaskId::new(0, 1));
        running.state = TaskState::Running;
        running.lag = Some(7);
        let mut standby = TaskStatus::new(TaskId::new(0, 2));
        standby.role = Role::Standby;
        standby.state = TaskState::Running;
        standby.state_lag = Some(5);
        let s = WorkerStatus {
            state: "Restoring".into(),
            generation: 9,
            tasks: vec![active, running, standby],
            ..Default::default()
        };
        let e = instance_entry("app-0", "127.0.1.2:8080", &s);
        assert_eq!(e.active_tasks, vec!["0_0", "0_1"]);
        assert_eq!(e.standby_tasks, vec!["0_2"]);
        assert_eq!(
            (
                e.restored,
                e.restore_total,
                e.restore_remaining,
                e.restore_rate
            ),
            (Some(40), Some(100), Some(60), Some(20))
        );
        assert_eq!(e.lag, Some(7));
        assert_eq!(
            e.state_lag,
            BTreeMap::from([("0_0".into(), 60), ("0_1".into(), 0), ("0_2".into(), 5)])
        );
        assert_eq!(e.assignment_generation, Some(9));
        assert_eq!(e.state.as_deref(), Some("Restoring"));
    }

    #[test]
    fn a_failed_task_makes_the_entry_failed_with_its_error() {
        let mut t = TaskStatus::new(TaskId::new(0, 3));
        t.state = TaskState::Failed;
        t.last_error = Some("step map: boom".into());
        let s = WorkerStatus {
            state: "Running".into(),
            tasks: vec![t],
            ..Default::default()
        };
        let e = instance_entry("app-0", "a:1", &s);
        assert_eq!(e.state.as_deref(), Some("Failed"));
        assert_eq!(e.last_error.as_deref(), Some("task 0_3: step map: boom"));
    }
}

//! Coordination with the operator (pods only): watches the assignment ConfigMap and the
//! app's report Leases (every pod's [`oxbow_crds::report`]), turns them into this
//! worker's [`Desired`] tasks and query routing, and starts [`crate::report`], which
//! writes this pod's own report.
//!
//! Owns the worker's Kubernetes reads. It must not touch state or Kafka: the engine
//! applies what this module publishes in [`Shared`]. The decisions are pure functions
//! ([`desired_for`], [`instance_entry`]) from facts already read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_crds::{InstanceStatus, TaskId};

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
    /// When set, other pods are reached at `<pod>.<peer_domain>` (cluster DNS for the
    /// StatefulSet's headless Service) rather than at the IP they report.
    pub peer_domain: Option<String>,
}

/// Where a routed query for `pod` goes: its DNS name under `domain` with the port of
/// the address it reported, or that address itself.
pub fn peer_address(pod: &str, reported: &str, domain: Option<&str>) -> String {
    match (domain, reported.rsplit_once(':')) {
        (Some(d), Some((_, port))) => format!("{pod}.{d}:{port}"),
        _ => reported.to_string(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("failed to create the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("failed to write this pod's report: {0}")]
    WriteStatus(#[source] kube::Error),
    #[error("failed to encode this pod's report: {0}")]
    Encode(#[source] serde_json::Error),
}

/// A pod whose report Lease has not been renewed for this long (three heartbeats, the
/// duration each worker declares in its Lease) is taken for dead: it holds nothing back
/// any more.
pub const HOLDER_SILENT: Duration = oxbow_crds::report::LEASE_DURATION;

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
        oxbow_crds::WorkerState::Failed
    } else {
        s.state
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
        state: Some(state.to_string()),
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

/// Watches the assignment and the reports; publishes desired tasks and routing.
pub async fn run(cfg: CoordConfig, shared: Arc<Shared>) -> Result<(), CoordError> {
    let client = kube::Client::try_default()
        .await
        .map_err(CoordError::Client)?;
    tokio::spawn(crate::report::write_loop(
        client.clone(),
        cfg.clone(),
        shared.clone(),
    ));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    let leases: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    // The Role grants list/watch on these names only: the watch selects by name.
    let cm_events = watcher(
        cms,
        watcher::Config::default().fields(&format!("metadata.name={}", cfg.config_map)),
    )
    .default_backoff()
    .applied_objects()
    .map(|r| r.map(|cm| Fact::Assignment(Box::new(cm))));
    let report_events = watcher(
        leases,
        watcher::Config::default().labels(&format!(
            "{}={}",
            oxbow_crds::report::REPORT_OF_LABEL,
            cfg.app
        )),
    )
    .default_backoff()
    .map(|r| r.map(|e| Fact::Reports(Box::new(e))));
    let mut events = std::pin::pin!(futures::stream::select(cm_events, report_events));
    let mut assignment: Option<Assignment> = None;
    // Nothing is published before both watches delivered: without the pods' reports a
    // task could start while its previous owner still runs it.
    let mut reports = Reports::default();
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
            Some(Ok(Fact::Reports(e))) => reports.apply(*e),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "watch error (retrying)");
                continue;
            }
            None => {}
        }
        let instances = reports.instances();
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
            .filter(|i| i.pod != cfg.pod)
            .filter_map(|i| {
                let a = peer_address(&i.pod, i.address.as_deref()?, cfg.peer_domain.as_deref());
                Some((i.pod.clone(), a))
            })
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
    Reports(Box<watcher::Event<Lease>>),
}

/// The pods' reports as the watch delivered them. `None` until the first full list.
#[derive(Debug, Default)]
struct Reports {
    listed: Option<BTreeMap<String, InstanceStatus>>,
    /// A re-list in progress: it replaces `listed` once done.
    listing: Option<BTreeMap<String, InstanceStatus>>,
}

impl Reports {
    fn apply(&mut self, e: watcher::Event<Lease>) {
        let put = |m: &mut BTreeMap<String, InstanceStatus>, l: &Lease| {
            let name = l.metadata.name.clone().unwrap_or_default();
            match oxbow_crds::report::read(l) {
                Some(r) => m.insert(name, r.entry),
                // Made by the operator, not written yet: no report.
                None => m.remove(&name),
            };
        };
        match e {
            watcher::Event::Init => self.listing = Some(BTreeMap::new()),
            watcher::Event::InitApply(l) => {
                if let Some(m) = self.listing.as_mut() {
                    put(m, &l);
                }
            }
            watcher::Event::InitDone => {
                if let Some(m) = self.listing.take() {
                    self.listed = Some(m);
                }
            }
            watcher::Event::Apply(l) => {
                if let Some(m) = self.listed.as_mut() {
                    put(m, &l);
                }
            }
            watcher::Event::Delete(l) => {
                if let Some(m) = self.listed.as_mut() {
                    m.remove(&l.metadata.name.clone().unwrap_or_default());
                }
            }
        }
    }

    fn instances(&self) -> Option<Vec<InstanceStatus>> {
        self.listed.as_ref().map(|m| m.values().cloned().collect())
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

    #[test]
    fn a_peer_is_reached_by_its_dns_name_on_its_reported_port_when_a_domain_is_set() {
        let d = Some("app-workers.ns.svc");
        assert_eq!(
            peer_address("app-1", "198.18.1.9:8080", d),
            "app-1.app-workers.ns.svc:8080"
        );
        assert_eq!(
            peer_address("app-1", "198.18.1.9:8080", None),
            "198.18.1.9:8080"
        );
        assert_eq!(
            peer_address("app-1", "[fd00::9]:8080", d),
            "app-1.app-workers.ns.svc:8080"
        );
    }

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
            state: oxbow_crds::WorkerState::Restoring,
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
            state: oxbow_crds::WorkerState::Running,
            tasks: vec![t],
            ..Default::default()
        };
        let e = instance_entry("app-0", "a:1", &s);
        assert_eq!(e.state.as_deref(), Some("Failed"));
        assert_eq!(e.last_error.as_deref(), Some("task 0_3: step map: boom"));
    }
}

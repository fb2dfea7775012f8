//! The workers' reports (see [`oxbow_crds::report`]): the operator makes one Lease per
//! worker pod, deletes those of pods the StatefulSet no longer has, aggregates the
//! reports into `status.instances` on a bounded schedule, and publishes the notices in
//! them as Events.
//!
//! Owns the report Leases and `status.instances`; it must not touch the rest of the
//! status (the controller's server-side apply owns that). The decisions ([`due`],
//! [`unpublished`], [`relevant`]) are pure; the functions taking a client do the I/O.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use oxbow_crds::report::{self, Notice, Report};
use oxbow_crds::{InstanceStatus, StreamApp};

/// `status.instances` is rewritten at most this often for progress and lag alone; a
/// change a reader acts on (tasks, states, errors, pods coming or going) goes out at the
/// next reconcile.
pub const INSTANCES_INTERVAL: Duration = Duration::from_secs(10);

/// When each report Lease's renewal last changed, by this operator's monotonic clock:
/// a pod is judged by how long ago its renewal was *seen* to change, not by the time its
/// own clock wrote into it, so a node whose clock runs ahead cannot keep a silent pod
/// fresh (nor one that runs behind make a live pod look silent). An operator that just
/// started counts every report as renewed at its start.
#[derive(Default)]
pub struct Renewals {
    seen: std::sync::Mutex<HashMap<String, (Option<String>, Instant)>>,
}

impl Renewals {
    /// The watch delivered the Lease `key` (namespace/name) with `renew` (`None` as
    /// `deleted`: it was deleted).
    pub fn observe(&self, key: String, renew: Option<String>, deleted: bool, at: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if deleted {
            seen.remove(&key);
        } else if seen.get(&key).is_none_or(|(r, _)| *r != renew) {
            seen.insert(key, (renew, at));
        }
    }

    /// How long before `now` the renewal of `key` last changed.
    pub fn age(&self, key: &str, now: Instant) -> Option<Duration> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(key)
            .map(|(_, at)| now.saturating_duration_since(*at))
    }
}

/// Replaces each report's `updatedAt` (written by the pod's clock) with this operator's
/// view: `now` less the age of its last renewal change. A report this operator has not
/// seen change keeps no time at all (it is judged as never renewed).
pub fn judged_locally(
    reports: &mut BTreeMap<String, Report>,
    age: impl Fn(&str) -> Option<Duration>,
    now: k8s_openapi::jiff::Timestamp,
) {
    for (pod, r) in reports.iter_mut() {
        // Whole seconds: the same renewal gives the same text at every reconcile.
        r.entry.updated_at = age(pod)
            .and_then(|a| now.checked_sub(a).ok())
            .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.as_second()).ok())
            .map(|t| t.to_string());
    }
}

/// `app`'s report Leases in `ns`, as the watch holds them.
fn app_leases(store: &Store<Lease>, ns: &str, app: &str) -> Vec<std::sync::Arc<Lease>> {
    store
        .state()
        .into_iter()
        .filter(|l| l.namespace().as_deref() == Some(ns))
        .filter(|l| l.labels().get(report::REPORT_OF_LABEL).map(String::as_str) == Some(app))
        .collect()
}

/// The reports of `app`'s pods, by pod name.
pub fn of_app(store: &Store<Lease>, ns: &str, app: &str) -> BTreeMap<String, Report> {
    app_leases(store, ns, app)
        .iter()
        .filter_map(|l| report::read(l))
        .map(|r| (r.entry.pod.clone(), r))
        .collect()
}

/// The part of a report the operator reconciles on: everything but the heartbeat. The
/// controller's watch passes a Lease on only when this changes, so renewals alone cost
/// no reconciliation.
pub fn relevant(lease: &Lease) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let r = report::read(lease).map(|r| report::without_heartbeat(&r));
    let text = r.and_then(|r| serde_json::to_string(&r).ok());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    Some(h.finish())
}

/// How long until the first of these reports, fresh now, goes silent for `timeout`
/// (plus a second): renewals alone trigger no reconciliation, so a pod that stops
/// renewing is noticed by a reconciliation due then. `None`: no report is fresh.
pub fn until_silent(
    reports: &BTreeMap<String, Report>,
    now: k8s_openapi::jiff::Timestamp,
    timeout: Duration,
) -> Option<Duration> {
    let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    reports
        .values()
        .filter_map(|r| {
            r.entry
                .updated_at
                .as_deref()?
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
        })
        .map(|t| timeout_ms.saturating_sub(now.as_millisecond().saturating_sub(t.as_millisecond())))
        .filter(|left| *left >= 0)
        .min()
        .map(|left| {
            Duration::from_millis(u64::try_from(left).unwrap_or(0)) + Duration::from_secs(1)
        })
}

/// Whether `next` is to be written over `prev` now, the last write having been
/// `since` ago (`None`: not since this operator started).
pub fn due(prev: &[InstanceStatus], next: &[InstanceStatus], since: Option<Duration>) -> bool {
    if prev == next {
        return false;
    }
    let key = |i: &InstanceStatus| {
        (
            i.pod.clone(),
            i.state.clone(),
            i.address.clone(),
            i.active_tasks.clone(),
            i.standby_tasks.clone(),
            i.assignment_generation,
            i.last_error.clone(),
        )
    };
    let acted_on = prev.iter().map(key).ne(next.iter().map(key));
    acted_on || since.is_none_or(|s| s >= INSTANCES_INTERVAL)
}

/// The notices not published yet, given the newest one published per pod (updated).
pub fn unpublished(
    reports: &BTreeMap<String, Report>,
    published: &mut HashMap<String, String>,
    ns: &str,
) -> Vec<(String, Notice)> {
    let mut out = Vec::new();
    for (pod, r) in reports {
        let key = format!("{ns}/{pod}");
        let newest = published.get(&key).cloned();
        for n in &r.notices {
            if newest.as_ref().is_none_or(|at| n.at > *at) {
                out.push((pod.clone(), n.clone()));
            }
        }
        if let Some(last) = r.notices.iter().map(|n| n.at.clone()).max() {
            published.insert(key, last);
        }
    }
    out
}

/// Creates the report Leases `wanted` that the watch has not seen, and deletes this
/// app's report Leases that are not wanted (pods the StatefulSet no longer has).
pub async fn sync_leases(
    client: &kube::Client,
    store: Option<&Store<Lease>>,
    app: &StreamApp,
    ns: &str,
    wanted: &[Lease],
) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let existing: Vec<String> = store
        .map(|s| app_leases(s, ns, &app.name_any()))
        .unwrap_or_default()
        .iter()
        .map(|l| l.name_any())
        .collect();
    for l in wanted {
        if existing.contains(&l.name_any()) {
            continue;
        }
        match api.create(&PostParams::default(), l).await {
            Ok(_) => {}
            // The watch had not caught up.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let wanted_names: Vec<String> = wanted.iter().map(|l| l.name_any()).collect();
    for name in existing.iter().filter(|n| !wanted_names.contains(n)) {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(lease = %name, "deleted the report of a pod that is gone"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Replaces `status.instances` with `instances` (a JSON merge patch replaces the whole
/// list, so entries of pods that are gone, and those older workers wrote under their own
/// field managers, go with it).
pub async fn write_instances(
    client: &kube::Client,
    app: &StreamApp,
    ns: &str,
    instances: &[InstanceStatus],
) -> Result<(), kube::Error> {
    let api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
    let mut patch = serde_json::json!({"status": {"instances": instances}});
    // lastError quotes Kafka's errors, which may quote a secret.
    oxbow_crds::redact::scrub_json(&mut patch);
    api.patch_status(
        &app.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

/// When each app's instances were last written, for [`due`].
#[derive(Default)]
pub struct Schedule {
    written: std::sync::Mutex<HashMap<String, Instant>>,
}

impl Schedule {
    pub fn since(&self, key: &str) -> Option<Duration> {
        let w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        w.get(key).map(Instant::elapsed)
    }

    pub fn written(&self, key: &str) {
        let mut w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        w.insert(key.to_string(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pod: &str, tasks: &[&str], lag: i64) -> InstanceStatus {
        InstanceStatus {
            pod: pod.into(),
            state: Some("Running".into()),
            active_tasks: tasks.iter().map(|t| t.to_string()).collect(),
            lag: Some(lag),
            ..Default::default()
        }
    }

    #[test]
    fn a_moved_task_or_a_gone_pod_is_written_at_once() {
        let prev = [entry("a-0", &["0_0"], 1), entry("a-1", &["0_1"], 1)];
        let moved = [entry("a-0", &["0_0", "0_1"], 1), entry("a-1", &[], 1)];
        assert!(due(&prev, &moved, Some(Duration::ZERO)));
        let gone = [entry("a-0", &["0_0"], 1)];
        assert!(due(&prev, &gone, Some(Duration::ZERO)));
    }

    #[test]
    fn lag_and_progress_alone_wait_for_the_interval() {
        let prev = [entry("a-0", &["0_0"], 1)];
        let lagging = [entry("a-0", &["0_0"], 500)];
        assert!(!due(&prev, &lagging, Some(Duration::from_secs(3))));
        assert!(due(&prev, &lagging, Some(INSTANCES_INTERVAL)));
        assert!(due(&prev, &lagging, None), "a new operator writes once");
        assert!(!due(&prev, &prev, None), "nothing changed: no write");
    }

    #[test]
    fn a_reconciliation_is_due_when_the_first_fresh_report_would_go_silent() {
        let now: k8s_openapi::jiff::Timestamp = "2026-12-04T10:00:30Z".parse().expect("ts");
        let at = |pod: &str, t: &str| {
            let mut e = entry(pod, &[], 0);
            e.updated_at = Some(t.into());
            (
                pod.to_string(),
                Report {
                    entry: e,
                    notices: vec![],
                },
            )
        };
        let t30 = Duration::from_secs(30);
        let reports: BTreeMap<_, _> = [
            at("a-0", "2026-12-04T10:00:20Z"),
            at("a-1", "2026-12-04T10:00:10Z"),
            at("a-2", "2026-12-04T09:59:00Z"),
        ]
        .into();
        assert_eq!(
            until_silent(&reports, now, t30),
            Some(Duration::from_secs(11))
        );
        let silent: BTreeMap<_, _> = [at("a-2", "2026-12-04T09:59:00Z")].into();
        assert_eq!(
            until_silent(&silent, now, t30),
            None,
            "already silent: nothing to wait for"
        );
    }

    #[test]
    fn a_renewal_counts_from_when_this_operator_saw_it_change_whatever_the_pods_clock() {
        let t0 = Instant::now();
        let r = Renewals::default();
        // The pod's clock runs an hour ahead: its renewal time is in the future.
        let ahead = Some("2026-12-04T11:00:00Z".to_string());
        r.observe("ns/a-0-report".into(), ahead.clone(), false, t0);
        r.observe(
            "ns/a-0-report".into(),
            ahead,
            false,
            t0 + Duration::from_secs(20),
        );
        assert_eq!(
            r.age("ns/a-0-report", t0 + Duration::from_secs(40)),
            Some(Duration::from_secs(40)),
            "the same renewal seen again is no renewal"
        );
        r.observe(
            "ns/a-0-report".into(),
            Some("2026-12-04T11:00:12Z".into()),
            false,
            t0 + Duration::from_secs(50),
        );
        assert_eq!(
            r.age("ns/a-0-report", t0 + Duration::from_secs(50)),
            Some(Duration::ZERO)
        );
        r.observe(
            "ns/a-0-report".into(),
            None,
            true,
            t0 + Duration::from_secs(51),
        );
        assert_eq!(r.age("ns/a-0-report", t0 + Duration::from_secs(51)), None);

        let now: k8s_openapi::jiff::Timestamp = "2026-12-04T10:00:40Z".parse().expect("ts");
        let mut e = entry("a-0", &[], 0);
        e.updated_at = Some("2026-12-04T11:00:00Z".into());
        let mut reports: BTreeMap<_, _> = [(
            "a-0".to_string(),
            Report {
                entry: e,
                notices: vec![],
            },
        )]
        .into();
        judged_locally(&mut reports, |_| Some(Duration::from_secs(40)), now);
        assert_eq!(
            reports["a-0"].entry.updated_at.as_deref(),
            Some("2026-12-04T10:00:00Z")
        );
        judged_locally(&mut reports, |_| None, now);
        assert_eq!(reports["a-0"].entry.updated_at, None, "never seen renewed");
    }

    #[test]
    fn each_notice_is_published_once() {
        let n = |at: &str| Notice {
            at: at.into(),
            reason: "StateMovedAside".into(),
            note: "x".into(),
        };
        let mut reports = BTreeMap::new();
        reports.insert(
            "a-0".to_string(),
            Report {
                entry: entry("a-0", &[], 0),
                notices: vec![n("2026-12-04T10:00:01Z")],
            },
        );
        let mut published = HashMap::new();
        assert_eq!(unpublished(&reports, &mut published, "ns").len(), 1);
        assert!(unpublished(&reports, &mut published, "ns").is_empty());
        if let Some(r) = reports.get_mut("a-0") {
            r.notices.push(n("2026-12-04T10:00:02Z"));
        }
        let again = unpublished(&reports, &mut published, "ns");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].1.at, "2026-12-04T10:00:02Z");
    }
}

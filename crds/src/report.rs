//! Per-pod reports: each worker pod writes only its own small `coordination.k8s.io`
//! Lease, and the operator aggregates them into `status.instances`.
//!
//! A Lease, because that is what Kubernetes itself moved node heartbeats to for the same
//! reason: a heartbeat written into one shared object is a full-object write and watch
//! event for every reader, N pods make O(N²) work, and any writer can rewrite the
//! others' entries. Here the renewal (`spec.renewTime`) is the heartbeat and the
//! fencing lease; what the pod reports (its tasks, restore progress, errors, notices)
//! rides in one annotation and changes only when the pod's work does.
//!
//! This module owns the names, labels, timing and encoding both sides must agree on. It
//! performs no I/O.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use serde::{Deserialize, Serialize};

use crate::InstanceStatus;

/// The annotation holding the pod's [`Report`] as JSON.
pub const REPORT_ANNOTATION: &str = "oxbow.dev/report";
/// The label naming the StreamApp a report Lease belongs to (the watches select on it).
pub const REPORT_OF_LABEL: &str = "oxbow.dev/report-of";

/// How often a worker renews its Lease while nothing it reports changes. Ten pods of an
/// app renew 0.83 Leases a second between them, leaving room in the budget of one API
/// write a second per app in steady state for the operator's aggregate (the kubelet
/// renews its node Lease every 10 s).
pub const HEARTBEAT: Duration = Duration::from_secs(12);
/// The duration a worker declares in its Lease: other pods start its tasks, and the
/// operator fails them over, only once its Lease has not changed for this long by their
/// own clocks. Two heartbeats and a margin, so a lost renewal does not move tasks.
pub const LEASE_DURATION: Duration = Duration::from_secs(36);

/// The Lease a pod reports through: named after the pod.
pub fn lease_name(pod: &str) -> String {
    format!("{pod}-report")
}

/// The pod a report Lease speaks for (its holder), from the name.
pub fn pod_of(lease_name: &str) -> Option<&str> {
    lease_name.strip_suffix("-report")
}

/// A warning the worker raises (state moved aside, …); the operator publishes it as an
/// Event on the StreamApp, so the workers need no right to write events.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// When the worker raised it (RFC 3339): the operator publishes each notice once.
    pub at: String,
    pub reason: String,
    pub note: String,
}

/// What the annotation holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The pod's `status.instances[]` entry (`updatedAt` is the Lease's renewal).
    pub entry: InstanceStatus,
    /// Notices of the last minutes, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<Notice>,
}

/// The report a Lease carries, with `updatedAt` set to its last renewal. `None` for a
/// Lease no worker has written yet (the operator creates them empty) or one whose
/// annotation does not parse (then the pod counts as not reporting).
pub fn read(lease: &Lease) -> Option<Report> {
    let raw = lease
        .metadata
        .annotations
        .as_ref()?
        .get(REPORT_ANNOTATION)?;
    let mut report: Report = serde_json::from_str(raw).ok()?;
    let spec = lease.spec.as_ref()?;
    report.entry.updated_at = spec.renew_time.as_ref().map(|t| t.0.to_string());
    if let Some(pod) = lease.metadata.name.as_deref().and_then(pod_of) {
        // The name, not the content, says whose report it is.
        report.entry.pod = pod.to_string();
    }
    Some(report)
}

/// The heartbeat part of the report: what changes with every renewal and nothing else.
/// Two reports that differ only here need no reconciliation by the operator.
pub fn without_heartbeat(r: &Report) -> Report {
    let mut r = r.clone();
    r.entry.updated_at = None;
    r.entry.lag = None;
    // How far a copy trails moves with every record; which copies the pod holds is
    // what matters between renewals (a pending move re-reads the figures on its own).
    for lag in r.entry.state_lag.values_mut() {
        *lag = 0;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(name: &str, annotation: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: annotation
                    .map(|a| [(REPORT_ANNOTATION.to_string(), a.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("app-1".into()),
                renew_time: Some(MicroTime(
                    "2026-12-04T10:00:00.123456Z".parse().expect("ts"),
                )),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_report_reads_its_pod_from_the_lease_name_and_its_time_from_the_renewal() {
        let raw = r#"{"entry":{"pod":"someone-else","state":"Running","activeTasks":["0_1"]}}"#;
        let r = read(&lease("app-1-report", Some(raw))).expect("report");
        assert_eq!(r.entry.pod, "app-1");
        assert_eq!(r.entry.active_tasks, vec!["0_1".to_string()]);
        assert_eq!(
            r.entry.updated_at.as_deref(),
            Some("2026-12-04T10:00:00.123456Z")
        );
    }

    #[test]
    fn an_unwritten_or_unreadable_lease_is_no_report() {
        assert!(read(&lease("app-1-report", None)).is_none());
        assert!(read(&lease("app-1-report", Some("{not json"))).is_none());
    }

    #[test]
    fn renewals_alone_are_not_a_change() {
        let mut a = Report::default();
        a.entry.updated_at = Some("t1".into());
        a.entry.lag = Some(5);
        let mut b = a.clone();
        b.entry.updated_at = Some("t2".into());
        b.entry.lag = Some(9);
        a.entry.state_lag.insert("0_1".into(), 3);
        b.entry.state_lag.insert("0_1".into(), 70);
        assert_eq!(without_heartbeat(&a), without_heartbeat(&b));
        b.entry.state_lag.insert("0_2".into(), 0);
        assert_ne!(without_heartbeat(&a), without_heartbeat(&b), "a new copy");
        b.entry.state_lag.remove("0_2");
        b.entry.active_tasks = vec!["0_0".into()];
        assert_ne!(without_heartbeat(&a), without_heartbeat(&b));
    }

    #[test]
    fn ten_pods_renew_under_one_lease_a_second_and_survive_a_lost_renewal() {
        assert!(HEARTBEAT > Duration::from_secs(10));
        assert!(LEASE_DURATION > HEARTBEAT * 2);
        assert_eq!(pod_of(&lease_name("orders-7")), Some("orders-7"));
    }
}

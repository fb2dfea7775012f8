//! Why the StatefulSet controller cannot create the app's worker pods (a ResourceQuota,
//! Pod Security admission, a webhook). The StatefulSet's status does not say; the
//! controller records each refusal as a `FailedCreate` event on the StatefulSet, with the
//! API server's message. This step reads those events, only while pods are missing, and
//! picks the message the app's conditions then carry. A refusal older than the newest
//! pod was followed by a pod the controller could create: it is not the cause of what is
//! missing now (a rolling update's replaced pod, for one).
//!
//! Reads events; writes nothing. Failing to read them only loses the detail: it is
//! logged, never an error of the reconciliation. One read answers for a StatefulSet for
//! [`REREAD_AFTER`] ([`EventReads`]): while volumes bind slowly, many reconciles of an
//! app with missing pods follow each other, and each listed the events again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::dereference::Observed;
use super::rollout::RolledOut;
use super::{Context, Error};

/// A refusal older than this is taken as resolved: the controller retries with back-off
/// (at most about 17 minutes apart, but it records each retry as the same event with a
/// new `lastTimestamp`), so a refusal that still holds is seen again well within this.
const RECENT: Duration = Duration::from_secs(20 * 60);

/// How long one read of a StatefulSet's events stands for it. A refusal shows in the
/// app's conditions at most this much later; the controller's own retries of a refused
/// pod are seconds to minutes apart.
pub const REREAD_AFTER: Duration = Duration::from_secs(10);

/// The last read of each StatefulSet's `FailedCreate` events, by its uid.
#[derive(Default)]
pub struct EventReads(Mutex<HashMap<String, (Instant, Vec<Event>)>>);

impl EventReads {
    /// The events read for `uid` less than [`REREAD_AFTER`] before `now`.
    fn fresh(&self, uid: &str, now: Instant) -> Option<Vec<Event>> {
        let reads = self.0.lock().expect("event reads lock");
        reads
            .get(uid)
            .filter(|(at, _)| now.saturating_duration_since(*at) < REREAD_AFTER)
            .map(|(_, events)| events.clone())
    }

    /// Keeps a read, and drops the reads that no longer stand (so a StatefulSet that
    /// got its pods, or is gone, leaves nothing behind).
    fn record(&self, uid: &str, now: Instant, events: Vec<Event>) {
        let mut reads = self.0.lock().expect("event reads lock");
        reads.retain(|_, (at, _)| now.saturating_duration_since(*at) < REREAD_AFTER);
        reads.insert(uid.to_string(), (now, events));
    }
}

/// Why the app's StatefulSet cannot create pods: the StatefulSet as the rollout's apply
/// returned it (its new generation), else as read at the start.
pub(super) async fn of_app(ctx: &Context, obs: &Observed, rolled: &RolledOut) -> Option<String> {
    let sts = rolled.applied_sts.as_ref().or(obs.sts.as_ref());
    let newest_pod = obs
        .pods
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .max();
    failure(&ctx.client, &ctx.event_reads, sts, newest_pod).await
}

/// The newest recent `FailedCreate` message of the app's StatefulSet, when it has fewer
/// pods than it wants; `newest_pod`: when the newest of its pods was created.
pub async fn failure(
    client: &kube::Client,
    reads: &EventReads,
    sts: Option<&StatefulSet>,
    newest_pod: Option<Timestamp>,
) -> Option<String> {
    let sts = sts?;
    let want = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let have = sts.status.as_ref().map_or(0, |s| s.replicas);
    if have >= want {
        return None;
    }
    let uid = sts.metadata.uid.as_deref();
    let now = Instant::now();
    let events = match uid.and_then(|u| reads.fresh(u, now)) {
        Some(events) => events,
        None => match events(client, sts).await {
            Ok(events) => {
                if let Some(u) = uid {
                    reads.record(u, now, events.clone());
                }
                events
            }
            Err(e) => {
                tracing::warn!(error = %e, "failed to read why worker pods are missing");
                return None;
            }
        },
    };
    newest_recent(&events, uid, newest_pod, Timestamp::now())
}

async fn events(client: &kube::Client, sts: &StatefulSet) -> Result<Vec<Event>, Error> {
    let api: Api<Event> = Api::namespaced(client.clone(), &sts.namespace().unwrap_or_default());
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=StatefulSet,involvedObject.name={},reason=FailedCreate",
        sts.name_any()
    ));
    let events = api.list(&lp).await.map_err(|source| Error::ReadCluster {
        what: format!("events of StatefulSet {}", sts.name_any()),
        source,
    })?;
    Ok(events.items)
}

/// The message of the newest event about the StatefulSet `uid` seen within [`RECENT`]
/// of `now` and not before `newest_pod` was created (pure).
pub fn newest_recent(
    events: &[Event],
    uid: Option<&str>,
    newest_pod: Option<Timestamp>,
    now: Timestamp,
) -> Option<String> {
    let seen = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    events
        .iter()
        // A StatefulSet of the same name deleted and created again has another uid.
        .filter(|e| uid.is_none() || e.involved_object.uid.as_deref() == uid)
        .filter_map(|e| Some((seen(e)?, e)))
        .filter(|(t, _)| now.duration_since(*t).unsigned_abs() <= RECENT)
        .filter(|(t, _)| newest_pod.is_none_or(|p| *t >= p))
        .max_by_key(|(t, _)| *t)
        .and_then(|(_, e)| e.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn event(uid: &str, at: Timestamp, message: &str) -> Event {
        Event {
            involved_object: k8s_openapi::api::core::v1::ObjectReference {
                uid: Some(uid.into()),
                ..Default::default()
            },
            last_timestamp: Some(Time(at)),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_newest_recent_refusal_of_this_statefulset_is_the_one_shown() {
        let now: Timestamp = "2026-12-03T12:00:00Z".parse().expect("time");
        let ago = |s: i64| now - k8s_openapi::jiff::SignedDuration::from_secs(s);
        let events = [
            event("sts-1", ago(120), "exceeded quota: old"),
            event(
                "sts-1",
                ago(10),
                "exceeded quota: pods=1, used: pods=1, limited: pods=1",
            ),
            event("sts-0", ago(5), "an earlier StatefulSet of the same name"),
            event("sts-1", ago(3 * 3600), "long resolved"),
        ];
        assert_eq!(
            newest_recent(&events, Some("sts-1"), Some(ago(600)), now).as_deref(),
            Some("exceeded quota: pods=1, used: pods=1, limited: pods=1")
        );
        assert_eq!(newest_recent(&events[3..], Some("sts-1"), None, now), None);
        assert_eq!(
            newest_recent(&events, Some("sts-1"), Some(ago(1)), now),
            None,
            "a pod created after the refusal shows the controller got past it"
        );
    }

    #[test]
    fn one_read_of_the_events_stands_for_a_while_and_then_is_read_again() {
        let reads = EventReads::default();
        let t0 = Instant::now();
        let refused = vec![event(
            "sts-1",
            "2026-12-03T12:00:00Z".parse().expect("time"),
            "quota",
        )];
        assert!(reads.fresh("sts-1", t0).is_none(), "nothing read yet");
        reads.record("sts-1", t0, refused);
        let later = t0 + REREAD_AFTER / 2;
        assert_eq!(reads.fresh("sts-1", later).map(|e| e.len()), Some(1));
        assert!(
            reads.fresh("sts-2", later).is_none(),
            "kept per StatefulSet"
        );
        let stale = t0 + REREAD_AFTER;
        assert!(
            reads.fresh("sts-1", stale).is_none(),
            "read again once stale"
        );
        reads.record("sts-2", stale, vec![]);
        assert_eq!(
            reads.0.lock().expect("lock").len(),
            1,
            "a read that no longer stands is dropped"
        );
    }
}

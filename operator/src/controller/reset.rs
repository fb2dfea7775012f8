//! The reset step of a reconciliation: `kubectl annotate sapp X oxbow.dev/reset=<store>`
//! lets a spec change that would misread a store (`IncompatibleStateChange`) go ahead
//! by emptying that store. In order: the workers are stopped (the StatefulSet is rolled
//! out with no replicas), the store's changelog topic is deleted once no worker pod is
//! left to write it, and once Kafka no longer lists it the new layout is recorded and
//! the annotation removed. The next reconciliation re-creates the changelog empty and
//! starts the workers, which move their local copy of the store aside (its recorded
//! layout differs, `worker::engine::quarantine`) and restore the other stores from
//! their changelogs. The source offsets are kept: processing goes on from where it
//! was, with the reset stores empty.
//!
//! [`plan`] is the pure decision; [`advance`] does one step of I/O per reconciliation.
//! Owns: the annotation and the changelog deletion of a reset. Must not touch: the
//! other stores' topics, or topics this app did not create (they are refused).

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::layouts::LayoutChange;
use oxbow_crds::{StoreName, StreamApp};
use serde_json::json;

use super::claim::owner;
use super::{Cluster, Error};
use crate::ownership::ClaimsView;

/// The annotation naming the stores the user allows to be emptied.
pub const ANNOTATION: &str = "oxbow.dev/reset";

/// The stores named by the annotation (comma or space separated).
pub fn requested(app: &StreamApp) -> BTreeSet<String> {
    app.annotations()
        .get(ANNOTATION)
        .map(|v| {
            v.split([',', ' '])
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// What the reset annotation means for this spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetPlan {
    /// No store changes layout: nothing to reset (an annotation waits for one).
    Nothing,
    /// Every changed store may be emptied: reset these.
    Reset(Vec<String>),
    /// Some changed stores are not named: refuse, with the stores still needed.
    NotAllowed(Vec<String>),
}

pub fn plan(changes: &[LayoutChange], requested: &BTreeSet<String>) -> ResetPlan {
    if changes.is_empty() {
        return ResetPlan::Nothing;
    }
    let missing: Vec<String> = changes
        .iter()
        .filter(|c| !requested.contains(&c.store))
        .map(|c| c.store.clone())
        .collect();
    if missing.is_empty() {
        ResetPlan::Reset(changes.iter().map(|c| c.store.clone()).collect())
    } else {
        ResetPlan::NotAllowed(missing)
    }
}

/// The way out `IncompatibleStateChange` adds for the stores not yet named.
pub fn hint(app: &StreamApp, missing: &[String]) -> String {
    let mut all = requested(app);
    all.extend(missing.iter().cloned());
    format!(
        "; or empty the store and keep the change: kubectl annotate sapp {} -n {} {ANNOTATION}={} (the workers stop, its changelog is deleted and re-created empty, processing resumes from the committed offsets)",
        app.name_any(),
        app.namespace().unwrap_or_default(),
        all.into_iter().collect::<Vec<_>>().join(",")
    )
}

/// Where a reset is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Worker pods are still there: they must not write the changelog being deleted.
    Stopping { pods: usize },
    /// The changelog topics were asked to be deleted; Kafka still lists them.
    Deleting { topics: Vec<String> },
    /// The changelogs are gone: the new layouts may be recorded.
    Done,
}

impl Progress {
    pub fn message(&self, stores: &[String]) -> String {
        let stores = stores.join(", ");
        match self {
            Self::Stopping { pods } => format!(
                "resetting store(s) {stores}: waiting for {pods} worker pod(s) to stop before their changelog is deleted"
            ),
            Self::Deleting { topics } => format!(
                "resetting store(s) {stores}: waiting for Kafka to delete {}",
                topics.join(", ")
            ),
            Self::Done => format!(
                "reset store(s) {stores}: changelogs deleted; they are re-created empty and the workers restart"
            ),
        }
    }
}

/// Why a reset cannot be done: a changelog this app did not create is never deleted.
pub fn refusal(app: &StreamApp, view: &ClaimsView, stores: &[String]) -> Option<String> {
    let id = app.application_id();
    let me = owner(app);
    let t = changelogs(&id, stores).into_iter().find(|t| {
        view.topic(t)
            .is_some_and(|r| r.application_id != id || r.owner() != me)
    })?;
    Some(format!(
        "{ANNOTATION} names a store whose changelog {t} is recorded for another app: Oxbow does not delete it; give the step a new store name instead"
    ))
}

fn changelogs(id: &str, stores: &[String]) -> Vec<String> {
    stores
        .iter()
        .map(|s| oxbow_crds::names::changelog_topic(id, &StoreName(s.clone())))
        .collect()
}

/// One step of a reset, once the StatefulSet is rolled out with no replicas.
/// `pods` counts the app's worker pods, terminating ones included.
pub async fn advance(
    cluster: &Cluster,
    id: &str,
    stores: &[String],
    pods: usize,
) -> Result<Progress, Error> {
    if pods > 0 {
        return Ok(Progress::Stopping { pods });
    }
    let topics = changelogs(id, stores);
    let counts = cluster.admin.partition_counts(&topics).await?;
    let existing: Vec<String> = counts
        .into_iter()
        .filter_map(|(t, n)| n.map(|_| t))
        .collect();
    if existing.is_empty() {
        return Ok(Progress::Done);
    }
    cluster.admin.delete_topics(&existing).await?;
    tracing::info!(topics = ?existing, "deleted changelogs of reset stores");
    Ok(Progress::Deleting { topics: existing })
}

/// Removes the annotation once its reset is done and recorded, so a later change is not
/// reset unasked.
pub async fn finish(client: &kube::Client, app: &StreamApp) -> Result<(), Error> {
    if !app.annotations().contains_key(ANNOTATION) {
        return Ok(());
    }
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &app.namespace().unwrap_or_default());
    let patch = json!({ "metadata": { "annotations": { ANNOTATION: null } } });
    api.patch(
        &app.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(Error::ResetAnnotation)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(store: &str) -> LayoutChange {
        LayoutChange {
            store: store.into(),
            was: "aggregate window=none fields=n:count".into(),
            now: "aggregate window=none fields=n:count,s:sum".into(),
        }
    }

    fn named(stores: &[&str]) -> BTreeSet<String> {
        stores.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn without_a_layout_change_there_is_nothing_to_reset() {
        assert_eq!(plan(&[], &named(&["totals"])), ResetPlan::Nothing);
    }

    #[test]
    fn every_changed_store_must_be_named_to_reset() {
        let changes = [change("totals"), change("per-user")];
        assert_eq!(
            plan(&changes, &named(&["totals"])),
            ResetPlan::NotAllowed(vec!["per-user".into()])
        );
        assert_eq!(
            plan(&changes, &named(&["per-user", "totals", "other"])),
            ResetPlan::Reset(vec!["totals".into(), "per-user".into()])
        );
    }

    #[test]
    fn the_annotation_lists_stores_by_comma_or_space() {
        let mut app: StreamApp = serde_yaml::from_str(
            "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {name: t, namespace: n}\nspec:\n  kafka: {bootstrapServers: \"k:9092\"}\n  source: {topics: [in]}\n  steps: []\n",
        )
        .expect("manifest");
        assert!(requested(&app).is_empty());
        app.annotations_mut()
            .insert(ANNOTATION.into(), " totals, per-user  x".into());
        assert_eq!(requested(&app), named(&["per-user", "totals", "x"]));
        let h = hint(&app, &["y".into()]);
        assert!(
            h.contains("kubectl annotate sapp t -n n oxbow.dev/reset=per-user,totals,x,y"),
            "{h}"
        );
    }
}

//! The validate step of a reconciliation (pure): the spec's own errors, the task count
//! the sources give, an `applicationId` change, and stores whose layout a change would
//! misread (unless `oxbow.dev/reset` names them).
//!
//! It must not read or write anything: what it needs was dereferenced before.

use std::collections::BTreeMap;

use oxbow_crds::StreamApp;
use oxbow_crds::validate::{join_partitions, task_count, validate_app};

use super::apply::Problems;
use super::dereference::Observed;
use super::reset::{self, ResetPlan};
use crate::status::{Verdict, reason};
use crate::topics::TopicError;

/// What validation decided.
pub(super) struct Validated {
    /// Tasks per stage, when the sources say so and are sound.
    pub tasks: Option<i32>,
    /// The store layouts the spec asks for, and those recorded in status.
    pub layouts: BTreeMap<String, String>,
    pub recorded: BTreeMap<String, String>,
    /// Stores whose change the user asked to reset (their data is deleted).
    pub resetting: Option<Vec<String>>,
}

/// Validates the spec against what was read: the sources' partition counts (`counts`,
/// or why Kafka could not say), the Kafka Secret and client configuration. The problems
/// found: `invalid` (the spec), `source` (the sources, the Secret or the client
/// configuration) and `kafka` (the counts could not be read).
pub(super) fn validate(
    app: &StreamApp,
    obs: &Observed,
    counts: Result<BTreeMap<String, Option<i32>>, TopicError>,
) -> (Validated, Problems) {
    let mut found = Problems {
        source: obs.client_refused.clone(),
        ..Problems::default()
    };
    let spec_errors = validate_app(app);
    if let (None, Some(r)) = (&obs.secret, &app.spec.kafka.secret_ref) {
        found.source = Some(Verdict::stalled(
            reason::KAFKA_SECRET_MISSING,
            format!(
                "Secret {} named by spec.kafka.secretRef does not exist",
                r.name
            ),
        ));
    }
    let tasks = match counts {
        Ok(_) if found.source.is_some() => None,
        Ok(counts) => match task_count(&source_only(&counts, &app.spec.source.topics)) {
            Ok(n) => match join_partitions(&app.spec, n, &counts).first() {
                Some(e) => {
                    found.source = Some(Verdict::stalled(reason::of(e), e.to_string()));
                    None
                }
                None => Some(n),
            },
            Err(e) => {
                found.source = Some(Verdict::stalled(reason::of(&e), e.to_string()));
                None
            }
        },
        Err(e) => {
            found.kafka = Some(e);
            None
        }
    };
    found.invalid = (!spec_errors.is_empty()).then(|| {
        let reason = reason::of(&spec_errors[0]);
        let msg = spec_errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        Verdict::stalled(reason, format!("invalid spec: {msg}"))
    });
    if let (None, Some((in_force, wanted))) = (&found.invalid, app.application_id_change()) {
        found.invalid = Some(Verdict::stalled(
            reason::APPLICATION_ID_CHANGED,
            format!(
                "spec.applicationId is {wanted} but the app runs as {in_force} (status.applicationId): changing it would orphan the state, the group and the topics; set it back to {in_force}, or create a new StreamApp"
            ),
        ));
    }

    // A store kept under its name must keep meaning what its data means.
    let layouts = oxbow_crds::layouts::store_layouts(&app.spec);
    let recorded = app
        .status
        .as_ref()
        .map(|s| s.store_layouts.clone())
        .unwrap_or_default();
    let changes = oxbow_crds::layouts::incompatible(&recorded, &layouts);
    // Unless the user named those stores to be emptied (`oxbow.dev/reset`).
    let mut resetting = None;
    match reset::plan(&changes, &reset::requested(app)) {
        ResetPlan::Nothing => {}
        ResetPlan::Reset(stores) => resetting = found.invalid.is_none().then_some(stores),
        ResetPlan::NotAllowed(missing) if found.invalid.is_none() => {
            found.invalid = Some(Verdict::stalled(
                reason::INCOMPATIBLE_STATE_CHANGE,
                oxbow_crds::layouts::message(&changes) + &reset::hint(app, &missing),
            ));
        }
        ResetPlan::NotAllowed(_) => {}
    }
    let validated = Validated {
        tasks,
        layouts,
        recorded,
        resetting,
    };
    (validated, found)
}

/// The partition counts of the source topics alone.
fn source_only(
    counts: &BTreeMap<String, Option<i32>>,
    sources: &[String],
) -> BTreeMap<String, Option<i32>> {
    counts
        .iter()
        .filter(|(t, _)| sources.contains(t))
        .map(|(t, n)| (t.clone(), *n))
        .collect()
}

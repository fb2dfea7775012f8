//! The validate step of a reconciliation (pure): the spec's own errors, the task count
//! the sources give, an `applicationId` change, and stores whose layout a change would
//! misread (unless `oxbow.dev/reset` names them).
//!
//! It must not read or write anything: what it needs was dereferenced before.

use std::collections::BTreeMap;

use oxbow_crds::StreamApp;
use oxbow_crds::validate::{join_partitions, task_count, validate_app};

use super::apply::Problems;
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

/// Validates the spec against the sources' partition counts (`counts`, or why Kafka
/// could not say). `secret_missing`: `spec.kafka.secretRef` names no Secret.
pub(super) fn validate(
    app: &StreamApp,
    secret_missing: bool,
    counts: Result<BTreeMap<String, Option<i32>>, TopicError>,
    problems: &mut Problems,
) -> Validated {
    let spec_errors = validate_app(app);
    if let (true, Some(r)) = (secret_missing, &app.spec.kafka.secret_ref) {
        problems.source = Some(Verdict::stalled(
            reason::KAFKA_SECRET_MISSING,
            format!(
                "Secret {} named by spec.kafka.secretRef does not exist",
                r.name
            ),
        ));
    }
    let tasks = match counts {
        Ok(_) if problems.source.is_some() => None,
        Ok(counts) => match task_count(&source_only(&counts, &app.spec.source.topics)) {
            Ok(n) => match join_partitions(&app.spec, n, &counts).first() {
                Some(e) => {
                    problems.source = Some(Verdict::stalled(reason::of(e), e.to_string()));
                    None
                }
                None => Some(n),
            },
            Err(e) => {
                problems.source = Some(Verdict::stalled(reason::of(&e), e.to_string()));
                None
            }
        },
        Err(e) => {
            problems.kafka = Some(e);
            None
        }
    };
    problems.invalid = (!spec_errors.is_empty()).then(|| {
        let reason = reason::of(&spec_errors[0]);
        let msg = spec_errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        Verdict::stalled(reason, format!("invalid spec: {msg}"))
    });
    if let (None, Some((in_force, wanted))) = (&problems.invalid, app.application_id_change()) {
        problems.invalid = Some(Verdict::stalled(
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
        ResetPlan::Reset(stores) => resetting = problems.invalid.is_none().then_some(stores),
        ResetPlan::NotAllowed(missing) if problems.invalid.is_none() => {
            problems.invalid = Some(Verdict::stalled(
                reason::INCOMPATIBLE_STATE_CHANGE,
                oxbow_crds::layouts::message(&changes) + &reset::hint(app, &missing),
            ));
        }
        ResetPlan::NotAllowed(_) => {}
    }
    Validated {
        tasks,
        layouts,
        recorded,
        resetting,
    }
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

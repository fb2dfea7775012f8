//! The ownership step of a reconciliation: claim the application id on the app's Kafka
//! cluster before anything is rolled out, and say whether the rest of `apply` may act.
//! What the records mean is [`crate::ownership`]'s; they travel through [`crate::claims`].

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use oxbow_crds::StreamApp;

use super::apply::Problems;
use crate::claims::{Claims, ClaimsError};
use crate::ownership::{AppClaim, ClaimDecision, ClaimsView, Owner, app_key, decide_claim};
use crate::status::{Verdict, reason};

/// Whose the app's application id is.
#[derive(Debug)]
pub enum Ownership {
    /// This app owns it: the view is as of after its claim.
    Owned(ClaimsView),
    /// Another app owns it.
    Conflict(Owner),
    /// The claims could not be read or written (Kafka unreachable).
    Unknown(ClaimsError),
}

pub fn owner(app: &StreamApp) -> Owner {
    Owner {
        namespace: app.namespace().unwrap_or_default(),
        name: app.name_any(),
    }
}

/// What the ownership step decided.
pub(super) struct Owned {
    /// The claims as of after this app's claim; `None` when the id is not (known to be)
    /// this app's.
    pub view: Option<ClaimsView>,
    /// The stores to reset, once the claims say their changelogs are this app's.
    pub reset_stores: Option<Vec<String>>,
}

/// Claims the application id on the app's Kafka cluster, unless the spec cannot run or
/// Kafka is already known unreachable (`problems`, found before). The problems found: a
/// conflict or a refused reset makes the spec `invalid`; unreadable claims are `claims`,
/// an unreachable Kafka `kafka`. A reset is allowed only for this app's changelogs.
pub(super) async fn own(
    app: &StreamApp,
    cluster: Option<&super::Cluster>,
    resetting: Option<Vec<String>>,
    problems: &Problems,
) -> (Owned, Problems) {
    let mut found = Problems::default();
    let ownership = match cluster {
        Some(c) if problems.invalid.is_none() && problems.kafka.is_none() => {
            match c.ensure_claims_topic().await {
                Ok(()) => Some(claim(app, &c.claims).await),
                Err(e) => {
                    found.kafka = Some(e);
                    None
                }
            }
        }
        _ => None,
    };
    let view = match ownership {
        Some(Ownership::Owned(view)) => Some(view),
        Some(Ownership::Conflict(owner)) => {
            found.invalid = Some(Verdict::stalled(
                reason::APPLICATION_ID_CONFLICT,
                conflict_message(app, &owner),
            ));
            None
        }
        Some(Ownership::Unknown(e)) => {
            found.claims = Some(e);
            None
        }
        None => None,
    };
    // A reset deletes changelogs: only this app's, and only with the claims read.
    let mut resetting = resetting;
    if let (Some(stores), Some(v)) = (&resetting, &view)
        && let Some(why) = super::reset::refusal(app, v, stores)
    {
        found.invalid = Some(Verdict::stalled(reason::INCOMPATIBLE_STATE_CHANGE, why));
        resetting = None;
    }
    let reset_stores = resetting.filter(|_| view.is_some());
    (Owned { view, reset_stores }, found)
}

/// Reads the claims and, when nobody claims the id, claims it and reads again: the first
/// claim in the log wins a race between two operators, and the loser takes its own back.
pub async fn claim(app: &StreamApp, claims: &Arc<Claims>) -> Ownership {
    let id = app.application_id();
    let me = owner(app);
    // Twice at most: claim, then read the outcome.
    for _ in 0..2 {
        let view = match claims.view().await {
            Ok(v) => v,
            Err(e) => return Ownership::Unknown(e),
        };
        match decide_claim(&view, &id, &me) {
            ClaimDecision::Owned => return Ownership::Owned(view),
            ClaimDecision::Conflict { owner, withdraw } => {
                if withdraw && let Err(e) = claims.write(&app_key(&id, &me), None).await {
                    // The next reconciliation tries again; the claim loses either way.
                    tracing::warn!(error = %e, "failed to take back a claim that lost");
                }
                return Ownership::Conflict(owner);
            }
            ClaimDecision::Claim => {
                let value = serde_json::to_vec(&AppClaim {
                    application_id: id.clone(),
                    namespace: me.namespace.clone(),
                    name: me.name.clone(),
                    claimed_at: Timestamp::now().to_string(),
                })
                .expect("a claim serializes");
                if let Err(e) = claims.write(&app_key(&id, &me), Some(&value)).await {
                    return Ownership::Unknown(e);
                }
                tracing::info!(application_id = %id, topic = claims.topic(), "claimed the application id");
            }
        }
    }
    Ownership::Unknown(ClaimsError::NotReadBack {
        topic: claims.topic().into(),
        key: app_key(&id, &me),
    })
}

/// Takes back the app's claim on its id (deletion). A claim it does not hold is left.
pub async fn release(
    app: &StreamApp,
    claims: &Claims,
    view: &ClaimsView,
) -> Result<(), ClaimsError> {
    let id = app.application_id();
    let me = owner(app);
    if view.has_claim(&id, &me) {
        claims.write(&app_key(&id, &me), None).await?;
    }
    Ok(())
}

/// The message of an `ApplicationIdConflict`.
pub fn conflict_message(app: &StreamApp, owner: &Owner) -> String {
    format!(
        "applicationId {} is owned by StreamApp {owner} on this Kafka cluster: two apps with one id would share changelogs, the consumer group and transactional ids; set spec.applicationId to an id of its own",
        app.application_id()
    )
}

//! Deletion of a StreamApp: stop the workers, then delete what `deletionPolicy` says and
//! only what the claims record as this app's, then release the application id. Bounded
//! by the cleanup timeout, so a terminating namespace is never wedged.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use oxbow_crds::{Retention, StreamApp};

use super::claim::{self, owner};
use super::{Context, Error, EventReason, kafka_secret, write_status};
use crate::build;
use crate::ownership::topic_key;
use crate::status::{self, reason};

/// What deletion did, for the event.
struct Done {
    topics: usize,
    group: bool,
}

/// What is not done yet in a deletion's cleanup, with the failure that stopped it; the
/// caller retries until the cleanup timeout.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("failed to delete the worker StatefulSet: {0}")]
    DeleteWorkers(#[source] kube::Error),
    #[error("failed to list worker pods: {0}")]
    ListPods(#[source] kube::Error),
    #[error("waiting for {0} worker pods to stop")]
    WorkersRunning(usize),
    /// Reading the Kafka Secret, or a client refused for its configuration.
    #[error(transparent)]
    Kafka(Box<Error>),
    #[error(transparent)]
    Topics(#[from] crate::topics::TopicError),
    #[error(transparent)]
    Claims(#[from] crate::claims::ClaimsError),
}

impl From<Error> for CleanupError {
    fn from(e: Error) -> Self {
        CleanupError::Kafka(Box::new(e))
    }
}

/// `Err` says what is not done yet; the caller retries until the cleanup timeout.
async fn cleanup_steps(app: &StreamApp, ctx: &Context) -> Result<Done, CleanupError> {
    let policy = &app.spec.deletion_policy;
    // Workers first: a consumer group with live members cannot be deleted, running
    // producers must not write to topics being deleted, and the id is released only
    // once nothing of this app uses it.
    let ns = app.namespace().unwrap_or_default();
    let sts_api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    match sts_api
        .delete(&app.worker_name(), &DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(CleanupError::DeleteWorkers(e)),
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let running = pods
        .list(&ListParams::default().labels(&build::selector_string(app)))
        .await
        .map_err(CleanupError::ListPods)?
        .items
        .len();
    if running > 0 {
        return Err(CleanupError::WorkersRunning(running));
    }
    let secret = kafka_secret(app, ctx).await?.unwrap_or_default();
    let cluster = ctx.cluster(app, &secret.properties)?;
    cluster.ensure_claims_topic().await?;
    let view = cluster.claims.view().await?;
    let id = app.application_id();
    let me = owner(app);
    let mut done = Done {
        topics: 0,
        group: false,
    };
    if policy.topics == Retention::Delete {
        // Only what was created or adopted for this app: never a source, a sink, a
        // named errors topic or another app's changelog.
        let names = view.topics_of(&id, &me);
        if !names.is_empty() {
            cluster.admin.delete_topics(&names).await?;
            for t in &names {
                cluster.claims.write(&topic_key(t), None).await?;
            }
        }
        done.topics = names.len();
    }
    if policy.consumer_group == Retention::Delete {
        let others = view.other_claimants(&id, &me);
        if others.is_empty() {
            cluster.admin.delete_group(&app.consumer_group()).await?;
            done.group = true;
        } else {
            tracing::info!(group = %app.consumer_group(), claimed_by = ?others, "kept the consumer group: another app claims it");
        }
    }
    claim::release(app, &cluster.claims, &view).await?;
    Ok(done)
}

/// Cleanup before deletion, per `deletionPolicy`, bounded by `cleanup_timeout`.
pub async fn cleanup(app: &StreamApp, ctx: &Context) -> Result<Action, Error> {
    let policy = &app.spec.deletion_policy;
    let mut work = vec!["release the application id"];
    if policy.topics == Retention::Delete {
        work.push("topics");
    }
    if policy.consumer_group == Retention::Delete {
        work.push("consumer group");
    }
    // Every failure below goes through the timeout check: nothing may wedge deletion.
    let why = match cleanup_steps(app, ctx).await {
        Ok(done) => {
            let mut what = vec![format!("released applicationId {}", app.application_id())];
            if policy.topics == Retention::Delete {
                what.push(format!(
                    "deleted {} topics recorded for this app",
                    done.topics
                ));
            }
            if done.group {
                what.push(format!("deleted consumer group {}", app.consumer_group()));
            }
            ctx.event(
                app,
                EventType::Normal,
                EventReason::CleanedUp.as_str(),
                format!("{} per deletionPolicy", what.join(", ")),
            )
            .await;
            return Ok(Action::await_change());
        }
        Err(why) => why,
    };
    let deleting_since = app
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now);
    let waited = Timestamp::now().duration_since(deleting_since);
    if (waited.as_secs().max(0) as u64) < ctx.cleanup_timeout.as_secs() {
        return Err(Error::Cleanup(why));
    }
    // Never wedge a terminating namespace: say what was left behind, then let go.
    let msg = format!(
        "gave up after {}s ({}), letting the StreamApp go; remove what is left by hand (docs/operations.md): {why}",
        ctx.cleanup_timeout.as_secs(),
        work.join(", "),
    );
    ctx.event(
        app,
        EventType::Warning,
        EventReason::CleanupTimedOut.as_str(),
        msg.clone(),
    )
    .await;
    let mut st = app.status.clone().unwrap_or_default();
    st.conditions
        .retain(|c| c.type_ != status::ConditionType::Stalled.as_str());
    st.conditions
        .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: status::ConditionType::Stalled.as_str().into(),
            status: status::ConditionStatus::True.as_str().into(),
            reason: reason::CLEANUP_TIMED_OUT.as_str().into(),
            message: msg,
            observed_generation: app.metadata.generation,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now(),
            ),
        });
    let _ = write_status(ctx, app, &st).await;
    Ok(Action::await_change())
}

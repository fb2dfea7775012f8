//! The topics step of a reconciliation: for each changelog, repartition and dead-letter
//! topic the spec wants, decide whose it is ([`crate::ownership`]), record the ones the
//! operator creates or adopts, then create, grow and correct only those. A topic that is
//! not the app's is left untouched and reported.

use kube::runtime::events::EventType;
use oxbow_crds::{DriftPolicy, StreamApp, StreamAppStatus, TopicStatus};

use super::apply::Problems;
use super::claim::owner;
use super::{Cluster, Context, Error, EventReason};
use crate::ownership::{ClaimsView, TopicFacts, TopicOwnership, TopicRecord, topic_key};
use crate::status::{Verdict, reason};
use crate::topics::{self, Role, TopicAction};

/// What the topics step found.
pub struct TopicsOutcome {
    pub statuses: Vec<TopicStatus>,
    /// One line per topic that exists but is not the app's.
    pub not_owned: Vec<String>,
}

/// The topics step's verdict, and what it recorded.
pub(super) struct TopicsStep {
    pub verdict: Verdict,
    pub statuses: Vec<TopicStatus>,
    /// Every wanted topic is recorded as the app's (an app from an operator that kept
    /// no records is adopted).
    pub recorded: bool,
}

/// The topics step: once the task count is known and the id is this app's, before the
/// workload (pods must never write to a topic that is not the app's). Otherwise the
/// verdict says what it waits for. The problem found: a Kafka or claims failure here
/// (`kafka`, `claims`).
pub(super) async fn step(
    app: &StreamApp,
    ctx: &Context,
    cluster: Option<&Cluster>,
    view: Option<&ClaimsView>,
    tasks: Option<i32>,
    resetting: bool,
    problems: &Problems,
) -> Result<(TopicsStep, Problems), Error> {
    let mut found = Problems::default();
    let mut statuses = Vec::new();
    let mut recorded = false;
    let verdict = if let Some(e) = &problems.kafka {
        Verdict::waiting(reason::of_topics(e), e.to_string())
    } else if let Some(e) = &problems.claims {
        Verdict::waiting(reason::KAFKA_UNREACHABLE, e.to_string())
    } else if let Some(p) = &problems.source {
        p.clone()
    } else if problems.invalid.is_some() {
        Verdict::waiting(
            reason::SPEC_INVALID,
            "topics are not reconciled while the spec is invalid or the applicationId is not this app's",
        )
    } else if resetting {
        // Re-created empty by the first reconciliation after the reset.
        statuses = app.status.clone().unwrap_or_default().topics;
        Verdict::waiting(
            reason::RESETTING_STATE,
            "the changelogs of the stores being reset are re-created once the workers have stopped",
        )
    } else if let (Some(tasks), Some(c), Some(view)) = (tasks, cluster, view) {
        match reconcile(app, c, view, tasks, ctx).await {
            Ok(outcome) => {
                statuses = outcome.statuses;
                if outcome.not_owned.is_empty() {
                    recorded = true;
                    crate::status::topics_verdict(&statuses)
                } else {
                    Verdict::stalled(reason::TOPIC_NOT_OWNED, outcome.not_owned.join("; "))
                }
            }
            Err(Error::Topics(e)) => {
                let v = Verdict::waiting(reason::of_topics(&e), e.to_string());
                found.kafka = Some(e);
                v
            }
            Err(Error::Claims(e)) => {
                let v = Verdict::waiting(reason::KAFKA_UNREACHABLE, e.to_string());
                found.claims = Some(e);
                v
            }
            Err(e) => return Err(e),
        }
    } else {
        Verdict::waiting(
            reason::TASKS_UNKNOWN,
            "source partition counts are not known yet",
        )
    };
    let step = TopicsStep {
        verdict,
        statuses,
        recorded,
    };
    Ok((step, found))
}

/// Whether the app was last reconciled by an operator that kept no topic records: its
/// status lists topics but records no application id.
pub fn legacy(previous: &StreamAppStatus) -> bool {
    previous.observed_generation.is_some() && previous.application_id.is_none()
}

/// Topics: record, then create what is missing, grow partitions, correct or report drift.
pub async fn reconcile(
    app: &StreamApp,
    cluster: &Cluster,
    view: &ClaimsView,
    tasks: i32,
    ctx: &Context,
) -> Result<TopicsOutcome, Error> {
    let admin = &cluster.admin;
    let id = app.application_id();
    let me = owner(app);
    let previous = app.status.clone().unwrap_or_default();
    let wanted = topics::wanted_topics(app, tasks);
    let actual = admin.describe(&wanted).await?;
    let mut statuses = Vec::new();
    let mut not_owned = Vec::new();
    for w in &wanted {
        let a = actual.get(&w.name);
        let facts = TopicFacts {
            exists: a.is_some(),
            user_named: w.role == Role::DeadLetter && app.spec.errors.topic.is_some(),
            adopt: app.spec.adopt_existing_topics,
            legacy: legacy(&previous) && previous.topics.iter().any(|t| t.name == w.name),
        };
        let ownership = crate::ownership::topic_ownership(view.topic(&w.name), &id, &me, facts);
        let policy = match ownership {
            TopicOwnership::NotOwned { owner } => {
                let whose = match owner {
                    Some(o) => format!("it was created for StreamApp {o}"),
                    None => "Oxbow did not create it for this app".into(),
                };
                let msg = format!(
                    "topic {} exists but {whose}; it is left untouched: delete it, give this app another applicationId, or set spec.adoptExistingTopics: true to take over a topic no other app records",
                    w.name
                );
                let mut st = topics::topic_status(w, a, &topics::plan(w, a, DriftPolicy::Report));
                st.ready = false;
                st.message = Some(msg.clone());
                statuses.push(st);
                not_owned.push(msg);
                continue;
            }
            // The user's topic: created when missing, never altered.
            TopicOwnership::User => DriftPolicy::Report,
            TopicOwnership::Ours => app.spec.drift_policy,
            TopicOwnership::Create | TopicOwnership::Adopt => {
                // Recorded before it is created or changed: a crash in between leaves a
                // record of a topic that is missing, never an unrecorded topic of ours.
                let record = TopicRecord {
                    application_id: id.clone(),
                    namespace: me.namespace.clone(),
                    name: me.name.clone(),
                    adopted: ownership == TopicOwnership::Adopt,
                };
                let value = serde_json::to_vec(&record).expect("a record serializes");
                cluster
                    .claims
                    .write(&topic_key(&w.name), Some(&value))
                    .await?;
                if ownership == TopicOwnership::Adopt {
                    tracing::info!(topic = %w.name, "adopted an existing topic");
                }
                app.spec.drift_policy
            }
        };
        let plan = topics::plan(w, a, policy);
        let mut st = topics::topic_status(w, a, &plan);
        for action in &plan.actions {
            if let Some(message) = carry_out(app, admin, w, action, ctx).await? {
                st.message = Some(message);
            }
        }
        statuses.push(st);
    }
    Ok(TopicsOutcome {
        statuses,
        not_owned,
    })
}

/// Creates, grows or corrects one topic as planned, with an event; what it did, for the
/// topic's status message.
async fn carry_out(
    app: &StreamApp,
    admin: &topics::KafkaAdmin,
    w: &topics::WantedTopic,
    action: &TopicAction,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let (reason, event, message) = match action {
        TopicAction::None => return Ok(None),
        TopicAction::Create => {
            admin.create(w).await?;
            (
                EventReason::TopicCreated,
                format!("created topic {} with {} partitions", w.name, w.partitions),
                "created".to_string(),
            )
        }
        TopicAction::AddPartitions(n) => {
            admin.add_partitions(&w.name, *n).await?;
            (
                EventReason::TopicPartitionsAdded,
                format!("topic {} grown to {n} partitions", w.name),
                format!("grown to {n} partitions"),
            )
        }
        TopicAction::AlterConfigs(cfg) => {
            admin.alter_configs(&w.name, cfg).await?;
            let what = cfg
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ");
            (
                EventReason::TopicConfigCorrected,
                format!("topic {}: set {what}", w.name),
                format!("corrected {what}"),
            )
        }
    };
    ctx.event(app, EventType::Normal, reason.as_str(), event)
        .await;
    Ok(Some(message))
}

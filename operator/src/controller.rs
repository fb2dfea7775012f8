//! The StreamApp controller: a thin `reconcile` (span, metrics timer, finalizer) around
//! [`apply`] and [`cleanup`], which run in steps: dereference (reads) → validate (pure)
//! → build (pure) → apply children and topics (writes, in a commented order) → status.
//!
//! The folder, one step a file:
//! - `dereference`: the Kafka Secret and the worker pods (reads);
//! - `claim`: the application id on the claims topic; `reset`: `oxbow.dev/reset`;
//! - `internal_topics`: changelog, repartition and dead-letter topics;
//! - `children`: server-side apply of every child in order, and pruning;
//! - `pod_creation`: why the StatefulSet controller cannot create pods;
//! - `status_write`: the status, `status.instances` and the workers' notices;
//! - `cleanup`: deletion under `deletionPolicy`;
//! - `watches`: the watches and stores that drive [`reconcile`].

mod children;
mod claim;
mod cleanup;
mod dereference;
mod internal_topics;
mod pod_creation;
mod reset;
mod status_write;
mod watches;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Resource, ResourceExt};
use oxbow_crds::assignment::Params;
use oxbow_crds::validate::{join_partitions, task_count, validate_app};
use oxbow_crds::{StreamApp, StreamAppStatus};

use crate::build::{self, BuildContext, BuildError};
use crate::claims::{Claims, ClaimsError};
use crate::metrics::Metrics;
use crate::placement::{self, PlacementConfig, Plan};
use crate::status::{self, ConditionType, StatusInput, Verdict, WorkloadFacts, reason};
use crate::topics::{KafkaAdmin, TopicError};
use children::{apply_children, short_kind, ssa};
use claim::Ownership;
pub use dereference::KafkaSecret;
use dereference::{kafka_secret, worker_pods};
use reset::ResetPlan;
use status_write::{publish_reports, write_status};
pub use watches::run;

pub const FINALIZER: &str = "oxbow.dev/cleanup";
pub const FIELD_MANAGER: &str = "oxbow-operator";

/// Each reconciliation in flight holds its own HTTP/1 connection to the API server, and
/// the pool keeps it with its TLS state and buffers, so the bound is on memory as much as
/// on load; 16 keeps up with a burst of apps (docs/benchmarks.md, "Tuning evidence").
const MAX_CONCURRENT_RECONCILES: u16 = 16;

/// The reasons of the events the operator emits: the variant's name is the reason. A
/// test holds [`EventReason::VARIANTS`] against docs/streamapp.md. Besides these, an
/// app that stalls gets a Warning whose reason is the `Stalled` condition's (see
/// [`status::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
pub enum EventReason {
    TopicCreated,
    TopicPartitionsAdded,
    TopicConfigCorrected,
    Ready,
    NotReady,
    CleanedUp,
    CleanupTimedOut,
    StateReset,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Errors of one reconciliation. The variant name is the metric label (no event is
/// emitted for them: the status conditions say what is wrong).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum Error {
    #[error("failed to apply {kind} {name}: {source}")]
    ApplyChild {
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("failed to read {what}: {source}")]
    ReadCluster { what: String, source: kube::Error },
    #[error("failed to prune {kind} {name}: {source}")]
    PruneChild {
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("failed to write status: {0}")]
    WriteStatus(#[source] kube::Error),
    #[error(transparent)]
    BuildChildren(#[from] BuildError),
    #[error(transparent)]
    Topics(#[from] TopicError),
    #[error(transparent)]
    Claims(#[from] ClaimsError),
    #[error("failed to clean up before deletion: {0}")]
    Cleanup(String),
    /// The finalizer's own step failed (adding or removing it), not apply or cleanup.
    #[error("failed to run the finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("failed to remove the oxbow.dev/reset annotation: {0}")]
    ResetAnnotation(#[source] kube::Error),
    /// No client is built from a configuration that would load code or read files.
    #[error("{}", refused.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; "))]
    RefusedProperties {
        refused: Vec<oxbow_crds::kafka_properties::Refused>,
    },
}

impl Error {
    /// The variant's name, but a Kafka connection problem is labelled with its condition
    /// reason (`KafkaUnreachable`, `KafkaAuthenticationFailed`, `KafkaTlsFailed`), so a
    /// dashboard tells an unreachable cluster from a refused topic operation.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Topics(
                e @ (TopicError::KafkaUnreachable { .. }
                | TopicError::KafkaAuthentication { .. }
                | TopicError::KafkaTls { .. }),
            ) => crate::status::reason::of_topics(e).as_str(),
            other => other.into(),
        }
    }
}

pub struct Context {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    pub build: BuildContext,
    pub recorder: Recorder,
    /// How long deletion may wait for Kafka cleanup before letting go.
    pub cleanup_timeout: Duration,
    /// How often a Ready app is looked at again. Kafka sends no watch events, so this
    /// bounds how long topic drift or a deleted topic goes unnoticed.
    pub resync: Duration,
    /// Failover timeout and warm-up bound of task placement.
    pub placement: PlacementConfig,
    /// The compacted topic, in each Kafka cluster, that records who owns which
    /// application id and topic ([`crate::ownership`]).
    pub claims_topic: String,
    /// Kafka clients per cluster and credentials, dropped with their last app.
    clusters: Mutex<crate::client_cache::ClientCache<Arc<Cluster>>>,
    failures: Mutex<HashMap<ObjectRef<StreamApp>, u32>>,
    /// Every worker pod's report Lease, kept by the controller's watch ([`run`]).
    reports: std::sync::OnceLock<reflector::Store<Lease>>,
    /// Every worker pod, kept by the controller's pod watch ([`run`]).
    pods: std::sync::OnceLock<reflector::Store<Pod>>,
    /// When each app's `status.instances` were last written.
    instances_schedule: crate::reports::Schedule,
    /// When each report Lease's renewal last changed, by this operator's clock.
    renewals: crate::reports::Renewals,
    /// Per worker pod, the newest notice already published as an Event.
    notices_published: Mutex<HashMap<String, String>>,
    /// What was last applied to each child, to skip applies that change nothing.
    applied: crate::applied::Applied,
    /// The last read of each StatefulSet's pod-creation events.
    event_reads: pod_creation::EventReads,
}

impl Context {
    pub fn new(
        client: kube::Client,
        build: BuildContext,
        cleanup_timeout: Duration,
        resync: Duration,
        placement: PlacementConfig,
        identity: &str,
    ) -> Self {
        let reporter = Reporter {
            controller: "oxbow-operator".into(),
            instance: Some(identity.into()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics: Arc::new(Metrics::default()),
            build,
            cleanup_timeout,
            resync,
            placement,
            claims_topic: crate::ownership::DEFAULT_CLAIMS_TOPIC.into(),
            clusters: Mutex::default(),
            failures: Mutex::default(),
            reports: std::sync::OnceLock::new(),
            pods: std::sync::OnceLock::new(),
            instances_schedule: crate::reports::Schedule::default(),
            notices_published: Mutex::default(),
            renewals: crate::reports::Renewals::default(),
            applied: crate::applied::Applied::default(),
            event_reads: pod_creation::EventReads::default(),
        }
    }

    /// One set of clients per Kafka cluster and client configuration, reused. `secret`
    /// holds the properties of `spec.kafka.secretRef`, read beforehand.
    fn cluster(
        &self,
        app: &StreamApp,
        secret: &BTreeMap<String, String>,
    ) -> Result<Arc<Cluster>, Error> {
        let k = &app.spec.kafka;
        let secret_name = k.secret_ref.as_ref().map(|r| r.name.as_str());
        let refused =
            oxbow_crds::kafka_properties::refused(&k.properties, secret, secret_name.unwrap_or(""));
        if !refused.is_empty() {
            return Err(Error::RefusedProperties { refused });
        }
        let mut properties = k.properties.clone();
        properties.extend(secret.clone());
        // librdkafka quotes a refused value in its error: remember the secrets first.
        oxbow_crds::redact::Redactor::new(&properties, secret.keys()).remember();
        let key = format!("{}|{:?}", k.bootstrap_servers, properties);
        let mut clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        clusters.get(&app_key(app), &key, || {
            Ok(Arc::new(Cluster {
                admin: KafkaAdmin::new(&k.bootstrap_servers, &properties)?,
                claims: Arc::new(Claims::new(
                    &self.claims_topic,
                    &k.bootstrap_servers,
                    &properties,
                )?),
                claims_topic_ready: AtomicBool::new(false),
            }))
        })
    }

    /// The app is gone: its Kafka clients go too, unless another app uses them.
    fn forget_cluster(&self, app: &StreamApp) {
        self.clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&app_key(app));
    }

    async fn event(&self, app: &StreamApp, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(oxbow_crds::redact::scrub(&note)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &app.object_ref(&())).await {
            tracing::warn!(error = %e, "failed to publish event");
        }
    }
}

/// The clients of one Kafka cluster.
pub struct Cluster {
    pub admin: KafkaAdmin,
    pub claims: Arc<Claims>,
    claims_topic_ready: AtomicBool,
}

impl Cluster {
    /// Creates the claims topic unless this operator already saw it.
    async fn ensure_claims_topic(&self) -> Result<(), TopicError> {
        if self.claims_topic_ready.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.admin
            .create(&crate::claims::wanted(self.claims.topic()))
            .await?;
        self.claims_topic_ready.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// `namespace/name`: an app's key in the client cache.
fn app_key(app: &StreamApp) -> String {
    format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any())
}

/// Thin: span, metrics timer, finalizer.
#[tracing::instrument(skip_all, fields(streamapp = %app.name_any(), namespace = ?app.namespace()))]
pub async fn reconcile(app: Arc<StreamApp>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start();
    let ns = app.namespace().unwrap_or_default();
    let api: Api<StreamApp> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, app.clone(), |event| async {
        match event {
            Finalizer::Apply(app) => apply(&app, &ctx).await,
            Finalizer::Cleanup(app) => {
                let done = cleanup::cleanup(&app, &ctx).await;
                if done.is_ok() {
                    ctx.forget_cluster(&app);
                }
                done
            }
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(Box::new(other)),
    });
    if result.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ObjectRef::from_obj(&*app));
    }
    result
}

/// How often an unfinished cleanup is tried again (until the cleanup timeout).
const CLEANUP_RETRY: Duration = Duration::from_secs(5);

/// Transient errors requeue with exponential back-off per object (5 s … 5 min); a
/// deleting app's cleanup every [`CLEANUP_RETRY`].
pub fn error_policy(app: Arc<StreamApp>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(err.metric_label());
    // A deletion's cleanup is retried on its own short schedule until the cleanup
    // timeout: an app that failed for long before (wrong credentials) has backed off
    // for minutes, and the timeout must still end its deletion on time.
    if app.metadata.deletion_timestamp.is_some() {
        tracing::warn!(streamapp = %app.name_any(), error = %err, retry_in = ?CLEANUP_RETRY, "cleanup not done yet");
        return Action::requeue(CLEANUP_RETRY);
    }
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(ObjectRef::from_obj(&*app)).or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_secs(5u64.saturating_mul(1u64 << (*n - 1).min(6)))
        .min(Duration::from_secs(300));
    tracing::warn!(streamapp = %app.name_any(), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// `sts_replicas`: the size the StatefulSet should have (above `spec.replicas` while
/// pods drain); `pods`: the worker pods that exist.
fn workload_facts(
    app: &StreamApp,
    sts: Option<&StatefulSet>,
    sts_replicas: i32,
    pods: &[placement::PodObservation],
    create_failure: Option<String>,
) -> WorkloadFacts {
    let draining = (sts_replicas - app.spec.replicas).max(0);
    // The StatefulSet's status may still count a pod it is removing as ready.
    let stopping = pods.iter().filter(|p| p.ordinal >= sts_replicas).count();
    let stopping = i32::try_from(stopping).unwrap_or(i32::MAX);
    let Some(sts) = sts else {
        return WorkloadFacts {
            want_replicas: app.spec.replicas,
            draining,
            stopping,
            ..Default::default()
        };
    };
    let st = sts.status.clone().unwrap_or_default();
    let generation_seen =
        st.observed_generation.unwrap_or(0) >= sts.metadata.generation.unwrap_or(0);
    let revisions_match =
        st.current_revision.is_some() && st.current_revision == st.update_revision;
    let spec_replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    WorkloadFacts {
        exists: true,
        want_replicas: app.spec.replicas,
        replicas: st.replicas,
        ready_replicas: st.ready_replicas.unwrap_or(0),
        updated_replicas: st.updated_replicas.unwrap_or(0),
        rolled_out: generation_seen && revisions_match && spec_replicas == sts_replicas,
        draining,
        stopping,
        create_failure,
    }
}

/// Apply: the whole reconciliation of a live StreamApp. Idempotent.
async fn apply(app: &StreamApp, ctx: &Context) -> Result<Action, Error> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();

    // --- dereference: everything we need to read, before deciding anything.
    let secret = kafka_secret(app, ctx).await?;
    let mut source_problem = None;
    // A client config librdkafka refuses (a misspelt property) is a spec problem.
    let no_secret = KafkaSecret::default();
    let cluster = match ctx.cluster(app, &secret.as_ref().unwrap_or(&no_secret).properties) {
        Ok(c) => Some(c),
        Err(e) => {
            let reason = match e {
                Error::RefusedProperties { .. } => reason::KAFKA_PROPERTY_REFUSED,
                _ => reason::INVALID_KAFKA_PROPERTIES,
            };
            source_problem = Some(Verdict::stalled(reason, e.to_string()));
            None
        }
    };
    // The sources, the tables and joined streams: all but global tables are co-partitioned.
    let mut read_topics = app.spec.source.topics.clone();
    read_topics.extend(oxbow_crds::validate::join_topics(&app.spec));
    let source_counts = match &cluster {
        Some(c) => c.admin.partition_counts(&read_topics).await,
        None => Ok(BTreeMap::new()),
    };
    let sts_api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let sts = sts_api
        .get_opt(&name)
        .await
        .map_err(|source| Error::ReadCluster {
            what: "StatefulSet".into(),
            source,
        })?;
    let pods = worker_pods(app, ctx).await?;
    let cm_api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let assignment_cm = cm_api
        .get_opt(&app.assignment_config_map_name())
        .await
        .map_err(|source| Error::ReadCluster {
            what: format!("ConfigMap {}", app.assignment_config_map_name()),
            source,
        })?;

    // --- validate (pure).
    let spec_errors = validate_app(app);
    let mut kafka_error = None;
    if let (None, Some(r)) = (&secret, &app.spec.kafka.secret_ref) {
        source_problem = Some(Verdict::stalled(
            reason::KAFKA_SECRET_MISSING,
            format!(
                "Secret {} named by spec.kafka.secretRef does not exist",
                r.name
            ),
        ));
    }
    let tasks = match source_counts {
        Ok(_) if source_problem.is_some() => None,
        Ok(counts) => match task_count(&source_only(&counts, &app.spec.source.topics)) {
            Ok(n) => match join_partitions(&app.spec, n, &counts).first() {
                Some(e) => {
                    source_problem = Some(Verdict::stalled(reason::of(e), e.to_string()));
                    None
                }
                None => Some(n),
            },
            Err(e) => {
                source_problem = Some(Verdict::stalled(reason::of(&e), e.to_string()));
                None
            }
        },
        Err(e) => {
            kafka_error = Some(e);
            None
        }
    };
    let mut invalid = (!spec_errors.is_empty()).then(|| {
        let reason = reason::of(&spec_errors[0]);
        let msg = spec_errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        Verdict::stalled(reason, format!("invalid spec: {msg}"))
    });
    if let (None, Some((in_force, wanted))) = (&invalid, app.application_id_change()) {
        invalid = Some(Verdict::stalled(
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
        ResetPlan::Reset(stores) => resetting = invalid.is_none().then_some(stores),
        ResetPlan::NotAllowed(missing) if invalid.is_none() => {
            invalid = Some(Verdict::stalled(
                reason::INCOMPATIBLE_STATE_CHANGE,
                oxbow_crds::layouts::message(&changes) + &reset::hint(app, &missing),
            ));
        }
        ResetPlan::NotAllowed(_) => {}
    }

    // --- own: claim the application id on this Kafka cluster before anything is rolled
    // out. Two apps with one id would share changelogs, group and transactional ids.
    let mut claims_error = None;
    let ownership = match &cluster {
        Some(c) if invalid.is_none() && kafka_error.is_none() => {
            match c.ensure_claims_topic().await {
                Ok(()) => Some(claim::claim(app, &c.claims).await),
                Err(e) => {
                    kafka_error = Some(e);
                    None
                }
            }
        }
        _ => None,
    };
    let view = match ownership {
        Some(Ownership::Owned(view)) => Some(view),
        Some(Ownership::Conflict(owner)) => {
            invalid = Some(Verdict::stalled(
                reason::APPLICATION_ID_CONFLICT,
                claim::conflict_message(app, &owner),
            ));
            None
        }
        Some(Ownership::Unknown(e)) => {
            if kafka_error.is_none() {
                claims_error = Some(e);
            }
            None
        }
        None => None,
    };
    // A reset deletes changelogs: only this app's, and only with the claims read.
    if let (Some(stores), Some(v)) = (&resetting, &view)
        && let Some(why) = reset::refusal(app, v, stores)
    {
        invalid = Some(Verdict::stalled(reason::INCOMPATIBLE_STATE_CHANGE, why));
        resetting = None;
    }
    let reset_stores = resetting.as_ref().filter(|_| view.is_some());

    // --- place (pure): who runs which task, and how large the StatefulSet must stay.
    let previous = app.status.clone().unwrap_or_default();
    // The pods' own reports (their Leases), not status.instances: that is only the
    // operator's aggregate of them, written on a bounded schedule.
    let mut reports = ctx
        .reports
        .get()
        .map(|store| crate::reports::of_app(store, &ns, &app.name_any()))
        .unwrap_or_default();
    // Judged by this operator's clock, not the pods' (see `Renewals`).
    let seen_at = std::time::Instant::now();
    crate::reports::judged_locally(
        &mut reports,
        |pod| {
            let key = format!("{ns}/{}", oxbow_crds::report::lease_name(pod));
            ctx.renewals.age(&key, seen_at)
        },
        Timestamp::now(),
    );
    let reported: Vec<oxbow_crds::InstanceStatus> =
        reports.values().map(|r| r.entry.clone()).collect();
    let now = Timestamp::now();
    let observed: Vec<placement::PodObservation> = pods
        .iter()
        .filter_map(|p| placement::observe(&app.worker_name(), p))
        .collect();
    let facts = placement::pod_facts(
        &observed,
        &reported,
        app.spec.replicas,
        now,
        ctx.placement.failover_timeout,
    );
    let published = placement::published(assignment_cm.as_ref()).unwrap_or_else(|why| {
        // Edited by hand: placement starts over from what the workers report.
        tracing::warn!(configmap = %app.assignment_config_map_name(), %why, "ignoring an unreadable assignment");
        None
    });
    // The task count in force: it fixes which keys each task's state holds. A source that
    // gained partitions would move keys to tasks that start empty: stall instead.
    let published_tasks = published.as_ref().and_then(published_task_count);
    if let (Some(n), Some(had), None) = (tasks, published_tasks, &source_problem)
        && n != had
    {
        source_problem = Some(Verdict::stalled(
            reason::SOURCE_PARTITIONS_CHANGED,
            format!(
                "the source topics have {n} partitions but the app's state is split into {had} tasks: records of a key would go to a task that does not hold its state. Either restore {had} partitions (re-create the source topics), or start over with the new partitioning under a new StreamApp (another applicationId; it reprocesses the sources), then delete this one"
            ),
        ));
    }
    // Without the source metadata (Kafka or its Secret unreachable, or the partitions
    // changed), placement goes on with the published task count: a dead pod's tasks
    // still fail over.
    let place_tasks = match &source_problem {
        None => tasks.or(published_tasks),
        Some(p)
            if p.reason == reason::SOURCE_PARTITIONS_CHANGED
                || p.reason == reason::KAFKA_SECRET_MISSING =>
        {
            published_tasks
        }
        Some(_) => None,
    };
    let plan: Option<Plan> = match place_tasks {
        Some(n) if invalid.is_none() => Some(placement::plan(
            published.as_ref(),
            &facts,
            &reported,
            Params {
                tasks: u32::try_from(n).unwrap_or(0),
                stages: oxbow_crds::topology::Topology::of(&app.application_id(), &app.spec)
                    .stage_count(),
                standby_replicas: u32::try_from(app.spec.standby_replicas).unwrap_or(0),
                warmup_max_lag: ctx.placement.warmup_max_lag,
            },
        )),
        _ => None,
    };
    let wanted = plan.as_ref().map(|p| &p.assignment).or(published.as_ref());
    // A reset stops every worker before the changelogs it would write are deleted.
    let sts_replicas = if reset_stores.is_some() {
        0
    } else {
        placement::stateful_set_replicas(
            app.spec.replicas,
            &app.worker_name(),
            wanted,
            &facts,
            &reported,
        )
    };

    // --- topics (once the task count is known and the id is this app's), before the
    // workload: pods must never write to a topic that is not the app's.
    let mut topic_statuses = Vec::new();
    let mut topics_recorded = false;
    let topics_verdict = if let Some(e) = &kafka_error {
        Verdict::waiting(reason::of_topics(e), e.to_string())
    } else if let Some(e) = &claims_error {
        Verdict::waiting(reason::KAFKA_UNREACHABLE, e.to_string())
    } else if let Some(p) = &source_problem {
        p.clone()
    } else if invalid.is_some() {
        Verdict::waiting(
            reason::SPEC_INVALID,
            "topics are not reconciled while the spec is invalid or the applicationId is not this app's",
        )
    } else if reset_stores.is_some() {
        // Re-created empty by the first reconciliation after the reset.
        topic_statuses = previous.topics.clone();
        Verdict::waiting(
            reason::RESETTING_STATE,
            "the changelogs of the stores being reset are re-created once the workers have stopped",
        )
    } else if let (Some(tasks), Some(c), Some(view)) = (tasks, &cluster, &view) {
        match internal_topics::reconcile(app, c, view, tasks, ctx).await {
            Ok(outcome) => {
                topic_statuses = outcome.statuses;
                if outcome.not_owned.is_empty() {
                    topics_recorded = true;
                    status::topics_verdict(&topic_statuses)
                } else {
                    Verdict::stalled(reason::TOPIC_NOT_OWNED, outcome.not_owned.join("; "))
                }
            }
            Err(Error::Topics(e)) => {
                let v = Verdict::waiting(reason::of_topics(&e), e.to_string());
                kafka_error = Some(e);
                v
            }
            Err(Error::Claims(e)) => {
                let v = Verdict::waiting(reason::KAFKA_UNREACHABLE, e.to_string());
                claims_error = Some(e);
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

    // --- build (pure) and apply. Nothing is rolled out for a spec that cannot run, for
    // an id another app owns, or next to a topic that is not the app's. While the claims
    // cannot be read, only a workload that already runs is kept up (it was claimed). A
    // failure here is reported in status before it is returned.
    let owned =
        view.is_some() || ((claims_error.is_some() || kafka_error.is_some()) && sts.is_some());
    let mut apply_error = None;
    let mut rolled_out = false;
    let mut in_force = published.clone();
    // The StatefulSet as the apply left it, when it was applied.
    let mut applied_sts = None;
    if invalid.is_none() && source_problem.is_none() && owned && !topics_verdict.stalled {
        let to_publish = plan.as_ref().filter(|p| p.publish).map(|p| &p.assignment);
        let secret_version = secret.as_ref().and_then(|s| s.version.as_deref());
        let built =
            build::build(app, &ctx.build, sts_replicas, secret_version).and_then(|children| {
                let cm = to_publish
                    .map(|a| build::assignment_config_map(app, a))
                    .transpose()?;
                Ok((children, cm))
            });
        let applied = match built {
            Ok((children, cm)) => apply_children(app, &ns, &children, cm.as_ref(), ctx).await,
            Err(e) => Err(e.into()),
        };
        match applied {
            Ok(live) => {
                applied_sts = live;
                rolled_out = true;
                if let Some(a) = to_publish {
                    tracing::info!(generation = a.generation, "published task assignment");
                    in_force = Some(a.clone());
                }
            }
            Err(e) => apply_error = Some(e),
        }
    } else if invalid.is_none()
        && sts.is_some()
        && let Some(a) = plan.as_ref().filter(|p| p.publish).map(|p| &p.assignment)
    {
        // Nothing else is rolled out, but the assignment moves on, so pods that die
        // still hand their tasks over.
        let published = build::assignment_config_map(app, a)
            .map_err(Error::from)
            .map(|cm| (cm, a));
        match published {
            Ok((cm, a)) => match ssa(ctx, &ns, &cm).await {
                Ok(_) => {
                    tracing::info!(generation = a.generation, "published task assignment");
                    in_force = Some(a.clone());
                }
                Err(e) => apply_error = Some(e),
            },
            Err(e) => apply_error = Some(e),
        }
    }
    // A reset goes one step further once the workers are told to stop.
    let mut reset_progress = None;
    if rolled_out && let (Some(stores), Some(c)) = (reset_stores, &cluster) {
        match reset::advance(c, &app.application_id(), stores, pods.len()).await {
            Ok(p) => reset_progress = Some(p),
            Err(Error::Topics(e)) => kafka_error = Some(e),
            Err(e) => apply_error = Some(e),
        }
    }
    let reset_done = reset_progress == Some(reset::Progress::Done);
    let reset_verdict = reset_stores.map(|stores| {
        let msg = match &reset_progress {
            Some(p) => p.message(stores),
            None => format!(
                "resetting store(s) {}: stopping the workers",
                stores.join(", ")
            ),
        };
        Verdict::waiting(reason::RESETTING_STATE, msg)
    });
    let apply_verdict = apply_error.as_ref().map(|e| match e {
        // The API server refused the object (invalid, or RBAC): retrying cannot help.
        Error::ApplyChild {
            source: kube::Error::Api(s),
            ..
        } if matches!(s.code, 400 | 403 | 422) => {
            Verdict::stalled(reason::APPLY_REJECTED, e.to_string())
        }
        Error::BuildChildren(_) => Verdict::stalled(reason::BUILD_FAILED, e.to_string()),
        _ => Verdict::waiting(reason::APPLY_FAILED, e.to_string()),
    });

    // --- status. The StatefulSet read at the start, or as this apply returned it (its
    // new generation): no second read.
    let sts = applied_sts.or(sts);
    let newest_pod = pods
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .max();
    let create_failure =
        pod_creation::failure(&ctx.client, &ctx.event_reads, sts.as_ref(), newest_pod).await;
    let workload = workload_facts(app, sts.as_ref(), sts_replicas, &observed, create_failure);
    let live: Vec<&str> = observed
        .iter()
        .filter(|p| !p.terminating)
        .map(|p| p.name.as_str())
        .collect();
    let instances = status::current_instances(&live, &reported);
    let (restoration, restored) = status::restoration(&instances);
    let tasks_verdict = status::tasks_verdict(in_force.as_ref(), &instances, app.spec.replicas);
    // Placement is under way: another step is due, or workers have yet to acknowledge.
    // (No assignment at all waits for pods, which the pod watch reports.)
    let placing = plan.as_ref().is_some_and(|p| !p.settled)
        || in_force
            .as_ref()
            .is_some_and(|a| !status::unacknowledged(a, &instances).is_empty());
    let input = StatusInput {
        generation: app.metadata.generation,
        invalid: invalid
            .clone()
            .or(apply_verdict.clone())
            .or(reset_verdict.clone()),
        topics: topics_verdict,
        tasks: tasks_verdict,
        workload: status::workload_verdict(&workload),
        restored,
        previous: &previous.conditions,
        now: Timestamp::now(),
    };
    let (conditions, phase) = status::conditions(&input);
    let ready = status::when_true(&conditions, ConditionType::Ready).is_some();
    let was_ready = status::when_true(&previous.conditions, ConditionType::Ready).is_some();
    let stalled = status::when_true(&conditions, ConditionType::Stalled).cloned();
    let was_stalled_reason =
        status::when_true(&previous.conditions, ConditionType::Stalled).map(|c| c.reason.clone());
    let new_status = StreamAppStatus {
        observed_generation: app.metadata.generation,
        // An app an earlier operator ran keeps reading as legacy until its topics are
        // recorded (adopted), so a failure in between does not lose that.
        application_id: (!internal_topics::legacy(&previous) || topics_recorded)
            .then(|| app.application_id()),
        conditions,
        phase: Some(phase),
        replicas: workload.replicas,
        ready_replicas: workload.ready_replicas,
        selector: Some(build::selector_string(app)),
        tasks: tasks.map(|n| {
            n * oxbow_crds::topology::Topology::of(&app.application_id(), &app.spec).stage_count()
                as i32
        }),
        lag: instances.iter().filter_map(|i| i.lag).reduce(|a, b| a + b),
        restoration,
        // The layouts the workers now run with; until a rollout (or a reset's end),
        // the ones before.
        store_layouts: if reset_done || (rolled_out && reset_stores.is_none()) {
            layouts
        } else {
            recorded
        },
        instances: vec![],
        topics: topic_statuses,
    };
    // The instances first: a condition naming a pod and its error is never seen before
    // that pod's entry in status.instances.
    publish_reports(ctx, app, &ns, &instances, &previous.instances, &reports).await?;
    write_status(ctx, app, &new_status).await?;
    if reset_done {
        if let Some(v) = &reset_verdict {
            ctx.event(
                app,
                EventType::Normal,
                EventReason::StateReset.as_str(),
                v.message.clone(),
            )
            .await;
        }
        // Recorded first: a failure here leaves an annotation with nothing to reset.
        reset::finish(&ctx.client, app).await?;
    }

    // --- events for notable transitions.
    if ready && !was_ready {
        ctx.event(
            app,
            EventType::Normal,
            EventReason::Ready.as_str(),
            "topics exist, every worker is ready and restored".into(),
        )
        .await;
    } else if !ready && was_ready {
        let why = status::find(&new_status.conditions, ConditionType::Ready)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        ctx.event(app, EventType::Warning, EventReason::NotReady.as_str(), why)
            .await;
    }
    if let Some(s) = &stalled
        && was_stalled_reason.as_deref() != Some(s.reason.as_str())
    {
        ctx.event(app, EventType::Warning, &s.reason, s.message.clone())
            .await;
    }

    if let Some(e) = apply_error {
        return match apply_verdict {
            Some(v) if v.stalled => Ok(Action::await_change()),
            _ => Err(e),
        };
    }
    if let Some(e) = kafka_error {
        // Status says so; the error policy retries with back-off.
        return Err(Error::Topics(e));
    }
    if let Some(e) = claims_error {
        return Err(Error::Claims(e));
    }
    Ok(
        if invalid.is_some()
            && stalled
                .as_ref()
                .is_some_and(|s| s.reason == reason::APPLICATION_ID_CONFLICT.as_str())
        {
            // The owner may be deleted: look again later.
            Action::requeue(Duration::from_secs(30))
        } else if invalid.is_some() {
            // Only a spec change can fix it.
            Action::await_change()
        } else if reset_stores.is_some() {
            // Pods stop and Kafka deletes topics without telling us.
            Action::requeue(Duration::from_secs(2))
        } else if source_problem.is_some() || stalled.is_some() {
            // Someone may create or fix the topics: look again later.
            Action::requeue(Duration::from_secs(30))
        } else if placing {
            // A report that changes what a pod runs triggers a reconciliation; this
            // bounds the wait for one whose pod went silent.
            Action::requeue(Duration::from_secs(2))
        } else {
            let base = if ready {
                ctx.resync
            } else {
                Duration::from_secs(5)
            };
            // Renewals trigger nothing: look again when a pod that reports now would
            // have been silent for the failover timeout.
            let silence = crate::reports::until_silent(
                &reports,
                Timestamp::now(),
                ctx.placement.failover_timeout,
            );
            Action::requeue(silence.map_or(base, |s| s.min(base)))
        },
    )
}

/// Tasks per stage in a published assignment (its stage-0 tasks).
fn published_task_count(a: &oxbow_crds::assignment::Assignment) -> Option<i32> {
    let n = a.tasks.keys().filter(|t| t.stage == 0).count();
    (n > 0).then(|| i32::try_from(n).unwrap_or(i32::MAX))
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_failed_finalizer_step_keeps_its_cause() {
        let e = Error::Finalizer(Box::new(kube::runtime::finalizer::Error::UnnamedObject));
        assert_eq!(e.metric_label(), "Finalizer");
        let cause = e
            .source()
            .expect("the finalizer's error is kept as the source");
        assert!(cause.to_string().contains("name"), "{cause}");
    }

    #[test]
    fn a_failed_status_write_keeps_the_api_error_as_its_source() {
        let e = Error::WriteStatus(kube::Error::LinesCodecMaxLineLengthExceeded);
        assert!(e.source().is_some(), "the kube error is the source");
    }

    #[test]
    fn a_metric_label_is_the_variant_name_but_a_kafka_connection_problem_names_its_reason() {
        let e = Error::Cleanup("x".into());
        assert_eq!(e.metric_label(), "Cleanup");
        let e = Error::RefusedProperties { refused: vec![] };
        assert_eq!(e.metric_label(), "RefusedProperties");
        let e = Error::Topics(TopicError::KafkaUnreachable {
            bootstrap: "b:9092".into(),
            source: rdkafka::error::KafkaError::Canceled,
        });
        assert_eq!(e.metric_label(), "KafkaUnreachable");
    }

    #[test]
    fn an_event_reason_is_its_variant_name() {
        assert_eq!(EventReason::TopicCreated.as_str(), "TopicCreated");
        assert_eq!(EventReason::CleanupTimedOut.as_str(), "CleanupTimedOut");
    }
}

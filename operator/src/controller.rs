//! The StreamApp controller: a thin `reconcile` (span, metrics timer, finalizer) around
//! [`apply::apply`] and [`cleanup`], each a list of steps, one step a file:
//! - `apply`: the steps of a live app in order, and what to do next;
//! - `dereference`: everything read before deciding (Kafka Secret and clients, the
//!   sources' partition counts, StatefulSet, worker pods, assignment);
//! - `validate`: the spec, the task count, store layouts (pure);
//! - `claim`: the application id on the claims topic; `reset`: `oxbow.dev/reset`;
//! - `place`: who runs which task (the decision is [`crate::placement`]'s);
//! - `internal_topics`: changelog, repartition and dead-letter topics;
//! - `rollout`: build and apply the children in order (`children`), publish the
//!   assignment, move a reset on;
//! - `status`: the status from the steps' verdicts; `status_write`: writing it,
//!   `status.instances` and the workers' notices; `events`: transitions as Events;
//! - `pod_creation`: why the StatefulSet controller cannot create pods;
//! - `cleanup`: deletion under `deletionPolicy`;
//! - `watches`: the watches and stores that drive [`reconcile`].

mod apply;
mod children;
mod claim;
mod cleanup;
mod dereference;
mod encoding;
mod events;
mod internal_topics;
mod place;
mod pod_creation;
mod reset;
mod rollout;
mod status;
mod status_write;
mod validate;
mod watches;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Resource, ResourceExt};
use oxbow_crds::StreamApp;

use crate::build::{BuildContext, BuildError};
use crate::claims::{Claims, ClaimsError};
use crate::metrics::Metrics;
use crate::placement::PlacementConfig;
use crate::topics::{KafkaAdmin, TopicError};
use children::short_kind;
pub use dereference::KafkaSecret;
use dereference::kafka_secret;
use status_write::write_status;
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
    Cleanup(#[source] cleanup::CleanupError),
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
            Error::Topics(e) if e.is_connection_problem() => e.into(),
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
            Finalizer::Apply(app) => apply::apply(&app, &ctx).await,
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
        let e = Error::Cleanup(cleanup::CleanupError::WorkersRunning(2));
        assert_eq!(e.metric_label(), "Cleanup");
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("waiting for 2 worker pods to stop"),
            "the cleanup's own failure is the source"
        );
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

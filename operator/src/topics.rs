//! Kafka topics a StreamApp needs: what is wanted (pure), how it compares with what
//! exists (pure), and the admin client that reads and changes them (I/O).
//!
//! This module owns changelog and dead-letter topics only. Source and sink topics belong
//! to the user: they are read (partition counts) but never created, altered or deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use oxbow_crds::topics::{
    DEFAULT_DIRTY_RATIO, DEFAULT_SEGMENT_MS, Role, WantedTopic, wanted_topics,
};
use oxbow_crds::{DriftPolicy, TopicStatus};
use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::kafka_context::{ConnectionContext, ConnectionProblem};

/// The variant's name (as strum serializes it) is the reason the topic condition shows:
/// a connection problem names itself, a refused client configuration is
/// `InvalidKafkaProperties`, and a refused topic operation `TopicOperationFailed`.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum TopicError {
    #[error("failed to reach Kafka at {bootstrap}: {source}")]
    KafkaUnreachable {
        bootstrap: String,
        source: KafkaError,
    },
    #[error(
        "Kafka at {bootstrap} refused the authentication: {detail}; check sasl.mechanism, sasl.username and sasl.password in the Secret of spec.kafka.secretRef"
    )]
    #[strum(serialize = "KafkaAuthenticationFailed")]
    KafkaAuthentication {
        bootstrap: String,
        detail: String,
        source: Box<KafkaError>,
    },
    #[error(
        "the TLS handshake with Kafka at {bootstrap} failed: {detail}; check the CA that verifies the broker (ssl.ca.pem) and, for mutual TLS, the client certificate and key the broker must trust (ssl.certificate.pem, ssl.key.pem)"
    )]
    #[strum(serialize = "KafkaTlsFailed")]
    KafkaTls {
        bootstrap: String,
        detail: String,
        source: Box<KafkaError>,
    },
    #[error("failed to create topic {topic}: {source}")]
    #[strum(serialize = "TopicOperationFailed")]
    CreateTopic { topic: String, source: KafkaError },
    #[error("failed to alter the config of topic {topic}: {source}")]
    #[strum(serialize = "TopicOperationFailed")]
    AlterTopicConfig { topic: String, source: KafkaError },
    #[error("failed to add partitions to topic {topic}: {source}")]
    #[strum(serialize = "TopicOperationFailed")]
    AddPartitions { topic: String, source: KafkaError },
    #[error("failed to delete topics {topics:?}: {source}")]
    #[strum(serialize = "TopicOperationFailed")]
    DeleteTopics {
        topics: Vec<String>,
        source: KafkaError,
    },
    #[error("failed to delete consumer group {group}: {source}")]
    #[strum(serialize = "TopicOperationFailed")]
    DeleteGroup { group: String, source: KafkaError },
    #[error("failed to create a Kafka admin client: {0}")]
    #[strum(serialize = "InvalidKafkaProperties")]
    Client(#[source] KafkaError),
}

impl TopicError {
    /// Kafka could not be reached or refused the connection: labelled with its own
    /// reason in the operator's metrics, not as a failed reconcile step.
    pub fn is_connection_problem(&self) -> bool {
        matches!(
            self,
            Self::KafkaUnreachable { .. }
                | Self::KafkaAuthentication { .. }
                | Self::KafkaTls { .. }
        )
    }
}

/// A topic as it exists.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ActualTopic {
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
}

/// What to do about one topic.
#[derive(Debug, Clone, PartialEq)]
pub enum TopicAction {
    Create,
    /// Grow to this many partitions (never shrink).
    AddPartitions(i32),
    AlterConfigs(BTreeMap<String, String>),
    None,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TopicPlan {
    pub actions: Vec<TopicAction>,
    /// Differences the plan does not fix, as `key: actual (want wanted)`.
    pub drift: Vec<String>,
}

fn same_value(a: &str, b: &str) -> bool {
    a == b || matches!((a.parse::<f64>(), b.parse::<f64>()), (Ok(x), Ok(y)) if (x - y).abs() < 1e-9)
}

/// Compares one topic with what is wanted. Under `Enforce` config differences become an
/// `AlterConfigs` action; under `Report` they are only listed. Partitions grow to the task
/// count under either policy (workers cannot run without them) and never shrink.
pub fn plan(wanted: &WantedTopic, actual: Option<&ActualTopic>, policy: DriftPolicy) -> TopicPlan {
    let Some(actual) = actual else {
        return TopicPlan {
            actions: vec![TopicAction::Create],
            drift: vec![],
        };
    };
    let mut actions = Vec::new();
    let mut drift = Vec::new();
    if actual.partitions < wanted.partitions {
        actions.push(TopicAction::AddPartitions(wanted.partitions));
    } else if actual.partitions > wanted.partitions && wanted.role != Role::DeadLetter {
        drift.push(format!(
            "partitions: {} (want {}); partitions are never decreased, tasks beyond {} have no source partition",
            actual.partitions, wanted.partitions, wanted.partitions
        ));
    }
    let mut wrong = BTreeMap::new();
    for (k, v) in &wanted.configs {
        let have = actual
            .configs
            .get(k)
            .map(String::as_str)
            .unwrap_or("<unset>");
        if !same_value(have, v) {
            wrong.insert(k.clone(), v.clone());
            if policy == DriftPolicy::Report {
                drift.push(format!("{k}: {have} (want {v})"));
            }
        }
    }
    if !wrong.is_empty() && policy == DriftPolicy::Enforce {
        actions.push(TopicAction::AlterConfigs(wrong));
    }
    if actions.is_empty() {
        actions.push(TopicAction::None);
    }
    TopicPlan { actions, drift }
}

pub fn topic_status(
    wanted: &WantedTopic,
    actual: Option<&ActualTopic>,
    plan: &TopicPlan,
) -> TopicStatus {
    let ready =
        actual.is_some() && plan.drift.is_empty() && plan.actions == vec![TopicAction::None];
    TopicStatus {
        name: wanted.name.clone(),
        role: wanted.role.as_str().into(),
        store: wanted.store.clone(),
        partitions: actual.map(|a| a.partitions).unwrap_or(0),
        ready,
        drift: plan.drift.clone(),
        message: None,
    }
}

/// The first per-resource failure of an admin request, ignoring `benign` codes (a topic
/// that already exists when creating, one already gone when deleting).
fn first_failure<T, N>(
    results: Vec<Result<T, (N, RDKafkaErrorCode)>>,
    benign: RDKafkaErrorCode,
) -> Option<KafkaError> {
    results.into_iter().find_map(|r| match r {
        Err((_, code)) if code != benign => Some(KafkaError::AdminOp(code)),
        _ => None,
    })
}

/// Polls `probe` until no event comes within `wait` (at most 256 events), so each error
/// reaches its context.
fn drain(probe: &BaseConsumer<ConnectionContext>, wait: Duration) {
    for _ in 0..256 {
        if probe.poll(wait).is_none() {
            break;
        }
    }
}

fn fetch_partition_counts(
    probe: &BaseConsumer<ConnectionContext>,
    topics: &[String],
    timeout: Duration,
) -> Result<BTreeMap<String, Option<i32>>, KafkaError> {
    let mut out = BTreeMap::new();
    for topic in topics {
        // Per topic: a whole-cluster metadata request would grow with the cluster.
        let md = probe.fetch_metadata(Some(topic), timeout)?;
        let partitions = match md.topics().iter().find(|t| t.name() == topic) {
            None => None,
            Some(t) => match t.error() {
                None => Some(t.partitions().len() as i32),
                // Only "unknown topic" means absent; anything else (a leader election
                // during a broker restart) is transient and must not read as missing.
                Some(e)
                    if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition =>
                {
                    None
                }
                Some(e) => return Err(KafkaError::MetadataFetch(RDKafkaErrorCode::from(e))),
            },
        };
        out.insert(topic.clone(), partitions);
    }
    Ok(out)
}

/// rdkafka's admin client for one Kafka cluster (its inner client answers metadata).
pub struct KafkaAdmin {
    bootstrap: String,
    admin: Arc<AdminClient<DefaultClientContext>>,
    /// Reads metadata. A consumer, not the admin client, because its events can be
    /// polled: the admin client's own connection errors (a refused login, a failed
    /// handshake) go to a queue nothing reads, and would show only as timeouts.
    probe: Arc<BaseConsumer<ConnectionContext>>,
    timeout: Duration,
}

impl KafkaAdmin {
    pub fn new(bootstrap: &str, properties: &BTreeMap<String, String>) -> Result<Self, TopicError> {
        let mut cfg = ClientConfig::new();
        for (k, v) in properties {
            cfg.set(k, v);
        }
        cfg.set("bootstrap.servers", bootstrap);
        cfg.set("socket.timeout.ms", "10000");
        // Asking for a source topic's metadata must never create it on a broker that
        // auto-creates topics: a typo would become a real topic with default partitions.
        cfg.set("allow.auto.create.topics", "false");
        let admin = Arc::new(cfg.create().map_err(TopicError::Client)?);
        let probe = Arc::new(
            cfg.create_with_context(ConnectionContext::default())
                .map_err(TopicError::Client)?,
        );
        Ok(Self {
            bootstrap: bootstrap.into(),
            admin,
            probe,
            timeout: Duration::from_secs(10),
        })
    }

    /// A request failed for want of a connection: named after the problem the client
    /// reported, if any (a refused login, a failed handshake), else unreachable.
    fn unreachable(&self, source: KafkaError) -> TopicError {
        let bootstrap = self.bootstrap.clone();
        self.drain_events();
        match self.probe.context().recent_problem() {
            Some(ConnectionProblem::Authentication(detail)) => TopicError::KafkaAuthentication {
                bootstrap,
                detail,
                source: Box::new(source),
            },
            Some(ConnectionProblem::Tls(detail)) => TopicError::KafkaTls {
                bootstrap,
                detail,
                source: Box::new(source),
            },
            None => TopicError::KafkaUnreachable { bootstrap, source },
        }
    }

    /// Hands the probe's pending events (errors, logs) to its context, so they neither
    /// pile up nor go unseen.
    fn drain_events(&self) {
        drain(&self.probe, Duration::ZERO);
    }

    fn opts(&self) -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(self.timeout))
            .operation_timeout(Some(self.timeout))
    }

    /// Partition counts of `topics`; `None` for a topic that does not exist.
    pub async fn partition_counts(
        &self,
        topics: &[String],
    ) -> Result<BTreeMap<String, Option<i32>>, TopicError> {
        let probe = self.probe.clone();
        let topics = topics.to_vec();
        let timeout = self.timeout;
        // librdkafka's metadata call blocks. On the blocking pool (capped in main.rs),
        // not block_in_place: that hands each caller's worker core to a new thread, and
        // a burst of reconciliations grew the runtime to a dozen threads, each with its
        // own malloc arena.
        let fetched = tokio::task::spawn_blocking(move || {
            let fetched = fetch_partition_counts(&probe, &topics, timeout);
            // The events, so they do not pile up. After a failure, the connection error
            // behind it reaches the queue a moment later: wait for it, briefly.
            let wait = if fetched.is_err() {
                Duration::from_millis(200)
            } else {
                Duration::ZERO
            };
            drain(&probe, wait);
            fetched
        })
        .await
        .unwrap_or_else(|e| match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(KafkaError::Canceled),
        });
        fetched.map_err(|e| self.unreachable(e))
    }

    /// Partitions and the configs named in `keys` of each topic that exists.
    pub async fn describe(
        &self,
        wanted: &[WantedTopic],
    ) -> Result<BTreeMap<String, ActualTopic>, TopicError> {
        let names: Vec<String> = wanted.iter().map(|w| w.name.clone()).collect();
        let counts = self.partition_counts(&names).await?;
        let present: Vec<&String> = names
            .iter()
            .filter(|n| counts.get(*n).is_some_and(|c| c.is_some()))
            .collect();
        let mut out = BTreeMap::new();
        if present.is_empty() {
            return Ok(out);
        }
        let specs: Vec<ResourceSpecifier> = present
            .iter()
            .map(|n| ResourceSpecifier::Topic(n.as_str()))
            .collect();
        let results = self
            .admin
            .describe_configs(specs.iter(), &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        for (name, res) in present.iter().zip(results) {
            let res = res.map_err(|code| self.unreachable(KafkaError::AdminOp(code)))?;
            let configs = res
                .entries
                .iter()
                .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
                .collect();
            let partitions = counts.get(*name).copied().flatten().unwrap_or(0);
            out.insert(
                (*name).clone(),
                ActualTopic {
                    partitions,
                    configs,
                },
            );
        }
        Ok(out)
    }

    pub async fn create(&self, t: &WantedTopic) -> Result<(), TopicError> {
        let mut nt = NewTopic::new(
            &t.name,
            t.partitions,
            TopicReplication::Fixed(t.replication_factor.unwrap_or(-1)),
        );
        for (k, v) in &t.configs {
            nt = nt.set(k, v);
        }
        let res = self
            .admin
            .create_topics([&nt], &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        match first_failure(res, RDKafkaErrorCode::TopicAlreadyExists) {
            None => Ok(()),
            Some(source) => Err(TopicError::CreateTopic {
                topic: t.name.clone(),
                source,
            }),
        }
    }

    pub async fn alter_configs(
        &self,
        topic: &str,
        configs: &BTreeMap<String, String>,
    ) -> Result<(), TopicError> {
        // AlterConfigs replaces the topic's whole dynamic config: start from what is set
        // now so unrelated overrides survive, then apply ours.
        let current = self
            .admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        let mut ac = AlterConfig::new(ResourceSpecifier::Topic(topic));
        let mut merged: BTreeMap<String, String> = BTreeMap::new();
        if let Some(Ok(res)) = current.into_iter().next() {
            for e in res
                .entries
                .iter()
                // Only the topic's own overrides: broker-level values must not be pinned
                // onto the topic (AlterConfigs writes every value it is given).
                .filter(|e| e.source == rdkafka::admin::ConfigSource::DynamicTopic)
            {
                if let Some(v) = &e.value {
                    merged.insert(e.name.clone(), v.clone());
                }
            }
        }
        merged.extend(configs.clone());
        for (k, v) in &merged {
            ac = ac.set(k, v);
        }
        let res = self
            .admin
            .alter_configs([&ac], &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        match first_failure(res, RDKafkaErrorCode::NoError) {
            None => Ok(()),
            Some(source) => Err(TopicError::AlterTopicConfig {
                topic: topic.into(),
                source,
            }),
        }
    }

    pub async fn add_partitions(&self, topic: &str, total: i32) -> Result<(), TopicError> {
        let np = NewPartitions::new(topic, total as usize);
        let res = self
            .admin
            .create_partitions([&np], &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        match first_failure(res, RDKafkaErrorCode::NoError) {
            None => Ok(()),
            Some(source) => Err(TopicError::AddPartitions {
                topic: topic.into(),
                source,
            }),
        }
    }

    pub async fn delete_topics(&self, topics: &[String]) -> Result<(), TopicError> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let res = self
            .admin
            .delete_topics(&names, &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        match first_failure(res, RDKafkaErrorCode::UnknownTopicOrPartition) {
            None => Ok(()),
            Some(source) => Err(TopicError::DeleteTopics {
                topics: topics.to_vec(),
                source,
            }),
        }
    }

    pub async fn delete_group(&self, group: &str) -> Result<(), TopicError> {
        let res = self
            .admin
            .delete_groups(&[group], &self.opts())
            .await
            .map_err(|e| self.unreachable(e))?;
        match first_failure(res, RDKafkaErrorCode::GroupIdNotFound) {
            None => Ok(()),
            Some(source) => Err(TopicError::DeleteGroup {
                group: group.into(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> WantedTopic {
        WantedTopic {
            name: "app-seen-changelog".into(),
            role: Role::Changelog,
            store: Some("seen".into()),
            partitions: 4,
            replication_factor: None,
            configs: BTreeMap::from([
                ("cleanup.policy".into(), "compact".into()),
                ("min.cleanable.dirty.ratio".into(), "0.1".into()),
            ]),
        }
    }

    fn actual(partitions: i32, ratio: &str) -> ActualTopic {
        ActualTopic {
            partitions,
            configs: BTreeMap::from([
                ("cleanup.policy".into(), "compact".into()),
                ("min.cleanable.dirty.ratio".into(), ratio.into()),
            ]),
        }
    }

    #[test]
    fn a_missing_topic_is_created() {
        assert_eq!(
            plan(&wanted(), None, DriftPolicy::Report).actions,
            vec![TopicAction::Create]
        );
    }

    #[test]
    fn a_matching_topic_needs_nothing_and_numbers_compare_by_value() {
        let p = plan(&wanted(), Some(&actual(4, "0.10")), DriftPolicy::Report);
        assert_eq!(
            p,
            TopicPlan {
                actions: vec![TopicAction::None],
                drift: vec![]
            }
        );
    }

    #[test]
    fn config_drift_is_reported_under_report_and_corrected_under_enforce() {
        let p = plan(&wanted(), Some(&actual(4, "0.5")), DriftPolicy::Report);
        assert_eq!(p.actions, vec![TopicAction::None]);
        assert_eq!(
            p.drift,
            vec!["min.cleanable.dirty.ratio: 0.5 (want 0.1)".to_string()]
        );
        let p = plan(&wanted(), Some(&actual(4, "0.5")), DriftPolicy::Enforce);
        assert_eq!(
            p.actions,
            vec![TopicAction::AlterConfigs(BTreeMap::from([(
                "min.cleanable.dirty.ratio".into(),
                "0.1".into()
            )]))]
        );
        assert!(p.drift.is_empty());
    }

    #[test]
    fn partitions_grow_but_never_shrink() {
        assert_eq!(
            plan(&wanted(), Some(&actual(2, "0.1")), DriftPolicy::Report).actions,
            vec![TopicAction::AddPartitions(4)]
        );
        let p = plan(&wanted(), Some(&actual(8, "0.1")), DriftPolicy::Enforce);
        assert_eq!(p.actions, vec![TopicAction::None]);
        assert!(
            p.drift[0].starts_with("partitions: 8 (want 4)"),
            "{:?}",
            p.drift
        );
    }
}

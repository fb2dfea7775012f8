//! The topics a worker looks after itself: creating the changelog, repartition and
//! dead-letter topics a standalone worker has no operator to create, and deleting the
//! repartition records its tasks have committed past.
//!
//! It must never create, alter or delete a source or sink topic: those are the user's.

use std::time::{Duration, Instant};

use oxbow_crds::StoreName;
use oxbow_crds::names::changelog_topic;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::kafka::base_config;
use super::{Engine, EngineError, KAFKA_TIMEOUT};
use crate::config::App;

/// The default of how often consumed repartition records are deleted (Kafka Streams'
/// `repartition.purge.interval.ms`).
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(30);

impl Engine {
    /// Deletes the repartition records this worker's stage-N tasks have committed past
    /// (DeleteRecords, as Kafka Streams does every 30 s), so a repartition topic holds
    /// only what is still to be processed. Committed means in Kafka: under exactly-once
    /// the transaction with the offsets committed, under at-least-once the offsets.
    /// A failure is only logged: the records stay until the next round.
    pub(super) fn purge_repartitions(&mut self) {
        use rdkafka::admin::{AdminClient, AdminOptions};
        self.last_purge = Instant::now();
        let mut tpl = TopicPartitionList::new();
        let mut wanted = Vec::new();
        for (id, committed) in &self.committed {
            if id.stage == 0 || !self.tasks.contains_key(id) {
                continue;
            }
            for (topic, off) in committed {
                if self.purged.get(id).is_some_and(|p| p >= off) {
                    continue;
                }
                if tpl
                    .add_partition_offset(topic, id.kafka_partition(), Offset::Offset(*off))
                    .is_ok()
                {
                    wanted.push((*id, topic.clone(), *off));
                }
            }
        }
        if wanted.is_empty() {
            return;
        }
        if self.admin.is_none() {
            match base_config(&self.app).create::<AdminClient<_>>() {
                Ok(a) => self.admin = Some(a),
                Err(e) => {
                    tracing::warn!(error = %e, "failed to create the admin client that deletes consumed repartition records");
                    return;
                }
            }
        }
        let Some(admin) = &self.admin else {
            return;
        };
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(5)));
        match futures::executor::block_on(admin.delete_records(&tpl, &opts)) {
            Ok(result) => {
                for (id, topic, off) in wanted {
                    let failed = result
                        .find_partition(&topic, id.kafka_partition())
                        .and_then(|e| e.error().err());
                    match failed {
                        None => {
                            self.purged.insert(id, off);
                        }
                        Some(e) => {
                            tracing::warn!(task = %id, topic, error = %e, "failed to delete consumed repartition records")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "failed to delete consumed repartition records"),
        }
    }
}

/// How long a worker under the operator waits for the operator to create the spec's
/// topics before it gives up (and its pod restarts).
const OPERATOR_TOPICS_WAIT: Duration = Duration::from_secs(300);

/// Creates the changelog and dead-letter topics that do not exist yet (a standalone
/// worker has no operator to do it). Existing topics are left as they are, but one with
/// fewer partitions than tasks is an error: a task would have nowhere to log.
///
/// Under the operator (`coordinated`) the spec's topics are the operator's to create: it
/// records each one as the app's before it creates it, and a topic created here would
/// read as someone else's. The worker waits for them and creates only the changelogs of
/// custom processors' stores, which the spec does not name.
pub(super) fn ensure_topics(
    app: &App,
    consumer: &BaseConsumer<impl ConsumerContext + 'static>,
    tasks: i32,
    stores: &[StoreName],
    coordinated: bool,
) -> Result<(), EngineError> {
    let spec_topics = oxbow_crds::topics::wanted_topics(&app.manifest, tasks);
    if coordinated {
        wait_for_operator_topics(consumer, &spec_topics)?;
    }
    let mut wanted = if coordinated {
        Vec::new()
    } else {
        spec_topics.clone()
    };
    wanted.extend(custom_changelogs(app, tasks, stores, &spec_topics));
    let mut missing = Vec::new();
    for w in &wanted {
        let md = consumer
            .fetch_metadata(Some(&w.name), KAFKA_TIMEOUT)
            .map_err(EngineError::Metadata)?;
        match md
            .topics()
            .iter()
            .find(|t| t.name() == w.name && t.error().is_none())
        {
            Some(t) if (t.partitions().len() as i32) < tasks => {
                return Err(EngineError::TopicTooSmall {
                    topic: w.name.clone(),
                    partitions: t.partitions().len(),
                    tasks,
                });
            }
            Some(_) => {}
            None => missing.push(w),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    create_topics(app, &missing)
}

/// The changelogs of custom processors' stores, which the spec does not name: with the
/// built-in changelogs' settings.
fn custom_changelogs(
    app: &App,
    tasks: i32,
    stores: &[StoreName],
    spec_topics: &[oxbow_crds::topics::WantedTopic],
) -> Vec<oxbow_crds::topics::WantedTopic> {
    let mut out: Vec<oxbow_crds::topics::WantedTopic> = Vec::new();
    for s in stores.iter().filter(|s| !app.is_table_store(s)) {
        let name = changelog_topic(&app.application_id, s);
        if !out.iter().chain(spec_topics).any(|w| w.name == name)
            && let Some(template) = spec_topics
                .iter()
                .find(|w| w.role == oxbow_crds::topics::Role::Changelog)
                .cloned()
                .or_else(|| oxbow_crds::topics::changelog_defaults(tasks))
        {
            out.push(oxbow_crds::topics::WantedTopic {
                name,
                store: Some(s.0.clone()),
                ..template
            });
        }
    }
    out
}

/// Creates `missing` (standalone: no operator does); one another instance created
/// first is fine.
fn create_topics(
    app: &App,
    missing: &[&oxbow_crds::topics::WantedTopic],
) -> Result<(), EngineError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        base_config(app)
            .create()
            .map_err(|source| EngineError::CreateClient {
                what: "admin",
                source,
            })?;
    let topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|w| {
            let mut t = NewTopic::new(
                &w.name,
                w.partitions,
                TopicReplication::Fixed(w.replication_factor.unwrap_or(-1)),
            );
            for (k, v) in &w.configs {
                t = t.set(k, v);
            }
            t
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(KAFKA_TIMEOUT));
    let results = futures::executor::block_on(admin.create_topics(topics.iter(), &opts)).map_err(
        |source| EngineError::CreateTopic {
            topic: missing
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            source,
        },
    )?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "created topic"),
            // Another instance created it first.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(EngineError::CreateTopic {
                    topic,
                    source: rdkafka::error::KafkaError::AdminOp(code),
                });
            }
        }
    }
    Ok(())
}

/// Waits until every topic the spec wants exists (the operator creates them).
fn wait_for_operator_topics(
    consumer: &BaseConsumer<impl ConsumerContext + 'static>,
    wanted: &[oxbow_crds::topics::WantedTopic],
) -> Result<(), EngineError> {
    let deadline = Instant::now() + OPERATOR_TOPICS_WAIT;
    let mut logged = false;
    loop {
        let mut missing = Vec::new();
        for w in wanted {
            let md = consumer
                .fetch_metadata(Some(&w.name), KAFKA_TIMEOUT)
                .map_err(EngineError::Metadata)?;
            if !md
                .topics()
                .iter()
                .any(|t| t.name() == w.name && t.error().is_none())
            {
                missing.push(w.name.clone());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(EngineError::OperatorTopicsMissing {
                topics: missing.join(", "),
                waited_secs: OPERATOR_TOPICS_WAIT.as_secs(),
            });
        }
        if !logged {
            tracing::info!(
                ?missing,
                "waiting for the operator to create the app's topics"
            );
            logged = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

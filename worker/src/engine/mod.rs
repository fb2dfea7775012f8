//! The processing loop: Kafka in, tasks, Kafka out, commits, restore. Owns every Kafka
//! client of the worker and the order of a commit:
//!
//! 1. changelog records for the dirty keys (last value per key, with [`SOURCE_HEADER`]);
//!    outputs and dead letters were already sent as records completed;
//! 2. exactly-once: the consumer offsets join the task's transaction
//!    (`<applicationId>-<task>`), which commits; at-least-once: flush, then commit the
//!    offsets (with the replay marks of a stage > 0 task, see [`replay`]);
//! 3. one RocksDB WriteBatch with the state and the new changelog/source offsets.
//!
//! A crash anywhere leaves RocksDB at an older committed prefix of the changelog, which
//! restore completes. Any commit or producer failure stops the worker (crash-only): the
//! restart recovers from committed state rather than guessing what half-happened.
//!
//! The folder, one concern a file; every file adds methods to the one [`Engine`]:
//! - this file: the engine's state and [`Engine::start`] (task count, topics, sink);
//! - [`assign`](self::assign): applying the desired tasks (hand-over, release, start);
//! - `standby`: changelog copies kept warm; `run`: the loop and what a record sends;
//! - `commit`: the unit of work into Kafka, then RocksDB; `topics`: creating topics
//!   and deleting consumed repartition records; `kafka`: client settings and producers;
//! - [`restore`]: restore I/O, next to its pure planner ([`restore::plan`]);
//! - [`replay`]: the pure rule that drops upstream replays across a repartition;
//! - [`lookups`]: global tables and which topics exist, for the steps.
//!
//! It must not touch Kubernetes (that is [`crate::coord`]) or decide what a record
//! means (that is [`crate::task`] and the steps).

mod assign;
mod commit;
mod kafka;
pub mod lookups;
pub mod merge;
mod outputs;
mod oversize;
mod parallel;
pub mod quarantine;
pub mod replay;
pub mod restore;
mod restoring;
mod run;
mod standby;
mod topics;
mod wake;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxbow_crds::{ProcessingGuarantee, StoreName, TaskId};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

use crate::config::App;
use crate::expr::Env;
use crate::status::{Desired, Shared};
use crate::store::{SharedMemory, StoreError};
use crate::task::Task;

pub use topics::DEFAULT_PURGE_INTERVAL;

use kafka::{
    FetchWatch, MainConsumer, Producers, Tracker, consumer_config, main_consumer, producer,
    transaction_timeout,
};
use replay::Marks;
use standby::Standby;

#[cfg(doc)]
use crate::task::SOURCE_HEADER;

/// How long a Kafka request may take before the engine gives up on it.
pub(crate) const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("failed to create the Kafka {what} client: {source}")]
    CreateClient {
        what: &'static str,
        source: KafkaError,
    },
    #[error("failed to read metadata of source topics: {0}")]
    Metadata(#[source] KafkaError),
    #[error(transparent)]
    Validate(#[from] oxbow_crds::validate::ValidationError),
    #[error(transparent)]
    Assign(#[from] oxbow_crds::assignment::AssignmentError),
    #[error("failed to read committed offsets of group {group}: {source}")]
    CommittedOffsets { group: String, source: KafkaError },
    #[error("failed to initialise transactions for {transactional_id}: {source}")]
    InitTransactions {
        transactional_id: String,
        source: KafkaError,
    },
    #[error("failed to restore store {store} of task {task} from {topic}: {cause}")]
    Restore {
        task: TaskId,
        store: String,
        topic: String,
        #[source]
        cause: Box<restore::RestoreFailure>,
    },
    #[error("failed to produce to {topic}: {source}")]
    Produce { topic: String, source: KafkaError },
    #[error("failed to commit task {task}: {source}")]
    Commit { task: TaskId, source: KafkaError },
    #[error("failed to commit offsets: {0}")]
    CommitOffsets(#[source] KafkaError),
    #[error("failed to deliver records{}: {source}", to.as_ref().map(|(t, p)| format!(" to {t} [{p}]")).unwrap_or_default())]
    Delivery {
        /// The topic and partition of the first record that failed, when one did (a
        /// flush that times out names none).
        to: Option<(String, i32)>,
        #[source]
        source: KafkaError,
    },
    #[error("failed to assign source partitions: {0}")]
    AssignPartitions(#[source] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("failed to create topic {topic}: {source}")]
    CreateTopic {
        topic: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error(
        "failed to use topic {topic}: it exists with {partitions} partitions; the app has {tasks} tasks and needs at least that many"
    )]
    TopicTooSmall {
        topic: String,
        partitions: usize,
        tasks: i32,
    },
    #[error(
        "failed to find topic(s) {topics}: the operator has not created them in {waited_secs}s; see the StreamApp's TopicsReady condition"
    )]
    OperatorTopicsMissing { topics: String, waited_secs: u64 },
    #[error(
        "failed to find the sink topic {0}: it does not exist (create it; Oxbow never creates or deletes sink topics)"
    )]
    SinkMissing(String),
    /// The task was assigned elsewhere while it restored here: the restore stops.
    #[error("task {0} was assigned elsewhere while it restored")]
    Superseded(TaskId),
    /// Asked to stop while starting tasks (SIGTERM during a restore): not a failure.
    #[error("stopped while starting tasks")]
    Stopped,
    #[error("failed to initialise task {task}: {source}")]
    Init {
        task: TaskId,
        #[source]
        source: crate::processor::StepError,
    },
    /// The engine's own bookkeeping disagrees with itself: a bug, reported not hidden.
    #[error("task {task}: {what}")]
    Inconsistent { task: TaskId, what: &'static str },
    #[error("task {task}: the thread {what} panicked")]
    Panicked { task: TaskId, what: &'static str },
    #[error(
        "failed to find the topic {0} of a table: it does not exist (Oxbow never creates table topics)"
    )]
    TableMissing(String),
    #[error("failed to start: {0}")]
    Invalid(#[source] oxbow_crds::validate::ValidationError),
    /// At-least-once: no report write reached the API server for longer than the
    /// lease, so another pod may be about to take this pod's tasks.
    #[error(
        "stopped processing: no report write reached the API server for {}s (lease {}s); under at-least-once nothing else could stop this pod from processing tasks another pod takes over, so it exits without committing and rejoins through the hand-over when restarted",
        since.as_secs(), crate::lease::LEASE.as_secs()
    )]
    LeaseLapsed { since: std::time::Duration },
    #[error(
        "failed to find the output topic {topic} of step {step}: it does not exist (create it; Oxbow never creates output topics)"
    )]
    OutputTopicMissing { step: String, topic: String },
    #[error("failed to write global table {table}: {source}")]
    GlobalTable {
        table: String,
        #[source]
        source: StoreError,
    },
}

/// Flags of `oxbow-worker run` that the engine needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub state_dir: PathBuf,
    pub instance: u32,
    pub instances: u32,
    /// Block cache plus memtables for the whole process.
    pub memory_budget: usize,
    /// The instance number came from the pod name, not from `--instance`: a pod whose
    /// ordinal is beyond `instances` runs no task (it must not double-process).
    pub instance_from_pod_name: bool,
    /// Standalone: `host:port` of every instance's HTTP server, index = instance, for query forwarding.
    pub peers: Vec<String>,
    /// Tasks come from the operator's assignment (see [`crate::coord`]), not from the
    /// standalone rule.
    pub coordination: Option<crate::coord::CoordConfig>,
    /// How often consumed repartition records are deleted.
    pub repartition_purge_interval: Duration,
    /// `/healthz` fails once the processing loop has not turned for this long.
    pub liveness_timeout: Duration,
    /// Where `/metrics` is served on its own (pods: a port the NetworkPolicy opens to
    /// Prometheus, apart from the query port). `None`: next to the queries.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Processing threads: how many active tasks run side by side (at least 1).
    pub threads: usize,
}

pub struct Engine {
    app: Arc<App>,
    shared: Arc<Shared>,
    env: Env,
    /// Shared with the loop's poll, so that a polled record (which borrows the
    /// consumer) can be handled by a method that needs the engine.
    consumer: Arc<MainConsumer>,
    /// The main consumer's statistics, for merged tasks.
    fetch_watch: Arc<FetchWatch>,
    producers: Producers,
    tracker: Arc<Tracker>,
    /// Active tasks: they process source records and own their output.
    tasks: BTreeMap<TaskId, Task>,
    /// The input queues of active tasks whose stage joins a second stream.
    merges: BTreeMap<TaskId, merge::Merge>,
    /// Standby tasks: they apply the changelog to a local copy of the state.
    standbys: BTreeMap<TaskId, Standby>,
    sink_topic: Option<String>,
    dlq_topic: Option<String>,
    /// The size limits of the topics outputs go to.
    limits: Arc<oversize::Limits>,
    /// Committed source offsets per task (what Kafka holds), for the restore filter.
    committed: BTreeMap<TaskId, BTreeMap<String, i64>>,
    /// A consumer for watermarks (lag), committed offsets and restore planning, on a
    /// connection that is not parked in the main consumer's long-poll fetches.
    side: BaseConsumer,
    /// The consumer restores read with; held by the restore threads while a batch
    /// restores (created on first use).
    restorer: Option<BaseConsumer>,
    /// A batch of new actives restoring beside the loop (`restoring`).
    restoring: Option<restoring::Restoring>,
    memory: SharedMemory,
    state_dir: PathBuf,
    /// At-least-once under the operator: a lapsed lease stops the worker (see
    /// [`crate::lease`]). Exactly-once is fenced by its transactional ids instead.
    lease_fences: bool,
    /// Changelog topic → store, to route standby records.
    changelogs: HashMap<String, StoreName>,
    /// Source and repartition topic → the stage that reads it.
    input_stage: HashMap<String, u32>,
    /// Tasks per stage (the source partition count).
    partitions: u32,
    /// Replay marks read from the group's committed offsets, until the task starts.
    resumed_marks: BTreeMap<TaskId, Marks>,
    /// Tasks whose marks did not fit in the commit metadata (warned once).
    marks_too_long: BTreeSet<TaskId>,
    /// When consumed repartition records were last deleted, and up to where.
    last_purge: Instant,
    purge_interval: Duration,
    purged: BTreeMap<TaskId, i64>,
    /// Global tables and the topic-existence cache, shared with every task.
    lookups: Arc<lookups::WorkerLookups>,
    /// For DeleteRecords on repartition topics; created at the first purge.
    admin: Option<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>,
    /// The desired-state version last applied.
    desired_seen: u64,
    desired: Desired,
    /// Active tasks waiting for their previous owner to let go, since when.
    waiting: BTreeMap<TaskId, Instant>,
    /// Processing threads (`--threads`), each thread's consumer once it has a task
    /// ([`parallel`]; with one thread its turn runs on the loop's), and the thread
    /// that runs each active task placed on one.
    threads: usize,
    pollers: Vec<parallel::Poller>,
    home: BTreeMap<TaskId, usize>,
    /// Raised by every queue the loop reads when something arrives in it: what an idle
    /// loop waits on.
    wake: Arc<wake::Wake>,
}

impl Engine {
    /// Connects, reads the task count, creates missing topics. Tasks start when a
    /// desired state arrives (at once in standalone mode).
    pub fn start(
        app: Arc<App>,
        opts: &RunOptions,
        shared: Arc<Shared>,
    ) -> Result<Self, EngineError> {
        let (mut consumer, fetch_watch) = main_consumer(&app)?;
        let wake = Arc::new(wake::Wake::default());
        consumer.set_nonempty_callback(wake.callback());
        // The checks go through the main consumer: it then knows the topics' leaders and
        // is connected to them when the first tasks are assigned. With a separate client
        // here, an at-least-once worker (ready at once, no producers to fence) sat up to
        // seconds after a restart before its first fetch.
        let task_count = source_task_count(&app, &consumer)?;
        check_tables(&app, &consumer, task_count)?;
        let all_stores = all_stores(&app, task_count);
        topics::ensure_topics(
            &app,
            &consumer,
            task_count,
            &all_stores,
            opts.coordination.is_some(),
        )?;
        check_sink(&app, &consumer)?;
        check_outputs(&app, &consumer)?;
        // The topic each store's copies follow: its changelog, or a table's topic.
        let changelogs = all_stores
            .iter()
            .map(|s| (app.store_topic(s), s.clone()))
            .collect();
        if let Ok(mut r) = shared.routing.write() {
            r.task_count = task_count as u32;
        }
        let input_stage = input_stages(&app);
        if opts.coordination.is_none() {
            publish_standalone_tasks(&app, opts, &shared, task_count)?;
        } else {
            tracing::info!(task_count, "waiting for the operator's assignment");
        }

        let tracker = Arc::new(Tracker::default());
        let producers = producers(&app, &tracker)?;
        let (restore_consumer, memory, lookups) = side_clients(&app, opts)?;
        if let Ok(mut g) = shared.globals.write() {
            *g = Some(lookups.clone());
        }
        let follow = lookups.follow_from()?;
        if follow.count() > 0 {
            consumer
                .incremental_assign(&follow)
                .map_err(EngineError::AssignPartitions)?;
        }
        let limits = Arc::new(oversize::Limits::load(&app, &output_topics(&app)));
        let app_guarantee = app.guarantee;
        let mut engine = Self {
            limits,
            sink_topic: app.manifest.spec.sink.as_ref().map(|s| s.topic.clone()),
            dlq_topic: app.manifest.dead_letter_topic(),
            app,
            shared,
            env: Env::default(),
            consumer: Arc::new(consumer),
            fetch_watch,
            producers,
            tracker,
            tasks: BTreeMap::new(),
            merges: BTreeMap::new(),
            standbys: BTreeMap::new(),
            committed: BTreeMap::new(),
            side: restore_consumer,
            restorer: None,
            restoring: None,
            memory,
            lookups,
            state_dir: opts.state_dir.clone(),
            lease_fences: opts.coordination.is_some()
                && app_guarantee == ProcessingGuarantee::AtLeastOnce,
            changelogs,
            input_stage,
            partitions: task_count as u32,
            resumed_marks: BTreeMap::new(),
            marks_too_long: BTreeSet::new(),
            last_purge: Instant::now(),
            purge_interval: opts.repartition_purge_interval,
            purged: BTreeMap::new(),
            admin: None,
            desired_seen: 0,
            desired: Desired::default(),
            waiting: BTreeMap::new(),
            threads: opts.threads.max(1),
            pollers: Vec::new(),
            home: BTreeMap::new(),
            wake,
        };
        // Standalone: restore and start every task before processing. Coordinated: the
        // worker stays Starting (not ready) until it has applied an assignment.
        engine.apply_desired()?;
        engine.poll_restore(true)?;
        Ok(engine)
    }
}

/// The restore consumer, the memory every task's RocksDB shares, and the global
/// tables, whole before any task runs.
fn side_clients(
    app: &App,
    opts: &RunOptions,
) -> Result<(BaseConsumer, SharedMemory, Arc<lookups::WorkerLookups>), EngineError> {
    let restore_consumer: BaseConsumer =
        consumer_config(app, true)
            .create()
            .map_err(|source| EngineError::CreateClient {
                what: "restore consumer",
                source,
            })?;
    let memory = SharedMemory::new(opts.memory_budget);
    let metadata: BaseConsumer =
        consumer_config(app, false)
            .create()
            .map_err(|source| EngineError::CreateClient {
                what: "metadata",
                source,
            })?;
    let lookups = Arc::new(lookups::WorkerLookups::bootstrap(
        app,
        &restore_consumer,
        metadata,
        &opts.state_dir,
        &memory,
    )?);
    Ok((restore_consumer, memory, lookups))
}

/// Which stage reads a topic: the sources feed stage 0, each repartition topic the
/// stage behind it; a stage's tables feed it too.
fn input_stages(app: &App) -> HashMap<String, u32> {
    let mut input_stage = HashMap::new();
    for stage in &app.topology.stages {
        for t in stage.input_topics(&app.manifest.spec) {
            input_stage.insert(t, stage.index);
        }
        for (_, t) in &stage.tables {
            input_stage.insert(t.clone(), stage.index);
        }
    }
    input_stage
}

/// At least once: one producer for every task. Exactly once: each task's transactional
/// producer starts with the task, but a bad transaction timeout fails the start, not
/// the first assignment.
fn producers(app: &App, tracker: &Arc<Tracker>) -> Result<Producers, EngineError> {
    Ok(match app.guarantee {
        ProcessingGuarantee::AtLeastOnce => Producers::Shared(producer(app, tracker, None)?),
        ProcessingGuarantee::ExactlyOnce => {
            let timeout = transaction_timeout(app)?;
            tracing::info!(
                transaction_timeout_ms = timeout.as_millis() as u64,
                "exactly-once"
            );
            Producers::Transactional(BTreeMap::new())
        }
    })
}

/// The app's task count per stage: the source topics' partition count (validated to be
/// the same for every source topic).
fn source_task_count(
    app: &App,
    consumer: &BaseConsumer<impl ConsumerContext + 'static>,
) -> Result<i32, EngineError> {
    let mut partitions = BTreeMap::new();
    for topic in &app.manifest.spec.source.topics {
        let md = consumer
            .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
            .map_err(EngineError::Metadata)?;
        let n = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len() as i32)
            .filter(|n| *n > 0);
        partitions.insert(topic.clone(), n);
    }
    Ok(oxbow_crds::validate::task_count(&partitions)?)
}

/// Every store of every task. A custom processor may declare stores per task, so each
/// task is asked.
fn all_stores(app: &App, task_count: i32) -> Vec<StoreName> {
    app.topology
        .tasks(task_count.max(1) as u32)
        .into_iter()
        .flat_map(|t| {
            app.stage_steps(t.stage)
                .iter()
                .flat_map(move |f| f(t).stores())
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Each co-partitioned table's topic and each joined stream has the app's task count; a global
/// table's topic exists.
fn check_tables(
    app: &App,
    consumer: &BaseConsumer<impl ConsumerContext + 'static>,
    task_count: i32,
) -> Result<(), EngineError> {
    let mut counts = BTreeMap::new();
    for topic in oxbow_crds::validate::join_topics(&app.manifest.spec) {
        let md = consumer
            .fetch_metadata(Some(&topic), KAFKA_TIMEOUT)
            .map_err(EngineError::Metadata)?;
        let n = md
            .topics()
            .iter()
            .find(|m| m.name() == topic && m.error().is_none())
            .map(|m| m.partitions().len() as i32)
            .filter(|n| *n > 0);
        counts.insert(topic, n);
    }
    let errors = oxbow_crds::validate::join_partitions(&app.manifest.spec, task_count, &counts);
    match errors.first() {
        Some(e) => Err(EngineError::Invalid(e.clone())),
        None => Ok(()),
    }
}

/// The fixed topics of `to` steps exist (a producer would wait for them for ever).
fn check_outputs(
    app: &App,
    consumer: &BaseConsumer<impl ConsumerContext + 'static>,
) -> Result<(), EngineError> {
    for (i, step) in app.manifest.spec.steps.iter().enumerate() {
        let Some(topic) = step.to.as_ref().and_then(|t| t.topic.as_ref()) else {
            continue;
        };
        let md = consumer
            .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
            .map_err(EngineError::Metadata)?;
        if !md
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        {
            return Err(EngineError::OutputTopicMissing {
                step: oxbow_crds::validate::step_label(i, step),
                topic: topic.clone(),
            });
        }
    }
    Ok(())
}

/// Every topic a task writes records to (besides changelogs): sink, `to` topics,
/// repartition topics and the dead-letter topic.
fn output_topics(app: &App) -> Vec<String> {
    let spec = &app.manifest.spec;
    let mut out: Vec<String> = spec.sink.iter().map(|s| s.topic.clone()).collect();
    out.extend(
        spec.steps
            .iter()
            .filter_map(|s| s.to.as_ref().and_then(|t| t.topic.clone())),
    );
    out.extend(
        app.topology
            .repartition_topics()
            .into_iter()
            .map(|(_, t)| t.to_string()),
    );
    out.extend(app.manifest.dead_letter_topic());
    out.sort();
    out.dedup();
    out
}

/// The sink belongs to the user (never created here): without this check a missing
/// one shows only as a delivery timeout at the first commit.
fn check_sink(
    app: &App,
    consumer: &BaseConsumer<impl ConsumerContext + 'static>,
) -> Result<(), EngineError> {
    let Some(sink) = &app.manifest.spec.sink else {
        return Ok(());
    };
    let md = consumer
        .fetch_metadata(Some(&sink.topic), KAFKA_TIMEOUT)
        .map_err(EngineError::Metadata)?;
    if md
        .topics()
        .iter()
        .any(|t| t.name() == sink.topic && t.error().is_none() && !t.partitions().is_empty())
    {
        Ok(())
    } else {
        Err(EngineError::SinkMissing(sink.topic.clone()))
    }
}

/// Standalone (no operator): this instance's tasks by the standalone rule, and a
/// routing table that places every task's active on its instance.
fn publish_standalone_tasks(
    app: &App,
    opts: &RunOptions,
    shared: &Shared,
    task_count: i32,
) -> Result<(), EngineError> {
    let all_tasks = app.topology.tasks(task_count as u32);
    let ids = if opts.instance_from_pod_name && opts.instance >= opts.instances {
        tracing::warn!(
            instance = opts.instance,
            instances = opts.instances,
            "this pod's ordinal is beyond --instances: it runs no task (set OXBOW_INSTANCES, or run under the operator)"
        );
        Vec::new()
    } else {
        oxbow_crds::assignment::standalone(&all_tasks, opts.instance, opts.instances)?
    };
    tracing::info!(tasks = ?ids.iter().map(ToString::to_string).collect::<Vec<_>>(), task_count, "assigned tasks (standalone)");
    if let Ok(mut r) = shared.routing.write() {
        r.me = format!("instance-{}", opts.instance);
        r.placements = all_tasks
            .iter()
            .map(|t| {
                (
                    *t,
                    oxbow_crds::assignment::TaskPlacement {
                        active: format!("instance-{}", t.partition % opts.instances.max(1)),
                        standbys: Vec::new(),
                        ..Default::default()
                    },
                )
            })
            .collect();
    }
    shared.set_desired(Desired {
        generation: 0,
        active: ids.into_iter().collect(),
        ..Default::default()
    });
    Ok(())
}

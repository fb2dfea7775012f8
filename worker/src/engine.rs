//! The processing loop: Kafka in, tasks, Kafka out, commits, restore. Owns every Kafka
//! client of the worker and the order of a commit:
//!
//! 1. changelog records for the dirty keys (last value per key, with [`SOURCE_HEADER`]);
//!    outputs and dead letters were already sent as records completed;
//! 2. exactly-once: the consumer offsets join the task's transaction
//!    (`<applicationId>-<task>`), which commits; at-least-once: flush, then commit the
//!    offsets;
//! 3. one RocksDB WriteBatch with the state and the new changelog/source offsets.
//!
//! A crash anywhere leaves RocksDB at an older committed prefix of the changelog, which
//! restore completes. Any commit or producer failure stops the worker (crash-only): the
//! restart recovers from committed state rather than guessing what half-happened.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxbow_crds::names::changelog_topic;
use oxbow_crds::validate::TRANSACTION_TIMEOUT_PROPERTY;
use oxbow_crds::{ProcessingGuarantee, StoreName, TaskId};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::App;
use crate::expr::Env;
use crate::metrics::{METRICS, RestoreGauges, task as task_label};
use crate::replay::{Admission, MAX_METADATA, Marks, ORIGIN_HEADER, Origin};
use crate::restore::{FullRestoreReason, RestoreFacts, RestorePlan, plan};
use crate::status::{Desired, RestoreProgress, Role, Shared, TaskState, TaskStatus};
use crate::store::{SharedMemory, StoreError, TaskDb};
use crate::task::{
    KEY_HEADER, Outcome, Output, SOURCE_HEADER, SourceMessage, Task, now_ms, parse_source_header,
    produced_by_committed_work,
};

const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// A task commits early when this many records are pending, whatever the interval.
const MAX_UNCOMMITTED: u64 = 50_000;
/// Every task commits its position at least this often, even when idle.
const OFFSET_REFRESH: Duration = Duration::from_secs(60);
/// Bulk-load chunk: entries buffered before an SST file is written.
const INGEST_CHUNK_BYTES: usize = 64 << 20;
/// Sorted files below this size make more work for compaction than they save memory.
const MIN_INGEST_CHUNK_BYTES: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("failed to create the Kafka {what} client: {source}")]
    CreateClient {
        what: &'static str,
        source: KafkaError,
    },
    #[error("failed to read metadata of source topics: {0}")]
    Metadata(KafkaError),
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
    #[error("failed to restore store {store} of task {task} from {topic}: {message}")]
    Restore {
        task: TaskId,
        store: String,
        topic: String,
        message: String,
    },
    #[error("failed to produce to {topic}: {source}")]
    Produce { topic: String, source: KafkaError },
    #[error("failed to commit task {task}: {source}")]
    Commit { task: TaskId, source: KafkaError },
    #[error("failed to commit offsets: {0}")]
    CommitOffsets(KafkaError),
    #[error("failed to deliver records: {0}")]
    Delivery(String),
    #[error("failed to assign source partitions: {0}")]
    AssignPartitions(KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("failed to create topic {topic}: {message}")]
    CreateTopic { topic: String, message: String },
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
    #[error("failed to initialise task {task}: {message}")]
    Init { task: TaskId, message: String },
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
}

/// Delivery reports of every producer: the last offset per partition (changelog
/// checkpoints) and the first error.
#[derive(Default)]
struct Tracker {
    offsets: Mutex<HashMap<(String, i32), i64>>,
    error: Mutex<Option<String>>,
}

#[derive(Clone)]
struct Ctx(Arc<Tracker>);
impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(m) => {
                if let Ok(mut o) = self.0.offsets.lock() {
                    let e = o
                        .entry((m.topic().to_string(), m.partition()))
                        .or_insert(-1);
                    *e = (*e).max(m.offset());
                }
            }
            Err((e, m)) => {
                if let Ok(mut err) = self.0.error.lock() {
                    err.get_or_insert_with(|| format!("{} [{}]: {e}", m.topic(), m.partition()));
                }
            }
        }
    }
}

type KProducer = ThreadedProducer<Ctx>;

enum Producers {
    /// One transactional producer per task: its id fences a zombie of that task.
    Transactional(BTreeMap<TaskId, (KProducer, bool)>),
    Shared(KProducer),
}

fn base_config(app: &App) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set(
        "bootstrap.servers",
        &app.manifest.spec.kafka.bootstrap_servers,
    );
    for (k, v) in &app.kafka {
        c.set(k, v);
    }
    c
}

fn consumer_config(app: &App, restore: bool) -> ClientConfig {
    let mut c = base_config(app);
    c.set("group.id", &app.application_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "false");
    // Prefetch is per partition (librdkafka's defaults allow 100 000 records or 64 MiB
    // each): bounded, memory goes to RocksDB's budget, not to records in a queue. Each
    // queued record also costs librdkafka a few hundred bytes of bookkeeping: at 4 MiB
    // and 20 000 records per partition the prefetch held about 85 MiB of the worker's
    // 205 MiB peak in W1 (500 000 records); at 1 MiB and 2 000 it peaked at 119 MiB with
    // the same throughput.
    c.set("queued.max.messages.kbytes", "1024")
        .set("queued.min.messages", "2000")
        // With a queue this small it fills often; librdkafka then postpones the
        // partition's next fetch by this long (1 s by default), and the engine, having
        // drained the queue meanwhile, sits idle for the rest of it.
        .set("fetch.queue.backoff.ms", "5");
    if restore {
        // Restore reads whole logs: big fetches, with the next one already queued
        // while a chunk is applied.
        c.set("fetch.max.bytes", "33554432")
            .set("max.partition.fetch.bytes", "8388608")
            .set("queued.max.messages.kbytes", "8192")
            .set("queued.min.messages", "20000");
    }
    if app.guarantee == ProcessingGuarantee::ExactlyOnce {
        c.set("isolation.level", "read_committed");
    }
    c
}

fn producer(
    app: &App,
    tracker: &Arc<Tracker>,
    transactional_id: Option<&str>,
) -> Result<KProducer, EngineError> {
    producer_config(app, transactional_id)?
        .create_with_context(Ctx(tracker.clone()))
        .map_err(|source| EngineError::CreateClient {
            what: "producer",
            source,
        })
}

fn producer_config(app: &App, transactional_id: Option<&str>) -> Result<ClientConfig, EngineError> {
    let mut c = base_config(app);
    c.set("enable.idempotence", "true")
        .set("linger.ms", "5")
        // Same partitioning as the Java clients, so keyed outputs land where Kafka
        // Streams would put them.
        .set("partitioner", "murmur2_random")
        .set("compression.type", "lz4");
    if let Some(id) = transactional_id {
        let timeout = transaction_timeout(app)?;
        c.set("transactional.id", id).set(
            TRANSACTION_TIMEOUT_PROPERTY,
            timeout.as_millis().to_string(),
        );
    }
    Ok(c)
}

/// The transaction timeout of a task's producer: it follows the commit interval, or is
/// the user's `transaction.timeout.ms` (from the spec or the Kafka Secret, which the
/// operator's validation does not see) when that leaves room for the interval.
fn transaction_timeout(app: &App) -> Result<Duration, EngineError> {
    Ok(oxbow_crds::validate::transaction_timeout(
        app.commit_interval,
        app.kafka
            .get(TRANSACTION_TIMEOUT_PROPERTY)
            .map(String::as_str),
    )?)
}

/// Waits until every record handed to `p` is acknowledged.
///
/// rdkafka's `flush` alternates `rd_kafka_flush(0)` with a `poll` of up to 100 ms; with
/// a `ThreadedProducer` the background thread takes the delivery events, so that poll
/// sleeps its full 100 ms and every flush costs at least that. Here the zero-timeout
/// flush (which also sends lingering batches at once) is repeated with short pauses.
fn flush(p: &KProducer, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        match p.flush(Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(e),
        }
    }
}

fn send(
    p: &KProducer,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: Option<OwnedHeaders>,
    timestamp: Option<i64>,
) -> Result<(), EngineError> {
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
    if let Some(p) = partition {
        rec = rec.partition(p);
    }
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    if let Some(h) = headers {
        rec = rec.headers(h);
    }
    if let Some(ts) = timestamp {
        rec = rec.timestamp(ts);
    }
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                p.poll(Duration::from_millis(2));
            }
            Err((source, _)) => {
                return Err(EngineError::Produce {
                    topic: topic.to_string(),
                    source,
                });
            }
        }
    }
}

pub struct Engine {
    app: Arc<App>,
    shared: Arc<Shared>,
    env: Env,
    consumer: BaseConsumer,
    producers: Producers,
    tracker: Arc<Tracker>,
    /// Active tasks: they process source records and own their output.
    tasks: BTreeMap<TaskId, Task>,
    /// Standby tasks: they apply the changelog to a local copy of the state.
    standbys: BTreeMap<TaskId, Standby>,
    sink_topic: Option<String>,
    dlq_topic: Option<String>,
    /// Committed source offsets per task (what Kafka holds), for the restore filter.
    committed: BTreeMap<TaskId, BTreeMap<String, i64>>,
    /// The restore consumer, unassigned after restore: it asks for watermarks (lag) on
    /// a connection that is not parked in the main consumer's long-poll fetches.
    side: BaseConsumer,
    memory: SharedMemory,
    state_dir: PathBuf,
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
    purged: BTreeMap<TaskId, i64>,
    /// For DeleteRecords on repartition topics; created at the first purge.
    admin: Option<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>,
    /// The desired-state version last applied.
    desired_seen: u64,
    desired: Desired,
    /// Active tasks waiting for their previous owner to let go, since when.
    waiting: BTreeMap<TaskId, Instant>,
}

/// A standby task: the changelog applied to a local copy of the state, checkpointed, so
/// a promotion restores only the tail.
struct Standby {
    db: Arc<TaskDb>,
    /// Per store: the next changelog offset to apply.
    next: BTreeMap<StoreName, i64>,
    /// Applied but not yet written to RocksDB.
    pending: Vec<crate::overlay::Write>,
    /// At-least-once only: records whose source work is not committed yet, in log
    /// order. A crash of the active between its changelog flush and its offset commit
    /// leaves such records behind; they are applied only once the group's committed
    /// offsets cover them (the same rule as restore).
    held: std::collections::VecDeque<HeldRecord>,
    committed: BTreeMap<String, i64>,
    last_flush: Instant,
}

struct HeldRecord {
    store: StoreName,
    offset: i64,
    source: Option<BTreeMap<String, i64>>,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
}

/// Exactly-once: how long a new active waits for a previous owner that still reports
/// but does not release the task (wedged) before it starts anyway; its producer fences
/// the old owner. Longer than a transaction's timeout and a long restore's commit gap.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(300);
/// How often consumed repartition records are deleted (Kafka Streams'
/// `repartition.purge.interval.ms`).
const PURGE_INTERVAL: Duration = Duration::from_secs(30);
/// A standby writes its applied records at least every this many.
const STANDBY_BATCH: usize = 10_000;

impl Engine {
    /// Connects, reads the task count, creates missing topics. Tasks start when a
    /// desired state arrives (at once in standalone mode).
    pub fn start(
        app: Arc<App>,
        opts: &RunOptions,
        shared: Arc<Shared>,
    ) -> Result<Self, EngineError> {
        let spec = &app.manifest.spec;
        let consumer: BaseConsumer =
            consumer_config(&app, false)
                .create()
                .map_err(|source| EngineError::CreateClient {
                    what: "consumer",
                    source,
                })?;
        let mut partitions = BTreeMap::new();
        for topic in &spec.source.topics {
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
        let task_count = oxbow_crds::validate::task_count(&partitions)?;
        let all_tasks = app.topology.tasks(task_count as u32);
        // A custom processor may declare stores per task: every task's count.
        let all_stores: Vec<StoreName> = app
            .topology
            .tasks(task_count.max(1) as u32)
            .into_iter()
            .flat_map(|t| {
                app.stage_steps(t.stage)
                    .iter()
                    .flat_map(move |f| f(t).stores())
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        ensure_topics(&app, &consumer, task_count, &all_stores)?;
        // The sink belongs to the user (never created here): without this check a
        // missing one shows only as a delivery timeout at the first commit.
        if let Some(sink) = &spec.sink {
            let md = consumer
                .fetch_metadata(Some(&sink.topic), KAFKA_TIMEOUT)
                .map_err(EngineError::Metadata)?;
            if !md.topics().iter().any(|t| {
                t.name() == sink.topic && t.error().is_none() && !t.partitions().is_empty()
            }) {
                return Err(EngineError::SinkMissing(sink.topic.clone()));
            }
        }
        let changelogs = all_stores
            .iter()
            .map(|s| (changelog_topic(&app.application_id, s), s.clone()))
            .collect();
        if let Ok(mut r) = shared.routing.write() {
            r.task_count = task_count as u32;
        }
        // Which stage reads a topic: the sources feed stage 0, each repartition topic
        // the stage behind it.
        let mut input_stage = HashMap::new();
        for stage in &app.topology.stages {
            for t in stage.input_topics(spec) {
                input_stage.insert(t, stage.index);
            }
        }
        if opts.coordination.is_none() {
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
        } else {
            tracing::info!(task_count, "waiting for the operator's assignment");
        }

        let tracker = Arc::new(Tracker::default());
        let producers = match app.guarantee {
            ProcessingGuarantee::AtLeastOnce => Producers::Shared(producer(&app, &tracker, None)?),
            ProcessingGuarantee::ExactlyOnce => {
                // Producers start with their tasks: a bad timeout fails the start, not
                // the first assignment.
                let timeout = transaction_timeout(&app)?;
                tracing::info!(
                    transaction_timeout_ms = timeout.as_millis() as u64,
                    "exactly-once"
                );
                Producers::Transactional(BTreeMap::new())
            }
        };
        let restore_consumer: BaseConsumer =
            consumer_config(&app, true)
                .create()
                .map_err(|source| EngineError::CreateClient {
                    what: "restore consumer",
                    source,
                })?;
        let mut engine = Self {
            sink_topic: spec.sink.as_ref().map(|s| s.topic.clone()),
            dlq_topic: app.manifest.dead_letter_topic(),
            app,
            shared,
            env: Env::default(),
            consumer,
            producers,
            tracker,
            tasks: BTreeMap::new(),
            standbys: BTreeMap::new(),
            committed: BTreeMap::new(),
            side: restore_consumer,
            memory: SharedMemory::new(opts.memory_budget),
            state_dir: opts.state_dir.clone(),
            changelogs,
            input_stage,
            partitions: task_count as u32,
            resumed_marks: BTreeMap::new(),
            marks_too_long: BTreeSet::new(),
            last_purge: Instant::now(),
            purged: BTreeMap::new(),
            admin: None,
            desired_seen: 0,
            desired: Desired::default(),
            waiting: BTreeMap::new(),
        };
        // Standalone: restore and start every task before processing. Coordinated: the
        // worker stays Starting (not ready) until it has applied an assignment.
        engine.apply_desired()?;
        Ok(engine)
    }

    /// Applies a new desired state, if any, and retries hand-overs that were waiting.
    fn apply_desired(&mut self) -> Result<(), EngineError> {
        let retry = !self.waiting.is_empty();
        if let Some(d) = self.shared.desired_since(&mut self.desired_seen) {
            tracing::info!(generation = d.generation, active = ?d.active, standby = ?d.standby,
                waiting_for_release = ?d.held_elsewhere, "new assignment");
            self.desired = d;
        } else if !retry {
            return Ok(());
        }
        let d = self.desired.clone();
        // Tasks that must start as actives now; the others wait for their previous owner.
        let now = Instant::now();
        let mut start_active = Vec::new();
        let mut keep_waiting = BTreeMap::new();
        for t in &d.active {
            if self.tasks.contains_key(t) {
                continue;
            }
            if d.held_elsewhere.contains(t) {
                let since = self.waiting.get(t).copied().unwrap_or(now);
                // Under at-least-once nothing fences a live holder: two owners would
                // interleave state, so the wait lasts as long as the holder reports (the
                // coordinator stops holding a task back once its holder goes silent).
                let alos = self.app.guarantee == ProcessingGuarantee::AtLeastOnce;
                if alos || now.duration_since(since) < HANDOVER_TIMEOUT {
                    keep_waiting.insert(*t, since);
                    continue;
                }
                tracing::warn!(task = %t, "the previous owner, still reporting, has not released the task within {}s: starting it anyway (its producer is fenced and its next commit fails)", HANDOVER_TIMEOUT.as_secs());
            }
            start_active.push(*t);
        }
        self.waiting = keep_waiting;
        let waiting: Vec<TaskId> = self.waiting.keys().copied().collect();
        self.shared.update(|s| s.waiting_for_release = waiting);

        // 1. Release what is no longer ours, first: the next owner waits for it.
        let release: Vec<TaskId> = self
            .tasks
            .keys()
            .filter(|t| !d.active.contains(t))
            .copied()
            .collect();
        if !release.is_empty() {
            self.commit_all()?;
            for t in release {
                let db = self.close_active(t)?;
                if d.standby.contains(&t) {
                    self.start_standby(t, Some(db))?;
                }
            }
        }
        // 2. Standbys no longer wanted (neither standby nor an active to be).
        let drop_standbys: Vec<TaskId> = self
            .standbys
            .keys()
            .filter(|t| !d.standby.contains(t) && !d.active.contains(t))
            .copied()
            .collect();
        for t in drop_standbys {
            self.close_standby(t)?;
        }
        // 3. New standbys, and actives waiting for a hand-over (kept warm meanwhile).
        let want_standby: Vec<TaskId> = d
            .standby
            .iter()
            .chain(self.waiting.keys())
            .filter(|t| !self.standbys.contains_key(t) && !self.tasks.contains_key(t))
            .copied()
            .collect();
        for t in want_standby {
            self.start_standby(t, None)?;
        }
        // 4. New actives: a warm standby is promoted (tail restore only). They restore
        // one after the other, so each is announced first with what it will read: the
        // reported progress and ETA cover them all rather than one task at a time. None
        // processes before all are restored (this loop returns first), so they are
        // reported Running together.
        if !start_active.is_empty() {
            // Restores hold this thread: nothing of the running tasks may stay open in
            // a transaction (it would time out) or uncommitted meanwhile.
            self.commit_all()?;
        }
        let mut batch = Vec::new();
        for t in start_active {
            let db = match self.standbys.contains_key(&t) {
                true => self.close_standby(t)?,
                false => self.open_db(t)?,
            };
            let total = restore_total(&self.app, &self.side, &db, t, &self.task_stores(t))?;
            let mut st = TaskStatus::new(t);
            st.state = TaskState::Restoring;
            st.restore = Some(RestoreProgress {
                mode: "pending".into(),
                total,
                remaining: total,
                ..Default::default()
            });
            self.shared.put_task(st);
            batch.push((t, db));
        }
        let StartOutcome {
            started,
            superseded,
        } = self.start_actives(batch)?;
        if !superseded.is_empty() || self.shared.desired_changed(self.desired_seen) {
            // The assignment moved on while restoring: this generation is not
            // acknowledged. A task placed elsewhere meanwhile (this pod's copy was cold
            // and a warm one exists) keeps what it restored, as a standby, until the
            // next round decides; the others run and the next round releases them if
            // they are no longer ours.
            tracing::info!("assignment changed while starting tasks: re-planning");
            for (t, db) in superseded {
                self.shared.remove_task(t);
                self.start_standby(t, Some(db))?;
            }
            for t in started {
                self.shared
                    .task(t, |s: &mut TaskStatus| s.state = TaskState::Running);
            }
            return Ok(());
        }
        for t in started {
            self.shared.task(t, |s| s.state = TaskState::Running);
        }
        self.shared.update(|s| {
            s.generation = d.generation;
            s.state = "Running".into();
        });
        Ok(())
    }

    /// `<state-dir>/<applicationId>/<stage>_<partition>`. A stage-0 directory written
    /// before tasks had stages (`<partition>`) is renamed, so an upgrade keeps its state.
    fn task_dir(&self, id: TaskId) -> PathBuf {
        let app_dir = self.state_dir.join(&self.app.application_id);
        let dir = app_dir.join(id.to_string());
        let legacy = app_dir.join(id.partition.to_string());
        if id.stage == 0 && !dir.exists() && legacy.is_dir() {
            match std::fs::rename(&legacy, &dir) {
                Ok(()) => {
                    tracing::info!(task = %id, from = %legacy.display(), "renamed a task directory from before stages")
                }
                Err(e) => {
                    tracing::warn!(task = %id, error = %e, "failed to rename the task directory from before stages: restoring from the changelog instead")
                }
            }
        }
        dir
    }

    fn task_stores(&self, id: TaskId) -> Vec<StoreName> {
        self.app
            .stage_steps(id.stage)
            .iter()
            .flat_map(|f| f(id).stores())
            .collect()
    }

    /// The stage of a task's store's changelog record, from its topic.
    fn stage_of_changelog(&self, store: &StoreName) -> u32 {
        self.app.topology.stage_of_store(store)
    }

    fn open_db(&self, id: TaskId) -> Result<Arc<TaskDb>, EngineError> {
        let stores = self.task_stores(id);
        // A query may still hold the handle of a store closed a moment ago (RocksDB's
        // LOCK is held until the last reader lets go): retry briefly.
        let mut tries = 0;
        loop {
            match TaskDb::open(&self.task_dir(id), id, &stores, &self.memory) {
                Ok(db) => return Ok(Arc::new(db)),
                Err(e @ StoreError::Open { .. }) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(task = %id, error = %e, "store still open elsewhere: retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn source_tpl(&self, id: TaskId) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for topic in self.app.inputs(id.stage) {
            tpl.add_partition(topic, id.kafka_partition());
        }
        tpl
    }

    /// Starts a batch of active tasks: fences each task's previous owner (exactly-once),
    /// restores each store (a tail when the local copy is warm), then starts consuming
    /// at the committed offsets.
    ///
    /// The round trips and restores of different tasks do not depend on each other, so
    /// they overlap: fencing waits on librdkafka's coordinator timers (about 0.5 s per
    /// producer, even on an idle broker) and a restore mostly on fetches. One after the
    /// other, four tasks took 2-3 s to start after a crash with nothing to restore.
    /// A task placed elsewhere while restoring comes back in `superseded`.
    fn start_actives(
        &mut self,
        batch: Vec<(TaskId, Arc<TaskDb>)>,
    ) -> Result<StartOutcome, EngineError> {
        let app = self.app.clone();
        let snapshot = self.shared.snapshot();
        for (id, _) in &batch {
            let mut st = TaskStatus::new(*id);
            st.state = TaskState::Restoring;
            // The figures announced for the batch stand until the restore reports its own.
            st.restore = snapshot.as_ref().and_then(|s| {
                s.tasks
                    .iter()
                    .find(|t| t.task == *id && t.role == Role::Active)?
                    .restore
                    .clone()
            });
            self.shared.put_task(st);
        }
        self.shared.update(|s| s.state = "Restoring".into());
        if let Producers::Transactional(m) = &mut self.producers {
            // Fences any older producer with each task's id and aborts its open
            // transaction, so the restores below read only committed data.
            let ids: Vec<TaskId> = batch.iter().map(|(id, _)| *id).collect();
            for (id, p) in init_producers(&app, &self.tracker, &ids)? {
                m.insert(id, (p, false));
            }
        }
        // What Kafka says is committed: the truth for where to resume and what to
        // restore. One request for the whole batch.
        let mut tpl = TopicPartitionList::new();
        for (id, _) in &batch {
            for topic in app.inputs(id.stage) {
                tpl.add_partition(topic, id.kafka_partition());
            }
        }
        let committed_tpl = self
            .consumer
            .committed_offsets(tpl, KAFKA_TIMEOUT)
            .map_err(|source| EngineError::CommittedOffsets {
                group: app.application_id.clone(),
                source,
            })?;
        let mut starting = Vec::new();
        for (id, db) in batch {
            let inputs = app.inputs(id.stage);
            let mut done: BTreeMap<String, i64> = BTreeMap::new();
            for e in committed_tpl.elements() {
                if e.partition() == id.kafka_partition()
                    && inputs.iter().any(|t| t == e.topic())
                    && let Offset::Offset(o) = e.offset()
                {
                    done.insert(e.topic().to_string(), o);
                    if id.stage > 0 {
                        let upstream = app.inputs(id.stage - 1);
                        self.resumed_marks
                            .insert(id, Marks::decode(e.metadata(), upstream));
                    }
                }
            }
            // Kafka drops a group's offsets after offsets.retention.minutes without a
            // commit; the positions kept with the state are then the best truth, far
            // better than reprocessing the topic from the start into existing state.
            let kept = db.checkpoint()?.source;
            for topic in inputs {
                if let (false, Some(pos)) = (done.contains_key(topic), kept.get(topic)) {
                    tracing::warn!(task = %id, topic, position = pos,
                        "no committed offset in Kafka (expired or deleted group?): resuming from the position stored with the state");
                    done.insert(topic.clone(), *pos);
                }
            }
            self.committed.insert(id, done.clone());
            if let Ok(mut dbs) = self.shared.dbs.write() {
                dbs.insert(id, db.clone());
            }
            starting.push((id, db, done));
        }
        let jobs: Vec<RestoreJob<'_>> = starting
            .iter()
            .map(|(id, db, done)| RestoreJob {
                id: *id,
                db,
                stores: self.task_stores(*id),
                // Under exactly-once read_committed already hides uncommitted work;
                // the source-offset filter is for at-least-once.
                committed: (app.guarantee == ProcessingGuarantee::AtLeastOnce).then_some(done),
            })
            .collect();
        let results = restore_tasks(&app, &self.side, &jobs, &self.shared);
        drop(jobs);
        let mut outcome = StartOutcome::default();
        let mut first_error = None;
        let mut assign = TopicPartitionList::new();
        for ((id, db, done), result) in starting.into_iter().zip(results) {
            match result {
                Ok(progress) => {
                    tracing::info!(task = %id, mode = %progress.mode, restored = progress.restored, skipped = progress.skipped,
                        seconds = progress.seconds, rate = progress.records_per_second, "restored");
                    self.finish_start(id, db, done, &mut assign)?;
                    outcome.started.push(id);
                }
                Err(EngineError::Superseded(_)) => {
                    if let Producers::Transactional(m) = &mut self.producers {
                        m.remove(&id);
                    }
                    self.committed.remove(&id);
                    if let Ok(mut dbs) = self.shared.dbs.write() {
                        dbs.remove(&id);
                    }
                    outcome.superseded.push((id, db));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // One assignment for the batch: partitions added one by one wait behind the
        // long-poll fetch of those added before (up to fetch.wait.max.ms each).
        if assign.count() > 0 {
            self.consumer
                .incremental_assign(&assign)
                .map_err(EngineError::AssignPartitions)?;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(outcome),
        }
    }

    /// Initialises a restored task's processors and adds its source partitions, at the
    /// committed offsets, to `assign`.
    fn finish_start(
        &mut self,
        id: TaskId,
        db: Arc<TaskDb>,
        done: BTreeMap<String, i64>,
        assign: &mut TopicPartitionList,
    ) -> Result<(), EngineError> {
        let app = self.app.clone();
        let processors: Vec<_> = app.stage_steps(id.stage).iter().map(|f| f(id)).collect();
        let mut task = Task::new(&app, id, self.partitions, db, processors);
        task.positions = done.clone();
        task.marks = self.resumed_marks.remove(&id).unwrap_or_default();
        if !task.marks.is_empty() {
            tracing::info!(task = %id, marks = ?task.marks, "resuming with replay marks");
        }
        task.init(&self.env).map_err(|e| EngineError::Init {
            task: id,
            message: e.to_string(),
        })?;
        // Running once every task of the batch is restored (apply_desired).
        self.shared.task(id, |t| {
            t.state_lag = Some(0);
            t.positions = task.positions.clone();
        });
        for topic in app.inputs(id.stage) {
            let off = done
                .get(topic)
                .map_or(Offset::Beginning, |o| Offset::Offset(*o));
            assign
                .add_partition_offset(topic, id.kafka_partition(), off)
                .map_err(EngineError::AssignPartitions)?;
        }
        // A pause (errors.policy: fail) outlives an unassign in librdkafka: a task that
        // failed here before, moved away and came back must not stay paused.
        let _ = self.consumer.resume(&self.source_tpl(id));
        self.tasks.insert(id, task);
        Ok(())
    }

    /// Stops an active task whose work is committed; returns its store.
    fn close_active(&mut self, id: TaskId) -> Result<Arc<TaskDb>, EngineError> {
        let tpl = self.source_tpl(id);
        self.consumer
            .incremental_unassign(&tpl)
            .map_err(EngineError::AssignPartitions)?;
        if let Producers::Transactional(m) = &mut self.producers {
            m.remove(&id);
        }
        self.committed.remove(&id);
        if let Ok(mut dbs) = self.shared.dbs.write() {
            dbs.remove(&id);
        }
        self.shared.remove_task(id);
        tracing::info!(task = %id, "released active task");
        let task = self.tasks.remove(&id).ok_or_else(|| EngineError::Init {
            task: id,
            message: "released a task that was not active".into(),
        })?;
        crate::metrics::forget_task(id, task.db.stores());
        Ok(task.db)
    }

    /// Starts applying a task's changelog to a local copy, from its checkpoint.
    fn start_standby(&mut self, id: TaskId, db: Option<Arc<TaskDb>>) -> Result<(), EngineError> {
        let db = match db {
            Some(db) => db,
            None => self.open_db(id)?,
        };
        let mut next = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        // Reported from the start: a copy without a lag would look cold to placement.
        let mut lag = 0;
        let stores = self.task_stores(id);
        for p in plan_stores(&self.app, &self.side, &db, id, &stores)? {
            let from = match p.plan {
                RestorePlan::UpToDate => p.log_end,
                RestorePlan::Tail { from, .. } => from,
                RestorePlan::Full { from, wipe, .. } => {
                    if wipe {
                        tracing::warn!(task = %id, store = %p.store, "standby copy is not a prefix of its changelog: wiping it");
                        db.wipe(&p.store)?;
                    }
                    from
                }
            };
            tpl.add_partition_offset(&p.topic, id.kafka_partition(), Offset::Offset(from))
                .map_err(EngineError::AssignPartitions)?;
            lag += (p.log_end - from).max(0);
            next.insert(p.store, from);
        }
        self.consumer
            .incremental_assign(&tpl)
            .map_err(EngineError::AssignPartitions)?;
        if let Ok(mut dbs) = self.shared.dbs.write() {
            dbs.insert(id, db.clone());
        }
        let mut st = TaskStatus::new(id);
        st.role = Role::Standby;
        st.state = TaskState::Running;
        st.state_lag = Some(lag);
        self.shared.put_task(st);
        tracing::info!(task = %id, "started standby task");
        self.standbys.insert(
            id,
            Standby {
                db,
                next,
                pending: Vec::new(),
                held: Default::default(),
                committed: self.committed.get(&id).cloned().unwrap_or_default(),
                last_flush: Instant::now(),
            },
        );
        if self.app.guarantee == ProcessingGuarantee::AtLeastOnce {
            self.refresh_standby_offsets(&[id]);
        }
        Ok(())
    }

    /// Checkpoints and stops a standby; returns its store.
    fn close_standby(&mut self, id: TaskId) -> Result<Arc<TaskDb>, EngineError> {
        self.flush_standby(id)?;
        let mut tpl = TopicPartitionList::new();
        for store in self.task_stores(id) {
            tpl.add_partition(
                &changelog_topic(&self.app.application_id, &store),
                id.kafka_partition(),
            );
        }
        self.consumer
            .incremental_unassign(&tpl)
            .map_err(EngineError::AssignPartitions)?;
        if let Ok(mut dbs) = self.shared.dbs.write() {
            dbs.remove(&id);
        }
        self.shared.remove_task(id);
        let sb = self.standbys.remove(&id).ok_or_else(|| EngineError::Init {
            task: id,
            message: "closed a standby that was not open".into(),
        })?;
        crate::metrics::forget_task(id, sb.db.stores());
        Ok(sb.db)
    }

    /// At-least-once: the group's committed offsets of a standby's source partitions.
    /// At-least-once: the group's committed offsets of these standbys' source
    /// partitions, in one request (it runs on the processing thread).
    fn refresh_standby_offsets(&mut self, ids: &[TaskId]) {
        let mut tpl = TopicPartitionList::new();
        for id in ids {
            for topic in self.app.inputs(id.stage) {
                tpl.add_partition(topic, id.kafka_partition());
            }
        }
        if tpl.count() == 0 {
            return;
        }
        let Ok(c) = self.side.committed_offsets(tpl, Duration::from_secs(5)) else {
            return;
        };
        for e in c.elements() {
            let Some(stage) = self.input_stage.get(e.topic()) else {
                continue;
            };
            if let (Offset::Offset(o), Some(sb)) = (
                e.offset(),
                self.standbys
                    .get_mut(&TaskId::new(*stage, e.partition() as u32)),
            ) {
                sb.committed.insert(e.topic().to_string(), o);
            }
        }
    }

    /// Writes a standby's applied records with their checkpoint.
    fn flush_standby(&mut self, id: TaskId) -> Result<(), EngineError> {
        // Under exactly-once, aborted records and transaction markers are never
        // delivered, yet the consumer's position moves past them: without it a standby
        // behind an aborted range (a crash mid-transaction, then silence) would look
        // that far behind for ever. Everything before the position was delivered.
        let positions = match self.app.guarantee {
            ProcessingGuarantee::ExactlyOnce => self.consumer.position().ok(),
            ProcessingGuarantee::AtLeastOnce => None,
        };
        let app_id = self.app.application_id.clone();
        let Some(sb) = self.standbys.get_mut(&id) else {
            return Ok(());
        };
        if let Some(pos) = &positions {
            for (store, next) in sb.next.iter_mut() {
                if let Some(Offset::Offset(o)) = pos
                    .find_partition(&changelog_topic(&app_id, store), id.kafka_partition())
                    .map(|e| e.offset())
                {
                    *next = (*next).max(o);
                }
            }
        }
        sb.last_flush = Instant::now();
        // A held record's offset bounds its store's checkpoint: it is not applied yet.
        let mut cp = sb.next.clone();
        for h in &sb.held {
            let e = cp.entry(h.store.clone()).or_insert(h.offset);
            *e = (*e).min(h.offset);
        }
        if sb.pending.is_empty() && sb.db.checkpoint()?.changelog == cp {
            return Ok(());
        }
        sb.db.commit(&sb.pending, &cp, &BTreeMap::new())?;
        sb.pending.clear();
        Ok(())
    }

    /// Processes until asked to stop, then commits and returns.
    pub fn run(mut self) -> Result<(), EngineError> {
        let interval = self.app.commit_interval;
        let mut last_commit = Instant::now();
        let mut last_punctuate = Instant::now();
        let mut last_report = Instant::now();
        let mut last_refresh = Instant::now();
        let mut out = Vec::new();
        let mut last_desired_check = Instant::now();
        let mut last_standby_flush = Instant::now();
        while !self.shared.stopping() {
            if last_desired_check.elapsed() >= Duration::from_millis(200) {
                last_desired_check = Instant::now();
                match self.apply_desired() {
                    // SIGTERM during a restore: commit what runs, below, and exit.
                    Err(EngineError::Stopped) => break,
                    r => r?,
                }
            }
            match self.consumer.poll(Duration::from_millis(5)) {
                // No `continue` below: the periodic work after the match (commits,
                // standby flushes, reports) must run however busy the consumer is.
                Some(Ok(m)) => 'msg: {
                    if let Some(store) = self.changelogs.get(m.topic()).cloned() {
                        let id = TaskId::new(self.stage_of_changelog(&store), m.partition() as u32);
                        apply_standby_record(
                            &mut self.standbys,
                            self.app.guarantee == ProcessingGuarantee::AtLeastOnce,
                            self.app.inputs(id.stage),
                            id,
                            store,
                            &m,
                        );
                        drop(m);
                        // A standby catching up a long changelog writes as it goes:
                        // its buffer stays bounded whatever the commit interval.
                        if self
                            .standbys
                            .get(&id)
                            .is_some_and(|sb| sb.pending.len() >= STANDBY_BATCH)
                        {
                            self.flush_standby(id)?;
                        }
                        break 'msg;
                    }
                    let Some(stage) = self.input_stage.get(m.topic()) else {
                        break 'msg;
                    };
                    let id = TaskId::new(*stage, m.partition() as u32);
                    let Some(task) = self.tasks.get_mut(&id) else {
                        break 'msg;
                    };
                    if task.failed.is_some() {
                        break 'msg;
                    }
                    METRICS.records_in.get_or_create(&task_label(id)).inc();
                    let alos = self.app.guarantee == ProcessingGuarantee::AtLeastOnce;
                    let origin = (alos && id.stage > 0)
                        .then(|| header(&m, ORIGIN_HEADER))
                        .flatten()
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(Origin::parse);
                    let msg = SourceMessage {
                        topic: m.topic(),
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key(),
                        value: m.payload(),
                        timestamp: m.timestamp().to_millis(),
                        record_key: (id.stage > 0)
                            .then(|| header(&m, KEY_HEADER))
                            .flatten(),
                    };
                    if let Some(o) = &origin
                        && task.marks.admit(o) == Admission::Replayed
                    {
                        task.skip_replayed(&msg);
                        METRICS.replays_dropped.get_or_create(&task_label(id)).inc();
                        self.shared.task(id, |t| t.replays_dropped += 1);
                        break 'msg;
                    }
                    out.clear();
                    let outcome = task.process(&self.app, &self.env, &msg, now_ms(), &mut out)?;
                    let topic = m.topic().to_string();
                    let from = alos.then(|| (m.partition(), m.offset()));
                    drop(m);
                    self.record_outcome(id, &topic, &outcome)?;
                    let from = from.map(|(p, o)| (topic.as_str(), p, o));
                    self.send_outputs(id, &out, from)?;
                }
                Some(Err(e)) => {
                    // Broker restarts and the like: librdkafka reconnects by itself.
                    tracing::warn!(error = %e, "consumer error");
                }
                None => {}
            }
            if last_punctuate.elapsed() >= Duration::from_millis(100) {
                last_punctuate = Instant::now();
                let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
                for id in ids {
                    out.clear();
                    if let Some(task) = self.tasks.get_mut(&id)
                        && task.failed.is_none()
                    {
                        task.punctuate(&self.app, &self.env, now_ms(), &mut out)?;
                    }
                    // Not tied to one input record: no origin, never dropped as a replay.
                    self.send_outputs(id, &out, None)?;
                }
            }
            if last_refresh.elapsed() >= OFFSET_REFRESH {
                // An idle partition's offsets would expire (offsets.retention.minutes)
                // without a commit: commit every task's position now and then.
                last_refresh = Instant::now();
                for t in self
                    .tasks
                    .values_mut()
                    .filter(|t| t.failed.is_none() && !t.positions.is_empty())
                {
                    t.uncommitted = t.uncommitted.max(1);
                }
            }
            let pending = self
                .tasks
                .values()
                .map(|t| t.uncommitted)
                .max()
                .unwrap_or(0);
            if last_commit.elapsed() >= interval || pending >= MAX_UNCOMMITTED {
                self.commit_all()?;
                last_commit = Instant::now();
            }
            if self.last_purge.elapsed() >= PURGE_INTERVAL {
                self.purge_repartitions();
            }
            if last_standby_flush.elapsed() >= Duration::from_millis(500) {
                last_standby_flush = Instant::now();
                self.flush_standbys()?;
            }
            if last_report.elapsed() >= Duration::from_secs(2) {
                last_report = Instant::now();
                self.report();
            }
        }
        tracing::info!("stopping: committing the current unit of work");
        self.shared.update(|s| s.state = "Stopping".into());
        self.commit_all()?;
        let standbys: Vec<TaskId> = self.standbys.keys().copied().collect();
        for t in standbys {
            self.flush_standby(t)?;
        }
        self.report();
        // Everything is committed: the last status entry says so, and the next owner of
        // each task need not wait for a release it would otherwise never see.
        self.shared.update(|s| s.tasks.clear());
        Ok(())
    }

    /// Checkpoints standbys now and then (at-least-once: after refreshing the committed
    /// offsets that release held records).
    fn flush_standbys(&mut self) -> Result<(), EngineError> {
        let alos = self.app.guarantee == ProcessingGuarantee::AtLeastOnce;
        let ids: Vec<TaskId> = self
            .standbys
            .iter()
            .filter(|(_, sb)| {
                sb.last_flush.elapsed() >= Duration::from_secs(1)
                    || sb.pending.len() >= STANDBY_BATCH
            })
            .map(|(t, _)| *t)
            .collect();
        if alos {
            self.refresh_standby_offsets(&ids);
        }
        for t in ids {
            let sources = self.app.inputs(t.stage);
            if let Some(sb) = self.standbys.get_mut(&t) {
                drain_held(sb, sources);
            }
            self.flush_standby(t)?;
        }
        Ok(())
    }

    fn record_outcome(
        &mut self,
        id: TaskId,
        topic: &str,
        outcome: &Outcome,
    ) -> Result<(), EngineError> {
        match outcome {
            Outcome::Processed => self.shared.task(id, |t| t.processed += 1),
            Outcome::DeadLettered => {
                METRICS.dead_letters.get_or_create(&task_label(id)).inc();
                self.shared.task(id, |t| t.dead_letters += 1);
            }
            Outcome::Skipped => {
                METRICS.skipped.get_or_create(&task_label(id)).inc();
                self.shared.task(id, |t| t.skipped += 1);
            }
            Outcome::Failed(m) => {
                tracing::error!(task = %id, error = %m, "task failed (errors.policy: fail); its partitions are paused");
                let _ = self.consumer.pause(&self.source_tpl(id));
                self.shared.task(id, |t| {
                    t.state = TaskState::Failed;
                    t.last_error = Some(m.clone());
                });
                let _ = topic;
            }
        }
        Ok(())
    }

    fn producer_for(&mut self, id: TaskId) -> Result<&KProducer, EngineError> {
        match &mut self.producers {
            Producers::Shared(p) => Ok(p),
            Producers::Transactional(m) => {
                let (p, in_txn) = m.get_mut(&id).ok_or_else(|| EngineError::Init {
                    task: id,
                    message: "no producer for task".into(),
                })?;
                if !*in_txn {
                    p.begin_transaction()
                        .map_err(|source| EngineError::Commit { task: id, source })?;
                    *in_txn = true;
                }
                Ok(p)
            }
        }
    }

    /// Sends a task's outputs. `from` is the input record they came from (topic,
    /// partition, offset) under at-least-once: its repartitioned outputs carry it as
    /// their origin, so the next stage can drop them when a replay writes them again.
    fn send_outputs(
        &mut self,
        id: TaskId,
        out: &[Output],
        from: Option<(&str, i32, i64)>,
    ) -> Result<(), EngineError> {
        if out.is_empty() {
            return Ok(());
        }
        let (sink, dlq) = (self.sink_topic.clone(), self.dlq_topic.clone());
        let p = self.producer_for(id)?;
        let mut sent = 0;
        let mut index = 0u32;
        for o in out {
            match o {
                Output::Sink {
                    key,
                    value,
                    timestamp,
                } => {
                    if let Some(topic) = &sink {
                        send(
                            p,
                            topic,
                            None,
                            key.as_deref(),
                            Some(value),
                            None,
                            Some(*timestamp),
                        )?;
                        sent += 1;
                    }
                }
                Output::Repartition {
                    topic,
                    partition,
                    key,
                    value,
                    record_key,
                    timestamp,
                } => {
                    let mut h = OwnedHeaders::new().insert(Header {
                        key: KEY_HEADER,
                        value: Some(record_key.as_slice()),
                    });
                    if let Some((t, partition, offset)) = from {
                        let origin = Origin::header(t, partition, offset, index);
                        index += 1;
                        h = h.insert(Header {
                            key: ORIGIN_HEADER,
                            value: Some(origin.as_str()),
                        });
                    }
                    send(
                        p,
                        topic,
                        Some(*partition),
                        Some(key),
                        Some(value),
                        Some(h),
                        Some(*timestamp),
                    )?;
                    sent += 1;
                }
                Output::DeadLetter {
                    key,
                    value,
                    headers,
                } => {
                    if let Some(topic) = &dlq {
                        let mut h = OwnedHeaders::new();
                        for (k, v) in headers {
                            h = h.insert(Header {
                                key: k,
                                value: Some(v.as_bytes()),
                            });
                        }
                        send(
                            p,
                            topic,
                            None,
                            key.as_deref(),
                            value.as_deref(),
                            Some(h),
                            None,
                        )?;
                    }
                }
            }
        }
        METRICS
            .records_out
            .get_or_create(&task_label(id))
            .inc_by(sent);
        Ok(())
    }

    fn commit_all(&mut self) -> Result<(), EngineError> {
        let started = Instant::now();
        let ids: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.uncommitted > 0)
            .map(|(id, _)| *id)
            .collect();
        let in_txn: Vec<TaskId> = match &self.producers {
            Producers::Transactional(m) => m
                .iter()
                .filter(|(_, (_, b))| *b)
                .map(|(id, _)| *id)
                .collect(),
            Producers::Shared(_) => Vec::new(),
        };
        let mut ids = ids;
        for id in in_txn {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        let app_id = self.app.application_id.clone();
        if let Producers::Shared(p) = &self.producers {
            // At-least-once: outputs must be durable before the changelog that records
            // their effect (a batch's deletion), or a crash in between could keep the
            // effect and lose the output.
            flush(p, KAFKA_TIMEOUT).map_err(|e| EngineError::Delivery(e.to_string()))?;
            self.check_delivery()?;
        }
        let mut commits = BTreeMap::new();
        for id in &ids {
            let Some(task) = self.tasks.get_mut(id) else {
                continue;
            };
            let c = task.take_commit();
            let mut stores = Vec::new();
            let p = self.producer_for(*id)?;
            for ((store, key), value) in &c.writes {
                let topic = changelog_topic(&app_id, store);
                let h = OwnedHeaders::new().insert(Header {
                    key: SOURCE_HEADER,
                    value: Some(c.source_header.as_bytes()),
                });
                send(
                    p,
                    &topic,
                    Some(id.kafka_partition()),
                    Some(key),
                    value.as_deref(),
                    Some(h),
                    None,
                )?;
                if !stores.contains(store) {
                    stores.push(store.clone());
                }
            }
            commits.insert(*id, (c, stores));
        }
        if let Producers::Transactional(m) = &mut self.producers {
            let gm = self
                .consumer
                .group_metadata()
                .ok_or_else(|| EngineError::Init {
                    task: ids[0],
                    message: "the consumer has no group metadata".into(),
                })?;
            let ended = end_transactions(m, &commits, &gm);
            self.check_delivery()?;
            // A task whose transaction committed has its state applied even when another
            // task's failed: its outputs and offsets are in Kafka now.
            let mut first_error = None;
            for (id, r) in ended {
                match r {
                    Ok(()) => {
                        if let Some((c, stores)) = commits.get(&id) {
                            self.apply_commit(id, c, stores)?;
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        if let Producers::Shared(p) = &self.producers {
            flush(p, KAFKA_TIMEOUT).map_err(|e| EngineError::Delivery(e.to_string()))?;
            self.check_delivery()?;
            let mut tpl = TopicPartitionList::new();
            for (id, (c, _)) in &commits {
                // A stage > 0 task has one input: its marks go with its offset.
                let marks = (id.stage > 0 && !c.marks.is_empty())
                    .then(|| self.encode_marks(*id, &c.marks))
                    .flatten();
                for (topic, off) in &c.positions {
                    tpl.add_partition_offset(topic, id.kafka_partition(), Offset::Offset(*off))
                        .map_err(EngineError::CommitOffsets)?;
                    if let (Some(m), Some(mut e)) =
                        (&marks, tpl.find_partition(topic, id.kafka_partition()))
                    {
                        e.set_metadata(m);
                    }
                }
            }
            if tpl.count() > 0 {
                self.consumer
                    .commit(&tpl, CommitMode::Sync)
                    .map_err(EngineError::CommitOffsets)?;
            }
            for (id, (c, stores)) in &commits {
                self.apply_commit(*id, c, stores)?;
            }
        }
        METRICS
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Deletes the repartition records this worker's stage-N tasks have committed past
    /// (DeleteRecords, as Kafka Streams does every 30 s), so a repartition topic holds
    /// only what is still to be processed. Committed means in Kafka: under exactly-once
    /// the transaction with the offsets committed, under at-least-once the offsets.
    /// A failure is only logged: the records stay until the next round.
    fn purge_repartitions(&mut self) {
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

    fn check_delivery(&self) -> Result<(), EngineError> {
        match self.tracker.error.lock().ok().and_then(|e| e.clone()) {
            Some(e) => Err(EngineError::Delivery(e)),
            None => Ok(()),
        }
    }

    /// A stage > 0 task's replay marks as offset-commit metadata; when they do not fit,
    /// none (a restart then counts an upstream replay again) and a warning, once.
    fn encode_marks(&mut self, id: TaskId, marks: &Marks) -> Option<String> {
        let encoded = marks.encode(self.app.inputs(id.stage - 1));
        if encoded.is_none() && self.marks_too_long.insert(id) {
            tracing::warn!(task = %id, max_bytes = MAX_METADATA,
                "the replay marks of this task do not fit in the offset commit's metadata: after a restart an upstream replay may be counted twice (at-least-once)");
        }
        encoded
    }

    /// Kafka has the unit of work: now RocksDB gets it, with the offsets it matches.
    fn apply_commit(
        &mut self,
        id: TaskId,
        c: &crate::task::Commit,
        stores: &[StoreName],
    ) -> Result<(), EngineError> {
        let app_id = &self.app.application_id;
        let offsets = self
            .tracker
            .offsets
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default();
        let mut checkpoints = BTreeMap::new();
        for s in stores {
            if let Some(o) = offsets.get(&(changelog_topic(app_id, s), id.kafka_partition())) {
                checkpoints.insert(s.clone(), o + 1);
            }
        }
        let Some(task) = self.tasks.get(&id) else {
            return Ok(());
        };
        task.db.commit(&c.writes, &checkpoints, &c.positions)?;
        self.committed.insert(id, c.positions.clone());
        METRICS.commits.get_or_create(&task_label(id)).inc();
        self.shared.task(id, |t| {
            t.commits += 1;
            t.positions = c.positions.clone();
        });
        Ok(())
    }

    fn report(&mut self) {
        for (id, task) in &self.tasks {
            let mut lag = 0;
            for topic in self.app.inputs(id.stage) {
                if let Ok((_, high)) =
                    self.side
                        .fetch_watermarks(topic, id.kafka_partition(), Duration::from_secs(2))
                {
                    let pos = task.positions.get(topic).copied().unwrap_or(0);
                    lag += (high - pos).max(0);
                }
            }
            METRICS.lag.get_or_create(&task_label(*id)).set(lag);
            for s in task.db.stores() {
                METRICS
                    .store_bytes
                    .get_or_create(&crate::metrics::store(*id, s))
                    .set(task.db.size_bytes(s) as i64);
            }
            self.shared.task(*id, |t| t.lag = Some(lag));
        }
        for (id, sb) in &self.standbys {
            let mut lag = 0;
            for (store, next) in &sb.next {
                let topic = changelog_topic(&self.app.application_id, store);
                if let Ok((_, high)) =
                    self.side
                        .fetch_watermarks(&topic, id.kafka_partition(), Duration::from_secs(2))
                {
                    lag += (high - next).max(0);
                }
            }
            // Under exactly-once the log end includes transaction markers, which are
            // never delivered: a caught-up standby may show a few records of lag.
            self.shared.task(*id, |t| t.state_lag = Some(lag));
        }
    }
}

/// The value of header `name` of `m`, if it has one.
fn header<'a>(m: &'a rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<&'a [u8]> {
    m.headers()?.iter().find(|h| h.key == name)?.value
}

/// The source offsets a changelog record says produced it ([`SOURCE_HEADER`]).
fn source_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<BTreeMap<String, i64>> {
    m.headers()
        .and_then(|h| {
            h.iter()
                .find(|h| h.key == SOURCE_HEADER)
                .and_then(|h| h.value)
        })
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(parse_source_header)
}

/// Applies one changelog record to a standby.
fn apply_standby_record(
    standbys: &mut BTreeMap<TaskId, Standby>,
    alos: bool,
    sources: &[String],
    id: TaskId,
    store: StoreName,
    m: &rdkafka::message::BorrowedMessage<'_>,
) {
    let Some(sb) = standbys.get_mut(&id) else {
        return;
    };
    // Never apply the past over newer state (a stale fetch after a re-assignment).
    if sb.next.get(&store).is_some_and(|n| m.offset() < *n) {
        return;
    }
    let Some(key) = m.key() else {
        sb.next.insert(store, m.offset() + 1);
        return;
    };
    let source = source_of(m);
    let rec = HeldRecord {
        store,
        offset: m.offset(),
        source,
        key: key.to_vec(),
        value: m.payload().map(<[u8]>::to_vec),
    };
    if alos {
        sb.held.push_back(rec);
        drain_held(sb, sources);
    } else {
        sb.next.insert(rec.store.clone(), rec.offset + 1);
        sb.pending.push(((rec.store, rec.key), rec.value));
    }
}

/// Applies the held records whose source work is now committed, in log order.
/// An end of transaction slower than this is logged with its round trips' times.
const SLOW_TRANSACTION: Duration = Duration::from_millis(500);

/// Ends the open transaction of each task in `commits`: its source offsets go to the
/// group through the transaction, then its records are flushed and the transaction
/// committed. Each of these is a round trip on the task's own producer, so the tasks'
/// transactions end side by side rather than one after another (four tasks queued
/// their round trips for most of a 100 ms commit interval).
fn end_transactions(
    producers: &mut BTreeMap<TaskId, (KProducer, bool)>,
    commits: &BTreeMap<TaskId, (crate::task::Commit, Vec<StoreName>)>,
    gm: &ConsumerGroupMetadata,
) -> Vec<(TaskId, Result<(), EngineError>)> {
    fn end(
        id: TaskId,
        p: &KProducer,
        in_txn: &mut bool,
        c: &crate::task::Commit,
        gm: &ConsumerGroupMetadata,
    ) -> Result<(), EngineError> {
        let fail = |source| EngineError::Commit { task: id, source };
        let mut tpl = TopicPartitionList::new();
        for (topic, off) in &c.positions {
            tpl.add_partition_offset(topic, id.kafka_partition(), Offset::Offset(*off))
                .map_err(fail)?;
        }
        let t0 = Instant::now();
        if tpl.count() > 0 {
            p.send_offsets_to_transaction(&tpl, gm, KAFKA_TIMEOUT)
                .map_err(fail)?;
        }
        let t1 = Instant::now();
        flush(p, KAFKA_TIMEOUT).map_err(fail)?;
        let t2 = Instant::now();
        p.commit_transaction(KAFKA_TIMEOUT).map_err(fail)?;
        *in_txn = false;
        // A slow end of transaction holds the task's records back from read_committed
        // readers: say which round trip was slow.
        let total = t0.elapsed();
        if total >= SLOW_TRANSACTION {
            tracing::warn!(task = %id,
                offsets_ms = (t1 - t0).as_millis() as u64,
                flush_ms = (t2 - t1).as_millis() as u64,
                commit_ms = t2.elapsed().as_millis() as u64,
                "slow end of transaction");
        }
        Ok(())
    }
    let work: Vec<_> = producers
        .iter_mut()
        .filter_map(|(id, (p, in_txn))| Some((*id, (&*p, in_txn, &commits.get(id)?.0))))
        .collect();
    // A panic in librdkafka's bindings is a bug; the task's commit is then unknown,
    // which a restart resolves by fencing and restoring.
    side_by_side(work, "ending the transaction", |id, (p, in_txn, c)| {
        end(id, p, in_txn, c, gm)
    })
}

/// Runs `f` on each task's item, on a thread per task when there are several, and
/// returns the results in the items' order. A thread that panics gives an error for
/// its task naming `what` it was doing.
fn side_by_side<I: Send, R: Send>(
    items: Vec<(TaskId, I)>,
    what: &str,
    f: impl Fn(TaskId, I) -> Result<R, EngineError> + Sync,
) -> Vec<(TaskId, Result<R, EngineError>)> {
    if items.len() <= 1 {
        return items.into_iter().map(|(id, i)| (id, f(id, i))).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|(id, i)| (id, s.spawn(move || f(id, i))))
            .collect();
        handles
            .into_iter()
            .map(|(id, h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(EngineError::Init {
                        task: id,
                        message: format!("the thread {what} panicked"),
                    })
                });
                (id, r)
            })
            .collect()
    })
}

fn drain_held(sb: &mut Standby, sources: &[String]) {
    while sb
        .held
        .front()
        .is_some_and(|h| produced_by_committed_work(h.source.as_ref(), &sb.committed, sources))
    {
        if let Some(h) = sb.held.pop_front() {
            sb.next.insert(h.store.clone(), h.offset + 1);
            sb.pending.push(((h.store, h.key), h.value));
        }
    }
}

/// What starting a batch of active tasks came to: the tasks now running, and those
/// placed elsewhere while they restored, with their stores.
#[derive(Default)]
struct StartOutcome {
    started: Vec<TaskId>,
    superseded: Vec<(TaskId, Arc<TaskDb>)>,
}

/// One task's restore, as `restore_tasks` runs it.
struct RestoreJob<'a> {
    id: TaskId,
    db: &'a TaskDb,
    stores: Vec<StoreName>,
    /// At-least-once: the committed source offsets, to skip the changelog records of
    /// work that was never committed.
    committed: Option<&'a BTreeMap<String, i64>>,
}

/// At most this many restores run at once, each with its own consumer.
const RESTORE_THREADS: usize = 4;

/// Creates the transactional producers of `ids` and initialises them side by side.
/// Each `init_transactions` fences the previous producer with the task's id and aborts
/// its open transaction; librdkafka waits on fixed 500 ms coordinator timers there, so
/// one after the other this took about half a second per task.
fn init_producers(
    app: &App,
    tracker: &Arc<Tracker>,
    ids: &[TaskId],
) -> Result<Vec<(TaskId, KProducer)>, EngineError> {
    let items = ids.iter().map(|id| (*id, ())).collect();
    side_by_side(items, "initialising the task's producer", |id, ()| {
        let tid = app.manifest.transactional_id(id);
        let p = producer(app, tracker, Some(&tid))?;
        p.init_transactions(KAFKA_TIMEOUT)
            .map_err(|source| EngineError::InitTransactions {
                transactional_id: tid.clone(),
                source,
            })?;
        Ok(p)
    })
    .into_iter()
    .map(|(id, r)| r.map(|p| (id, p)))
    .collect()
}

/// Restores the tasks of `jobs`, up to `RESTORE_THREADS` at a time, and returns each
/// one's result in the order of `jobs`. The first thread uses `side`; the others
/// their own consumers (a consumer's assignment is one restore at a time). Bulk loads
/// share the sort memory of one: the chunk shrinks with the number of threads.
fn restore_tasks(
    app: &App,
    side: &BaseConsumer,
    jobs: &[RestoreJob<'_>],
    shared: &Shared,
) -> Vec<Result<RestoreProgress, EngineError>> {
    let started = Instant::now();
    // More threads than cores only add contention: each restore keeps a core busy
    // decoding and sorting while its consumer's threads fetch.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = jobs.len().clamp(1, RESTORE_THREADS.min(cores.max(1)));
    let chunk = (INGEST_CHUNK_BYTES / threads).max(MIN_INGEST_CHUNK_BYTES);
    if threads == 1 {
        return jobs
            .iter()
            .map(|j| restore_task(app, side, j, chunk, shared, started))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<RestoreProgress, EngineError>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for n in 0..threads {
            let (next, results) = (&next, &results);
            s.spawn(move || {
                let own;
                let consumer = if n == 0 {
                    side
                } else {
                    match consumer_config(app, true).create::<BaseConsumer>() {
                        Ok(c) => {
                            own = c;
                            &own
                        }
                        // The jobs left are taken by the threads that have a consumer.
                        Err(e) => {
                            tracing::warn!(error = %e, "could not create an extra restore consumer");
                            return;
                        }
                    }
                };
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(job) = jobs.get(i) else { return };
                    let r = restore_task(app, consumer, job, chunk, shared, started);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .zip(jobs)
        .map(|(slot, job)| {
            slot.into_inner().ok().flatten().unwrap_or_else(|| {
                // Only a panic in a restore leaves a slot empty.
                Err(EngineError::Restore {
                    task: job.id,
                    store: String::new(),
                    topic: String::new(),
                    message: "the restore thread panicked".into(),
                })
            })
        })
        .collect()
}

/// Each store's restore plan from its checkpoint and its changelog's watermarks, with
/// the changelog topic and the log end. Restore, the announcement of what a restore will
/// read, and a standby's starting point all plan the same way.
struct StorePlan {
    store: StoreName,
    topic: String,
    plan: RestorePlan,
    log_end: i64,
}

fn plan_stores(
    app: &App,
    consumer: &BaseConsumer,
    db: &TaskDb,
    id: TaskId,
    stores: &[StoreName],
) -> Result<Vec<StorePlan>, EngineError> {
    let checkpoint = db.checkpoint()?;
    let mut out = Vec::new();
    for store in stores {
        let topic = changelog_topic(&app.application_id, store);
        let (low, high) = watermarks(consumer, &topic, id.kafka_partition()).map_err(|e| {
            EngineError::Restore {
                task: id,
                store: store.0.clone(),
                topic: topic.clone(),
                message: e.to_string(),
            }
        })?;
        let plan = plan(RestoreFacts {
            checkpoint: checkpoint.changelog.get(store).copied(),
            log_start: low,
            log_end: high,
            local_empty: db.is_empty(store)?,
        });
        out.push(StorePlan {
            store: store.clone(),
            topic,
            plan,
            log_end: high,
        });
    }
    Ok(out)
}

/// A partition's watermarks, retried while the cluster settles: right after a broker
/// restart, leadership moves and the first requests fail with `NotLeaderForPartition`
/// for a moment, which must not stop a worker that is starting.
fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), KafkaError> {
    let deadline = Instant::now() + KAFKA_TIMEOUT;
    loop {
        match consumer.fetch_watermarks(topic, partition, KAFKA_TIMEOUT) {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(topic, partition, error = %e, "watermarks not available yet: retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The changelog records a task's restore will read.
fn restore_total(
    app: &App,
    consumer: &BaseConsumer,
    db: &TaskDb,
    id: TaskId,
    stores: &[StoreName],
) -> Result<u64, EngineError> {
    Ok(plan_stores(app, consumer, db, id, stores)?
        .iter()
        .map(|p| match p.plan {
            RestorePlan::UpToDate => 0,
            RestorePlan::Tail { from, to } | RestorePlan::Full { from, to, .. } => {
                (to - from).max(0) as u64
            }
        })
        .sum())
}

/// Restores every store of a task: tail from the checkpoint, or a full rebuild (bulk
/// loaded by SST ingestion when the store is empty). Records produced by source offsets
/// at or past the committed offset are skipped.
fn restore_task(
    app: &App,
    consumer: &BaseConsumer,
    job: &RestoreJob<'_>,
    chunk_bytes: usize,
    shared: &Shared,
    // When the batch's restores began: `seconds` counts from there, so the slowest task
    // of a batch restored concurrently gives the batch's wall time.
    started: Instant,
) -> Result<RestoreProgress, EngineError> {
    let own_start = Instant::now();
    let mut total = RestoreProgress {
        mode: "upToDate".into(),
        ..Default::default()
    };
    let (id, db, stores, committed) = (job.id, job.db, &job.stores, job.committed);
    // Every early return below drops this and so clears the task's restore gauges.
    let gauges = RestoreGauges::start(id);
    let mut plans = Vec::new();
    for StorePlan {
        store,
        topic,
        plan: p,
        ..
    } in plan_stores(app, consumer, db, id, stores)?
    {
        match &p {
            RestorePlan::UpToDate => {}
            RestorePlan::Tail { from, to } => {
                total.total += (to - from) as u64;
                if total.mode == "upToDate" {
                    total.mode = "tail".into();
                }
            }
            RestorePlan::Full {
                from, to, reason, ..
            } => {
                total.total += (to - from) as u64;
                total.mode = format!(
                    "full ({})",
                    match reason {
                        FullRestoreReason::NoCheckpoint => "no checkpoint",
                        FullRestoreReason::CheckpointBeyondLog =>
                            "checkpoint beyond the changelog end: topic recreated",
                        FullRestoreReason::CheckpointBeforeLogStart =>
                            "checkpoint before the changelog start",
                    }
                );
            }
        }
        plans.push((store, topic, p));
    }
    total.remaining = total.total;
    shared.task(id, |t| t.restore = Some(total.clone()));
    for (store, topic, p) in plans {
        let (from, to, bulk) = match p {
            RestorePlan::UpToDate => continue,
            RestorePlan::Tail { from, to } => (from, to, false),
            RestorePlan::Full {
                from,
                to,
                bulk_load,
                wipe,
                ..
            } => {
                if wipe {
                    tracing::warn!(task = %id, store = %store, "local store is not a prefix of its changelog: wiping it");
                    db.wipe(&store)?;
                }
                (from, to, bulk_load)
            }
        };
        restore_store(
            consumer,
            id,
            db,
            &store,
            &topic,
            from,
            to,
            bulk.then_some(chunk_bytes),
            committed,
            // The topics this stage reads: a stage > 0 unit of work is a position in its
            // repartition topic, not in the app's sources.
            app.inputs(id.stage),
            &mut total,
            started,
            shared,
            &gauges,
        )?;
    }
    total.remaining = 0;
    total.seconds = started.elapsed().as_secs_f64();
    let own = own_start.elapsed().as_secs_f64();
    if own > 0.0 {
        total.records_per_second = (total.restored + total.skipped) as f64 / own;
    }
    gauges.finish(total.restored, total.records_per_second);
    shared.task(id, |t| t.restore = Some(total.clone()));
    Ok(total)
}

#[allow(clippy::too_many_arguments)]
fn restore_store(
    consumer: &BaseConsumer,
    id: TaskId,
    db: &TaskDb,
    store: &StoreName,
    topic: &str,
    from: i64,
    to: i64,
    // A bulk load, in sorted files of about this many bytes each.
    bulk_chunk: Option<usize>,
    committed: Option<&BTreeMap<String, i64>>,
    source_topics: &[String],
    progress: &mut RestoreProgress,
    started: Instant,
    shared: &Shared,
    gauges: &RestoreGauges,
) -> Result<(), EngineError> {
    let bulk = bulk_chunk.is_some();
    if from >= to {
        let cp = BTreeMap::from([(store.clone(), to)]);
        db.commit(&[], &cp, &BTreeMap::new())?;
        return Ok(());
    }
    let fail = |message: String| EngineError::Restore {
        task: id,
        store: store.0.clone(),
        topic: topic.to_string(),
        message,
    };
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, id.kafka_partition(), Offset::Offset(from))
        .map_err(|e| fail(e.to_string()))?;
    consumer.assign(&tpl).map_err(|e| fail(e.to_string()))?;
    let mut sorted: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    let mut sorted_bytes = 0usize;
    let mut batch: Vec<crate::overlay::Write> = Vec::new();
    let mut files = 0usize;
    let mut last_progress = Instant::now();
    let mut last_offset = from - 1;
    let mut idle_since = Instant::now();
    let base_remaining = progress.remaining;
    // When records started to arrive, and how many were done then (see the rate below).
    let mut flowing_since: Option<(Instant, u64)> = None;
    loop {
        if shared.stopping() {
            // A tail keeps what it applied, with its checkpoint; a bulk load has no
            // checkpoint until it ends and is redone from the start.
            if !bulk {
                let cp = BTreeMap::from([(store.clone(), last_offset + 1)]);
                db.commit(&batch, &cp, &BTreeMap::new())?;
            }
            consumer.unassign().map_err(|e| fail(e.to_string()))?;
            return Err(EngineError::Stopped);
        }
        // Near the end only a transaction marker may be left, which is never delivered;
        // a long poll would sit out its whole timeout before the position check below
        // sees the log consumed, once per store restored.
        let wait = if last_offset + 2 >= to {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(wait) {
            Some(Ok(m)) => {
                idle_since = Instant::now();
                if m.offset() >= to {
                    break;
                }
                if flowing_since.is_none() {
                    flowing_since = Some((Instant::now(), progress.restored + progress.skipped));
                    // The first report then comes when a rate can be given: with a tick
                    // counted from the assignment instead, the first report of a
                    // concurrent bulk load fell just short of the half second, the next
                    // behind a long ingestion, and the ETA never showed.
                    last_progress = Instant::now();
                }
                last_offset = m.offset();
                let header = source_of(&m);
                if let Some(committed) = committed
                    && !produced_by_committed_work(header.as_ref(), committed, source_topics)
                {
                    progress.skipped += 1;
                    continue;
                }
                let (Some(key), value) = (m.key(), m.payload()) else {
                    progress.skipped += 1;
                    continue;
                };
                progress.restored += 1;
                if bulk {
                    // Two heap blocks, their Vec headers and a share of a B-tree node.
                    sorted_bytes += key.len() + value.map_or(0, <[u8]>::len) + 128;
                    sorted.insert(key.to_vec(), value.map(<[u8]>::to_vec));
                    if bulk_chunk.is_some_and(|chunk| sorted_bytes >= chunk) {
                        db.ingest_sorted(store, &sorted, files)?;
                        files += 1;
                        sorted.clear();
                        sorted_bytes = 0;
                    }
                } else {
                    batch.push(((store.clone(), key.to_vec()), value.map(<[u8]>::to_vec)));
                    if batch.len() >= 10_000 {
                        let cp = BTreeMap::from([(store.clone(), last_offset + 1)]);
                        db.commit(&batch, &cp, &BTreeMap::new())?;
                        batch.clear();
                    }
                }
                if last_progress.elapsed() >= Duration::from_millis(500) {
                    last_progress = Instant::now();
                    if shared
                        .desired_peek()
                        .is_some_and(|d| !d.active.contains(&id))
                    {
                        // Assigned elsewhere meanwhile: stop; a tail keeps what it
                        // applied (a standby continues from there).
                        if !bulk {
                            let cp = BTreeMap::from([(store.clone(), last_offset + 1)]);
                            db.commit(&batch, &cp, &BTreeMap::new())?;
                        }
                        consumer.unassign().map_err(|e| fail(e.to_string()))?;
                        return Err(EngineError::Superseded(id));
                    }
                    let done = (last_offset + 1 - from).max(0) as u64;
                    progress.remaining = base_remaining.saturating_sub(done);
                    progress.seconds = started.elapsed().as_secs_f64();
                    // The rate counts from the first record, over at least half a second:
                    // the assignment and first fetch can take seconds, and a rate taken
                    // over them (one record in three seconds) gives an ETA of weeks.
                    // Until then the previous store's rate stands (none for the first).
                    if let Some((t0, d0)) = flowing_since
                        && t0.elapsed() >= Duration::from_millis(500)
                    {
                        progress.records_per_second = (progress.restored + progress.skipped - d0)
                            as f64
                            / t0.elapsed().as_secs_f64();
                    }
                    gauges.set(
                        progress.restored,
                        progress.remaining,
                        progress.records_per_second,
                    );
                    shared.task(id, |t| t.restore = Some(progress.clone()));
                }
            }
            Some(Err(e)) => tracing::warn!(task = %id, topic, error = %e, "restore consumer error"),
            None => {
                // The end may be a transaction marker or aborted records, which are
                // never delivered: the fetch position tells when the log is consumed.
                let at_end = consumer.position().ok().is_some_and(|tpl| {
                    tpl.find_partition(topic, id.kafka_partition())
                        .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= to))
                });
                if at_end {
                    break;
                }
                if idle_since.elapsed() > KAFKA_TIMEOUT {
                    return Err(fail(format!(
                        "no progress for {}s at offset {} of {to}",
                        KAFKA_TIMEOUT.as_secs(),
                        last_offset + 1
                    )));
                }
            }
        }
    }
    if bulk {
        db.ingest_sorted(store, &sorted, files)?;
        files += usize::from(!sorted.is_empty());
        progress.ingested_files += files as u64;
    }
    // Checkpoint at the end of what was read: everything before `to` is applied.
    let cp = BTreeMap::from([(store.clone(), to)]);
    db.commit(&batch, &cp, &BTreeMap::new())?;
    consumer.unassign().map_err(|e| fail(e.to_string()))?;
    progress.remaining = base_remaining.saturating_sub((to - from).max(0) as u64);
    Ok(())
}

/// Creates the changelog and dead-letter topics that do not exist yet (a standalone
/// worker has no operator to do it). Existing topics are left as they are, but one with
/// fewer partitions than tasks is an error: a task would have nowhere to log.
fn ensure_topics(
    app: &App,
    consumer: &BaseConsumer,
    tasks: i32,
    stores: &[StoreName],
) -> Result<(), EngineError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let mut wanted = oxbow_crds::topics::wanted_topics(&app.manifest, tasks);
    // Stores of custom processors are not in the spec: same defaults as built-in ones.
    for s in stores {
        let name = changelog_topic(&app.application_id, s);
        if !wanted.iter().any(|w| w.name == name)
            && let Some(template) = wanted
                .iter()
                .find(|w| w.role == oxbow_crds::topics::Role::Changelog)
                .cloned()
                .or_else(|| oxbow_crds::topics::changelog_defaults(tasks))
        {
            wanted.push(oxbow_crds::topics::WantedTopic {
                name,
                store: Some(s.0.clone()),
                ..template
            });
        }
    }
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
                return Err(EngineError::CreateTopic {
                    topic: w.name.clone(),
                    message: format!(
                        "it exists with {} partitions; the app has {tasks} tasks and needs at least that many",
                        t.partitions().len()
                    ),
                });
            }
            Some(_) => {}
            None => missing.push(w),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
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
    let results =
        futures::executor::block_on(admin.create_topics(topics.iter(), &opts)).map_err(|e| {
            EngineError::CreateTopic {
                topic: "*".into(),
                message: e.to_string(),
            }
        })?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "created topic"),
            // Another instance created it first.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(EngineError::CreateTopic {
                    topic,
                    message: code.to_string(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(commit_interval: &str, properties: &[(&str, &str)]) -> App {
        let text = format!(
            r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: t}}
spec:
  commitInterval: {commit_interval}
  kafka: {{bootstrapServers: "127.0.0.1:1"}}
  source: {{topics: [in]}}
"#
        );
        let m =
            crate::config::parse_manifest(std::path::Path::new("t.yaml"), &text).expect("parses");
        let kafka = properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        App::from_manifest(m, kafka).expect("valid")
    }

    fn timeout_ms(app: &App) -> Option<String> {
        producer_config(app, Some("t-0"))
            .expect("configures")
            .get(TRANSACTION_TIMEOUT_PROPERTY)
            .map(str::to_string)
    }

    #[test]
    fn a_long_commit_interval_gets_a_transaction_timeout_that_outlives_it() {
        assert_eq!(timeout_ms(&app("100ms", &[])).as_deref(), Some("60000"));
        assert_eq!(timeout_ms(&app("90s", &[])).as_deref(), Some("210000"));
    }

    #[test]
    fn a_users_transaction_timeout_is_not_overwritten() {
        let a = app("90s", &[(TRANSACTION_TIMEOUT_PROPERTY, "400000")]);
        assert_eq!(timeout_ms(&a).as_deref(), Some("400000"));
    }

    #[test]
    fn a_transaction_timeout_from_the_kafka_secret_that_cannot_hold_the_interval_fails_the_start() {
        // The Secret's properties reach only the worker: the operator's validation
        // never sees them, so the worker is the one to refuse.
        let a = app("90s", &[(TRANSACTION_TIMEOUT_PROPERTY, "60000")]);
        let err = producer_config(&a, Some("t-0")).expect_err("no room for the interval");
        assert!(
            err.to_string().contains("at least twice that (180000 ms)"),
            "{err}"
        );
        assert!(
            producer_config(&a, None).is_ok(),
            "the at-least-once producer has no transaction"
        );
    }
}

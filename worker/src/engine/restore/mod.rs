//! Restore I/O: reading a task's changelogs back into its stores, several tasks side by
//! side, by tail from the checkpoint or as a full rebuild bulk-loaded from sorted files.
//! What to read is decided by the pure [`plan`] from facts read here.
//!
//! It must not decide where a task resumes processing (that is `assign`), only bring its
//! state up to the changelog's end.

pub mod plan;
mod sorted;
mod store;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oxbow_crds::{StoreName, TaskId};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;

pub use plan::{
    FullRestoreReason, RestoreFacts, RestorePlan, apply_changelog_record, plan,
    resume_without_group_offset,
};

use super::kafka::consumer_config;
use super::{EngineError, KAFKA_TIMEOUT};
use crate::config::App;
use crate::metrics::RestoreGauges;
use crate::status::{RestoreProgress, Shared};
use crate::store::TaskDb;
use store::StoreRestore;

/// Bulk-load chunk: entries buffered before an SST file is written.
const INGEST_CHUNK_BYTES: usize = 16 << 20;
/// Sorted files below this size make more work for compaction than they save memory.
const MIN_INGEST_CHUNK_BYTES: usize = 8 << 20;

/// One task's restore, as `restore_tasks` runs it.
pub(super) struct RestoreJob<'a> {
    pub(super) id: TaskId,
    pub(super) db: &'a TaskDb,
    pub(super) stores: Vec<StoreName>,
    /// At-least-once: the committed source offsets, to skip the changelog records of
    /// work that was never committed.
    pub(super) committed: Option<&'a BTreeMap<String, i64>>,
}

/// At most this many restores run at once, each with its own consumer.
pub(super) const RESTORE_THREADS: usize = 4;

/// Why a restore failed, kept as its cause in [`EngineError::Restore`].
#[derive(Debug, thiserror::Error)]
pub enum RestoreFailure {
    #[error(transparent)]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("no progress for {}s at offset {at} of {end}", super::KAFKA_TIMEOUT.as_secs())]
    Stalled { at: i64, end: i64 },
    #[error("no progress for {}s loading the global table", super::KAFKA_TIMEOUT.as_secs())]
    GlobalTableStalled,
    #[error("could not start a restore thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the restore thread panicked")]
    Panicked,
}

/// Restores the tasks of `jobs`, up to `RESTORE_THREADS` (and `max_threads`) at a
/// time, and returns each one's result in the order of `jobs`. The first thread uses
/// `side` (the engine's restore consumer); the others their own consumers (a
/// consumer's assignment is one restore at a time). Bulk loads share the sort memory
/// of one: the chunk shrinks with the number of threads.
pub(super) fn restore_tasks(
    app: &App,
    side: &BaseConsumer,
    jobs: &[RestoreJob<'_>],
    shared: &Shared,
    max_threads: usize,
) -> Vec<Result<RestoreProgress, EngineError>> {
    let started = Instant::now();
    // More threads than cores only add contention: each restore keeps a core busy
    // decoding and sorting while its consumer's threads fetch. The caller leaves a
    // core to the running tasks.
    let threads = jobs.len().clamp(1, RESTORE_THREADS.min(max_threads.max(1)));
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
                    cause: Box::new(RestoreFailure::Panicked),
                })
            })
        })
        .collect()
}

/// Each store's restore plan from its checkpoint and its changelog's watermarks, with
/// the changelog topic and the log end. Restore, the announcement of what a restore will
/// read, and a standby's starting point all plan the same way.
pub(super) struct StorePlan {
    pub(super) store: StoreName,
    pub(super) topic: String,
    pub(super) plan: RestorePlan,
    pub(super) log_end: i64,
}

pub(super) fn plan_stores(
    app: &App,
    consumer: &BaseConsumer,
    db: &TaskDb,
    id: TaskId,
    stores: &[StoreName],
) -> Result<Vec<StorePlan>, EngineError> {
    let checkpoint = db.checkpoint()?;
    let mut out = Vec::new();
    for store in stores {
        let topic = app.store_topic(store);
        let (low, high) = watermarks(consumer, &topic, id.kafka_partition()).map_err(|e| {
            EngineError::Restore {
                task: id,
                store: store.0.clone(),
                topic: topic.clone(),
                cause: Box::new(e.into()),
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
pub(super) fn watermarks(
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
pub(super) fn restore_total(
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
pub(super) fn restore_task(
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
    let (id, db) = (job.id, job.db);
    // Every early return below drops this and so clears the task's restore gauges.
    let gauges = RestoreGauges::start(id);
    let plans = plan_stores(app, consumer, db, id, &job.stores)?;
    let mut total = announced(&plans);
    shared.task(id, |t| t.restore = Some(total.clone()));
    for StorePlan {
        store, topic, plan, ..
    } in &plans
    {
        let (from, to, bulk) = match *plan {
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
                    db.wipe(store)?;
                }
                (from, to, bulk_load)
            }
        };
        StoreRestore {
            consumer,
            id,
            db,
            store,
            topic,
            from,
            to,
            bulk_chunk: bulk.then_some(chunk_bytes),
            committed: job.committed,
            // The topics this stage reads: a stage > 0 unit of work is a position in its
            // repartition topic, not in the app's sources.
            inputs: app.inputs(id.stage),
            started,
            shared,
            gauges: &gauges,
        }
        .run(&mut total)?;
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

/// What a task's restore will read, and how (`upToDate`, `tail`, or `full (why)`).
fn announced(plans: &[StorePlan]) -> RestoreProgress {
    let mut total = RestoreProgress {
        mode: "upToDate".into(),
        ..Default::default()
    };
    for p in plans {
        match &p.plan {
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
    }
    total.remaining = total.total;
    total
}

//! A batch of new active tasks restoring beside the processing loop.
//!
//! Starting a batch fences each task's previous owner (exactly-once), reads where each
//! resumes, restores every store (a tail when the local copy is warm) and only then
//! assigns the batch's source partitions. The restore is the long part: up to seconds
//! per million changelog records. It runs on threads of its own while the loop goes on
//! processing, committing and reporting the tasks already running, so a pod taking over
//! a task never pauses the ones it has (a restore on the loop's thread used to stop them
//! for the whole restore). The loop looks at the batch on every assignment check and
//! finishes it once the threads are done.
//!
//! Owns: the in-flight batch and the restore consumer while the threads hold it. It
//! must not decide what to restore (that is [`super::restore`]) or which tasks start
//! (that is `assign`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use oxbow_crds::{ProcessingGuarantee, StoreName, TaskId};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::TopicPartitionList;

use super::assign::{Resuming, StartOutcome, resume_past_state};
use super::kafka::{Producers, consumer_config, init_producers};
use super::restore::{RestoreJob, restore_tasks};
use super::{Engine, EngineError};
use crate::status::{Desired, RestoreProgress, Role, TaskState, TaskStatus};
use crate::store::TaskDb;

type Results = Vec<Result<RestoreProgress, EngineError>>;

/// A batch whose stores are restoring on their own threads.
pub(super) struct Restoring {
    handle: JoinHandle<(BaseConsumer, Results)>,
    starting: Vec<Resuming>,
    /// The assignment that started the batch: acknowledged once it runs.
    desired: Desired,
}

/// One task's restore, owned, for the restore threads.
struct Job {
    id: TaskId,
    db: Arc<TaskDb>,
    stores: Vec<StoreName>,
    committed: Option<BTreeMap<String, i64>>,
}

impl Engine {
    /// Fences and positions a batch of new actives, then starts restoring it on threads
    /// of its own (`restore_tasks`). The round trips and restores of different tasks do
    /// not depend on each other, so they overlap: fencing waits on librdkafka's
    /// coordinator timers (about 0.5 s per producer, even on an idle broker) and a
    /// restore mostly on fetches. One after the other, four tasks took 2-3 s to start
    /// after a crash with nothing to restore.
    pub(super) fn begin_restore(
        &mut self,
        batch: Vec<(TaskId, Arc<TaskDb>)>,
        desired: Desired,
    ) -> Result<(), EngineError> {
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
        let starting = self.resume_positions(batch)?;
        let jobs: Vec<Job> = starting
            .iter()
            .map(|(id, db, done, _)| Job {
                id: *id,
                db: db.clone(),
                stores: self.task_stores(*id),
                // Under exactly-once read_committed already hides uncommitted work;
                // the source-offset filter is for at-least-once.
                committed: (app.guarantee == ProcessingGuarantee::AtLeastOnce)
                    .then(|| done.clone()),
            })
            .collect();
        let consumer = match self.restorer.take() {
            Some(c) => c,
            None => consumer_config(&app, true)
                .create::<BaseConsumer>()
                .map_err(|source| EngineError::CreateClient {
                    what: "restore",
                    source,
                })?,
        };
        // Running tasks keep a core for processing; a pod with nothing running yet
        // restores on every core.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if self.tasks.is_empty() {
            cores
        } else {
            cores.saturating_sub(1).max(1)
        };
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name("oxbow-restore".into())
            .spawn(move || {
                let refs: Vec<RestoreJob<'_>> = jobs
                    .iter()
                    .map(|j| RestoreJob {
                        id: j.id,
                        db: &j.db,
                        stores: j.stores.clone(),
                        committed: j.committed.as_ref(),
                    })
                    .collect();
                let results = restore_tasks(&app, &consumer, &refs, &shared, threads);
                (consumer, results)
            })
            .map_err(|e| EngineError::Restore {
                task: starting[0].0,
                store: String::new(),
                topic: String::new(),
                message: format!("could not start a restore thread: {e}"),
            })?;
        self.restoring = Some(Restoring {
            handle,
            starting,
            desired,
        });
        Ok(())
    }

    /// Finishes the restoring batch if its threads are done (or waits for them when
    /// `wait`): the restored tasks start consuming and the assignment is acknowledged.
    pub(super) fn poll_restore(&mut self, wait: bool) -> Result<(), EngineError> {
        let Some(r) = self.restoring.take_if(|r| wait || r.handle.is_finished()) else {
            return Ok(());
        };
        let results = match r.handle.join() {
            Ok((consumer, results)) => {
                self.restorer = Some(consumer);
                results
            }
            Err(_) => r
                .starting
                .iter()
                .map(|(id, ..)| {
                    Err(EngineError::Restore {
                        task: *id,
                        store: String::new(),
                        topic: String::new(),
                        message: "the restore thread panicked".into(),
                    })
                })
                .collect(),
        };
        let outcome = self.start_restored(r.starting, results)?;
        self.after_start(&r.desired, outcome)
    }

    /// Stopping with a batch still restoring: its threads see the stop and return; none
    /// of its tasks ever ran, so there is nothing of theirs to commit.
    pub(super) fn abandon_restore(&mut self) {
        if let Some(r) = self.restoring.take() {
            let _ = r.handle.join();
        }
    }

    /// The restored tasks of a batch start consuming at their committed offsets, in one
    /// assignment; a task placed elsewhere while it restored comes back in `superseded`.
    fn start_restored(
        &mut self,
        starting: Vec<Resuming>,
        results: Results,
    ) -> Result<StartOutcome, EngineError> {
        let mut outcome = StartOutcome::default();
        let mut first_error = None;
        let mut assign = TopicPartitionList::new();
        for ((id, db, mut done, missing), result) in starting.into_iter().zip(results) {
            match result {
                Ok(progress) => {
                    tracing::info!(task = %id, mode = %progress.mode, restored = progress.restored, skipped = progress.skipped,
                        seconds = progress.seconds, rate = progress.records_per_second, "restored");
                    if self.app.guarantee == ProcessingGuarantee::ExactlyOnce {
                        // Exactly-once restores every committed changelog record: a
                        // topic without a group offset resumes past all of them.
                        resume_past_state(id, &mut done, &missing, &progress);
                        self.committed.insert(id, done.clone());
                    }
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
}

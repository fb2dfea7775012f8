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

use super::assign::{ResumedMarks, Resuming, StartOutcome, resume_past_state, resume_positions};
use super::kafka::{KProducer, Producers, Tracker, consumer_config, init_producers};
use super::restore::{RestoreJob, restore_tasks};
use super::{Engine, EngineError};
use crate::config::App;
use crate::status::{Desired, RestoreProgress, Role, Shared, TaskState, TaskStatus};
use crate::store::TaskDb;

type Results = Vec<Result<RestoreProgress, EngineError>>;

/// What the restore thread hands back: the batch's fenced producers (exactly-once),
/// where each task resumes, the replay marks of stage > 0 tasks, and each restore's
/// result in the order of `starting`.
struct Restored {
    producers: Vec<(TaskId, KProducer)>,
    starting: Vec<Resuming>,
    marks: ResumedMarks,
    results: Results,
}

/// A batch whose stores are restoring on their own threads.
pub(super) struct Restoring {
    handle: JoinHandle<(BaseConsumer, Result<Restored, EngineError>)>,
    /// The batch's tasks, for the error when the thread panics.
    ids: Vec<TaskId>,
    /// The assignment that started the batch: acknowledged once it runs.
    desired: Desired,
}

impl Engine {
    /// Starts a batch of new actives on a thread of its own: it fences each task's
    /// previous owner, reads where each resumes and restores every store
    /// (`restore_tasks`), all beside the loop. The fences wait on librdkafka's
    /// coordinator timers (about 0.5 s, even on an idle broker): on the loop's thread
    /// they held the running tasks that long. The round trips and restores of different
    /// tasks do not depend on each other, so they overlap: one after the other, four
    /// tasks took 2-3 s to start after a crash with nothing to restore.
    pub(super) fn begin_restore(
        &mut self,
        batch: Vec<(TaskId, Arc<TaskDb>)>,
        desired: Desired,
    ) -> Result<(), EngineError> {
        let app = self.app.clone();
        let snapshot = self.shared.snapshot();
        for (id, db) in &batch {
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
            if let Ok(mut dbs) = self.shared.dbs.write() {
                dbs.insert(*id, db.clone());
            }
        }
        self.shared
            .update(|s| s.state = oxbow_crds::WorkerState::Restoring);
        let ids: Vec<TaskId> = batch.iter().map(|(id, _)| *id).collect();
        let stores: BTreeMap<TaskId, Vec<StoreName>> =
            ids.iter().map(|id| (*id, self.task_stores(*id))).collect();
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
        let (shared, tracker, fenced) = (self.shared.clone(), self.tracker.clone(), ids.clone());
        let handle = std::thread::Builder::new()
            .name("oxbow-restore".into())
            .spawn(move || {
                let restored =
                    restore_batch(&app, &tracker, &consumer, &shared, batch, &stores, threads);
                (consumer, restored)
            })
            .map_err(|e| EngineError::Restore {
                task: fenced[0],
                store: String::new(),
                topic: String::new(),
                cause: Box::new(super::restore::RestoreFailure::Spawn(e)),
            })?;
        self.restoring = Some(Restoring {
            handle,
            ids: fenced,
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
        let restored = match r.handle.join() {
            Ok((consumer, restored)) => {
                self.restorer = Some(consumer);
                restored
            }
            Err(_) => Err(EngineError::Restore {
                task: r.ids[0],
                store: String::new(),
                topic: String::new(),
                cause: Box::new(super::restore::RestoreFailure::Panicked),
            }),
        };
        let restored = match restored {
            Ok(restored) => restored,
            Err(e) => {
                if let Ok(mut dbs) = self.shared.dbs.write() {
                    for id in &r.ids {
                        dbs.remove(id);
                    }
                }
                return Err(e);
            }
        };
        if let Producers::Transactional(m) = &mut self.producers {
            for (id, p) in restored.producers {
                m.insert(id, (p, false));
            }
        }
        self.resumed_marks.extend(restored.marks);
        let outcome = self.start_restored(restored.starting, restored.results)?;
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
        // One assignment per consumer: the main one's first, then each thread's.
        let mut assign: Vec<TopicPartitionList> = vec![TopicPartitionList::new()];
        for ((id, db, mut done, missing), result) in starting.into_iter().zip(results) {
            match result {
                Ok(progress) => {
                    tracing::info!(task = %id, mode = %progress.mode, restored = progress.restored, skipped = progress.skipped,
                        seconds = progress.seconds, rate = progress.records_per_second, "restored");
                    if self.app.guarantee == ProcessingGuarantee::ExactlyOnce {
                        // Exactly-once restores every committed changelog record: a
                        // topic without a group offset resumes past all of them.
                        resume_past_state(id, &mut done, &missing, &progress);
                    }
                    self.committed.insert(id, done.clone());
                    let slot = self.place(id)?.map_or(0, |k| k + 1);
                    if assign.len() <= slot {
                        assign.resize_with(slot + 1, TopicPartitionList::new);
                    }
                    self.finish_start(id, db, done, &mut assign[slot])?;
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
        for (slot, tpl) in assign.iter().enumerate() {
            if tpl.count() == 0 {
                continue;
            }
            let consumer = match slot {
                0 => &self.consumer,
                k => &self.pollers[k - 1].consumer,
            };
            consumer
                .incremental_assign(tpl)
                .map_err(EngineError::AssignPartitions)?;
            if let Some(p) = slot.checked_sub(1).and_then(|k| self.pollers.get_mut(k)) {
                p.assigned(tpl);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(outcome),
        }
    }
}

/// The restore thread's work for a batch, in order: fence the previous owners (their
/// open transactions abort, so what follows reads only committed data), read where
/// each task resumes, restore.
fn restore_batch(
    app: &App,
    tracker: &Arc<Tracker>,
    consumer: &BaseConsumer,
    shared: &Shared,
    batch: Vec<(TaskId, Arc<TaskDb>)>,
    stores: &BTreeMap<TaskId, Vec<StoreName>>,
    threads: usize,
) -> Result<Restored, EngineError> {
    let producers = if app.guarantee == ProcessingGuarantee::ExactlyOnce {
        let ids: Vec<TaskId> = batch.iter().map(|(id, _)| *id).collect();
        init_producers(app, tracker, &ids)?
    } else {
        Vec::new()
    };
    let (starting, marks) = resume_positions(app, consumer, batch)?;
    let jobs: Vec<RestoreJob<'_>> = starting
        .iter()
        .map(|(id, db, done, _)| RestoreJob {
            id: *id,
            db,
            stores: stores.get(id).cloned().unwrap_or_default(),
            // Under exactly-once read_committed already hides uncommitted work; the
            // source-offset filter is for at-least-once.
            committed: (app.guarantee == ProcessingGuarantee::AtLeastOnce).then_some(done),
        })
        .collect();
    let results = restore_tasks(app, consumer, &jobs, shared, threads);
    drop(jobs);
    Ok(Restored {
        producers,
        starting,
        marks,
        results,
    })
}

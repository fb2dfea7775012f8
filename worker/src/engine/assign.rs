//! Applying the desired tasks: which actives wait for their previous owner, what is
//! released first, which standbys start or stop, and starting a batch of actives
//! (fence, committed offsets, restore, one assignment). The hand-over order is the
//! safety argument: a task is released (committed, unassigned) before anything new
//! starts, so its next owner never overlaps it.
//!
//! It must not process records or commit on its own schedule (that is `run` and
//! `commit`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxbow_crds::{ProcessingGuarantee, StoreName, TaskId};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::kafka::Producers;
use super::quarantine;
use super::replay::Marks;
use super::restore::{restore_total, resume_without_group_offset};
use super::{Engine, EngineError, KAFKA_TIMEOUT};
use crate::config::App;
use crate::status::{Desired, RestoreProgress, TaskState, TaskStatus};
use crate::store::{Identity, StoreError, TaskDb};
use crate::task::Task;

/// Exactly-once: how long a new active waits for a previous owner that still reports
/// but does not release the task (wedged) before it starts anyway; its producer fences
/// the old owner. Longer than a transaction's timeout and a long restore's commit gap.
pub(super) const HANDOVER_TIMEOUT: Duration = Duration::from_secs(300);

impl Engine {
    /// Applies a new desired state, if any, and retries hand-overs that were waiting.
    pub(super) fn apply_desired(&mut self) -> Result<(), EngineError> {
        // One batch restores at a time, beside the loop; the next assignment is
        // applied once it has finished (the restore itself notices a task placed
        // elsewhere meanwhile).
        if self.restoring.is_some() {
            return self.poll_restore(false);
        }
        let retry = !self.waiting.is_empty();
        if let Some(d) = self.shared.desired_since(&mut self.desired_seen) {
            tracing::info!(generation = d.generation, active = ?d.active, standby = ?d.standby,
                waiting_for_release = ?d.held_elsewhere, "new assignment");
            self.desired = d;
        } else if !retry {
            return Ok(());
        }
        let d = self.desired.clone();
        let start_active = self.actives_to_start(&d);
        // 1. Release what is no longer ours, first: the next owner waits for it.
        self.release_actives(&d)?;
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
        // on threads of their own while the running tasks go on (`restoring`); none
        // processes before all are restored, so they are reported Running together.
        let batch = self.announce_actives(start_active)?;
        if batch.is_empty() {
            return self.after_start(&d, StartOutcome::default());
        }
        self.begin_restore(batch, d)
    }

    /// The end of applying an assignment, once its new actives are restored: those
    /// placed elsewhere meanwhile become standbys, the others run, and the generation
    /// is acknowledged unless the assignment moved on.
    pub(super) fn after_start(
        &mut self,
        d: &Desired,
        outcome: StartOutcome,
    ) -> Result<(), EngineError> {
        let StartOutcome {
            started,
            superseded,
        } = outcome;
        let moved_on = !superseded.is_empty() || self.shared.desired_changed(self.desired_seen);
        if moved_on {
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
        }
        for t in started {
            self.shared.task(t, |s| s.state = TaskState::Running);
        }
        if !moved_on {
            self.shared.update(|s| {
                s.generation = d.generation;
                s.state = oxbow_crds::WorkerState::Running;
            });
        }
        Ok(())
    }

    /// The desired actives that start now; the others wait for their previous owner
    /// (kept in `self.waiting`, with since when).
    fn actives_to_start(&mut self, d: &Desired) -> Vec<TaskId> {
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
        start_active
    }

    /// Commits and closes the actives that are no longer ours; those that stay here as
    /// standbys keep their store open.
    fn release_actives(&mut self, d: &Desired) -> Result<(), EngineError> {
        let release: Vec<TaskId> = self
            .tasks
            .keys()
            .filter(|t| !d.active.contains(t))
            .copied()
            .collect();
        if release.is_empty() {
            return Ok(());
        }
        self.commit_all()?;
        for t in release {
            let db = self.close_active(t)?;
            if d.standby.contains(&t) {
                self.start_standby(t, Some(db))?;
            }
        }
        Ok(())
    }

    /// Opens the stores of the actives to start and announces each with what its
    /// restore will read, so the reported progress and ETA cover the whole batch rather
    /// than one task at a time.
    fn announce_actives(
        &mut self,
        start_active: Vec<TaskId>,
    ) -> Result<Vec<(TaskId, Arc<TaskDb>)>, EngineError> {
        if !start_active.is_empty() {
            // The running tasks' work so far is committed before the fences and the
            // committed-offsets request of the batch, which take a few round trips.
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
        Ok(batch)
    }

    /// `<state-dir>/<applicationId>/<stage>_<partition>`. A stage-0 directory written
    /// before tasks had stages (`<partition>`) is renamed, so an upgrade keeps its state.
    pub(super) fn task_dir(&self, id: TaskId) -> PathBuf {
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

    pub(super) fn task_stores(&self, id: TaskId) -> Vec<StoreName> {
        self.app
            .stage_steps(id.stage)
            .iter()
            .flat_map(|f| f(id).stores())
            .collect()
    }

    /// The stage of a task's store's changelog record, from its topic.
    pub(super) fn stage_of_changelog(&self, store: &StoreName) -> u32 {
        self.app.topology.stage_of_store(store)
    }

    /// Opens a task's state, after checking it is this task's: a directory that
    /// cannot be opened or belongs to another app, task or partitioning is moved aside
    /// (see [`quarantine`]) and the task starts empty, to restore from its changelog.
    pub(super) fn open_db(&self, id: TaskId) -> Result<Arc<TaskDb>, EngineError> {
        let dir = self.task_dir(id);
        let stores = self.task_stores(id);
        let expected = Identity {
            application_id: self.app.application_id.clone(),
            task: id.to_string(),
            partitions: self.partitions,
            layouts: oxbow_crds::layouts::store_layouts(&self.app.manifest.spec)
                .into_iter()
                .filter(|(s, _)| stores.iter().any(|t| t.0 == *s))
                .collect(),
        };
        // Found corrupted while it ran: reading it again would fail on the same block.
        let noted = TaskDb::corruption_noted(&dir).map(quarantine::Unusable::Corrupted);
        let unusable = match noted {
            Some(why) => why,
            None => match self.open_dir(id, &dir)? {
                Ok(db) => match quarantine::judge(db.identity()?, &expected) {
                    quarantine::Verdict::Use => return Ok(Arc::new(db)),
                    quarantine::Verdict::Stamp => {
                        db.stamp(&expected)?;
                        return Ok(Arc::new(db));
                    }
                    quarantine::Verdict::MoveAside(why) => why,
                },
                Err(why) => why,
            },
        };
        self.move_aside(id, &dir, &unusable, &expected)?;
        let db = self.open_dir(id, &dir)?.map_err(|why| {
            EngineError::from(StoreError::Io {
                path: dir.clone(),
                source: std::io::Error::other(why.describe(&expected)),
            })
        })?;
        db.stamp(&expected)?;
        Ok(Arc::new(db))
    }

    /// Opens a directory; `Ok(Err(_))` when RocksDB refuses it for good.
    fn open_dir(
        &self,
        id: TaskId,
        dir: &std::path::Path,
    ) -> Result<Result<TaskDb, quarantine::Unusable>, EngineError> {
        let stores = self.task_stores(id);
        // A query may still hold the handle of a store closed a moment ago (RocksDB's
        // LOCK is held until the last reader lets go): retry briefly.
        let mut tries = 0;
        loop {
            match TaskDb::open(dir, id, &stores, &self.memory) {
                Ok(db) => return Ok(Ok(db)),
                Err(StoreError::Open { source, .. })
                    if quarantine::is_lock_held(source.as_ref()) =>
                {
                    if tries >= 50 {
                        return Err(StoreError::Open {
                            task: id,
                            path: dir.to_path_buf(),
                            source,
                        }
                        .into());
                    }
                    tries += 1;
                    tracing::debug!(task = %id, error = %source, "store still open elsewhere: retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(StoreError::Open { source, .. }) => {
                    return Ok(Err(quarantine::Unusable::Unreadable(source)));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn move_aside(
        &self,
        id: TaskId,
        dir: &std::path::Path,
        why: &quarantine::Unusable,
        expected: &Identity,
    ) -> Result<(), EngineError> {
        let moved = quarantine::move_aside(dir, crate::task::now_ms()).map_err(|source| {
            StoreError::Io {
                path: dir.to_path_buf(),
                source,
            }
        })?;
        let message = format!(
            "task {id}: the state directory {} cannot be used ({}); moved to {} and restoring from the changelog",
            dir.display(),
            why.describe(expected),
            moved.display()
        );
        tracing::warn!(task = %id, reason = why.label(), "{message}");
        crate::metrics::METRICS
            .state_quarantined
            .get_or_create(&crate::metrics::QuarantineLabel {
                task: id.to_string(),
                reason: why.label().into(),
            })
            .inc();
        self.shared
            .notice(crate::status::NoticeReason::StateQuarantined, message);
        Ok(())
    }

    pub(super) fn source_tpl(&self, id: TaskId) -> TopicPartitionList {
        source_tpl(&self.app, id)
    }

    /// Initialises a restored task's processors and adds its source partitions, at the
    /// committed offsets, to `assign`.
    pub(super) fn finish_start(
        &mut self,
        id: TaskId,
        db: Arc<TaskDb>,
        done: BTreeMap<String, i64>,
        assign: &mut TopicPartitionList,
    ) -> Result<(), EngineError> {
        let app = self.app.clone();
        let processors: Vec<_> = app.stage_steps(id.stage).iter().map(|f| f(id)).collect();
        let lookups: Arc<dyn crate::processor::Lookups> = self.lookups.clone();
        let mut task = Task::new(&app, id, self.partitions, db.clone(), processors, lookups);
        task.positions = done.clone();
        // A table's topic goes on from where its store was restored to.
        let checkpoint = db.checkpoint()?;
        for (store, topic) in app.stage_tables(id.stage) {
            let next = checkpoint.changelog.get(store).copied().unwrap_or(0);
            task.positions.insert(topic.clone(), next);
        }
        task.marks = self.resumed_marks.remove(&id).unwrap_or_default();
        if !task.marks.is_empty() {
            tracing::info!(task = %id, marks = ?task.marks, "resuming with replay marks");
        }
        task.init(&self.env)
            .map_err(|source| EngineError::Init { task: id, source })?;
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
        for (_, topic) in app.stage_tables(id.stage) {
            let next = task.positions.get(topic).copied().unwrap_or(0);
            assign
                .add_partition_offset(topic, id.kafka_partition(), Offset::Offset(next))
                .map_err(EngineError::AssignPartitions)?;
        }
        // A pause (errors.policy: fail) outlives an unassign in librdkafka: a task that
        // failed here before, moved away and came back must not stay paused.
        let _ = self.consumer_for(id).resume(&self.source_tpl(id));
        if app
            .topology
            .stage(id.stage)
            .is_some_and(|s| !s.streams.is_empty())
        {
            // Where each input starts, as a number: an input read from its beginning
            // starts at its low watermark.
            let mut starts = done.clone();
            for topic in app.inputs(id.stage) {
                if !starts.contains_key(topic)
                    && let Ok((low, _)) =
                        self.side
                            .fetch_watermarks(topic, id.kafka_partition(), KAFKA_TIMEOUT)
                {
                    starts.insert(topic.clone(), low);
                }
            }
            self.merges
                .insert(id, super::merge::Merge::new(app.inputs(id.stage), &starts));
        }
        self.tasks.insert(id, task);
        Ok(())
    }

    /// Stops an active task whose work is committed; returns its store.
    pub(super) fn close_active(&mut self, id: TaskId) -> Result<Arc<TaskDb>, EngineError> {
        let tpl = self.source_tpl(id);
        self.consumer_for(id)
            .incremental_unassign(&tpl)
            .map_err(EngineError::AssignPartitions)?;
        if let Some(k) = self.home.remove(&id)
            && let Some(p) = self.pollers.get_mut(k)
        {
            p.forget(&tpl);
        }
        if let Producers::Transactional(m) = &mut self.producers {
            m.remove(&id);
        }
        self.committed.remove(&id);
        // Buffered records were not processed: the next owner reads them again.
        self.merges.remove(&id);
        if let Ok(mut dbs) = self.shared.dbs.write() {
            dbs.remove(&id);
        }
        self.shared.remove_task(id);
        tracing::info!(task = %id, "released active task");
        let task = self
            .tasks
            .remove(&id)
            .ok_or_else(|| EngineError::Inconsistent {
                task: id,
                what: "released a task that was not active",
            })?;
        crate::metrics::forget_task(id, task.db.stores());
        Ok(task.db)
    }
}

/// Every partition task `id` reads: its inputs' and its co-partitioned tables'.
pub(super) fn source_tpl(app: &App, id: TaskId) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for topic in app.inputs(id.stage) {
        tpl.add_partition(topic, id.kafka_partition());
    }
    for (_, topic) in app.stage_tables(id.stage) {
        tpl.add_partition(topic, id.kafka_partition());
    }
    tpl
}

/// Where each task of a batch resumes: what Kafka says is committed (the truth for
/// where to resume and what to restore, one request for the whole batch), else the
/// position kept with the state; and a stage > 0 task's replay marks. Runs on the
/// restore thread, after the batch's fences (nothing of the previous owners' is pending).
pub(super) fn resume_positions(
    app: &App,
    consumer: &BaseConsumer,
    batch: Vec<(TaskId, Arc<TaskDb>)>,
) -> Result<(Vec<Resuming>, ResumedMarks), EngineError> {
    let mut tpl = TopicPartitionList::new();
    for (id, _) in &batch {
        for topic in app.inputs(id.stage) {
            tpl.add_partition(topic, id.kafka_partition());
        }
    }
    let committed_tpl = consumer
        .committed_offsets(tpl, KAFKA_TIMEOUT)
        .map_err(|source| EngineError::CommittedOffsets {
            group: app.application_id.clone(),
            source,
        })?;
    let mut starting = Vec::new();
    let mut marks = Vec::new();
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
                    marks.push((id, Marks::decode(e.metadata(), upstream)));
                }
            }
        }
        // Kafka drops a group's offsets after offsets.retention.minutes without a
        // commit; the positions kept with the state are then the best truth, far
        // better than reprocessing the topic from the start into existing state.
        let kept = db.checkpoint()?.source;
        let mut missing = Vec::new();
        for topic in inputs {
            if done.contains_key(topic) {
                continue;
            }
            missing.push(topic.clone());
            if let Some(pos) = kept.get(topic) {
                tracing::warn!(task = %id, topic, position = pos,
                    "no committed offset in Kafka (expired or deleted group?): resuming from the position stored with the state");
                done.insert(topic.clone(), *pos);
            }
        }
        starting.push((id, db, done, missing));
    }
    Ok((starting, marks))
}

/// What starting a batch of active tasks came to: the tasks now running, and those
/// placed elsewhere while they restored, with their stores.
#[derive(Default)]
pub(super) struct StartOutcome {
    pub(super) started: Vec<TaskId>,
    pub(super) superseded: Vec<(TaskId, Arc<TaskDb>)>,
}

/// A task about to restore: its store, where it resumes, and the input topics Kafka
/// had no committed offset for.
pub(super) type Resuming = (TaskId, Arc<TaskDb>, BTreeMap<String, i64>, Vec<String>);

/// The replay marks committed with the offsets of a batch's stage > 0 tasks.
pub(super) type ResumedMarks = Vec<(TaskId, Marks)>;

/// Moves the position of each input topic that had no group offset past the work the
/// restored state holds (see [`resume_without_group_offset`]).
pub(super) fn resume_past_state(
    id: TaskId,
    done: &mut BTreeMap<String, i64>,
    missing: &[String],
    progress: &RestoreProgress,
) {
    for topic in missing {
        let kept = done.get(topic).copied();
        let seen = progress.sources_seen.get(topic).copied();
        match resume_without_group_offset(kept, seen) {
            Some(pos) => {
                if Some(pos) != kept {
                    tracing::warn!(task = %id, topic, position = pos, kept = ?kept, last_in_changelog = ?seen,
                        "no committed offset in Kafka: resuming after the last source offset the restored changelog holds");
                }
                done.insert(topic.clone(), pos);
            }
            None => {
                tracing::warn!(task = %id, topic,
                    "no committed offset in Kafka and none in the state: reading the topic from the start")
            }
        }
    }
}

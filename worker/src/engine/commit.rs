//! A unit of work into Kafka, then into RocksDB: changelog records, then the offsets
//! (in the task's transaction under exactly-once; after a flush, with replay marks,
//! under at-least-once), then one WriteBatch per task. The order is the guarantee; see
//! the module docs of [`super`].
//!
//! It must not decide what is in a unit of work (that is [`crate::task`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxbow_crds::names::changelog_topic;
use oxbow_crds::{StoreName, TaskId};
use rdkafka::consumer::{CommitMode, Consumer, ConsumerGroupMetadata};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::kafka::{KProducer, Producers, flush, send};
use super::replay::{MAX_METADATA, Marks};
use super::{Engine, EngineError, KAFKA_TIMEOUT};
use crate::metrics::{METRICS, task as task_label};
use crate::store::TaskDb;
use crate::task::{Commit, SOURCE_HEADER, Task};

/// Each task's unit of work being committed, with the stores it wrote.
type Commits = BTreeMap<TaskId, (Commit, Vec<StoreName>)>;

impl Engine {
    /// Commits every task with uncommitted work or an open transaction, in the order
    /// the module docs give.
    pub(super) fn commit_all(&mut self) -> Result<(), EngineError> {
        let started = Instant::now();
        let ids = self.tasks_to_commit();
        if ids.is_empty() {
            return Ok(());
        }
        if let Producers::Shared(p) = &self.producers {
            // At-least-once: outputs must be durable before the changelog that records
            // their effect (a batch's deletion), or a crash in between could keep the
            // effect and lose the output.
            flush(p, KAFKA_TIMEOUT).map_err(|source| EngineError::Delivery { to: None, source })?;
            self.check_delivery()?;
        }
        let commits = self.send_changelogs(&ids)?;
        match &self.producers {
            Producers::Transactional(_) => self.commit_transactions(&commits, ids[0])?,
            Producers::Shared(_) => self.commit_offsets(&commits)?,
        }
        METRICS
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Tasks with uncommitted work, and those with an open transaction.
    fn tasks_to_commit(&self) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.uncommitted > 0)
            .map(|(id, _)| *id)
            .collect();
        if let Producers::Transactional(m) = &self.producers {
            for (id, _) in m.iter().filter(|(_, (_, in_txn))| *in_txn) {
                if !ids.contains(id) {
                    ids.push(*id);
                }
            }
        }
        ids
    }

    /// Takes each task's unit of work and sends its changelog records (the last value
    /// of each dirty key, with the source positions that produced it); with more than
    /// one processing thread, the tasks side by side.
    fn send_changelogs(&mut self, ids: &[TaskId]) -> Result<Commits, EngineError> {
        // Every task's transaction is open before the tasks go their own ways.
        for id in ids {
            if self.tasks.contains_key(id) {
                self.producer_for(*id)?;
            }
        }
        let app = &*self.app;
        let producers = &self.producers;
        let work: Vec<(TaskId, (&mut Task, &KProducer))> = self
            .tasks
            .iter_mut()
            .filter(|(id, _)| ids.contains(id))
            .filter_map(|(id, task)| {
                let p = match producers {
                    Producers::Shared(p) => p,
                    Producers::Transactional(m) => &m.get(id)?.0,
                };
                Some((*id, (task, p)))
            })
            .collect();
        let send_one = |id, (task, p): (&mut Task, &KProducer)| send_changelog(app, id, task, p);
        let results = if self.threads > 1 {
            side_by_side(work, "sending the changelog", send_one)
        } else {
            work.into_iter()
                .map(|(id, w)| (id, send_one(id, w)))
                .collect()
        };
        let mut commits = BTreeMap::new();
        for (id, r) in results {
            commits.insert(id, r?);
        }
        Ok(commits)
    }

    /// Exactly-once: ends each task's transaction with its offsets in it, then applies
    /// the state of each task whose transaction committed, even when another task's
    /// failed (its outputs and offsets are in Kafka now).
    fn commit_transactions(&mut self, commits: &Commits, any: TaskId) -> Result<(), EngineError> {
        let gm = self
            .consumer
            .group_metadata()
            .ok_or_else(|| EngineError::Inconsistent {
                task: any,
                what: "the consumer has no group metadata",
            })?;
        let Producers::Transactional(m) = &mut self.producers else {
            return Ok(());
        };
        let ended = end_transactions(m, commits, &gm);
        self.check_delivery()?;
        let mut first_error = None;
        let mut committed = Vec::new();
        for (id, r) in ended {
            match r {
                Ok(()) => {
                    if let Some((c, stores)) = commits.get(&id) {
                        committed.push((id, c, stores.as_slice()));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.apply_commits(committed)?;
        first_error.map_or(Ok(()), Err)
    }

    /// At-least-once: once every record is acknowledged, commits the offsets (a stage
    /// > 0 task's with its replay marks as metadata), then applies the state.
    fn commit_offsets(&mut self, commits: &Commits) -> Result<(), EngineError> {
        if let Producers::Shared(p) = &self.producers {
            flush(p, KAFKA_TIMEOUT).map_err(|source| EngineError::Delivery { to: None, source })?;
        }
        self.check_delivery()?;
        let mut tpl = TopicPartitionList::new();
        for (id, (c, _)) in commits {
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
        self.apply_commits(
            commits
                .iter()
                .map(|(id, (c, stores))| (*id, c, stores.as_slice()))
                .collect(),
        )
    }

    pub(super) fn check_delivery(&self) -> Result<(), EngineError> {
        match self.tracker.error.lock().ok().and_then(|e| e.clone()) {
            Some((topic, partition, source)) => Err(EngineError::Delivery {
                to: Some((topic, partition)),
                source,
            }),
            None => Ok(()),
        }
    }

    /// A stage > 0 task's replay marks as offset-commit metadata; when they do not fit,
    /// none (a restart then counts an upstream replay again) and a warning, once.
    pub(super) fn encode_marks(&mut self, id: TaskId, marks: &Marks) -> Option<String> {
        let encoded = marks.encode(self.app.inputs(id.stage - 1));
        if encoded.is_none() && self.marks_too_long.insert(id) {
            tracing::warn!(task = %id, max_bytes = MAX_METADATA,
                "the replay marks of this task do not fit in the offset commit's metadata: after a restart an upstream replay may be counted twice (at-least-once)");
        }
        encoded
    }

    /// Kafka has the units of work: now RocksDB gets them, each task's with the offsets
    /// it matches; with more than one processing thread, the tasks side by side.
    pub(super) fn apply_commits<'a>(
        &mut self,
        units: Vec<(TaskId, &'a Commit, &[StoreName])>,
    ) -> Result<(), EngineError> {
        let offsets = self
            .tracker
            .offsets
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default();
        let app = &*self.app;
        let work: Vec<_> = units
            .iter()
            .filter_map(|(id, c, stores)| {
                let task = self.tasks.get(id)?;
                let mut checkpoints = BTreeMap::new();
                for s in *stores {
                    let topic = changelog_topic(&app.application_id, s);
                    if let Some(o) = offsets.get(&(topic, id.kafka_partition())) {
                        checkpoints.insert(s.clone(), o + 1);
                    }
                }
                // A table's store is as far as the task has read its topic.
                for (s, topic) in app.stage_tables(id.stage) {
                    if let Some(next) = c.positions.get(topic) {
                        checkpoints.insert(s.clone(), *next);
                    }
                }
                Some((*id, (&task.db, *c, checkpoints)))
            })
            .collect();
        let write = |_, (db, c, checkpoints): (&Arc<TaskDb>, &'a Commit, _)| {
            db.commit(&c.writes, &checkpoints, &c.positions)?;
            Ok(c)
        };
        let results = if self.threads > 1 {
            side_by_side(work, "writing the state", write)
        } else {
            work.into_iter().map(|(id, w)| (id, write(id, w))).collect()
        };
        for (id, r) in results {
            let c = r?;
            self.committed.insert(id, c.positions.clone());
            METRICS.commits.get_or_create(&task_label(id)).inc();
            self.shared.task(id, |t| {
                t.commits += 1;
                t.positions = c.positions.clone();
            });
        }
        Ok(())
    }
}

/// Takes a task's unit of work and sends its changelog records; returns it with the
/// stores it wrote.
fn send_changelog(
    app: &crate::config::App,
    id: TaskId,
    task: &mut Task,
    p: &KProducer,
) -> Result<(Commit, Vec<StoreName>), EngineError> {
    let c = task.take_commit();
    let mut stores = Vec::new();
    for ((store, key), value) in &c.writes {
        // A table's rows come from its own topic, which is its changelog.
        if app.is_table_store(store) {
            continue;
        }
        let topic = changelog_topic(&app.application_id, store);
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
    Ok((c, stores))
}

/// An end of transaction slower than this is logged with its round trips' times.
pub(super) const SLOW_TRANSACTION: Duration = Duration::from_millis(500);

/// Ends the open transaction of each task in `commits`: its source offsets go to the
/// group through the transaction, then its records are flushed and the transaction
/// committed. Each of these is a round trip on the task's own producer, so the tasks'
/// transactions end side by side rather than one after another (four tasks queued
/// their round trips for most of a 100 ms commit interval).
pub(super) fn end_transactions(
    producers: &mut BTreeMap<TaskId, (KProducer, bool)>,
    commits: &Commits,
    gm: &ConsumerGroupMetadata,
) -> Vec<(TaskId, Result<(), EngineError>)> {
    fn end(
        id: TaskId,
        p: &KProducer,
        in_txn: &mut bool,
        c: &Commit,
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
pub(super) fn side_by_side<I: Send, R: Send>(
    items: Vec<(TaskId, I)>,
    what: &'static str,
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
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(EngineError::Panicked { task: id, what }));
                (id, r)
            })
            .collect()
    })
}

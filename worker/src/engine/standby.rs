//! Standby tasks: a task's changelogs applied to a local copy of its state and
//! checkpointed, so a promotion restores only the tail. Under at-least-once a record
//! whose unit of work is not committed yet is held until the group's offsets cover it
//! (the same rule as restore).
//!
//! It must not write to Kafka: a standby only reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxbow_crds::{ProcessingGuarantee, StoreName, TaskId};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::kafka::source_of;
use super::restore::{RestorePlan, plan_stores};
use super::{Engine, EngineError};
use crate::status::{Role, TaskState, TaskStatus};
use crate::store::TaskDb;
use crate::task::produced_by_committed_work;

/// A standby task: the changelog applied to a local copy of the state, checkpointed, so
/// a promotion restores only the tail.
pub(super) struct Standby {
    pub(super) db: Arc<TaskDb>,
    /// Per store: the next changelog offset to apply.
    pub(super) next: BTreeMap<StoreName, i64>,
    /// Applied but not yet written to RocksDB.
    pub(super) pending: Vec<crate::overlay::Write>,
    /// At-least-once only: records whose source work is not committed yet, in log
    /// order. A crash of the active between its changelog flush and its offset commit
    /// leaves such records behind; they are applied only once the group's committed
    /// offsets cover them (the same rule as restore).
    pub(super) held: std::collections::VecDeque<HeldRecord>,
    pub(super) committed: BTreeMap<String, i64>,
    pub(super) last_flush: Instant,
}

pub(super) struct HeldRecord {
    pub(super) store: StoreName,
    pub(super) offset: i64,
    pub(super) source: Option<BTreeMap<String, i64>>,
    pub(super) key: Vec<u8>,
    pub(super) value: Option<Vec<u8>>,
}

/// A standby writes its applied records at least every this many.
pub(super) const STANDBY_BATCH: usize = 10_000;

impl Engine {
    /// Starts applying a task's changelog to a local copy, from its checkpoint.
    pub(super) fn start_standby(
        &mut self,
        id: TaskId,
        db: Option<Arc<TaskDb>>,
    ) -> Result<(), EngineError> {
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
    pub(super) fn close_standby(&mut self, id: TaskId) -> Result<Arc<TaskDb>, EngineError> {
        self.flush_standby(id)?;
        let mut tpl = TopicPartitionList::new();
        for store in self.task_stores(id) {
            tpl.add_partition(&self.app.store_topic(&store), id.kafka_partition());
        }
        self.consumer
            .incremental_unassign(&tpl)
            .map_err(EngineError::AssignPartitions)?;
        if let Ok(mut dbs) = self.shared.dbs.write() {
            dbs.remove(&id);
        }
        self.shared.remove_task(id);
        let sb = self
            .standbys
            .remove(&id)
            .ok_or_else(|| EngineError::Inconsistent {
                task: id,
                what: "closed a standby that was not open",
            })?;
        crate::metrics::forget_task(id, sb.db.stores());
        Ok(sb.db)
    }

    /// At-least-once: the group's committed offsets of a standby's source partitions.
    /// At-least-once: the group's committed offsets of these standbys' source
    /// partitions, in one request (it runs on the processing thread).
    pub(super) fn refresh_standby_offsets(&mut self, ids: &[TaskId]) {
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
    pub(super) fn flush_standby(&mut self, id: TaskId) -> Result<(), EngineError> {
        // Under exactly-once, aborted records and transaction markers are never
        // delivered, yet the consumer's position moves past them: without it a standby
        // behind an aborted range (a crash mid-transaction, then silence) would look
        // that far behind for ever. Everything before the position was delivered.
        let positions = match self.app.guarantee {
            ProcessingGuarantee::ExactlyOnce => self.consumer.position().ok(),
            ProcessingGuarantee::AtLeastOnce => None,
        };
        let app = self.app.clone();
        let Some(sb) = self.standbys.get_mut(&id) else {
            return Ok(());
        };
        if let Some(pos) = &positions {
            for (store, next) in sb.next.iter_mut() {
                if let Some(Offset::Offset(o)) = pos
                    .find_partition(&app.store_topic(store), id.kafka_partition())
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

    /// Checkpoints standbys now and then (at-least-once: after refreshing the committed
    /// offsets that release held records).
    pub(super) fn flush_standbys(&mut self) -> Result<(), EngineError> {
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
}

/// Applies one changelog record to a standby.
pub(super) fn apply_standby_record(
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
pub(super) fn drain_held(sb: &mut Standby, sources: &[String]) {
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

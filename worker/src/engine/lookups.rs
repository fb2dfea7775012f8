//! What steps may ask of the worker beyond their task ([`Lookups`]): the global tables,
//! which every worker keeps whole, and whether a topic exists.
//!
//! A global table is one RocksDB per partition of its topic
//! (`<state-dir>/<applicationId>/global/<table>/<partition>`), each checkpointed at the
//! offset it has read. At start the worker reads every partition from its checkpoint to
//! the end before any task runs (as Kafka Streams bootstraps a GlobalKTable); then the
//! main consumer follows the topic and each row is written as it arrives. Rows are not
//! part of any task's unit of work: a join sees the latest row read, like a
//! GlobalKTable, and a restart continues from the checkpoint.
//!
//! It must not write any task's state or any Kafka topic.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxbow_crds::{Partitioner, StoreName, TaskId};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::restore::watermarks;
use super::{EngineError, KAFKA_TIMEOUT};
use crate::config::App;
use crate::processor::Lookups;
use crate::query::partition_for;
use crate::store::{SharedMemory, StoreError, TaskDb};

/// The stage number of a global table's partition stores in their [`TaskId`]s (errors
/// and metrics only: they belong to no task).
pub const GLOBAL_STAGE: u32 = u32::MAX;

/// A negative answer of [`Lookups::topic_exists`] is asked again after this long.
const MISSING_TOPIC_RECHECK: Duration = Duration::from_secs(10);

/// One global table: a store per partition of its topic.
pub(crate) struct GlobalTable {
    pub(crate) topic: String,
    pub(crate) store: StoreName,
    pub(crate) partitions: Vec<Arc<TaskDb>>,
}

/// The worker's [`Lookups`]: global tables and a cache of which topics exist.
pub(crate) struct WorkerLookups {
    /// Global tables by name.
    pub(crate) globals: BTreeMap<String, GlobalTable>,
    metadata: BaseConsumer,
    topics: Mutex<HashMap<String, (bool, Instant)>>,
}

impl Lookups for WorkerLookups {
    fn global_row(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(t) = self.globals.get(table) else {
            return Ok(None);
        };
        // The default partitioner's partition first; a producer that partitioned
        // otherwise still finds its rows in the others.
        let n = t.partitions.len() as u32;
        let first = partition_for(Partitioner::Murmur2, key, n).unwrap_or(0) as usize;
        if let Some(v) = t.partitions[first].get(&t.store, key)? {
            return Ok(Some(v));
        }
        for (i, db) in t.partitions.iter().enumerate() {
            if i != first
                && let Some(v) = db.get(&t.store, key)?
            {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    fn topic_exists(&self, topic: &str) -> bool {
        if let Ok(cache) = self.topics.lock()
            && let Some((exists, at)) = cache.get(topic)
            && (*exists || at.elapsed() < MISSING_TOPIC_RECHECK)
        {
            return *exists;
        }
        let exists = self
            .metadata
            .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
            .is_ok_and(|md| {
                md.topics()
                    .iter()
                    .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            });
        if let Ok(mut cache) = self.topics.lock() {
            cache.insert(topic.to_string(), (exists, Instant::now()));
        }
        exists
    }
}

impl WorkerLookups {
    /// Opens every global table's stores and reads each partition to its end.
    pub(crate) fn bootstrap(
        app: &App,
        side: &BaseConsumer,
        metadata: BaseConsumer,
        state_dir: &Path,
        memory: &SharedMemory,
    ) -> Result<Self, EngineError> {
        let mut globals = BTreeMap::new();
        for t in app.global_tables() {
            let store = StoreName(t.name.clone());
            let n = partition_count(side, &t.topic)?;
            let dir = state_dir
                .join(&app.application_id)
                .join("global")
                .join(&t.name);
            let partitions = (0..n)
                .map(|p| {
                    let id = TaskId::new(GLOBAL_STAGE, p);
                    TaskDb::open(
                        &dir.join(p.to_string()),
                        id,
                        std::slice::from_ref(&store),
                        memory,
                    )
                    .map(Arc::new)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let table = GlobalTable {
                topic: t.topic.clone(),
                store,
                partitions,
            };
            let started = Instant::now();
            let rows = read_to_end(side, &table)?;
            tracing::info!(table = %t.name, topic = %t.topic, partitions = n, rows,
                seconds = started.elapsed().as_secs_f64(), "global table loaded");
            globals.insert(t.name.clone(), table);
        }
        Ok(Self {
            globals,
            metadata,
            topics: Mutex::new(HashMap::new()),
        })
    }

    /// The global table whose topic is `topic`.
    pub(crate) fn by_topic(&self, topic: &str) -> Option<&GlobalTable> {
        self.globals.values().find(|g| g.topic == topic)
    }

    /// Where the main consumer follows each global table from: its checkpoints.
    pub(crate) fn follow_from(&self) -> Result<TopicPartitionList, EngineError> {
        let mut tpl = TopicPartitionList::new();
        for g in self.globals.values() {
            for (p, db) in g.partitions.iter().enumerate() {
                let next = db
                    .checkpoint()?
                    .changelog
                    .get(&g.store)
                    .copied()
                    .unwrap_or(0);
                tpl.add_partition_offset(&g.topic, p as i32, Offset::Offset(next))
                    .map_err(EngineError::AssignPartitions)?;
            }
        }
        Ok(tpl)
    }
}

impl GlobalTable {
    /// Writes one row (a tombstone deletes) with its checkpoint.
    pub(crate) fn apply(
        &self,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let Some(db) = self.partitions.get(partition as usize) else {
            return Ok(());
        };
        let writes: Vec<crate::overlay::Write> = key
            .map(|k| ((self.store.clone(), k.to_vec()), value.map(<[u8]>::to_vec)))
            .into_iter()
            .collect();
        let cp = BTreeMap::from([(self.store.clone(), offset + 1)]);
        db.commit(&writes, &cp, &BTreeMap::new())
    }
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> Result<u32, EngineError> {
    let md = consumer
        .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
        .map_err(EngineError::Metadata)?;
    md.topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len() as u32)
        .filter(|n| *n > 0)
        .ok_or_else(|| EngineError::TableMissing(topic.to_string()))
}

/// Reads every partition of a global table from its checkpoint to the end as it is
/// now; returns the rows read.
fn read_to_end(consumer: &BaseConsumer, t: &GlobalTable) -> Result<u64, EngineError> {
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for (p, db) in t.partitions.iter().enumerate() {
        let (low, high) =
            watermarks(consumer, &t.topic, p as i32).map_err(EngineError::Metadata)?;
        let cp = db.checkpoint()?.changelog.get(&t.store).copied();
        // A checkpoint outside the log (the topic was recreated or truncated): read it
        // all again over what is there; rows are the latest value per key anyway.
        let from = match cp {
            Some(c) if (low..=high).contains(&c) => c,
            _ => low,
        };
        if from < high {
            tpl.add_partition_offset(&t.topic, p as i32, Offset::Offset(from))
                .map_err(EngineError::AssignPartitions)?;
            ends.insert(p as i32, high);
        } else {
            let cp = BTreeMap::from([(t.store.clone(), high)]);
            db.commit(&[], &cp, &BTreeMap::new())?;
        }
    }
    if ends.is_empty() {
        return Ok(0);
    }
    consumer
        .assign(&tpl)
        .map_err(EngineError::AssignPartitions)?;
    let mut rows = 0u64;
    let mut batches: BTreeMap<i32, (Vec<crate::overlay::Write>, i64)> = BTreeMap::new();
    let mut idle_since = Instant::now();
    while !ends.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                idle_since = Instant::now();
                let p = m.partition();
                let Some(end) = ends.get(&p).copied() else {
                    continue;
                };
                let b = batches.entry(p).or_default();
                if let Some(k) = m.key() {
                    b.0.push((
                        (t.store.clone(), k.to_vec()),
                        m.payload().map(<[u8]>::to_vec),
                    ));
                    rows += 1;
                }
                b.1 = m.offset() + 1;
                if b.1 >= end || b.0.len() >= 10_000 {
                    flush_batch(t, p, b)?;
                }
                if b.1 >= end {
                    ends.remove(&p);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(topic = %t.topic, error = %e, "global table consumer error")
            }
            None => {
                // The end may be a transaction marker, never delivered.
                if let Ok(pos) = consumer.position() {
                    for e in pos.elements_for_topic(&t.topic) {
                        if let (Offset::Offset(o), Some(end)) =
                            (e.offset(), ends.get(&e.partition()).copied())
                            && o >= end
                        {
                            let b = batches.entry(e.partition()).or_default();
                            b.1 = end;
                            flush_batch(t, e.partition(), b)?;
                            ends.remove(&e.partition());
                        }
                    }
                }
                if idle_since.elapsed() > KAFKA_TIMEOUT {
                    return Err(EngineError::Restore {
                        task: TaskId::new(GLOBAL_STAGE, 0),
                        store: t.store.0.clone(),
                        topic: t.topic.clone(),
                        cause: Box::new(super::restore::RestoreFailure::GlobalTableStalled),
                    });
                }
            }
        }
    }
    consumer.unassign().map_err(EngineError::AssignPartitions)?;
    Ok(rows)
}

fn flush_batch(
    t: &GlobalTable,
    p: i32,
    b: &mut (Vec<crate::overlay::Write>, i64),
) -> Result<(), EngineError> {
    if let Some(db) = t.partitions.get(p as usize) {
        let cp = BTreeMap::from([(t.store.clone(), b.1)]);
        db.commit(&b.0, &cp, &BTreeMap::new())?;
    }
    b.0.clear();
    Ok(())
}

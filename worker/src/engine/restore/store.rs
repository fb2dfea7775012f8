//! Reading one store's changelog range back into RocksDB: a tail applied in batches
//! with checkpoints as it goes, or a full rebuild bulk-loaded from sorted files (no
//! checkpoint until it ends). Reports progress, and stops when the task is assigned
//! elsewhere or the worker is asked to stop.
//!
//! It must not decide what range to read (that is [`super::plan`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oxbow_crds::{StoreName, TaskId};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::super::kafka::source_of;
use super::super::{EngineError, KAFKA_TIMEOUT};
use super::RestoreFailure;
use super::sorted::SortBuffer;
use crate::metrics::RestoreGauges;
use crate::status::{RestoreProgress, Shared};
use crate::store::TaskDb;
use crate::task::produced_by_committed_work;

/// A tail writes what it applied at least every this many records.
const TAIL_BATCH: usize = 10_000;

/// What one store's restore reads and where it reports.
pub(super) struct StoreRestore<'a> {
    pub consumer: &'a BaseConsumer,
    pub id: TaskId,
    pub db: &'a TaskDb,
    pub store: &'a StoreName,
    pub topic: &'a str,
    /// The changelog range `[from, to)`.
    pub from: i64,
    pub to: i64,
    /// A bulk load, in sorted files of about this many bytes each.
    pub bulk_chunk: Option<usize>,
    /// At-least-once: the committed positions of the stage's inputs; a record of work
    /// past them is skipped.
    pub committed: Option<&'a BTreeMap<String, i64>>,
    /// The topics the task's stage reads (what the committed positions are of).
    pub inputs: &'a [String],
    pub started: Instant,
    pub shared: &'a Shared,
    pub gauges: &'a RestoreGauges,
}

/// What has been read and not yet written.
#[derive(Default)]
struct Buffer {
    /// Bulk load: the records of the next sorted file.
    sorted: SortBuffer,
    files: usize,
    /// Tail: the entries of the next write batch.
    batch: Vec<crate::overlay::Write>,
}

/// Why a restore loop ended early.
enum Interrupted {
    Stopping,
    AssignedElsewhere,
}

impl StoreRestore<'_> {
    fn fail(&self, cause: impl Into<RestoreFailure>) -> EngineError {
        EngineError::Restore {
            task: self.id,
            store: self.store.0.clone(),
            topic: self.topic.to_string(),
            cause: Box::new(cause.into()),
        }
    }

    fn bulk(&self) -> bool {
        self.bulk_chunk.is_some()
    }

    /// Reads `[from, to)` into the store, adding to `progress`.
    pub(super) fn run(&self, progress: &mut RestoreProgress) -> Result<(), EngineError> {
        if self.from >= self.to {
            let cp = BTreeMap::from([(self.store.clone(), self.to)]);
            self.db.commit(&[], &cp, &BTreeMap::new())?;
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            self.topic,
            self.id.kafka_partition(),
            Offset::Offset(self.from),
        )
        .map_err(|e| self.fail(e))?;
        self.consumer.assign(&tpl).map_err(|e| self.fail(e))?;
        let mut buf = Buffer::default();
        let base_remaining = progress.remaining;
        let mut last_offset = self.from - 1;
        match self.read(&mut buf, &mut last_offset, progress, base_remaining)? {
            None => {}
            Some(why) => {
                // A tail keeps what it applied, with its checkpoint (a standby continues
                // from there); a bulk load has no checkpoint until it ends and is redone.
                if !self.bulk() {
                    let cp = BTreeMap::from([(self.store.clone(), last_offset + 1)]);
                    self.db.commit(&buf.batch, &cp, &BTreeMap::new())?;
                }
                self.consumer.unassign().map_err(|e| self.fail(e))?;
                return Err(match why {
                    Interrupted::Stopping => EngineError::Stopped,
                    Interrupted::AssignedElsewhere => EngineError::Superseded(self.id),
                });
            }
        }
        if self.bulk() {
            let written = !buf.sorted.is_empty();
            self.db
                .ingest_sorted(self.store, buf.sorted.sorted(), buf.files)?;
            buf.files += usize::from(written);
            progress.ingested_files += buf.files as u64;
        }
        // Checkpoint at the end of what was read: everything before `to` is applied.
        let cp = BTreeMap::from([(self.store.clone(), self.to)]);
        self.db.commit(&buf.batch, &cp, &BTreeMap::new())?;
        self.consumer.unassign().map_err(|e| self.fail(e))?;
        progress.remaining = base_remaining.saturating_sub((self.to - self.from).max(0) as u64);
        Ok(())
    }

    /// Polls until the range is read (`None`) or the restore must stop early.
    fn read(
        &self,
        buf: &mut Buffer,
        last_offset: &mut i64,
        progress: &mut RestoreProgress,
        base_remaining: u64,
    ) -> Result<Option<Interrupted>, EngineError> {
        let mut last_progress = Instant::now();
        let mut idle_since = Instant::now();
        // When records started to arrive, and how many were done then (see the rate).
        let mut flowing_since: Option<(Instant, u64)> = None;
        loop {
            if self.shared.stopping() {
                return Ok(Some(Interrupted::Stopping));
            }
            // A restore holds the processing loop; its turns are the engine's beats.
            self.shared.liveness.beat();
            // Near the end only a transaction marker may be left, which is never
            // delivered; a long poll would sit out its whole timeout before the position
            // check below sees the log consumed, once per store restored.
            let wait = if *last_offset + 2 >= self.to {
                Duration::from_millis(5)
            } else {
                Duration::from_millis(100)
            };
            match self.consumer.poll(wait) {
                Some(Ok(m)) => {
                    idle_since = Instant::now();
                    if m.offset() >= self.to {
                        return Ok(None);
                    }
                    if flowing_since.is_none() {
                        flowing_since =
                            Some((Instant::now(), progress.restored + progress.skipped));
                        // The first report then comes when a rate can be given: with a
                        // tick counted from the assignment instead, the first report of
                        // a concurrent bulk load fell just short of the half second, the
                        // next behind a long ingestion, and the ETA never showed.
                        last_progress = Instant::now();
                    }
                    *last_offset = m.offset();
                    self.apply(&m, buf, progress, *last_offset)?;
                    if last_progress.elapsed() >= Duration::from_millis(500) {
                        last_progress = Instant::now();
                        if self
                            .shared
                            .desired_peek()
                            .is_some_and(|d| !d.active.contains(&self.id))
                        {
                            return Ok(Some(Interrupted::AssignedElsewhere));
                        }
                        let done = (*last_offset + 1 - self.from).max(0) as u64;
                        progress.remaining = base_remaining.saturating_sub(done);
                        self.report(progress, flowing_since);
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(task = %self.id, topic = self.topic, error = %e, "restore consumer error")
                }
                None => {
                    if self.consumed() {
                        return Ok(None);
                    }
                    if idle_since.elapsed() > KAFKA_TIMEOUT {
                        return Err(self.fail(RestoreFailure::Stalled {
                            at: *last_offset + 1,
                            end: self.to,
                        }));
                    }
                }
            }
        }
    }

    /// The end may be a transaction marker or aborted records, which are never
    /// delivered: the fetch position tells when the log is consumed.
    fn consumed(&self) -> bool {
        self.consumer.position().ok().is_some_and(|tpl| {
            tpl.find_partition(self.topic, self.id.kafka_partition())
                .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= self.to))
        })
    }

    /// Applies one changelog record: skipped when its unit of work never committed
    /// (at-least-once), else buffered for the next file or write batch.
    fn apply(
        &self,
        m: &BorrowedMessage<'_>,
        buf: &mut Buffer,
        progress: &mut RestoreProgress,
        offset: i64,
    ) -> Result<(), EngineError> {
        let header = source_of(m);
        if let Some(committed) = self.committed
            && !produced_by_committed_work(header.as_ref(), committed, self.inputs)
        {
            progress.skipped += 1;
            return Ok(());
        }
        let (Some(key), value) = (m.key(), m.payload()) else {
            progress.skipped += 1;
            return Ok(());
        };
        progress.restored += 1;
        for (topic, o) in header.iter().flatten() {
            match progress.sources_seen.get_mut(topic) {
                Some(seen) => *seen = (*seen).max(*o),
                None => {
                    progress.sources_seen.insert(topic.clone(), *o);
                }
            }
        }
        if let Some(chunk) = self.bulk_chunk {
            buf.sorted.push(key, value);
            if buf.sorted.size() >= chunk {
                self.db
                    .ingest_sorted(self.store, buf.sorted.sorted(), buf.files)?;
                buf.files += 1;
                buf.sorted.clear();
            }
        } else {
            buf.batch.push((
                (self.store.clone(), key.to_vec()),
                value.map(<[u8]>::to_vec),
            ));
            if buf.batch.len() >= TAIL_BATCH {
                let cp = BTreeMap::from([(self.store.clone(), offset + 1)]);
                self.db.commit(&buf.batch, &cp, &BTreeMap::new())?;
                buf.batch.clear();
            }
        }
        Ok(())
    }

    /// Publishes the progress: elapsed seconds, and a rate once there is one.
    fn report(&self, progress: &mut RestoreProgress, flowing_since: Option<(Instant, u64)>) {
        progress.seconds = self.started.elapsed().as_secs_f64();
        // The rate counts from the first record, over at least a second: the
        // assignment and first fetch can take seconds, and a rate taken over them (one
        // record in three seconds) gives an ETA of weeks. The first half second still
        // warms up (238k records/s, then 870k: an ETA four times too long). Until then
        // the previous store's rate stands (none for the first).
        if let Some((t0, d0)) = flowing_since
            && t0.elapsed() >= Duration::from_secs(1)
        {
            progress.records_per_second =
                (progress.restored + progress.skipped - d0) as f64 / t0.elapsed().as_secs_f64();
        }
        self.gauges.set(
            progress.restored,
            progress.remaining,
            progress.records_per_second,
        );
        self.shared
            .task(self.id, |t| t.restore = Some(progress.clone()));
    }
}
